"""The sweep's question at a glance, on its MLflow parent run: the objective against each swept parameter (a
figure) and a pivot table, logged when `run_sweep` ends (and again when a finished sweep is run again).

Owns the parent run's `comparison/` artifacts: `objective.png` (+ .pdf), `pivot.png` and `pivot.json` (an MLflow
table, `tracking.Run.log_table`: MlflowClient.log_table's format, listed in the tag mlflow.loggedArtifacts).

What they show. The trials are the study's COMPLETE trials with a finite value (the objective Optuna recorded).
- Lines: one per positional encoding when model.pos_enc is swept beside other keys (rope first, then
  absolute), else one line. Seeds are the unit: at each level of a parameter a seed's value is the mean of
  its trials there (the other swept keys averaged over), drawn as a dot; the line joins the means over
  seeds, with a 95% t interval on G - 1 df (`stats.t_mean`, as the report's layerwise pooling does). One
  seed: no interval. A parameter with a continuous range (tpe/random) is drawn as its trials, no means.
- Units and the oracle: the y axis names the objective's unit (`units.metric_units`: nats/token, a
  fraction of test tokens); the oracle is drawn beside it (`units.oracle_reference`): a dotted line at 0
  for a quantity the oracle sets to 0 (excess CE, KL, the retrieval gap), else the oracle's own value at each
  level (the mean of the trials' oracle metric there, e.g. eval/seen/oracle_mix_test_acc for test accuracy,
  read through `metrics_of`) as a dashed grey line; the pivot table gets an `oracle mean` column then.
- Pivot rows: each level of each swept grid parameter but pos_enc (e.g. `hmm.gamma = 0.5`), then `all`: the
  pooled difference alone when other keys are swept (paired within their levels: a mean over gamma levels would
  be a number of no setting), the means when nothing else is; no `all` row without a difference to pool;
  columns: each line's mean with its CI and seed count, and, when rope and absolute are both swept, their
  difference rope - absolute with its 95% CI exactly as the report computes it (`effects`, which the report's
  `report.posenc` uses: blocks chosen by `choose_blocks`, the per-level effects by `per_level_effects`, the `all` row the report's
  pooled verdict estimate: within-(seed, block) paired differences, t over seeds). A factor the report
  cannot pair within (e.g. confounded with pos_enc) gets its means and the reason instead of a difference.

Imports `effects`, `sentences` and `spec` of its siblings (`parent` imports this one), and `units`, `stats` and
`safe_output`; pandas and matplotlib inside the functions that use them; never the report (which imports the sweep
package); talks to MLflow only through the `tracking.Run` it is handed.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from ..config import flatten
from ..stats import t_mean
from ..units import axis_label, better, fmt_ci, fmt_num, metric_units, oracle_reference, replicates, value_ci, wrap
from .effects import (
    choose_blocks,
    factor_effects,
    is_tuned,
    level_order,
    options,
    per_level_effects,
    pos_enc_effect,
    seeds_needed,
)
from .sentences import sentence
from .spec import RUNTIME_CONFIG, seed_keys

FOLDER = "comparison"
FIGURE, PIVOT_FIGURE, PIVOT_TABLE = "objective", "pivot", "pivot.json"
POS_ENC = "model.pos_enc"
OBJ = "metric:objective"
ORACLE = "metric:oracle"  # the oracle's value on the trial's episodes (`units.oracle_reference`), if any


def seed_column(spec) -> str:
    """The trial frame's seed column: param:train.seed (param:theory.seed for theory, param:data.seed for headroom)."""
    return {"theory": "param:theory.seed", "headroom": "param:data.seed"}.get(spec.kind, "param:train.seed")


def trial_frame(spec, study, metrics_of=None):
    """One row per COMPLETE trial with a finite value: trial number, `param:<key>` per swept key, the seed
    (`seed_column`), the objective (`metric:objective`) and, when the objective's oracle is a metric of the trials
    and `metrics_of(run_id) -> {key: value}` is given, the oracle's value (`metric:oracle`)."""
    import pandas as pd  # lazy: pandas (~0.5 s) off the sweep commands that draw no comparison


    ref = oracle_reference(spec.objective)
    oracle_key = ref[0] if ref is not None and isinstance(ref[0], str) and metrics_of is not None else None
    seed_col, rows = seed_column(spec), []
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number):
        if t.value is None or not math.isfinite(t.value):
            continue
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))
        seed = t.user_attrs.get("seed", params.pop("seed", None))
        row = {"trial": t.number, **{f"param:{p.key}": params.get(p.key) for p in spec.space},
               seed_col: seed, OBJ: float(t.value)}
        if oracle_key is not None:
            rid = t.user_attrs.get("mlflow_run_id")
            try:
                row[ORACLE] = _num((metrics_of(rid) if rid else {}).get(oracle_key))
            except Exception:  # an unreadable run: no oracle value for it
                row[ORACLE] = None
        rows.append(row)
    return pd.DataFrame(rows)


