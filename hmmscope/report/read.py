"""Reading a sweep back: find its study and parent run, count its trials, read one MLflow run per COMPLETE
trial, and lay the runs out as tables (see the package docstring for the rules)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from optuna.trial import TrialState

from .. import tracking
from ..config import Config, ConfigError, flatten
from ..sweep.spec import parse_spec
from ..sweep.status import counts
from ..sweep.storage import safe_url
from ..sweep.study import ATTR_PARENT, ATTR_TEXT, load_study
from .common import NAN, param_number


@dataclass
class Trials:
    parent: Any
    complete: list  # the one MLflow run of each COMPLETE trial, by trial number
    counts: dict  # trial states from the study: complete, failed, pruned, running, waiting, retried
    children: dict  # run id -> list of child runs (whole experiment)
    analysis: dict  # training run id -> the analysis run id its trial recorded
    notes: list
    trial_of: dict = field(default_factory=dict)  # run id -> its COMPLETE trial's number
    value_of: dict = field(default_factory=dict)  # run id -> the trial's objective value (the study's record)
    objective: str = "objective"  # the objective's name (study metric names, else the spec's objective)


def _storage_candidates(uri: str, parent) -> list[str]:
    """Storage URLs that may hold the study, in order, without creating anything (module docstring)."""
    out = []
    db = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
    if db is not None:
        out.append(f"sqlite:///{db.parent.resolve() / 'optuna.db'}")
    tag = parent.data.tags.get("hmmscope.storage", "") if parent is not None else ""
    if tag and "***" not in tag:
        out.append(tag)
    out.append(f"sqlite:///{(Path('mlruns') / 'optuna.db').resolve()}")
    seen, keep = set(), []
    for u in out:
        if u in seen or (u.startswith("sqlite:///") and not Path(u[len("sqlite:///"):]).is_file()):
            continue
        seen.add(u)
        keep.append(u)
    return keep


def _load_study(name: str, url: str, explicit: bool):
    """The study `name` in storage `url`; None if that storage does not hold it (or, unless `explicit`,
    cannot be read)."""
    try:
        return load_study(name, url)
    except ConfigError:
        return None
    except Exception as e:
        if explicit:
            raise ValueError(f"cannot read storage {safe_url(url)}: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        return None


def find_parent(uri: str, sweep: str, storage: str | None = None):
    """(parent run, study, storage URL) of sweep `sweep` (study name, parent run id or a unique prefix of it of at
    least 6 characters); ValueError if unknown."""
    parent, name = None, sweep
    if re.fullmatch(r"[0-9a-f]{6,32}", sweep):  # a parent run id, or a unique prefix of one (>= 6 characters)
        try:
            run = tracking.get_run(uri, sweep)
        except ValueError:  # an ambiguous prefix: perhaps a study's name
            if len(sweep) == 32:
                raise
            run = None
        if run is not None and (len(sweep) == 32 or run.data.tags.get("hmmscope.kind") == "sweep"):
            parent = run
            name = parent.data.tags.get("hmmscope.study") or re.sub(r"^sweep-", "", parent.info.run_name or "")
    urls = [storage] if storage else _storage_candidates(uri, parent)
    for url in urls:
        study = _load_study(name, url, storage is not None)
        if study is not None:
            break
    else:
        where = ", ".join(safe_url(u) for u in urls) or "no storage found (pass --storage URL)"
        raise ValueError(f"unknown sweep {sweep!r}: no sweep study {name!r} (looked in {where})")
    pid = study.user_attrs.get(ATTR_PARENT)
    if parent is None:
        parent = tracking.get_run(uri, pid) if pid else None
        if parent is None:
            raise ValueError(f"sweep {sweep!r}: its parent run {pid} is not in {uri}")
    elif parent.info.run_id != pid:
        raise ValueError(f"run {sweep} is not the parent run of study {name!r} in {safe_url(url)} ({pid})")
    return parent, study, url


def read_sweep_trials(uri: str, parent, study) -> Trials:
    """Count the study's trials by state; read the one recorded MLflow run of each COMPLETE trial."""

    runs = tracking.search_runs(uri, experiment_ids=[parent.info.experiment_id])
    by_id = {r.info.run_id: r for r in runs}
    children: dict[str, list] = defaultdict(list)
    for r in runs:
        p = r.data.tags.get("mlflow.parentRunId")
        if p:
            children[p].append(r)
    complete, analysis, notes, used, trial_of, value_of = [], {}, [], set(), {}, {}
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number):
        rid = t.user_attrs.get("mlflow_run_id")
        run = by_id.get(rid) or (tracking.get_run(uri, rid) if rid else None)
        if run is None or rid in used:
            notes.append(f"trial {t.number} is COMPLETE but its MLflow run {rid} is "
                         f"{'missing' if run is None else 'shared with another trial'}: left out of every statistic")
            continue
        used.add(rid)
        complete.append(run)
        trial_of[rid], value_of[rid] = t.number, (t.value if t.value is not None else NAN)
        if t.user_attrs.get("mlflow_analysis_run_id"):
            analysis[rid] = t.user_attrs["mlflow_analysis_run_id"]
    return Trials(parent, complete, counts(study), children, analysis, notes, trial_of, value_of,
                   _objective_name(study))


def _objective_name(study) -> str:
    """The study's metric name (set by the sweep), else the objective of the spec it stored, else 'objective'."""
    try:
        names = study.metric_names
        if names and names[0]:
            return str(names[0])
    except Exception:  # older Optuna, or no names set
        pass
    try:
        return parse_spec(study.user_attrs[ATTR_TEXT], "study").objective
    except Exception:
        return "objective"


