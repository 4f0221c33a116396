"""Effects over seeds, with their verdicts, equivalence and power: one implementation for the report's first section,
the sweep parent run's comparison (`compare`) and the analysis records (analysis/inference_ablations.py's
effects.csv), so all of them print the same numbers.

A trial table here is one row per trial with `param:<key>` columns, a seed column and metric columns, as
`compare.trial_frame` and the report's reader build it. Seeds are the unit (stats.paired_effect, stats.t_mean).

Estimates.
- `contrast`: level b - level a of one key, paired within (seed, block) cells, blocks = levels of the other swept
  keys, t over seeds (`pos_enc_effect`: rope - absolute); `choose_blocks` picks the keys to pair within (one
  confounded with the contrast is left out, with the reason), `per_level_effects` the effect at each level of each
  blocking key.
- `slope`: the OLS slope of a metric on a numeric key within each (seed, block) cell, a seed's value the mean over
  its cells, t over seeds (one seed: the cells are the units). Keys whose levels span more than a factor of 50 (all
  > 0) are read on log2 (per doubling).
- `tost` (the TOST at +-margin of a t estimate: its 90% interval and both one-sided p-values, equal to statsmodels'
  ttost_paired / ttost_ind) and `seeds_needed` (stats module docstring).

Effects with verdicts (`effect`, an `Effect`): a stats.Claim (rule, 95% CI, df; a slope's adjacent steps, so a
slope the steps do not all follow reads "not monotone"), the margin (a slope's: the margin over the swept range,
margin / (x_max - x_min) per unit of x), its TOST, what the design excludes, and the seeds needed to decide an effect
of the margin with 80% power from the observed SD of the seed-level values. `effect_row` is effects.csv's row
(`COLUMNS`).

Every swept key (`factor_effects`): two levels -> their contrast; ordered numeric levels (three or more) -> the
adjacent contrasts and the slope (the slope first); categorical keys -> each level against a stated reference
(`[report] references`, else `REFERENCE` (model.pos_enc: absolute, so the sign is rope - absolute as everywhere),
else the base config's value, else the first level). The report's claims are two-sided ('!= 0': "the key changes
the metric"); a key a user tunes (`tuned`: train.* by default, or every key of a tpe / random sweep) gets no
effect, only its best setting, after the effects (`compare.answers`). Each is said in words (`sentences.sentence`).

The spec's [report] table (`options`, checked when the spec is parsed; not part of the sweep's identity, so it can
change without renaming): margin (in the objective's units; default stats.DEFAULT_MARGIN by unit), reference (a
sweep that holds this sweep's base cell: its matching trials join as one more level, `compare.with_reference`),
references (key -> its reference level), tuned (the keys that get a best setting, not an effect).

Imports `stats` and `config` only (pandas frames are handed in; scipy and statsmodels lazily); the report imports
the sweep package, so this lives here; its sentences are `sentences`'.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import ConfigError, parse_toml
from ..stats import (
    DEFAULT_MARGIN,
    Claim,
    Estimate,
    claim,
    decide_equivalence,
    paired_effect,
    parse_rule,
    rule,
    t_mean,
)

REFERENCE = {"model.pos_enc": "absolute"}  # a categorical key's reference level by default
COLUMNS = ("effect", "statistic", "value", "ci_lo", "ci_hi", "df", "n_seeds", "rule", "verdict", "reason", "unit",
           "steps", "margin", "tost_lo90", "tost_hi90", "tost_p", "equivalence", "excluded_beyond", "sd",
           "seeds_needed")
REPORT_KEYS = {"margin", "reference", "references", "tuned"}


# ---------------------------------------------------------------- estimates


def block_labels(d, cols: list[str]) -> list[tuple[str, ...]] | None:
    """Each trial's block: its levels of the blocking factors `cols` (None without blocks)."""
    return [tuple(str(v) for v in r) for r in d[cols].itertuples(index=False)] if cols else None


