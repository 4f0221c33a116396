"""`hmmscope report`: read a sweep's runs back from MLflow and write the statistical summary (SCIENCE.md 7).

    report = build_report(uri, "my-study", Path("out/report"))          # storage found as below
    report = build_report(uri, "my-study", Path("out/report"), storage="postgresql://...")
    print("\\n".join(report.summary_lines()))

Which trials count. The Optuna study is the record of a sweep: the report counts trials by their
study states (complete / failed / pruned / running / waiting, and "retried": failed trials whose slot
was run again after their worker died or was interrupted), and exactly one MLflow run per COMPLETE
trial enters any statistic: the run the trial recorded (user attr mlflow_run_id; with its analysis run,
user attr mlflow_analysis_run_id). Other children of the parent run (the finished run of a worker killed
before it told the study, runs of interrupted or failed trials) are never read.

Finding the study. `sweep` is a study name or the sweep's MLflow parent run id. The storage is, in
order: `storage` if given; else the first of these that holds the study: `optuna.db` beside a sqlite
tracking database (the project's default layout, `mlruns/optuna.db`, which moves with the project), the
storage URL the parent run recorded (tag hmmscope.storage; unusable when its password was masked),
and `./mlruns/optuna.db`. Nothing is created while looking. The study's user attr
mlflow_parent_run_id names its parent run (one per study, see sweep.py). No study -> ValueError
naming where it looked.

A sweep is one parent run with one child per trial. A training trial is the training run itself
(params = flattened config, metrics eval/*, memory/*), possibly with a grandchild "analysis"
(claim/<name>/value|ci_lo|ci_hi, tags verdict/<name>); a theory trial is a theory parent run whose
children are the settings (theory/rate, rate_lo, rate_hi, log_intercept, gamma_eff).

The report is built once as a list of blocks (heading, paragraph, table, image) per section, then
rendered to Markdown (GitHub pipe tables) and HTML (escaped text, <table>); both files, the PNG
figures and report.json sit in `out_dir` and are logged to the parent run under `report/`.

Statistical choices (each claim is a `stats.Claim` with a 95% CI and a verdict):

- Theory: the per-setting rates and CIs are the ones logged; the exponent of rate on gamma and on
  gamma_eff (`theory.fit_exponent`, unweighted OLS of log r on log x, as in `run_theory`) per
  (S, d, rho) group and pooled; the rank slope of the intercept (`theory.fit_rank_intercept`) per
  (S, rho, gamma) group with >= 3 ranks. Verdicts are theory's: k <= 4 supported if the CI upper < 4.
- Positional encoding: effect = RoPE - absolute, trials restricted to those two levels, seeds
  (train.seed, else data.seed) as replicates. OLS `metric ~ rope + C(other swept factors)` with HC3
  errors (plain errors, stated, when HC3 is not finite: a leverage-1 point); when every cell
  (pos_enc x other factors) has >= 2 seeds, also a mixed model with a random intercept per seed
  (smf.mixedlm, REML); the mixed model is the headline when it converges, else OLS, with the reason.
  Effect size: effect / residual sd (mixed model: sd of residual + seed intercept). Verdict for
  "RoPE improves <metric>": the CI of the effect in the better direction (acc: up; CE, KL: down;
  analysis claims: the direction that supports the claim) entirely above 0 -> supported ("RoPE
  better"), entirely below -> not supported ("RoPE worse"), else inconclusive ("no detectable
  difference").
- Layerwise claims pooled across analyzed runs: the headline estimate is the mean of the per-run
  values with a t-based 95% CI across runs (runs = seeds/settings are the replicates; this keeps the
  between-run variance, which an inverse-variance fixed-effect mean would ignore); the
  inverse-variance weighted mean (SE = (ci_hi - ci_lo) / 3.92) is shown beside it. One run: its own
  CI. Pooled verdict: the CI entirely on the claimed side of 0 -> supported, entirely on the other
  side -> not supported, else inconclusive (the claimed side comes from the claim's name; per-run
  verdicts with extra conditions, e.g. "rises then falls" also needing a rise and a fall, are counted
  but the pooled verdict reads the value only).
- Depth vs rank: cell means of eval/excess_ce by (n_layers, rank) and OLS
  `excess_ce ~ n_layers * log(rank)` (HC3 when finite), each coefficient with a 95% CI.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html as _html
import json
import math
import re
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import tracking
from .stats import NO_POWER, VERDICTS, Claim, claim, decide, jsonable, parse_rule, rule

NAN = float("nan")
Block = tuple  # ("h", level, text) | ("p", text) | ("table", headers, rows) | ("img", filename, alt)

# better direction for "RoPE improves <metric>": +1 higher is better, -1 lower is better
METRIC_DIRECTION = {"eval/test_acc": +1, "eval/excess_ce": -1, "eval/kl_mix": -1}
# the side of 0 a layerwise claim's value lies on when the claim holds (names as logged: safe_key'd)
# (the statistics of probes.py and shuffle.py; the runs' logged rules decide the pooled verdicts)
_CLAIM_SIDE = [(r"upper layers change less", -1), (r"_beats_control$", +1), (r"_beats_baseline$", +1),
               (r"rises_then_falls$", +1), (r"peak_moves_up$", +1), (r"acc_falls_with_k$", -1),
               (r"state_before_task(_reach\d+)?$", +1)]


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)


@dataclass
class Report:
    sweep: str
    parent_id: str
    header: dict
    sections: list[Section]
    claims: list[Claim]
    files: dict[str, str] = field(default_factory=dict)  # md, html, json, figures (local paths)
    notes: list[str] = field(default_factory=list)

    def summary_lines(self) -> list[str]:
        h = self.header
        out = [f"sweep {self.sweep} (parent run {self.parent_id}): {h['n_complete']} complete, "
               f"{h['n_failed']} failed, {h['n_pruned']} pruned"]
        out += [f"[{c.verdict}] {c.name}: {c.value:.4g} [95% CI {c.ci_lo:.4g}, {c.ci_hi:.4g}] ({c.reason})"
                for c in self.claims]
        out += [f"note: {n}" for n in self.notes]
        out += [f"{k}: {v}" for k, v in self.files.items() if k in ("md", "html")]
        return out


def report_to_dict(report: Report) -> dict:
    """The report as plain JSON-able data (blocks included)."""
    return jsonable(report)


# ---------------------------------------------------------------- small helpers


def _f(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, (float, np.floating)):
        return "-" if not math.isfinite(v) else f"{v:.{digits}g}"
    return str(v)


def _p(p: float) -> str:
    return "< 1e-16" if p == 0 else _f(p, 3)


def _ci(lo: float, hi: float) -> str:
    return f"[{_f(lo)}, {_f(hi)}]"


def _num(s: Any) -> Any:
    """A param string as a number when it is one."""
    try:
        x = float(s)
    except (TypeError, ValueError):
        return s
    return int(x) if x.is_integer() and re.fullmatch(r"-?\d+", str(s).strip()) else x


def _side_verdict(lo: float, hi: float, side: int) -> str:
    """Claim: the quantity lies on `side` of 0 (+1 above, -1 below: stats.decide with '> 0' / '< 0');
    side 0: two-sided 'differs from 0' (supported if the CI excludes 0, else inconclusive)."""
    if side == 0:
        ok = math.isfinite(lo) and math.isfinite(hi)
        return "supported" if ok and (lo > 0 or hi < 0) else "inconclusive"
    return decide(rule(">" if side > 0 else "<", 0), lo, hi)


def claim_side(name: str, per_run: list[tuple[float, str]] | None = None) -> int:
    """+1 / -1: the side of 0 where claim `name` holds; else inferred from supported runs; 0 if unknown."""
    for pat, side in _CLAIM_SIDE:
        if re.search(pat, name):
            return side
    signs = {int(np.sign(v)) for v, verdict in (per_run or []) if verdict == "supported" and math.isfinite(v) and v}
    return signs.pop() if len(signs) == 1 else 0


# ---------------------------------------------------------------- reading the sweep


@dataclass
class _Trials:
    parent: Any
    complete: list  # the one MLflow run of each COMPLETE trial, by trial number
    counts: dict  # trial states from the study: complete, failed, pruned, running, waiting, retried
    children: dict  # run id -> list of child runs (whole experiment)
    analysis: dict  # training run id -> the analysis run id its trial recorded
    notes: list


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
    from .config import ConfigError
    from .sweep import _load, _safe_url

    try:
        return _load(name, url)
    except ConfigError:
        return None
    except Exception as e:
        if explicit:
            raise ValueError(f"cannot read storage {_safe_url(url)}: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        return None


def _find_parent(uri: str, sweep: str, storage: str | None = None):
    """(parent run, study, storage URL) of sweep `sweep` (study name or parent run id); ValueError if unknown."""
    from .sweep import ATTR_PARENT, _safe_url

    parent, name = None, sweep
    if re.fullmatch(r"[0-9a-f]{32}", sweep):
        parent = tracking.get_run(uri, sweep)
        if parent is not None:
            name = parent.data.tags.get("hmmscope.study") or re.sub(r"^sweep-", "", parent.info.run_name or "")
    urls = [storage] if storage else _storage_candidates(uri, parent)
    for url in urls:
        study = _load_study(name, url, storage is not None)
        if study is not None:
            break
    else:
        where = ", ".join(_safe_url(u) for u in urls) or "no storage found (pass --storage URL)"
        raise ValueError(f"unknown sweep {sweep!r}: no sweep study {name!r} (looked in {where})")
    pid = study.user_attrs.get(ATTR_PARENT)
    if parent is None:
        parent = tracking.get_run(uri, pid) if pid else None
        if parent is None:
            raise ValueError(f"sweep {sweep!r}: its parent run {pid} is not in {uri}")
    elif parent.info.run_id != pid:
        raise ValueError(f"run {sweep} is not the parent run of study {name!r} in {_safe_url(url)} ({pid})")
    return parent, study, url


def _read_trials(uri: str, parent, study) -> _Trials:
    """Count the study's trials by state; read the one recorded MLflow run of each COMPLETE trial."""
    from optuna.trial import TrialState

    from .sweep import _counts

    runs = tracking.search_runs(uri, experiment_ids=[parent.info.experiment_id])
    by_id = {r.info.run_id: r for r in runs}
    children: dict[str, list] = defaultdict(list)
    for r in runs:
        p = r.data.tags.get("mlflow.parentRunId")
        if p:
            children[p].append(r)
    complete, analysis, notes, used = [], {}, [], set()
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number):
        rid = t.user_attrs.get("mlflow_run_id")
        run = by_id.get(rid) or (tracking.get_run(uri, rid) if rid else None)
        if run is None or rid in used:
            notes.append(f"trial {t.number} is COMPLETE but its MLflow run {rid} is "
                         f"{'missing' if run is None else 'shared with another trial'}: left out of every statistic")
            continue
        used.add(rid)
        complete.append(run)
        if t.user_attrs.get("mlflow_analysis_run_id"):
            analysis[rid] = t.user_attrs["mlflow_analysis_run_id"]
    return _Trials(parent, complete, _counts(study), children, analysis, notes)