SEED_KEYS = ("train.seed", "data.seed", "theory.seed")  # replicates (sweep.spec.seed_keys): never design factors


def input_keys() -> frozenset[str]:
    """Every config key (`config.flatten` of the defaults): what a run's params may hold as an input."""
    return frozenset(flatten(Config()))


def design_keys(spec, runs: list) -> list[str]:
    """The keys a report may treat as design factors (blocks, per-level effects, the trials table's columns):
    the spec's [space] keys when the study stored its spec (`spec` a SweepSpec); else the params of `runs` that
    are config keys. Never a seed (the replicates) and never what a run fits from data (SCIENCE.md 9, params and
    outputs): older stores logged the counting baselines' chosen settings as params counting.k<k>.*, which are
    no config keys, so they never enter (they change with the seed: outcomes as covariates)."""
    if spec is not None and getattr(spec, "space", None) is not None:
        return [p.key for p in spec.space if p.key not in SEED_KEYS]
    inputs = input_keys()
    return sorted({k for r in runs for k in r.data.params if k in inputs and k not in SEED_KEYS})


def is_theory(r) -> bool:
    return r.data.tags.get("hmmscope.kind") in ("theory", "sweep-theory") or (any(k.startswith("theory.") for k in r.data.params)
                                                             and not any(k.startswith("eval/") for k in r.data.metrics))


def analysis_run(r, children: dict, analysis: dict | None = None):
    """The analysis child of training run r that counts: the one its trial recorded, else the newest FINISHED."""
    ana = [c for c in children.get(r.info.run_id, []) if c.info.run_name == "analysis"
           or c.data.tags.get("hmmscope.kind") == "analysis"]
    recorded = (analysis or {}).get(r.info.run_id)
    ana = [c for c in ana if c.info.run_id == recorded] or [c for c in ana if c.info.status == "FINISHED"] or ana
    return ana[0] if ana else None  # newest first (search order)


def training_frame(runs: list, children: dict, analysis: dict | None = None, uri: str | None = None):
    """One row per training trial: numeric-ified params, metrics, analysis claims (claim/<name>/*, read from
    the analysis run's claims.json by `tracking.read_claims`; `uri` is the store, needed for that table).

    The analysis read is the one the trial recorded (`analysis`: run id -> analysis run id), else the
    newest FINISHED analysis child.
    """
    rows = []
    for r in runs:
        row: dict[str, Any] = {"run_id": r.info.run_id, "trial": r.data.tags.get("hmmscope.trial", "")}
        row.update({f"param:{k}": param_number(v) for k, v in r.data.params.items()})
        row.update({f"metric:{k}": v for k, v in r.data.metrics.items()})
        a = analysis_run(r, children, analysis)
        if a is not None:
            row["analysis_id"] = a.info.run_id
            nums, verdicts, rules = tracking.read_claims(uri, a)  # its claims.json (older runs: metrics, tags)
            row.update({f"metric:{k}": v for k, v in nums.items()})
            row.update({f"verdict:{k}": v for k, v in verdicts.items()})
            row.update({f"rule:{k}": v for k, v in rules.items()})
        rows.append(row)
    return pd.DataFrame(rows)


_DRAW_KEYS = ("rate", "rate_lo", "rate_hi", "log_intercept", "gamma_eff", "mixing_rate", "seed", "fit_points")


def _draws(uri: str | None, run_id: str) -> list[dict]:
    """A setting run's HMM draws from the metric histories theory/draw/<key> (step = draw index)."""
    if uri is None:
        return []
    cl = tracking.client(uri)
    by: dict[int, dict] = defaultdict(dict)
    for k in _DRAW_KEYS:
        for m in cl.get_metric_history(run_id, f"theory/draw/{k}"):
            by[int(m.step)][k] = float(m.value)
    return [{"index": i, **{k: by[i].get(k, NAN) for k in _DRAW_KEYS}} for i in sorted(by)]


def theory_settings(theory_runs: list, children: dict, uri: str | None = None) -> list[dict]:
    """One dict per theory-setting run: params, the setting's metrics and, when it logged more than one HMM
    draw (theory/draws > 1), its draws (`_draws`; needs `uri`), else draws = []."""
    out = []
    for t in theory_runs:
        for s in children.get(t.info.run_id, []):
            m, p = s.data.metrics, s.data.params
            if "theory/rate" not in m and "theory/rate_lo" not in m:
                continue

            def g(k, d=NAN, p=p):
                v = param_number(p.get(k, d))
                return float(v) if isinstance(v, (int, float)) else d
            out.append({"run_id": s.info.run_id, "n_states": int(g("hmm.n_states", 0)), "rank": int(g("hmm.rank", 0)),
                        "rho": g("hmm.rho", 0.0), "gamma": g("hmm.gamma"), "seed": g("hmm.seed", 0.0),
                        "gamma_eff": float(m.get("theory/gamma_eff", NAN)), "rate": float(m.get("theory/rate", NAN)),
                        "rate_lo": float(m.get("theory/rate_lo", NAN)), "rate_hi": float(m.get("theory/rate_hi", NAN)),
                        "log_intercept": float(m.get("theory/log_intercept", NAN)),
                        "mixing_rate": float(m.get("theory/mixing_rate", NAN)),
                        "n_draws": int(m.get("theory/draws", 1)), "rate_df": float(m.get("theory/rate_df", NAN)),
                        "rate_mc_se": float(m.get("theory/rate_mc_se", NAN)),
                        "rate_between_sd": float(m.get("theory/rate_between_sd", NAN)),
                        "draws": _draws(uri, s.info.run_id) if m.get("theory/draws", 1) > 1 else []})
    return out