def contrast(d, y: str, treat, blocks: list[str], seed_col: str | None) -> Estimate | str:
    """Trials where `treat` (a boolean per row) minus the others on column `y`: paired within (seed, block) cells,
    t over seeds (stats.paired_effect); a string saying why when it cannot be estimated."""
    return paired_effect(d[y].astype(float).to_numpy(), np.asarray(treat, bool),
                         d[seed_col].astype(str).to_numpy() if seed_col else None, block_labels(d, blocks))


def pos_enc_effect(d, y: str, blocks: list[str], seed_col: str | None) -> Estimate | str:
    """rope - absolute on column `y` (`contrast`)."""
    return contrast(d, y, (d["param:model.pos_enc"] == "rope").to_numpy(), blocks, seed_col)


def choose_blocks(d, y: str, factors: list[str], seed_col: str | None, treat=None):
    """(blocks, {factor: fate}) for the contrast `treat` (default: rope vs the rest): confounded factors out; others
    in while the paired design keeps >= 2 units."""
    t = (d["param:model.pos_enc"] == "rope") if treat is None else np.asarray(treat, bool)
    t = np.asarray(t, bool)
    fate, blocks = {}, []
    if t.all() or not t.any():
        return blocks, fate
    for f in factors:
        lv = d[f].astype(str).to_numpy()
        if len(set(lv)) < 2:  # one level among the trials with this metric: nothing to block on
            continue
        if all(len(set(t[lv == v])) == 1 for v in set(lv)):
            fate[f] = ("left out: confounded with pos_enc (every level occurs with one encoding only)" if treat is None
                       else "left out: confounded with the contrast (every level occurs on one side only)")
            continue
        got = contrast(d, y, t, [*blocks, f], seed_col)
        if isinstance(got, Estimate) and got.n >= 2 and "paired" in got.method:
            blocks.append(f)
            fate[f] = "paired within (a block)"
        else:
            fate[f] = f"left out: no seed holds both {'encodings' if treat is None else 'sides'} within its levels"
    return blocks, fate


def per_level_effects(dm, m: str, blocks: list[str], seed_col: str | None) -> list[tuple[str, str, Estimate | str]]:
    """[(factor, level, rope - absolute there)] for each level of each blocking factor, the other blocks paired
    within (`pos_enc_effect`): the report's per-level rows, and the sweep parent run's pivot table (compare.py)."""
    out = []
    for f in blocks:
        for lv in sorted(dm[f].astype(str).unique(), key=level_order):
            sub = dm[dm[f].astype(str) == lv]
            out.append((f, lv, pos_enc_effect(sub, m, [b for b in blocks if b != f], seed_col)))
    return out


def level_order(v: str) -> tuple[int, float, str]:
    """Sort key of a factor's levels (as strings): numbers by value first, then the rest by name."""
    try:
        return (0, float(v), v)
    except ValueError:
        return (1, 0.0, v)