def _is_theory(r) -> bool:
    return r.data.tags.get("hmmscope.kind") in ("theory", "sweep-theory") or (any(k.startswith("theory.") for k in r.data.params)
                                                             and not any(k.startswith("eval/") for k in r.data.metrics))


def _training_frame(runs: list, children: dict, analysis: dict | None = None):
    """One row per training trial: numeric-ified params, metrics, analysis claims (claim/<name>/*).

    The analysis read is the one the trial recorded (`analysis`: run id -> analysis run id), else the
    newest FINISHED analysis child.
    """
    import pandas as pd

    rows = []
    for r in runs:
        row: dict[str, Any] = {"run_id": r.info.run_id, "trial": r.data.tags.get("hmmscope.trial", "")}
        row.update({f"param:{k}": _num(v) for k, v in r.data.params.items()})
        row.update({f"metric:{k}": v for k, v in r.data.metrics.items()})
        ana = [c for c in children.get(r.info.run_id, []) if c.info.run_name == "analysis"
               or c.data.tags.get("hmmscope.kind") == "analysis"]
        recorded = (analysis or {}).get(r.info.run_id)
        ana = [c for c in ana if c.info.run_id == recorded] or [c for c in ana if c.info.status == "FINISHED"] or ana
        if ana:
            a = ana[0]  # newest
            row["analysis_id"] = a.info.run_id
            row.update({f"metric:{k}": v for k, v in a.data.metrics.items() if k.startswith("claim/")})
            row.update({f"verdict:{k[len('verdict/'):]}": v.split(":", 1)[0].strip()
                        for k, v in a.data.tags.items() if k.startswith("verdict/")})
            row.update({f"rule:{k[len('rule/'):]}": v for k, v in a.data.tags.items() if k.startswith("rule/")})
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- sections