def with_reference(spec, df, ref_spec, ref_df):
    """(df with the reference sweep's matching trials as more rows, a note in words): a trial of `ref_spec` (the spec's
    [report] reference, `effects.options`) matches when its config equals this sweep's on every key but this sweep's
    swept keys, the seed keys and the run-time keys (e.g. the depth sweep's 2-layer RoPE cell for a gamma sweep that
    fixes 2 layers and RoPE); its values of this sweep's swept keys become its levels here. Nothing joins when the
    objectives or kinds differ, or when the matched cell is one this sweep ran itself."""
    import pandas as pd  # lazy: pandas (~0.5 s) off the sweep commands that draw no comparison

    name = ref_spec.name
    if (ref_spec.objective, ref_spec.kind) != (spec.objective, spec.kind):
        return df, (f"reference sweep {name}: objective {ref_spec.objective} ({ref_spec.kind}), not {spec.objective} "
                    f"({spec.kind}): not joined")
    swept = [p.key for p in spec.space]
    skip = {*swept, *seed_keys(spec.kind, 0), *RUNTIME_CONFIG}
    mine = {k: v for k, v in flatten(spec.trial_config({p.key: p.grid[0] if p.grid else p.low for p in spec.space}))
            .items() if k not in skip}
    have = {tuple(str(v) for v in r) for r in df[[f"param:{k}" for k in swept]].itertuples(index=False)}
    seed_col, rows = seed_column(spec), []
    for r in ref_df.to_dict("records"):  # native types per column (iterrows would make a level 2 a 2.0)
        cfg = flatten(ref_spec.trial_config({p.key: r[f"param:{p.key}"] for p in ref_spec.space}))
        level = tuple(cfg[k] for k in swept)
        if all(cfg.get(k) == v for k, v in mine.items()) and tuple(str(v) for v in level) not in have:
            rows.append({"trial": f"{name}#{r['trial']}", **{f"param:{k}": v for k, v in zip(swept, level)},
                         seed_col: r[seed_col], OBJ: r[OBJ], **({ORACLE: r[ORACLE]} if ORACLE in ref_df else {})})
    if not rows:
        return df, f"reference sweep {name}: no trial matches this sweep's base cell"
    levels = sorted({", ".join(f"{k} = {row[f'param:{k}']}" for k in swept) for row in rows})
    note = (f"{'; '.join(levels)}: the reference cell, {len(rows)} trial{'s' if len(rows) != 1 else ''} of sweep "
            f"{name} (its config equals this sweep's but for {', '.join(swept)})")
    return pd.concat([df, pd.DataFrame(rows)], ignore_index=True), note


def _sort_key(v: Any):
    return level_order(str(v))


def level_mean(d, seed_col: str):
    """The objective's mean over seeds (each seed: the mean of its trials in `d`) with a 95% t interval."""
    seeds = d[seed_col].astype(str)
    labs = sorted(seeds.unique(), key=_sort_key)
    return t_mean([float(d[OBJ][seeds == s].mean()) for s in labs], labs, unit="seed")


