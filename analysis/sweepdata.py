"""Shared by the analysis scripts: read one sweep's COMPLETE trials from its Optuna study and MLflow store.

The package never imports this folder. A script reads a sweep as

    sw = load_sweep(args)            # --sweep NAME [--tracking-uri URI] [--storage URL]
    for t in sw.trials: t.params, t.metrics, t.run_id, t.analysis (the analysis child run or None)

Each COMPLETE trial of the study links its MLflow run (user attr mlflow_run_id) and, for sweeps with
`analyze = true`, its analysis run (mlflow_analysis_run_id; else the newest FINISHED analysis child of the run,
from a later `hmmscope analyze RUN_ID`); a theory trial's settings are the
child runs tagged hmmscope.kind = theory-setting. Statistics across replicate seeds use the t
interval on the seed means (the unit of replication is the seed: one model per seed).
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
SEED_KEYS = ("train.seed", "data.seed", "theory.seed", "seed")


@dataclass
class Trial:
    number: int
    run_id: str
    params: dict[str, str]
    metrics: dict[str, float]
    analysis: dict[str, float] | None = None  # the analysis child run's metrics
    analysis_run_id: str | None = None
    settings: list[dict] = field(default_factory=list)  # theory trials: one dict of params + metrics per setting

    @property
    def seed(self) -> str:
        return next((self.params[k] for k in SEED_KEYS if k in self.params), "0")


@dataclass
class Sweep:
    name: str
    uri: str
    storage: str
    kind: str
    objective: str
    varied: list[str]  # the spec's [space] keys (what differs between cells), replicate seed excluded
    trials: list[Trial]
    counts: dict[str, int]

    def cell(self, t: Trial, keys: list[str] | None = None) -> tuple[str, ...]:
        return tuple(t.params.get(k, "") for k in (self.varied if keys is None else keys))

    def artifact_csv(self, run_id: str, path: str) -> list[dict[str, str]]:
        """Rows of a CSV artifact of a run (e.g. evaluation/figure1_by_k.csv); [] if the run has none."""
        from hmmscope import tracking

        with tempfile.TemporaryDirectory() as tmp:
            try:
                f = tracking.Run(self.uri, run_id).download(path, tmp)
            except FileNotFoundError:
                return []
            with open(f, newline="") as fh:
                return list(csv.DictReader(fh))


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--sweep", required=True, help="sweep (study) name")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: hmmscope's, sqlite under ./mlruns)")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default: sqlite:///mlruns/optuna.db)")
    p.add_argument("--out", type=Path, default=None, help="folder for the figures and tables "
                   "(default: analysis/results/SWEEP/figures)")
    return p


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def out_dir(args) -> Path:
    d = args.out or RESULTS / args.sweep / "figures"
    d.mkdir(parents=True, exist_ok=True)
    return d


def default_storage(storage: str | None) -> str:
    """The Optuna storage URL: as given, else the project's sqlite:///<cwd>/mlruns/optuna.db."""
    return storage or f"sqlite:///{Path('mlruns').resolve() / 'optuna.db'}"


def load_sweep(args) -> Sweep:
    """The sweep's COMPLETE trials with their runs; exits 2 with one line if the sweep is unknown."""
    import optuna
    from optuna.trial import TrialState

    from hmmscope import tracking
    from hmmscope.sweep.spec import parse_spec

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    uri = tracking.resolve_uri(args.tracking_uri)
    storage = default_storage(args.storage)
    try:
        study = optuna.load_study(study_name=args.sweep, storage=storage)
    except Exception as e:  # KeyError for an unknown study, OperationalError for a missing database
        fail(f"no sweep {args.sweep!r} in {storage} ({type(e).__name__})")
    spec = parse_spec(study.user_attrs["spec_text"], study.user_attrs.get("spec_path") or "spec.toml")
    varied = [p.key for p in spec.space if p.key != "seed"]
    client = tracking.client(uri)
    trials, counts = [], defaultdict(int)
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] += 1
        if t.state != TrialState.COMPLETE or not t.user_attrs.get("mlflow_run_id"):
            continue
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        tr = Trial(t.number, run.info.run_id, dict(run.data.params), dict(run.data.metrics))
        aid = t.user_attrs.get("mlflow_analysis_run_id") or _analysis_child(client, run)
        if aid:
            tr.analysis, tr.analysis_run_id = dict(client.get_run(aid).data.metrics), aid
        if spec.kind == "theory":
            tr.settings = _theory_settings(client, run)
        trials.append(tr)
    if not trials:
        fail(f"sweep {args.sweep!r} has no COMPLETE trial yet")
    return Sweep(args.sweep, uri, storage, spec.kind, spec.objective, varied,
                 sorted(trials, key=lambda t: t.number), dict(counts))