def _header(sweep: str, t: _Trials, n_train: int, n_theory: int) -> tuple[dict, Section]:
    p = t.parent
    hashes = {k: v for k, v in {**p.data.params, **p.data.tags}.items() if "hash" in k.lower()}
    versions = sorted({r.data.tags.get("hmmscope.code_version", "unknown") for r in t.complete})
    study = p.data.tags.get("hmmscope.study") or p.info.run_name or sweep
    started = _dt.datetime.fromtimestamp(p.info.start_time / 1000, _dt.UTC) if p.info.start_time else None
    h = {"study": study, "sweep_run_name": p.info.run_name, "parent_run_id": p.info.run_id,
         "config_hash": next(iter(hashes.values()), None), "hashes": hashes,
         "n_complete": t.counts["complete"], "n_failed": t.counts["failed"], "n_pruned": t.counts["pruned"],
         "n_running": t.counts["running"], "n_waiting": t.counts["waiting"], "n_retried": t.counts["retried"],
         "n_training_trials": n_train, "n_theory_trials": n_theory,
         "code_version": p.data.tags.get("hmmscope.code_version", "unknown"), "trial_code_versions": versions,
         "sweep_started": started.isoformat(timespec="seconds") if started else None,
         "report_date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    rows = [["study", study], ["parent run id", p.info.run_id], ["config hash", h["config_hash"] or "-"],
            ["trials complete / failed / pruned / running",
             f"{h['n_complete']} / {h['n_failed']} / {h['n_pruned']} / {h['n_running']}"],
            ["trials waiting / retried (re-run after an interruption or a dead worker)",
             f"{h['n_waiting']} / {h['n_retried']}"],
            ["training / theory trials (complete)", f"{n_train} / {n_theory}"],
            ["code version (parent)", h["code_version"]],
            ["code versions (trials)", ", ".join(versions) or "-"],
            ["sweep started", h["sweep_started"] or "-"], ["report date", h["report_date"]]]
    sec = Section("Sweep", [("table", ["field", "value"], rows)])
    if len(versions) > 1:
        sec.blocks.append(("p", f"Warning: the trials ran on {len(versions)} different code versions."))
    if not t.complete:
        sec.blocks.append(("p", "This sweep has no complete trials: there is nothing to summarize."))
    return h, sec