def _lines(spec, df) -> tuple[str | None, list[str]]:
    """(the line factor's column or None, its levels in order: rope, absolute, then the others)."""
    col = f"param:{POS_ENC}"
    others = [p for p in spec.space if p.key != POS_ENC]
    if col not in df.columns or df[col].astype(str).nunique() < 2 or not others:
        return None, ["all trials"]
    have = sorted(df[col].astype(str).unique())
    return col, [*(x for x in ("rope", "absolute") if x in have), *(x for x in have if x not in ("rope", "absolute"))]


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def pivot(spec, df) -> dict[str, list]:
    """The pivot table's columns (module docstring): factor, level, per line `<line> mean | ci_lo | ci_hi | seeds`,
    with rope and absolute `rope - absolute`, `diff ci_lo`, `diff ci_hi`, `diff df`, `diff units`, `diff note`,
    and with the oracle's values (`metric:oracle`) `oracle mean`."""
    seed_col = seed_column(spec)
    line_col, lines = _lines(spec, df)
    diff = line_col is not None and {"rope", "absolute"} <= set(lines)
    factors = [f"param:{p.key}" for p in spec.space if p.grid is not None and p.key != POS_ENC
               and df[f"param:{p.key}"].astype(str).nunique() >= 2]
    effects: dict[tuple[str, str], Any] = {}
    pooled: Any = None
    notes: dict[str, str] = {}
    if diff:
        d = df[df[line_col].astype(str).isin(["rope", "absolute"])]
        blocks, fate = choose_blocks(d, OBJ, factors, seed_col)
        effects = {(f, lv): e for f, lv, e in per_level_effects(d, OBJ, blocks, seed_col)}
        pooled = pos_enc_effect(d, OBJ, blocks, seed_col)
        notes = {f: why for f, why in fate.items() if f not in blocks}
    cols: dict[str, list] = {"factor": [], "level": []}
    for ln in lines:
        for k in ("mean", "ci_lo", "ci_hi", "seeds"):
            cols[f"{ln} {k}"] = []
    if diff:
        for k in ("rope - absolute", "diff ci_lo", "diff ci_hi", "diff df", "diff units", "diff note"):
            cols[k] = []
    oracle = ORACLE in df.columns and df[ORACLE].notna().any()
    if oracle:
        cols["oracle mean"] = []
    # the `all` row: never a mean over the levels of another swept key (it would average over, e.g., gamma); with
    # such keys only the paired difference is pooled there (within their levels), and without one there is no row
    rows = [(f, lv, df[df[f].astype(str) == lv]) for f in factors
            for lv in sorted(df[f].astype(str).unique(), key=_sort_key)]
    if diff or not factors:
        rows.append(("all", ", ".join(f[len("param:"):] for f in factors) if factors else "all", df))
    for f, lv, sub in rows:
        cols["factor"].append(f[len("param:"):] if f != "all" else "all")
        cols["level"].append(lv)
        for ln in lines:
            part = sub if line_col is None else sub[sub[line_col].astype(str) == ln]
            e = level_mean(part, seed_col) if len(part) and not (f == "all" and factors) else None
            cols[f"{ln} mean"].append(_num(e.value) if e else None)
            cols[f"{ln} ci_lo"].append(_num(e.lo) if e else None)
            cols[f"{ln} ci_hi"].append(_num(e.hi) if e else None)
            cols[f"{ln} seeds"].append(e.n if e else 0)
        if diff:
            e = pooled if f == "all" else effects.get((f, lv), notes.get(f, "not a blocking factor"))
            ok = not isinstance(e, str)
            cols["rope - absolute"].append(_num(e.value) if ok else None)
            cols["diff ci_lo"].append(_num(e.lo) if ok else None)
            cols["diff ci_hi"].append(_num(e.hi) if ok else None)
            cols["diff df"].append(_num(e.df) if ok else None)
            cols["diff units"].append(f"{e.n} {e.unit}" if ok else "")
            cols["diff note"].append((e.degenerate or e.method) if ok else e)
        if oracle:
            cols["oracle mean"].append(None if f == "all" and factors else _num(sub[ORACLE].astype(float).mean()))
    return cols


def answer(spec, df, opts=None) -> str | None:
    """The sweep's answer (`answers`) in one line: its sentences joined by '; '; None with no complete trial."""
    said = answers(spec, df, opts)[0]
    return "; ".join(said) if said else None