def slope(x, y, seeds=None, blocks=None) -> Estimate | str:
    """The OLS slope of y on x within each (seed, block) cell with >= 2 distinct x; a seed's value is the mean of
    its cells' slopes; t over seeds (one seed: the cells are the units). A string saying why when fewer than one
    cell has two levels."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    s = list(seeds) if seeds is not None else [0] * n
    b = list(blocks) if blocks is not None else [()] * n
    cells: dict = {}
    for xi, yi, si, bi in zip(x, y, s, b):
        if math.isfinite(xi) and math.isfinite(yi):
            cells.setdefault((si, bi), []).append((xi, yi))
    fits = {k: float(np.polyfit(*np.array(v).T, 1)[0]) for k, v in cells.items() if len({p[0] for p in v}) >= 2}
    if not fits:
        return "no seed holds two or more levels: no slope"
    units = sorted({k[0] for k in fits}, key=str)
    if len(units) >= 2:
        return t_mean([np.mean([v for k, v in fits.items() if k[0] == u]) for u in units], units, unit="seed")
    keys = sorted(fits, key=str)
    return t_mean([fits[k] for k in keys], [k[1] for k in keys], unit="block (one seed)")


@dataclass(frozen=True)
class Equivalence:
    """A TOST of |effect| < margin on a t estimate (stats module docstring, equivalence)."""

    margin: float
    lo90: float  # the 90% t interval: inside (-margin, margin) exactly when both one-sided tests reject at 5%
    hi90: float
    p_lower: float  # H0: effect <= -margin (one-sided t)
    p_upper: float  # H0: effect >= +margin
    verdict: str  # stats.decide_equivalence
    excluded_beyond: float  # max(|lo90|, |hi90|): effects beyond +-this are excluded, each side at 95%

    @property
    def p(self) -> float:
        """The TOST p-value: the larger of the two one-sided p-values."""
        return max(self.p_lower, self.p_upper)


def tost(est: Estimate, margin: float) -> Equivalence | None:
    """The TOST at +-margin of a t estimate (t_mean, paired_effect, the Welch t: its value, se and df); None
    without a t interval (one unit). Without a margin (NaN) only what the design excludes (the 90% interval), no p
    and no verdict. Equals statsmodels' ttost_paired / ttost_ind."""
    from scipy import stats as st  # lazy: scipy.stats (~0.5 s) off every sweep command that tests no equivalence

    if not (math.isfinite(est.df) and est.df >= 1):
        return None
    m, se, df = est.value, est.se, est.df
    if not se > 0:  # every unit the same: nothing measures the noise
        return Equivalence(margin, m, m, math.nan, math.nan,
                           decide_equivalence(margin, m, m, df=df, degenerate=est.degenerate or "no spread"), math.nan)
    q = float(st.t.ppf(0.95, df))
    lo, hi = m - q * se, m + q * se
    if not margin > 0:
        return Equivalence(math.nan, lo, hi, math.nan, math.nan, "", max(abs(lo), abs(hi)))
    return Equivalence(margin, lo, hi, float(st.t.sf((m + margin) / se, df)), float(st.t.cdf((m - margin) / se, df)),
                       decide_equivalence(margin, lo, hi, df=df, degenerate=est.degenerate), max(abs(lo), abs(hi)))


def seeds_needed(sd: float, effect: float, *, power: float = 0.8, level: float = 0.95,
                 most: int = 100_000) -> int | None:
    """The fewest seeds (units) whose t interval at `level` lies on the effect's side of 0 with probability >=
    `power` when the true effect is `effect` and the unit-level SD is `sd`: the rule's own test, one-sided at
    (1 - level) / 2 (statsmodels' TTestPower). None for sd or effect not > 0, or more than `most` seeds."""
    from statsmodels.stats.power import TTestPower  # lazy: statsmodels (~1 s) off every command but a power plan

    sd, effect = float(sd), abs(float(effect))
    if not (sd > 0 and effect > 0 and math.isfinite(sd)):
        return None
    for lo, hi in ((2, 256), (257, most)):
        n = np.arange(lo, hi + 1)
        ok = np.flatnonzero(TTestPower().power(effect / sd, n, (1 - level) / 2, alternative="larger") >= power)
        if len(ok):
            return int(n[ok[0]])
    return None


# ---------------------------------------------------------------- effects with verdicts