def _theory_section(settings: list, out_dir: Path, figs: dict) -> tuple[Section, list[Claim]]:
    from .theory import exponent_fits, fit_rank_intercept

    sec, claims = Section("Theory: decay of eps(L) (Theorem 1)"), []
    rows = []
    for s in sorted(settings, key=lambda s: (s["n_states"], s["rank"], s["rho"], s["gamma"])):
        rows.append([_f(s["n_states"]), _f(s["rank"]), _f(s["rho"]), _f(s["gamma"]), _f(s["gamma_eff"]),
                     _f(s["rate"]), _ci(s["rate_lo"], s["rate_hi"]), _f(s["mixing_rate"]),
                     _f(s["rate"] - s["mixing_rate"]), _f(s["log_intercept"])])
    sec.blocks += [("p", "Decay rate r of log eps(L) = a - r L per setting, with its 95% CI (as logged), beside "
                         "the chain's own mixing rate m = -log|lambda_2(T)| (theory/mixing_rate): with no "
                         "information in the emissions eps(L) still decays like exp(-m L)."),
                   ("table", ["S", "d", "rho", "gamma", "gamma_eff", "rate", "95% CI", "mixing m", "rate - m",
                              "intercept a"], rows)]
    groups: dict[tuple, list] = defaultdict(list)
    for s in settings:
        groups[(s["n_states"], s["rank"], s["rho"])].append(s)
    scopes = [(f"S={k[0]} d={k[1]} rho={_f(k[2])}", v) for k, v in groups.items()]
    if len(groups) > 1:
        scopes.append(("pooled", settings))
    fits, erows = [], []
    for scope, ss in scopes:
        for f in exponent_fits(ss, scope):
            fits.append(f)
            erows.append([scope, f.y_name, f.x_name, _f(f.k), _ci(*f.k_ci), str(f.n_used),
                          "(same regression)" if f.same_as else f.verdict, f.reason])
            if f.same_as is None:
                c = f.claim()
                claims.append(dataclasses.replace(c, name=f"theory: {c.name}"))
    sec.blocks += [("h", 3, "Exponent of the rate on gamma (the bound allows k <= 4)"),
                   ("p", "OLS of log y on log x. y = rate, and y = rate - mixing floor over the settings whose "
                         "rate CI lies above the floor (a gamma^4 law plus a floor looks like a small k). A CI "
                         "below 4 means exponent 4 is rejected and the bound holds, loose by gamma^(4 - k)."),
                   ("table", ["scope", "y", "x", "k", "95% CI", "n", "verdict (k <= 4)", "reason"], erows)]
    by: dict[tuple, list] = defaultdict(list)
    for s in settings:
        by[(s["n_states"], s["rho"], s["gamma"])].append(s)
    rrows = []
    for k, ss in by.items():
        if len({s["rank"] for s in ss}) < 3:
            continue
        f = fit_rank_intercept([s["rank"] for s in ss], [s["log_intercept"] for s in ss],
                               scope=f"S={k[0]} rho={_f(k[1])} gamma={_f(k[2])}")
        rrows.append([f.scope, _f(f.slope), _ci(*f.slope_ci), str(f.n_used), f.verdict, f.reason])
        c = f.claim()
        claims.append(dataclasses.replace(c, name=f"theory: {c.name}"))
    sec.blocks.append(("h", 3, "Rank dependence of the intercept (bound: slope <= 1 in log d)"))
    sec.blocks.append(("table", ["scope", "slope", "95% CI", "n", "verdict (slope <= 1)", "reason"], rrows) if rrows
                      else ("p", "Fewer than 3 ranks per (S, rho, gamma): no rank fit."))
    for f in fits:
        if f.x_name == "gamma" and (f.scope == "pooled" or len(scopes) == 1):
            sec.blocks.append(("p", f"The bound's exponent on {f.y_name} ({f.scope}): k = {_f(f.k, 3)} "
                                    f"{_ci(*f.k_ci)}; {f.reason} (claim k <= 4: {f.verdict})."))
    path = out_dir / "theory_rate_vs_gamma.png"
    if _plot_theory(settings, fits, path):
        figs["theory"] = str(path)
        sec.blocks.append(("img", path.name, "decay rate vs gamma (log-log) with the exponent fit"))
    return sec, claims