def answers(spec, df, opts=None) -> tuple[list[str], list]:
    """(sentences, effects): the sweep's answer, one sentence per swept key, with its unit, 95% CI, replicates and
    verdict (the report's first lines, the last lines of `hmmscope run` and `sweep run`); ([], []) with no complete
    trial.

    Every key that is not tuned (`effects.is_tuned`) gets its effect over seeds (`effects.factor_effects`: a paired
    contrast for two levels, the slope with its adjacent steps for ordered levels, each level against the reference
    for a categorical key), e.g. "hmm.gamma: 0.9 - 0.5 = +0.54 [+0.30, +0.78] nats/token, 2 seeds: excess CE (seen
    tasks) grows with gamma (supported)"; model.pos_enc reads "rope - absolute", the same signed difference as the
    pivot and the figures. Then, for the tuned keys (train.* by default, every key of a tpe / random sweep), the best
    setting by the spec's direction, its mean over seeds with its 95% t interval beside the runner-up, marked as a
    tuned key's. `opts`: the spec's [report] options (`effects.options`)."""
    if df is None or df.empty:
        return [], []
    opts = opts or options(spec)
    seed_col, unit = seed_column(spec), metric_units(spec.objective)
    keys = [p.key for p in spec.space if f"param:{p.key}" in df.columns]
    factors = [k for k in keys if not is_tuned(spec, k, opts)]
    effs = factor_effects(df, factors, OBJ, seed_col if seed_col in df.columns else None, metric=spec.objective,
                          unit=unit, margin=opts.margin_for(unit), references=opts.references,
                          direction=spec.direction, base=flatten(spec.base))
    said = [sentence(e) for e in effs]
    tuned = [k for k in keys if k not in factors]
    if tuned or not keys:
        cols = [f"param:{k}" for k in keys]
        cells = []
        for cell, sub in (df.groupby([df[k].astype(str) for k in cols], sort=False) if cols else [((), df)]):
            cell = cell if isinstance(cell, tuple) else (cell,)
            label = ", ".join(f"{k[len('param:'):]} = {v}" for k, v in zip(cols, cell)) or "all trials"
            cells.append((label, level_mean(sub, seed_col)))
        cells.sort(key=lambda c: c[1].value if spec.direction == "minimize" else -c[1].value)
        (label, e), rest = cells[0], cells[1:]
        text = (f"best of {len(cells)} setting{'s' if len(cells) != 1 else ''} on {spec.objective} ({spec.direction}"
                + (f"; tuned: {', '.join(tuned)}" if tuned else "") + f"): {label}: "
                f"{value_ci(e.value, e.lo, e.hi, unit)}, {replicates(e.n, e.unit)}")
        if rest:
            label2, e2 = rest[0]
            text += f"; next {label2}: {value_ci(e2.value, e2.lo, e2.hi, unit)}"
        said.append(text[0].upper() + text[1:])
    return said, effs


def plan(spec, effect: float, *, sd: float | None = None, df=None, source: str = "") -> list[str]:
    """`hmmscope sweep plan SPEC --effect DELTA`: how many seeds this grid sweep needs to decide an effect of +-DELTA
    (the objective's units) with 80% power: its 95% t interval over seeds on one side of 0 (`effects.seeds_needed`).
    The seed-to-seed SD comes from `sd` (one number for every contrast), else from `df`, the trials of a sweep of
    this design (`source` names it): each swept key's effect and adjacent steps there (`effects.factor_effects`,
    the margin the report uses), a slope's DELTA taken over the swept range."""
    unit = metric_units(spec.objective)
    cells = spec.n_trials // len(spec.seeds)
    out = [f"sweep {spec.name}: {cells} cell{'s' if cells != 1 else ''} x {len(spec.seeds)} seed"
           f"{'s' if len(spec.seeds) != 1 else ''} = {spec.n_trials} trials; each seed adds {cells}",
           f"to decide an effect of ±{effect:g} {unit} on {spec.objective} with 80% power (its 95% CI over seeds on one "
           "side of 0):".replace("  ", " ")]

    def need(n: int | None) -> str:
        return "more than 100000 seeds" if n is None else f"{n} seeds ({n * cells} trials)"

    if sd is not None:
        return [*out, f"  seed-to-seed SD {sd:g} {unit} (given): {need(seeds_needed(sd, effect))}"]
    opts = options(spec)
    keys = [p.key for p in spec.space if not is_tuned(spec, p.key, opts)]
    col = seed_column(spec)
    effs = factor_effects(df, keys, OBJ, col, metric=spec.objective, unit=unit, margin=effect)
    out.append(f"  seed-to-seed SDs from {source} ({df[col].astype(str).nunique()} seeds, {len(df)} trials):")
    for e in effs:
        for label, x in [(e.label, e), *e.steps]:
            if x.why or not x.sd > 0:
                out.append(f"  {e.key}: {label}: no SD over seeds ({x.why or x.claim.reason or 'one seed'})")
            else:
                out.append(f"  {e.key}: {label}: SD {x.sd:.3g} {x.unit}, effect ±{x.margin:.3g}: {need(x.seeds_needed)}")
    return out