def _analysis_child(client, run) -> str | None:
    """The newest FINISHED analysis child of a training run (`hmmscope analyze RUN_ID` after the sweep, for a
    sweep run without `analyze = true`), else None."""
    kids = client.search_runs([run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}'",
                              order_by=["attributes.start_time DESC"])
    return next((k.info.run_id for k in kids if k.info.status == "FINISHED"
                 and (k.data.tags.get("hmmscope.kind") == "analysis" or k.info.run_name == "analysis")), None)


def _theory_settings(client, run) -> list[dict]:
    """The theory-setting runs below a theory trial run (at any depth), params and metrics merged."""
    out, todo = [], [run]
    while todo:
        r = todo.pop()
        kids = client.search_runs([r.info.experiment_id], f"tags.mlflow.parentRunId = '{r.info.run_id}'")
        for k in kids:
            if k.data.tags.get("hmmscope.kind") == "theory-setting":
                out.append({**k.data.params, **k.data.metrics, "run_id": k.info.run_id})
            else:
                todo.append(k)
    return out


def mean_ci(values) -> tuple[float, float, float, int]:
    """Mean and 95% t interval over replicates (the seeds); a single value has no interval (nan)."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], float)
    n = len(x)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), 0
    m = float(x.mean())
    if n < 2:
        return m, float("nan"), float("nan"), 1
    h = float(stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / np.sqrt(n))
    return m, m - h, m + h, n


def save(fig, out: Path, stem: str) -> list[Path]:
    """The figure as PNG and PDF, each written atomically (hmmscope.safe_output); prints the paths."""
    import matplotlib.pyplot as plt

    from hmmscope.safe_output import atomic_path

    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    for p in paths:
        with atomic_path(p) as tmp:
            fig.savefig(tmp, dpi=130, bbox_inches="tight", format=p.suffix[1:])
        print(f"figure: {p}")
    plt.close(fig)
    return paths


def table_csv(rows: list[dict]) -> str:
    """The rows as CSV text (columns in first-seen order), as write_table writes them."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fh = io.StringIO(newline="")
    w = csv.DictWriter(fh, cols)
    w.writeheader()
    w.writerows(rows)
    return fh.getvalue()


def write_table(rows: list[dict], out: Path, stem: str) -> Path:
    """A CSV table beside the figures (written atomically: hmmscope.safe_output), also printed as aligned text."""
    from hmmscope.safe_output import write_text

    p = out / f"{stem}.csv"
    write_text(p, table_csv(rows))
    print_table(rows, p)
    return p


def print_table(rows: list[dict], p: Path) -> None:
    """The rows as aligned text, then the table's path."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = [{k: (f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in r.items()} for r in rows]
    widths = {k: max(len(k), *(len(r.get(k, "")) for r in fmt)) for k in cols}
    print("  ".join(k.ljust(widths[k]) for k in cols))
    for r in fmt:
        print("  ".join(r.get(k, "").ljust(widths[k]) for k in cols))
    print(f"table: {p}")


def label(sw: Sweep, cell: tuple[str, ...]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(sw.varied, cell)) or "all"
