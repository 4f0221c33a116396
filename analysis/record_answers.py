"""The answer a kept record's report opens with under the current rules, from the record's files alone (no store).

    python analysis/record_answers.py RECORD/report-gamma sweeps/inference-ablations-gamma.toml \
        [--reference RECORD/report-depth sweeps/inference-ablations-depth.toml]

`hmmscope report` needs the sweep's MLflow store and Optuna study, which a record does not keep; its trials.csv keeps
every COMPLETE trial's swept params, seed and objective, which is all the answer reads. This prints, one line each,
what the report's first section would say (hmmscope.sweep.compare.answers, the report's own code: every swept key's
effect over seeds, with its CI, verdict, equivalence and power), from the report folder's trials.csv and the sweep's
spec. With `--reference` (the folder and spec of the sweep the spec's [report] reference names), that sweep's
matching trials join as a level (hmmscope.sweep.compare.with_reference), as in the report. The package never imports
this folder.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from sweepdata import fail


def frame(folder: Path, spec):
    """The trial frame (sweep.compare.trial_frame's columns) of a report folder's trials.csv."""
    import pandas as pd

    from hmmscope.sweep.compare import OBJ, seed_column

    path = folder / "trials.csv"
    if not path.is_file():
        fail(f"{str(folder)!r}: no trials.csv there (a report folder of a kept record)")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    objective = f"objective ({spec.objective})"
    seed = seed_column(spec)[len("param:"):]
    need = [objective, seed, *(p.key for p in spec.space)]
    missing = [c for c in need if rows and c not in rows[0]]
    if not rows or missing:
        fail(f"{path}: no trials, or no column {', '.join(missing)} (is it the report of {spec.name}?)")
    typed = {p.key: {str(v): v for v in (p.grid or ())} for p in spec.space}
    out = [{"trial": r["trial"], **{f"param:{k}": typed[k].get(r[k], r[k]) for k in typed},
            f"param:{seed}": r[seed], OBJ: float(r[objective])} for r in rows if r[objective] not in ("", "nan")]
    return pd.DataFrame(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a kept report folder (its trials.csv)")
    p.add_argument("spec", type=Path, help="the sweep's spec")
    p.add_argument("--reference", nargs=2, type=Path, metavar=("FOLDER", "SPEC"),
                   help="the report folder and spec of the sweep the spec's [report] reference names")
    args = p.parse_args(argv)
    from hmmscope.config import ConfigError
    from hmmscope.sweep.compare import answers, with_reference
    from hmmscope.sweep.spec import load_spec

    try:
        spec = load_spec(args.spec)
        ref = load_spec(args.reference[1]) if args.reference else None
    except ConfigError as e:
        fail(str(e))
    df = frame(args.folder, spec)
    if ref is not None:
        df, note = with_reference(spec, df, ref, frame(args.reference[0], ref))
        print(f"reference: {note}")
    for line in answers(spec, df)[0]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