def _x(values: list[Any]) -> tuple[list[float], list[str], bool]:
    """(x positions, tick labels, log scale?) of a parameter's levels: numbers on their own axis (log when they
    span more than a factor of 50 and are all > 0), anything else as categories."""
    nums = [_num(v) for v in values]
    if all(n is not None for n in nums):
        log = min(nums) > 0 and max(nums) / min(nums) > 50
        return [float(n) for n in nums], [f"{n:g}" for n in nums], log
    return [float(i) for i in range(len(values))], [str(v) for v in values], False


def figure(spec, df, path: Path) -> list[Path]:
    """`objective_figure` as PNG + PDF at `path`."""
    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
    return save_figure(objective_figure(spec, df), path)


def objective_figure(spec, df):
    """The objective against each swept parameter (module docstring), a matplotlib Figure."""
    from matplotlib.figure import Figure  # lazy: matplotlib (~0.3 s) off the sweep commands that draw nothing


    ref = oracle_reference(spec.objective)
    seed_col = seed_column(spec)
    line_col, lines = _lines(spec, df)
    xs = [p for p in spec.space if line_col is None or p.key != POS_ENC] or list(spec.space)
    fig = Figure(figsize=(max(5.2, 4.6 * len(xs)), 4.6), layout="constrained")
    axes = fig.subplots(1, max(len(xs), 1), squeeze=False)[0]
    for ax, p in zip(axes, xs):
        col = f"param:{p.key}"
        for i, ln in enumerate(lines):
            d = df if line_col is None else df[df[line_col].astype(str) == ln]
            color = f"C{i}"
            if p.grid is None:  # a continuous range: the trials themselves
                ax.plot([float(v) for v in d[col]], d[OBJ], ".", color=color, alpha=0.7, label=ln)
                continue
            levels = sorted(d[col].astype(str).unique(), key=_sort_key)
            pos, ticks, log = _x(levels)
            off = (i - (len(lines) - 1) / 2) * 0.02  # lines side by side: a small shift each
            width = (max(pos) - min(pos)) if len(pos) > 1 else 1.0
            px = [x * 10 ** off if log else x + off * width for x in pos]
            means, los, his = [], [], []
            for x, lv in zip(px, levels):
                e = level_mean(d[d[col].astype(str) == lv], seed_col)
                ax.plot([x] * len(e.units), [u[1] for u in e.units], ".", color=color, alpha=0.45)
                means.append(e.value)
                los.append(e.value - e.lo if math.isfinite(e.lo) else 0.0)
                his.append(e.hi - e.value if math.isfinite(e.hi) else 0.0)
            ax.errorbar(px, means, yerr=[los, his], fmt="o-", color=color, capsize=3, label=ln)
            if log:
                ax.set_xscale("log")
            ax.set_xticks(pos)
            ax.set_xticklabels(ticks)
            ax.minorticks_off()
        if ref is not None and isinstance(ref[0], float):
            ax.axhline(ref[0], color="gray", ls=":", lw=1.2, label=ref[1])
        elif ref is not None and ORACLE in df.columns and df[ORACLE].notna().any() and p.grid is not None:
            levels = sorted(df[col].astype(str).unique(), key=_sort_key)
            pos, _, _ = _x(levels)
            ax.plot(pos, [df[df[col].astype(str) == lv][ORACLE].astype(float).mean() for lv in levels], "x--",
                    color="gray", label=f"{ref[1]} (mean over the trials' episodes)")
        ax.set(xlabel=p.key, ylabel=f"{axis_label(spec.objective)}\n{better(spec.direction)}".strip())
        ax.tick_params(labelsize=10)
        ax.grid(alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if len(lines) > 1 or any(p.grid is None for p in xs) or ref is not None:  # below the panels: on no line
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=min(4, len(handles)),
                   fontsize=9, title=POS_ENC if line_col else None, title_fontsize=9, frameon=False)
    n_seeds = int(df[seed_col].astype(str).nunique()) if len(df) else 0
    fig.suptitle(wrap(f"sweep {spec.name}: {spec.objective} ({spec.direction}), {len(df)} trials\n{n_seeds} seed"
                      f"{'s' if n_seeds != 1 else ''} as dots; mean with 95% CI (t over seeds)",
                      fig.get_figwidth() - 0.3), fontsize=10)  # whole, whatever the sweep's name
    return fig