def _plot_theory(settings, fits, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good = [s for s in settings if s["gamma"] > 0 and math.isfinite(s["rate"]) and s["rate"] > 0]
    if not good:
        return False
    fig, ax = plt.subplots(figsize=(5.5, 4))
    groups: dict[tuple, list] = defaultdict(list)
    for s in good:
        groups[(s["n_states"], s["rank"], s["rho"])].append(s)
    for k, ss in sorted(groups.items()):
        ss = sorted(ss, key=lambda s: s["gamma"])
        g, r = np.array([s["gamma"] for s in ss]), np.array([s["rate"] for s in ss])
        lo = np.array([s["rate_lo"] if math.isfinite(s["rate_lo"]) and s["rate_lo"] > 0 else s["rate"] for s in ss])
        hi = np.array([s["rate_hi"] if math.isfinite(s["rate_hi"]) else s["rate"] for s in ss])
        ax.errorbar(g, r, yerr=[r - lo, hi - r], fmt="o", capsize=3, label=f"S={k[0]} d={k[1]} rho={_f(k[2])}")
    gg = np.geomspace(min(s["gamma"] for s in good), max(s["gamma"] for s in good), 50)
    for f in fits:
        if f.x_name == "gamma" and f.y_name == "rate" and math.isfinite(f.k) and (f.scope == "pooled" or len(groups) == 1):
            ax.plot(gg, np.exp(f.intercept) * gg ** f.k, "k--", label=f"fit k={f.k:.2f} {_ci(*f.k_ci)}")
    ax.set(xscale="log", yscale="log", xlabel="gamma", ylabel="decay rate r", title="rate vs gamma")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _practice_section(df, out_dir: Path, figs: dict) -> Section | None:
    need = {"param:model.window", "metric:memory/model_tv"}
    if df.empty or not need <= set(df.columns):
        return None
    d = df[(df["param:model.window"].apply(lambda v: isinstance(v, (int, float)) and v > 0))
           & df["metric:memory/model_tv"].notna()]
    if d.empty:
        return None
    eps = "metric:memory/eps" if "metric:memory/eps" in d.columns else None
    groups = [c for c in ("param:hmm.gamma", "param:hmm.rank") if c in d.columns]
    d = d.copy()
    rf = "metric:memory/receptive_field"
    old = rf not in d.columns or d[rf].isna().any()
    d["L"] = d["param:model.window"] if old else d[rf]  # runs logged before receptive fields: eps at the window
    rows, series = [], defaultdict(list)
    for key, g in d.groupby([*groups, "L"], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        setting, L = dict(zip(groups, key[:-1])), key[-1]
        gam, rank = setting.get("param:hmm.gamma", "-"), setting.get("param:hmm.rank", "-")
        tv = g["metric:memory/model_tv"]
        e = g[eps].mean() if eps else NAN
        wins = ", ".join(_f(w) for w in sorted(set(g["param:model.window"])))
        rows.append([_f(gam), _f(rank), wins, _f(L), str(len(g)), _f(tv.mean()),
                     _f(tv.std(ddof=1) if len(g) > 1 else NAN), _f(e),
                     _f(tv.mean() / e if e and math.isfinite(e) else NAN, 3)])
        series[f"gamma={_f(gam)} d={_f(rank)}"].append((L, tv.mean(), e))
    sec = Section("Practice vs theory: windowed transformers", [
        ("p", "Excess error of a transformer with banded attention (memory/model_tv, mean over runs) beside the "
              "L-memory predictor's eps(L) (memory/eps) per (gamma, d). A stack of n_layers banded layers of width w "
              "sees L = n_layers (w - 1) + 1 tokens (its receptive field, memory/receptive_field), so eps is taken "
              "at that L and the model is scored on test positions whose receptive field holds test tokens only."
         + (" Some runs predate receptive fields: their rows use L = w, which understates what a deep model sees."
            if old else "")),
        ("table", ["gamma", "d", "window w", "L (receptive field)", "runs", "model TV", "sd", "eps(L)", "model / eps"],
         rows)])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (gam, pts) in enumerate(sorted(series.items())):
        pts = sorted(pts)
        L = [p[0] for p in pts]
        c = f"C{i % 10}"
        ax.plot(L, [p[1] for p in pts], "o-", color=c, label=f"model, {gam}")
        if any(math.isfinite(p[2]) for p in pts):
            ax.plot(L, [p[2] for p in pts], "s--", color=c, label=f"eps(L), {gam}")
    ax.set(yscale="log", xlabel="receptive field L", ylabel="TV to full-history oracle", title="practice vs theory")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "practice_vs_theory.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    figs["practice"] = str(path)
    sec.blocks.append(("img", path.name, "model excess error and eps(L) vs L"))
    return sec


def _other_factors(d, exclude: set[str]) -> list[str]:
    out = []
    for c in d.columns:
        if not c.startswith("param:") or c in exclude or c.endswith("seed") or c.split(".")[-1].endswith("seed"):
            continue
        vals = d[c].astype(str)
        if 2 <= vals.nunique() < len(d):
            out.append(c)
    return out


def _ols(formula: str, data):
    """OLS with HC3 errors, plain errors when HC3 is not finite; returns (result, cov label)."""
    import statsmodels.formula.api as smf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = smf.ols(formula, data).fit(cov_type="HC3", use_t=True)
        if not np.all(np.isfinite(np.asarray(res.bse))):
            return smf.ols(formula, data).fit(), "plain OLS (HC3 not finite: a leverage-1 point)"
    return res, "OLS, HC3"


def _effect(d, metric: str, factors: list[str], seed_col: str | None):
    """(model label, effect, lo, hi, p, std effect, note) for rope - absolute on `metric`."""
    import statsmodels.formula.api as smf

    data = d[[metric, *factors] + ([seed_col] if seed_col else [])].copy()
    data = data[data[metric].notna()]
    data["y"] = data[metric].astype(float)
    data["rope"] = (d.loc[data.index, "param:model.pos_enc"] == "rope").astype(float)
    names = {f: f"f{i}" for i, f in enumerate(factors)}
    for f, n in names.items():
        data[n] = data[f].astype(str)
    used, note = [], []
    for f in factors:  # add factors while the fit stays estimable
        trial = [*used, names[f]]
        X = _design(data, trial)
        if np.linalg.matrix_rank(X) == X.shape[1] and len(data) - X.shape[1] >= 2:
            used = trial
        else:
            note.append(f"{f} left out (not estimable)")
    if data["rope"].nunique() < 2:
        return "only one pos_enc level has this metric"
    if len(data) - _design(data, used).shape[1] < 1:
        return "too few trials for the model"
    if np.ptp(data["y"].to_numpy()) == 0:
        return "constant across trials"
    formula = "y ~ rope" + "".join(f" + C({n})" for n in used)
    ols, label = _ols(formula, data)
    b, (lo, hi) = float(ols.params["rope"]), (float(v) for v in np.asarray(ols.conf_int(0.05).loc["rope"]))
    sd = math.sqrt(ols.mse_resid) if ols.df_resid > 0 else NAN
    out = {"ols": (label, b, lo, hi, float(ols.pvalues["rope"]), b / sd if sd > 0 else NAN)}
    if seed_col:
        cells = data.groupby(["rope", *used]).size() if used else data.groupby("rope").size()
        nseed = data.groupby(["rope", *used])[seed_col].nunique() if used else data.groupby("rope")[seed_col].nunique()
        if cells.min() >= 2 and nseed.min() >= 2:
            data["seed"] = data[seed_col].astype(str)
            try:
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    mm = smf.mixedlm(formula, data, groups=data["seed"]).fit(reml=True)
                conv = [str(x.message) for x in w if "converge" in str(x.message).lower()]
                if not mm.converged or conv or not math.isfinite(float(mm.bse_fe["rope"])):
                    raise RuntimeError("did not converge" + (f" ({conv[0][:80]})" if conv else ""))
                if float(mm.scale) <= 1e-6 * float(data["y"].var()):
                    raise RuntimeError("singular fit: no residual variance within seeds")
                mb = float(mm.fe_params["rope"])
                mlo, mhi = (float(v) for v in np.asarray(mm.conf_int(0.05).loc["rope"]))
                tot = math.sqrt(float(mm.scale) + float(np.asarray(mm.cov_re).ravel()[0]))
                out["mixed"] = ("mixed model, random intercept per seed", mb, mlo, mhi, float(mm.pvalues["rope"]),
                                mb / tot if tot > 0 else NAN)
            except Exception as e:  # singular fits, non-convergence
                note.append(f"mixed model failed ({type(e).__name__}: {str(e)[:100]}); headline is OLS")
        else:
            note.append("fewer than 2 seeds in some cell: OLS only")
    return out, used, note


def _design(data, cols):
    import patsy

    return np.asarray(patsy.dmatrix("rope" + "".join(f" + C({c})" for c in cols), data))


def _posenc_section(df) -> tuple[Section | None, list[Claim]]:
    if df.empty or "param:model.pos_enc" not in df.columns or df["param:model.pos_enc"].nunique() < 2:
        return None, []
    levels = sorted(df["param:model.pos_enc"].astype(str).unique())
    sec, claims = Section("Positional encoding: RoPE vs absolute"), []
    if not {"rope", "absolute"} <= set(levels):
        sec.blocks.append(("p", f"pos_enc levels {levels} do not include both rope and absolute: no comparison."))
        return sec, []
    d = df[df["param:model.pos_enc"].isin(["rope", "absolute"])]
    seed_col = next((c for c in ("param:train.seed", "param:data.seed") if c in d.columns and d[c].nunique() > 1),
                    None)
    factors = _other_factors(d, {"param:model.pos_enc"})
    metrics = [m for m in METRIC_DIRECTION if f"metric:{m}" in d.columns]
    claim_cols = sorted(c for c in d.columns if c.startswith("metric:claim/") and c.endswith("/value"))
    sec.blocks.append(("p", f"Effect = RoPE - absolute; {len(d)} trials; seeds as replicates "
                            f"({seed_col[6:] if seed_col else 'no varying seed'}); other swept factors: "
                            f"{', '.join(f[6:] for f in factors) or 'none'}. Claim tested: 'RoPE improves <metric>'."))
    rows, notes = [], []
    for m in [f"metric:{m}" for m in metrics] + claim_cols:
        name = m[len("metric:"):]
        if m in claim_cols:
            cname = name[len("claim/"):-len("/value")]
            vals = [(v, vd) for v, vd in zip(d[m], d.get(f"verdict:{cname}", [""] * len(d))) if v == v]
            side, label = claim_side(cname, vals), f"claim {cname}"
        else:
            side, label = METRIC_DIRECTION[name], name
        got = _effect(d, m, factors, seed_col)
        if isinstance(got, str):
            notes.append(f"{label}: not estimated ({got})")
            continue
        fits, used, note = got
        head = fits.get("mixed", fits["ols"])
        for key in ("ols", "mixed"):
            if key not in fits:
                continue
            lab, b, lo, hi, p, es = fits[key]
            v = _side_verdict(lo, hi, side)
            word = ("RoPE better" if v == "supported" else "RoPE worse" if v == "not supported"
                    else "no detectable difference") if side else ("differs" if v == "supported" else "no detectable difference")
            rows.append([label, lab, _f(b), _ci(lo, hi), _p(p), _f(es, 3), v, word])
        lab, b, lo, hi, p, es = head
        v = _side_verdict(lo, hi, side)
        better = {1: "higher", -1: "lower", 0: "different"}[side]
        claims.append(Claim(f"RoPE improves {label}", f"rope - absolute ({lab}); better = {better}",
                            b, lo, hi, v, f"p = {_p(p)}, standardized effect {_f(es, 3)}"
                            + (f"; {'; '.join(note)}" if note else "")))
        notes += [f"{label}: {n}" for n in note]
    sec.blocks.append(("table", ["metric", "model", "effect (rope - abs)", "95% CI", "p", "effect / resid sd",
                                 "verdict (RoPE improves)", "reading"], rows))
    for n in dict.fromkeys(notes):
        sec.blocks.append(("p", n))
    return sec, claims


def _pooled_rule(r: str) -> str:
    """A run's rule for the pooled claim: the same test, its requirements renamed to the pooled claims."""
    op, t, req = parse_rule(r)
    return NO_POWER if op == NO_POWER else rule(op, t, [f"pooled: {x}" for x in req])


def _layerwise_section(df) -> tuple[Section | None, list[Claim]]:
    cols = sorted(c for c in df.columns if c.startswith("metric:claim/") and c.endswith("/value")) if not df.empty else []
    if not cols:
        return None, []
    from scipy import stats as st

    sec = Section("Layerwise claims (Figures 2, 3a, 3b), pooled over analyzed runs")
    sec.blocks.append(("p", "Pooled estimate = mean of the per-run values of the statistic that decides each claim, "
                            "with a t-based 95% CI across runs (between-run variance kept); one run: its own CI. "
                            "IVW = inverse-variance weighted mean with SE = (ci_hi - ci_lo) / 3.92, shown for "
                            "comparison. Pooled verdict: the claim's own decision rule (logged with each run, "
                            "stats.decide) applied to the pooled CI, the same rule every run used. A claim whose "
                            "runs logged no rule (older hmmscope) or different rules is not judged (inconclusive)."))
    rows, per_run, pooled = [], [], []
    for c in cols:
        name = c[len("metric:claim/"):-len("/value")]
        sub = df[df[c].notna()]
        v = sub[c].astype(float).to_numpy()
        lo = sub.get(f"metric:claim/{name}/ci_lo", np.full(len(sub), NAN))
        hi = sub.get(f"metric:claim/{name}/ci_hi", np.full(len(sub), NAN))
        lo, hi = np.asarray(lo, float), np.asarray(hi, float)
        verd = list(sub.get(f"verdict:{name}", [""] * len(sub)))
        rules = {str(r) for r in sub.get(f"rule:{name}", [""] * len(sub)) if isinstance(r, str) and r}
        counts = {k: sum(x == k for x in verd) for k in VERDICTS}
        n = len(v)
        if n >= 2:
            m, se = float(v.mean()), float(v.std(ddof=1) / math.sqrt(n))
            q = st.t.ppf(0.975, n - 1)
            plo, phi = m - q * se, m + q * se
        else:
            m, plo, phi = float(v[0]), float(lo[0]), float(hi[0])
        se_i = (hi - lo) / 3.92
        ok = np.isfinite(se_i) & (se_i > 0)
        if ok.any():
            w = 1 / se_i[ok] ** 2
            ivw, ivw_se = float((w * v[ok]).sum() / w.sum()), float(1 / math.sqrt(w.sum()))
        else:
            ivw, ivw_se = NAN, NAN
        pooled.append((name, n, m, plo, phi, ivw, ivw_se, counts, rules))
        for i in range(n):
            per_run.append([name, str(sub["trial"].iloc[i]), _f(v[i]), _ci(lo[i], hi[i]), verd[i] or "-"])
    claims: dict[str, Claim] = {}
    pending = list(pooled)
    while pending:  # claims whose requirements are decided first
        done = {k: c.verdict for k, c in claims.items()}
        ready = [p for p in pending if len(p[8]) != 1 or all(r in done for r in parse_rule(
            _pooled_rule(next(iter(p[8]))))[2])] or pending
        for p in ready:
            name, n, m, plo, phi, ivw, ivw_se, counts, rules = p
            stat = f"mean over {n} runs, t-CI" if n >= 2 else "single run's CI"
            tally = "; ".join(f"{counts[k]} {k}" for k in VERDICTS if counts[k]) or "no per-run verdicts"
            if len(rules) == 1:
                c = claim(f"pooled: {name}", stat, m, plo, phi, _pooled_rule(next(iter(rules))),
                          f"per-run verdicts: {tally}", done)
            else:
                why = "no decision rule logged (older hmmscope)" if not rules else f"runs logged different rules {sorted(rules)}"
                c = Claim(f"pooled: {name}", stat, m, plo, phi, "inconclusive", f"{why}: not judged; per-run verdicts: {tally}")
            claims[f"pooled: {name}"] = c
            done[f"pooled: {name}"] = c.verdict
        pending = [p for p in pending if p not in ready]
    for name, n, m, plo, phi, ivw, ivw_se, counts, _ in pooled:
        c = claims[f"pooled: {name}"]
        rows.append([name, str(n), _f(m), _ci(plo, phi), f"{_f(ivw)} ± {_f(1.96 * ivw_se)}",
                     "/".join(str(counts[k]) for k in VERDICTS), c.rule or "-", c.verdict])
    sec.blocks += [("table", ["claim", "runs", "pooled mean", "95% CI", "IVW ± 1.96 SE",
                              "per-run supported/not/inconclusive/no power", "rule", "pooled verdict"], rows),
                   ("h", 3, "Per-run values"),
                   ("table", ["claim", "trial", "value", "95% CI", "verdict"], per_run)]
    return sec, [claims[f"pooled: {p[0]}"] for p in pooled]


def _depth_rank_section(df) -> tuple[Section | None, list[Claim]]:
    need = ["param:model.n_layers", "param:hmm.rank", "metric:eval/excess_ce"]
    if df.empty or not all(c in df.columns for c in need):
        return None, []
    d = df[df["metric:eval/excess_ce"].notna()].copy()
    if d["param:model.n_layers"].nunique() < 2 or d["param:hmm.rank"].nunique() < 2:
        return None, []
    d["y"] = d["metric:eval/excess_ce"].astype(float)
    d["n_layers"] = d["param:model.n_layers"].astype(float)
    d["log_rank"] = np.log(d["param:hmm.rank"].astype(float))
    rows = []
    for (nl, rk), g in d.groupby(["param:model.n_layers", "param:hmm.rank"], sort=True):
        rows.append([_f(nl), _f(rk), str(len(g)), _f(g["y"].mean()),
                     _f(g["y"].std(ddof=1) if len(g) > 1 else NAN)])
    sec = Section("Depth vs rank", [("p", "eval/excess_ce by (n_layers, rank): cell means over trials."),
                                    ("table", ["n_layers", "rank", "runs", "mean excess CE", "sd"], rows)])
    claims = []
    if len(d) - 4 < 1:
        sec.blocks.append(("p", f"{len(d)} trials: too few for excess_ce ~ n_layers * log(rank)."))
        return sec, claims
    res, label = _ols("y ~ n_layers * log_rank", d)
    ci = res.conf_int(0.05)
    crow = []
    for term in res.params.index:
        lo, hi = float(ci.loc[term][0]), float(ci.loc[term][1])
        crow.append([term, _f(float(res.params[term])), _ci(lo, hi), _p(float(res.pvalues[term]))])
    sec.blocks += [("p", f"{label}: excess_ce ~ n_layers + log(rank) + n_layers:log(rank), {len(d)} trials, "
                         f"R^2 = {_f(float(res.rsquared), 3)}. A negative interaction means extra layers help more "
                         "at higher rank."),
                   ("table", ["term", "coef", "95% CI", "p"], crow)]
    t = "n_layers:log_rank"
    lo, hi = (float(x) for x in ci.loc[t])
    v = _side_verdict(lo, hi, -1)
    claims.append(Claim("depth helps more at higher rank", f"interaction n_layers:log(rank) ({label})",
                        float(res.params[t]), lo, hi, v, "negative interaction = deeper models gain more as rank grows"))
    return sec, claims


# ---------------------------------------------------------------- rendering


def render_md(title: str, sections: list[Section]) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if b[0] == "h":
                out += [f"{'#' * b[1]} {b[2]}", ""]
            elif b[0] == "p":
                out += [b[1], ""]
            elif b[0] == "table":
                cell = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731
                out.append("| " + " | ".join(cell(h) for h in b[1]) + " |")
                out.append("|" + "|".join("---" for _ in b[1]) + "|")
                out += ["| " + " | ".join(cell(x) for x in r) + " |" for r in b[2]]
                out.append("")
            elif b[0] == "img":
                out += [f"![{b[2]}]({b[1]})", ""]
    return "\n".join(out)


def render_html(title: str, sections: list[Section]) -> str:
    e = _html.escape
    out = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">", f"<title>{e(title)}</title>",
           "<style>body{font-family:sans-serif;max-width:70em;margin:auto}table{border-collapse:collapse;"
           "margin:0.5em 0}td,th{border:1px solid #bbb;padding:2px 6px;font-size:0.9em}th{background:#eee}</style>",
           "</head><body>", f"<h1>{e(title)}</h1>"]
    for s in sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        for b in s.blocks:
            if b[0] == "h":
                out.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{e(b[1])}</p>")
            elif b[0] == "table":
                out.append("<table><thead><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in b[1]) + "</tr></thead><tbody>")
                out += ["<tr>" + "".join(f"<td>{e(str(x))}</td>" for x in r) + "</tr>" for r in b[2]]
                out.append("</tbody></table>")
            elif b[0] == "img":
                out.append(f"<p><img src=\"{e(b[1], quote=True)}\" alt=\"{e(b[2], quote=True)}\"></p>")
    out.append("</body></html>")
    return "\n".join(out)


# ---------------------------------------------------------------- the entry point


def _theory_settings(theory_runs: list, children: dict) -> list[dict]:
    out = []
    for t in theory_runs:
        for s in children.get(t.info.run_id, []):
            m, p = s.data.metrics, s.data.params
            if "theory/rate" not in m and "theory/rate_lo" not in m:
                continue

            def g(k, d=NAN, p=p):
                v = _num(p.get(k, d))
                return float(v) if isinstance(v, (int, float)) else d
            out.append({"run_id": s.info.run_id, "n_states": int(g("hmm.n_states", 0)), "rank": int(g("hmm.rank", 0)),
                        "rho": g("hmm.rho", 0.0), "gamma": g("hmm.gamma"),
                        "gamma_eff": float(m.get("theory/gamma_eff", NAN)), "rate": float(m.get("theory/rate", NAN)),
                        "rate_lo": float(m.get("theory/rate_lo", NAN)), "rate_hi": float(m.get("theory/rate_hi", NAN)),
                        "log_intercept": float(m.get("theory/log_intercept", NAN)),
                        "mixing_rate": float(m.get("theory/mixing_rate", NAN))})
    return out


def build_report(uri: str, sweep: str, out_dir: Path, *, log: bool = True, storage: str | None = None) -> Report:
    """Read sweep `sweep` (study name or parent run id) and write the report under `out_dir`.

    The study is looked up in `storage`, else as the module docstring says. Writes report.md, report.html,
    report.json and PNG figures; logs them to the parent run under report/ when `log` (a store that
    cannot be written gets a note instead). Unknown sweep -> ValueError before anything is written;
    no complete trials -> a report that says so.
    """
    uri = tracking.resolve_uri(uri)
    out_dir = Path(out_dir)
    parent, study, _ = _find_parent(uri, sweep, storage)
    out_dir.mkdir(parents=True, exist_ok=True)  # after the sweep is found: an unknown sweep writes nothing
    t = _read_trials(uri, parent, study)
    theory_runs = [r for r in t.complete if _is_theory(r)]
    train_runs = [r for r in t.complete if not _is_theory(r)]
    header, head_sec = _header(sweep, t, len(train_runs), len(theory_runs))
    sections, claims, figs, notes = [head_sec], [], {}, list(t.notes)
    settings = _theory_settings(theory_runs, t.children)
    if theory_runs and not settings:
        notes.append("theory trials found but no settings with logged rates")
    df = _training_frame(train_runs, t.children, t.analysis)
    steps = [("theory", lambda: _theory_section(settings, out_dir, figs) if settings else (None, [])),
             ("practice vs theory", lambda: (_practice_section(df, out_dir, figs), [])),
             ("positional encoding", lambda: _posenc_section(df)),
             ("layerwise claims", lambda: _layerwise_section(df)),
             ("depth vs rank", lambda: _depth_rank_section(df))]
    for title, fn in steps:
        try:
            s, c = fn()
        except Exception as e:  # one broken section must not sink the report
            s, c = Section(f"{title} (failed)", [("p", f"This section failed: {type(e).__name__}: {e}")]), []
            notes.append(f"{title}: {type(e).__name__}: {e}")
        if s is not None:
            sections.append(s)
            claims += c
    if t.complete and len(sections) == 1:
        sections.append(Section("Results", [("p", "Complete trials carry none of the metrics this report reads.")]))
    if claims:
        sections.append(Section("Verdicts", [("table", ["claim", "statistic", "value", "95% CI", "verdict", "reason"],
                                              [[c.name, c.statistic, _f(c.value), _ci(c.ci_lo, c.ci_hi), c.verdict,
                                                c.reason] for c in claims])]))
    title = f"hmmscope report: {header['study']}"
    rep = Report(header["study"], parent.info.run_id, header, sections, claims, {}, notes)
    files = {"md": out_dir / "report.md", "html": out_dir / "report.html", "json": out_dir / "report.json"}
    files["md"].write_text(render_md(title, sections))
    files["html"].write_text(render_html(title, sections))
    rep.files = {**{k: str(v) for k, v in files.items()}, **figs}
    files["json"].write_text(json.dumps(report_to_dict(rep), indent=2, default=str))
    if log:
        try:
            run = tracking.existing_run(uri, parent.info.run_id)
            for p in [*files.values(), *map(Path, figs.values())]:
                run.log_artifact(p, "report")
        except Exception as e:  # e.g. a read-only store: the files are written, say why they are not logged
            rep.notes.append(f"the report was not logged to run {parent.info.run_id}: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
    return rep
