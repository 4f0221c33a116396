"""Write RUN.md for a finished sweep's record under analysis/results/<sweep>/.

    python analysis/record.py --sweep rope-vs-absolute-cpu

RUN.md gives the exact commands that made the record (sweep, report, figures), the git commit the
trials ran (their hmmscope.code_version tags), the machine, the sweep's wall time (first trial start to
last trial end, from the Optuna study) and its trial counts by state. The record's trials.csv (one row
per COMPLETE trial: params, metrics, run ids) is written by `hmmscope report`, beside report.md.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from sweepdata import RESULTS, load_sweep, parser

FIGURES = {"train": ["figure1", "figure2", "figure3", "practice_vs_theory", "depth_vs_rank"], "theory": ["theorem1"]}


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    mem = next((int(line.split()[1]) / 2**20 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0.0) if Path("/proc/meminfo").exists() else 0.0
    import torch

    return (f"{os.cpu_count()} CPU cores ({model}), {mem:.0f} GiB RAM, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}, no GPU used")


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--note", default="", help="a line about the conditions (e.g. the machine's load)")
    args = p.parse_args(argv)
    sw = load_sweep(args)
    import optuna

    study = optuna.load_study(study_name=sw.name, storage=sw.storage)
    ts = [t for t in study.get_trials(deepcopy=False) if t.datetime_start]
    t0 = min(t.datetime_start for t in ts)
    t1 = max((t.datetime_complete or t.datetime_start) for t in ts)
    from hmmscope import tracking

    client = tracking.client(sw.uri)
    commits = sorted({client.get_run(t.run_id).data.tags.get("hmmscope.code_version", "unknown") for t in sw.trials})
    out = args.out or RESULTS / sw.name
    out.mkdir(parents=True, exist_ok=True)
    figs = [f for f in FIGURES[sw.kind] if (out / "figures" / f"{f}.png").exists()]
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(sw.counts.items()))
    wall = (t1 - t0).total_seconds()
    try:
        here = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent,
                              timeout=5).stdout.strip()
    except OSError:
        here = "unknown"
    lines = [f"# Record: sweep `{sw.name}`", "",
             f"- spec: `sweeps/{sw.name}.toml` ({sw.kind} sweep, objective `{sw.objective}`)",
             f"- code: git commit {', '.join(commits)} (the trials' `hmmscope.code_version` tag)",
             f"- machine: {machine()}",
             f"- wall time: {wall / 60:.1f} min with {args.workers} workers (first trial start "
             f"{t0:%Y-%m-%d %H:%M:%S} to last trial end {t1:%H:%M:%S}, from the Optuna study)",
             f"- trials: {counts} (of {len(ts)} started)"]
    if args.note:
        lines.append(f"- conditions: {args.note}")
    lines += ["", "## Commands (from a fresh clone, in the repository root)", "", "```bash",
              'python3 -m venv .venv && .venv/bin/pip install "torch==2.13.0" && .venv/bin/pip install -e ".[dev]"',
              f"git checkout {commits[0] if len(commits) == 1 else '<commit above>'}   # the code the trials ran",
              f".venv/bin/hmmscope sweep run sweeps/{sw.name}.toml --workers {args.workers}",
              f"git checkout {here or 'main'}   # the analysis scripts and report of this record",
              f".venv/bin/hmmscope report {sw.name} --out analysis/results/{sw.name}",
              *(f".venv/bin/python analysis/{f}.py --sweep {sw.name}" for f in figs),
              f".venv/bin/python analysis/record.py --sweep {sw.name} --workers {args.workers}",
              "```", "",
              "The store (mlruns/mlflow.db, mlruns/optuna.db, checkpoints) is not kept here; only text and figures.",
              "", "## Files", "", "- `report.md` (and `report.html`): `hmmscope report`",
              "- `trials.csv`: one row per COMPLETE trial (params, every metric, run ids): `hmmscope report`",
              *(f"- `figures/{f}.png`, `.pdf`, and its tables `figures/*.csv`: `analysis/{f}.py`" for f in figs), ""]
    (out / "RUN.md").write_text("\n".join(lines))
    print(f"record: {out / 'RUN.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