def pivot_rows(cols: dict[str, list]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the pivot table as text: each line's mean with its 95% CI and seeds, rope - absolute with
    its CI and df (or why it is missing), the oracle's mean: the pivot image's and the report's table."""
    def cell(m, lo, hi, extra=""):
        if m is None:
            return "-"
        ci = fmt_ci(lo if lo is not None else math.nan, hi if hi is not None else math.nan)
        return f"{fmt_num(m)} {ci if lo is not None else '(no CI)'}{extra}"

    lines = [c[:-len(" mean")] for c in cols if c.endswith(" mean") and c != "oracle mean"]
    head = ["factor = level", *(f"{ln}: mean [95% CI]" for ln in lines)]
    diff = "rope - absolute" in cols
    if diff:
        head.append("rope - absolute [95% CI]")
    if "oracle mean" in cols:
        head.append("oracle (mean)")
    body = []
    for i in range(len(cols["factor"])):
        row = [f"{cols['factor'][i]} = {cols['level'][i]}" if cols["factor"][i] != "all" else
               "all (pooled)" if cols["level"][i] == "all" else f"all (paired within {cols['level'][i]})"]
        row += [cell(cols[f"{ln} mean"][i], cols[f"{ln} ci_lo"][i], cols[f"{ln} ci_hi"][i],
                     f", {cols[f'{ln} seeds'][i]} seed{'s' if cols[f'{ln} seeds'][i] != 1 else ''}") for ln in lines]
        if diff:
            df_ = cols["diff df"][i]
            row.append(cell(cols["rope - absolute"][i], cols["diff ci_lo"][i], cols["diff ci_hi"][i],
                            f", df {fmt_num(df_)}" if df_ is not None else "") if cols["rope - absolute"][i] is not None
                       else str(cols["diff note"][i])[:60])
        if "oracle mean" in cols:
            row.append(fmt_num(cols["oracle mean"][i]))
        body.append(row)
    return head, body


def pivot_figure(spec, cols: dict[str, list], path: Path) -> list[Path]:
    """The pivot table drawn as a table (values with their 95% CIs, `pivot_rows`); PNG + PDF at `path`."""
    from matplotlib.figure import Figure  # lazy: matplotlib (~0.3 s) off the sweep commands that draw nothing


    head, body = pivot_rows(cols)
    chars = sum(max(len(r[j]) for r in [head, *body]) for j in range(len(head)))
    fig = Figure(figsize=(1.0 + 0.062 * chars, 0.9 + 0.3 * len(body)), layout="constrained")
    ax = fig.subplots()
    ax.axis("off")
    t = ax.table(cellText=body, colLabels=head, loc="center", cellLoc="left")
    t.auto_set_font_size(False)
    t.set_fontsize(8)
    t.auto_set_column_width(list(range(len(head))))
    unit = metric_units(spec.objective)
    ax.set_title(wrap(f"sweep {spec.name}: {spec.objective}{f' ({unit})' if unit else ''}, seeds as the unit"
                      + ("; rope - absolute < 0: RoPE lower" if "rope - absolute" in cols else ""),
                      fig.get_figwidth() - 0.3, 9), fontsize=9)  # whole, whatever the sweep's name
    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
    return save_figure(fig, path)


def log_comparison(run, spec, study, metrics_of=None) -> dict[str, list] | None:
    """Write the figure, the pivot image and the pivot table into `run` (the parent run, a `tracking.Run`) under
    comparison/; returns the pivot's columns, or None when the study has no complete trial yet (nothing logged).
    `metrics_of(run_id)`: a trial run's metrics, for the oracle's values (module docstring)."""
    df = trial_frame(spec, study, metrics_of)
    if df.empty:
        return None
    cols = pivot(spec, df)
    with tempfile.TemporaryDirectory() as tmp:
        for p in [*figure(spec, df, Path(tmp) / FIGURE), *pivot_figure(spec, cols, Path(tmp) / PIVOT_FIGURE)]:
            run.log_artifact(p, FOLDER)
    run.log_table(cols, f"{FOLDER}/{PIVOT_TABLE}")
    return cols