@dataclass(frozen=True)
class Effect:
    """An effect and everything said about it (module docstring)."""

    claim: Claim
    unit: str  # of the value (nats/token, nats/token per unit of hmm.gamma, ...)
    n: int = 0  # units the CI stands on
    unit_of_replication: str = "seed"
    margin: float = math.nan
    equivalence: Equivalence | None = None
    sd: float = math.nan  # SD of the unit-level values
    seeds_needed: int | None = None  # to decide an effect of the margin with 80% power
    label: str = ""  # the contrast in short: '0.9 - 0.5', 'slope', 'rope - absolute'
    steps: tuple = ()  # a slope's adjacent contrasts: ((label, Effect), ...)
    why: str = ""  # why nothing was estimated ('' when something was)
    key: str = ""  # the swept key, the metric and how to say it (`sentence`)
    metric: str = ""
    ordered: bool = False  # numeric levels: "grows / falls with"
    direction: str = ""  # the objective's (minimize / maximize): a categorical level "better / worse"

    @property
    def verdict(self) -> str:
        return self.claim.verdict

    def power_text(self) -> str:
        """What an inconclusive effect's design excludes and how many seeds it would need ('' otherwise)."""
        e, parts = self.equivalence, []
        if self.verdict != "inconclusive":
            return ""
        if e is not None and math.isfinite(e.excluded_beyond):
            parts.append(f"effects beyond ±{e.excluded_beyond:.2g}{' ' + self.unit if self.unit else ''} are "
                         "excluded (TOST, each side at 95%)")
        if self.seeds_needed is not None and math.isfinite(self.margin):
            parts.append(f"{self.seeds_needed} seeds would detect ±{self.margin:.2g} with 80% power (SD of the seed "
                         f"values {self.sd:.2g})")
        return "; ".join(parts)


def effect(name: str, est: Estimate | str, rule_: str, statistic: str, *, unit: str, margin: float = math.nan,
           steps: tuple = (), label: str = "") -> Effect:
    """An Effect from an estimate (or the reason there is none): its claim by stats.claim (the verdict; `steps`:
    ((label, Effect), ...), a slope's adjacent contrasts), its TOST at `margin` and the seeds needed (module
    docstring)."""
    if isinstance(est, str):
        c = Claim(name, statistic, math.nan, math.nan, math.nan, "no power", est, rule_)
        return Effect(c, unit, margin=margin, label=label, steps=steps, why=est)
    values = tuple(s[1].claim.value for s in steps)
    c = claim(name, statistic, est.value, est.lo, est.hi, rule_, "", df=est.df, degenerate=est.degenerate,
              steps=values if len(values) >= 2 else ())
    paired = est.unit in ("seed", "block (one seed)") and math.isfinite(est.se)
    sd = est.se * math.sqrt(est.n) if paired and est.n >= 2 else math.nan
    need = seeds_needed(sd, margin) if paired and math.isfinite(margin) and est.unit == "seed" else None
    return Effect(c, unit, est.n, est.unit, margin, tost(est, margin), sd, need, label, steps)


def effect_row(e: Effect) -> dict[str, Any]:
    """effects.csv's row of an effect (`COLUMNS`)."""
    c, q = e.claim, e.equivalence
    return {"effect": c.name, "statistic": c.statistic, "value": c.value, "ci_lo": c.ci_lo, "ci_hi": c.ci_hi,
            "df": c.df, "n_seeds": e.n, "rule": c.rule, "verdict": c.verdict, "reason": c.reason, "unit": e.unit,
            "steps": "; ".join(f"{lab} {s.claim.value:+.4g} [{s.claim.ci_lo:+.4g}, {s.claim.ci_hi:+.4g}]"
                               for lab, s in e.steps),
            "margin": e.margin, "tost_lo90": q.lo90 if q else math.nan, "tost_hi90": q.hi90 if q else math.nan,
            "tost_p": q.p if q else math.nan, "equivalence": q.verdict if q else "",
            "excluded_beyond": q.excluded_beyond if q else math.nan, "sd": e.sd,
            "seeds_needed": e.seeds_needed if e.seeds_needed is not None else ""}


# ---------------------------------------------------------------- every swept key


@dataclass(frozen=True)
class Options:
    """The spec's [report] table (module docstring)."""

    margin: float | None = None  # None: the default for the objective's unit
    reference: str = ""
    references: dict = field(default_factory=dict)
    tuned: tuple | None = None  # None: train.* keys (every key of a tpe / random sweep)

    def margin_for(self, unit: str) -> float:
        return self.margin if self.margin is not None else DEFAULT_MARGIN.get(unit, math.nan)


def check_options(path: str, table: Any, swept: list[str]) -> Options:
    """The [report] table of a spec, checked: ConfigError '<file>: report.<key>: <why>' on the first problem."""
    def err(k: str, msg: str) -> ConfigError:
        return ConfigError(f"{path}: report.{k}: {msg}")

    if not isinstance(table, dict):
        raise err("", "must be a table")
    for k in table:
        if k not in REPORT_KEYS:
            raise err(k, f"unknown key (known: {', '.join(sorted(REPORT_KEYS))})")
    m = table.get("margin")
    if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 < m < math.inf):
        raise err("margin", f"must be a number > 0 (in the objective's units), got {m!r}")
    ref = table.get("reference", "")
    if not isinstance(ref, str):
        raise err("reference", f"must be a sweep name, got {ref!r}")
    refs = table.get("references", {})
    if not isinstance(refs, dict) or any(k not in swept for k in refs):
        bad = next((k for k in refs if k not in swept), None) if isinstance(refs, dict) else None
        raise err("references", f"{bad!r} is not a key of [space]" if bad else "must be a table key -> level")
    tuned = table.get("tuned")
    if tuned is not None and (not isinstance(tuned, list) or any(k not in swept for k in tuned)):
        raise err("tuned", f"must be a list of [space] keys, got {tuned!r}")
    return Options(None if m is None else float(m), ref, {k: str(v) for k, v in refs.items()},
                   None if tuned is None else tuple(tuned))


def options(spec) -> Options:
    """The [report] table of a parsed spec (its text); defaults for a spec without one."""
    data = parse_toml(spec.text, spec.path) if getattr(spec, "text", "") else {}
    return check_options(spec.path, data.get("report", {}), [p.key for p in spec.space])


def is_tuned(spec, key: str, opts: Options) -> bool:
    """A key a user tunes (its best setting is the answer), not a factor whose effect is asked."""
    if opts.tuned is not None:
        return key in opts.tuned
    return spec.sampler != "grid" or key.startswith("train.")


def _numbers(levels: list[str]) -> list[float] | None:
    try:
        return [float(v) for v in levels] if not any(v in ("True", "False") for v in levels) else None
    except ValueError:
        return None


def reference_level(key: str, levels: list[str], opts: Options, base: Any = None) -> str:
    """The level a categorical key's contrasts are taken against (module docstring)."""
    for cand in (opts.references.get(key), REFERENCE.get(key), None if base is None else str(base)):
        if cand is not None and cand in levels:
            return cand
    return levels[0]


def factor_effects(df, keys: list[str], y: str, seed_col: str | None, *, metric: str, unit: str,
                   margin: float = math.nan, references: dict | None = None, direction: str = "",
                   base: dict | None = None) -> list[Effect]:
    """The effect of every key in `keys` (columns `param:<key>` of `df`) on column `y`, over seeds (module
    docstring): one headline Effect per key with 2+ levels (a slope carries its steps; a categorical key with more
    than two levels, one Effect per level against the reference, the first standing for the key). `base`: the base
    config's values by key (a categorical key's reference when none is stated)."""
    out = []
    for key in keys:
        col = f"param:{key}"
        if col not in df.columns:
            continue
        d = df[df[y].notna()]
        levels = sorted(d[col].astype(str).unique(), key=level_order)
        if len(levels) < 2:
            continue
        others = [f"param:{k}" for k in keys if k != key and f"param:{k}" in d.columns]
        nums = _numbers(levels)
        if nums is not None and len(levels) >= 3:
            out.append(_slope_effect(d, key, levels, nums, others, y, seed_col, metric, unit, margin))
            continue
        if nums is not None:
            pairs = [(levels[1], levels[0])]
        else:
            ref = reference_level(key, levels, Options(references=dict(references or {})), (base or {}).get(key))
            pairs = [(lv, ref) for lv in levels if lv != ref]
        for b, a in pairs:
            out.append(_contrast_effect(d, key, b, a, others, y, seed_col, metric, unit, margin, direction,
                                        ordered=nums is not None))
    return out


def _contrast_effect(d, key, b, a, others, y, seed_col, metric, unit, margin, direction, ordered) -> Effect:
    sub = d[d[f"param:{key}"].astype(str).isin([a, b])]
    treat = (sub[f"param:{key}"].astype(str) == b).to_numpy()
    blocks, _ = choose_blocks(sub, y, others, seed_col, treat)
    est = contrast(sub, y, treat, blocks, seed_col)
    e = effect(f"{key}: {b} - {a} on {metric}", est, rule("!=", 0), _method(est, blocks), unit=unit, margin=margin,
               label=f"{b} - {a}")
    return dataclasses.replace(e, key=key, metric=metric, direction=direction, ordered=ordered)


def _slope_effect(d, key, levels, nums, others, y, seed_col, metric, unit, margin) -> Effect:
    col = f"param:{key}"
    first = d[d[col].astype(str).isin([levels[0], levels[-1]])]
    blocks, _ = choose_blocks(first, y, others, seed_col, (first[col].astype(str) == levels[-1]).to_numpy())
    log = min(nums) > 0 and max(nums) / min(nums) > 50
    e = ordered_effect(f"{key}: slope on {metric}", d[col].astype(float).to_numpy(), d[y].astype(float).to_numpy(),
                       d[seed_col].astype(str).to_numpy() if seed_col else None, block_labels(d, blocks), rule("!=", 0),
                       "OLS slope within each (seed, block), t over seeds"
                       + (f"; blocks {', '.join(b[6:] for b in blocks)}" if blocks else ""), unit=unit, margin=margin,
                       per=f"{'doubling' if log else 'unit'} of {key}", log=log)
    return dataclasses.replace(e, key=key, metric=metric, ordered=True)


def ordered_effect(name: str, x, y, seeds, blocks, rule_: str, statistic: str, *, unit: str, margin: float = math.nan,
                   per: str = "unit of x", log: bool = False) -> Effect:
    """The slope of y on x over ordered levels (`slope`: within each (seed, block), t over seeds; on log2 x with
    `log`) with its adjacent steps (level b - level a for neighbouring levels, paired within (seed, block), each
    decided by the slope's rule taken at 0), so that a slope the steps do not all follow reads "not monotone"; its
    margin is `margin` over the swept range (the unit: `unit` per `per`)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    s = np.asarray(seeds, object) if seeds is not None else None
    b = np.empty(len(x), object)
    b[:] = list(blocks) if blocks is not None else [()] * len(x)
    levels = sorted(set(x[np.isfinite(x)]))
    op = parse_rule(rule_)[0]
    steps = []
    for lo, hi in zip(levels, levels[1:]):
        sel = (x == lo) | (x == hi)
        est = paired_effect(y[sel], x[sel] == hi, None if s is None else s[sel], list(b[sel]))
        steps.append((f"{hi:g} - {lo:g}", effect(f"{name}: step {hi:g} - {lo:g}", est, rule(op, 0),
                                                 "paired within (seed, block), t over seeds", unit=unit,
                                                 margin=margin, label=f"{hi:g} - {lo:g}")))
    xs = np.log2(x) if log else x
    span = float(np.nanmax(xs) - np.nanmin(xs)) if len(levels) >= 2 else math.nan
    est = slope(xs, y, s, list(b))
    return effect(name, est, rule_, statistic, unit=f"{unit} per {per}".strip(),
                  margin=margin / span if span > 0 else math.nan, steps=tuple(steps), label="slope")


def _method(est, blocks) -> str:
    if isinstance(est, str):
        return "not estimated"
    return est.method + (f"; blocks {', '.join(b[6:] for b in blocks)}" if blocks else "")
