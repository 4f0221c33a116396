"""Claims and the one place their verdicts are decided (SCIENCE.md 6); equivalence and families of claims;
JSON-safe conversion.

Every claim hmmscope checks is a `Claim`: a named statistic, its value, a 95% confidence interval
[ci_lo, ci_hi], a `rule`, the degrees of freedom of the interval (`df`: NaN when it is not a t
interval, e.g. a bootstrap percentile interval; inf for a normal one), a `degenerate` reason (empty
when the statistic can vary), and a verdict that is `decide(rule, ci_lo, ci_hi, df=..., degenerate=...)`:
a function of the row alone. Build claims with `claim(...)`, which computes the verdict; nothing else
assigns one.

Verdicts (VERDICTS):
- supported: the CI lies on the claimed side of the threshold;
- not supported: the CI lies on the other side;
- inconclusive: the CI straddles the threshold or is not finite, or it lies on the claimed side while a
  required claim is not supported (a failed prerequisite can only stop "supported": a CI wholly on the
  other side reads "not supported" whatever the prerequisites say, SCIENCE.md 9);
- no power: the check cannot fail whatever the data (rule "no power"; the reason says why, e.g. a
  bound that exceeds 1 at every measured point, or an exponent bound that any rate ignoring the
  regressor would pass), or the interval is not an interval (`no_power_reason`): the statistic is
  degenerate (it cannot vary by construction, or it took one value in every resample or replicate:
  a zero-width CI such as [1, 1] from 12 identical integers), or the interval has no degrees of
  freedom left (df < 1). Such a check is never "supported".

Rules are short strings, so they travel unchanged through MLflow tags, CSV and JSON:

    "> t"   supported if ci_lo >  t, not supported if ci_hi <= t
    ">= t"  supported if ci_lo >= t, not supported if ci_hi <  t
    "< t"   supported if ci_hi <  t, not supported if ci_lo >= t
    "<= t"  supported if ci_hi <= t, not supported if ci_lo >  t
    "!= t"  supported if the CI lies on either side of t (lo > t or hi < t), else inconclusive: a two-sided
            claim ("the factor changes the metric") cannot be "not supported" by a CI; what a CI around t
            excludes is the equivalence verdict's to say (below)
    "no power"

A rule may end in "; requires A, B": then the verdict cannot be "supported" unless the claims named A and
B are "supported" (e.g. "the state is decodable before the task" needs both to be decodable at all): it is
"inconclusive" where the CI alone would support it, and "not supported" where the CI is on the other side;
`decide` takes the verdicts of the other claims for this. `check_claims` recomputes every verdict
from its row and returns the rows that disagree (the tests enumerate every claim kind with it).

Slopes over three or more levels (a fifth word, "not monotone"). A slope claim carries its adjacent steps (the
difference between neighbouring levels, `Claim.steps`); it is "supported" only when the CI supports it AND every
step lies on its side of 0. Otherwise, where the CI alone would support it, the verdict is "not monotone" and the
reason shows the steps: a U-shaped relation never reads as a trend.

Equivalence (a field beside the verdict; the four verdicts keep their meaning). A claim's rule may come with a
margin delta in the metric's units. Its TOST (two one-sided t tests at 5%: effect <= -delta, effect >= +delta;
`sweep.effects.tost`, equal to statsmodels' ttost_paired / ttost_ind) reads "equivalent within ±delta" when the
90% t interval lies inside (-delta, delta), else "not shown equivalent" (`decide_equivalence`). The 90% interval's
farther end is what the design excludes: effects beyond it are rejected, each side at 95% ("excluded beyond").
Default margin for paired CE effects (`DEFAULT_MARGIN`): 0.01 nats/token, because (1) exp(0.01) = 1.010, a 1%
change of the per-token likelihood ratio (perplexity), below the size any claim of the paper rests on; (2) it is
twice the tolerance within which the family-Bayes reference counts as converged (measure.headroom.TOLERANCE,
0.005 nats/token, SCIENCE.md 9): a CE difference below it is within the precision of the references effects are
read against; (3) it is a few percent of the differences the ablations are about (the room above counting and
model - best counting, tenths of a nat per token in the inference record). Other units have no default; a spec
states its own ([report] margin). Seeds needed (`sweep.effects.seeds_needed`): the fewest seeds whose 95% t
interval lands on the effect's side of 0 with 80% power for a true effect of delta, from the observed SD of the
seed-level values (statsmodels' TTestPower; tests/test_sweep_effects.py checks it by simulation).

Families of claims (`holm_verdicts`): where a report decides many claims, one line says how many are supported,
how many the rule's own error rate (2.5% each: one side of a 95% CI; 5% for '!=') would give with no real effect,
and the Holm-adjusted verdicts, shown beside the per-claim ones, never instead of them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

VERDICTS = ("supported", "not supported", "inconclusive", "no power")
NO_POWER, NOT_MONOTONE = "no power", "not monotone"
ALL_VERDICTS = (*VERDICTS, NOT_MONOTONE)  # a slope's fifth word (decide's `steps`)
NOT_EQUIVALENT = "not shown equivalent"  # the equivalence verdict's other word (decide_equivalence)
DEFAULT_MARGIN = {"nats/token": 0.01}  # equivalence margins by unit (module docstring: why 0.01 nats/token)
_OPS = (">=", "<=", ">", "<", "!=")
_RULE = re.compile(r"^\s*(>=|<=|>|<|!=)\s*([-+0-9.eEinfa]+)\s*$")


@dataclass(frozen=True)
class Claim:
    name: str
    statistic: str
    value: float
    ci_lo: float
    ci_hi: float
    verdict: str  # one of VERDICTS: decide(rule, ci_lo, ci_hi, df=df, degenerate=degenerate) for claims built with `claim`
    reason: str
    rule: str = ""  # see the module docstring; "" for claims that predate rules
    df: float = math.nan  # degrees of freedom of the CI (NaN: not a t interval; inf: normal)
    degenerate: str = ""  # why the statistic cannot vary ("" when it can): the verdict is then "no power"
    steps: tuple = ()  # a slope's adjacent differences (decide's `steps`: "not monotone" unless all on its side)


def rule(op: str, threshold: float = 0.0, requires: Iterable[str] = ()) -> str:
    """The rule string for 'statistic <op> threshold' (op in >, >=, <, <=), optionally gated on other claims."""
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    s = f"{op} {float(threshold):.6g}"
    req = [r for r in requires]
    return s + (f"; requires {', '.join(req)}" if req else "")


def parse_rule(s: str) -> tuple[str, float, tuple[str, ...]]:
    """(op, threshold, requires) of a rule string; op is 'no power' for that rule (threshold NaN)."""
    head, _, req = str(s).partition(";")
    requires = ()
    if req.strip():
        if not req.strip().startswith("requires "):
            raise ValueError(f"bad rule {s!r}: expected '; requires A, B'")
        requires = tuple(x.strip() for x in req.strip()[len("requires "):].split(",") if x.strip())
    if head.strip() == NO_POWER:
        return NO_POWER, math.nan, requires
    m = _RULE.match(head)
    if not m:
        raise ValueError(f"bad rule {s!r}: expected e.g. '> 0', '<= 4' or 'no power'")
    return m.group(1), float(m.group(2)), requires


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def no_power_reason(lo: float, hi: float, df: float | None = None, degenerate: str = "") -> str:
    """Why an interval cannot carry a verdict ('' when it can): a degenerate statistic (the reason given),
    a zero-width finite CI (the statistic took one value in every resample or replicate), or df < 1."""
    if degenerate:
        return degenerate
    lo, hi, df = _num(lo), _num(hi), _num(df)
    if math.isfinite(lo) and math.isfinite(hi) and hi - lo <= 1e-12 * max(1.0, abs(lo), abs(hi)):
        return (f"zero-width 95% CI [{lo:.4g}, {hi:.4g}]: the statistic took one value in every resample or "
                "replicate, so nothing measures its uncertainty")
    if math.isfinite(df) and df < 1:
        return f"{df:g} degrees of freedom: nothing measures the noise (one replicate)"
    return ""


def decide(rule_: str, lo: float, hi: float, verdicts: Mapping[str, str] | None = None, *,
           df: float | None = None, degenerate: str = "", steps: Iterable[float] = ()) -> str:
    """The verdict of a claim with this rule and 95% CI [lo, hi] (module docstring); `steps`: a slope's adjacent
    differences (three or more levels), which must all lie on its side of 0 for "supported" (else "not monotone")."""
    op, t, requires = parse_rule(rule_)
    if op == NO_POWER or no_power_reason(lo, hi, df, degenerate):
        return NO_POWER
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if op == "!=":
        v = "supported" if lo > t or hi < t else "inconclusive"
        op = ">" if lo > t else "<"  # the side the CI found, for the steps
    elif op == ">":
        v = "supported" if lo > t else "not supported" if hi <= t else "inconclusive"
    elif op == ">=":
        v = "supported" if lo >= t else "not supported" if hi < t else "inconclusive"
    elif op == "<":
        v = "supported" if hi < t else "not supported" if lo >= t else "inconclusive"
    else:  # "<="
        v = "supported" if hi <= t else "not supported" if lo > t else "inconclusive"
    if v == "supported" and requires and any((verdicts or {}).get(r) != "supported" for r in requires):
        return "inconclusive"  # a failed prerequisite only stops "supported"
    side = 1 if op in (">", ">=") else -1
    if v == "supported" and any(not side * float(d) > 0 for d in steps):
        return NOT_MONOTONE  # a slope the adjacent steps do not all follow
    return v


def side_verdict(lo: float, hi: float, side: int, *, df: float | None = None, degenerate: str = "") -> str:
    """Claim: the quantity lies on `side` of 0 (+1 above, -1 below: stats.decide with '> 0' / '< 0');
    side 0: two-sided 'differs from 0' (supported if decide finds the CI on either side, no power if decide
    says so, else inconclusive)."""
    if side == 0:
        v = [decide(rule(op, 0), lo, hi, df=df, degenerate=degenerate) for op in (">", "<")]
        return "no power" if "no power" in v else "supported" if "supported" in v else "inconclusive"
    return decide(rule(">" if side > 0 else "<", 0), lo, hi, df=df, degenerate=degenerate)


def claim(name: str, statistic: str, value: float, lo: float, hi: float, rule_: str, reason: str,
          verdicts: Mapping[str, str] | None = None, *, df: float | None = None, degenerate: str = "",
          steps: Iterable[float] = ()) -> Claim:
    """A Claim whose verdict is decide(rule_, lo, hi, verdicts, df=df, degenerate=..., steps=...); a requirement
    that fails, the steps of a slope that is not monotone, or the reason the interval carries no verdict
    (`no_power_reason`), is named in the reason."""
    why = no_power_reason(lo, hi, df, degenerate) if parse_rule(rule_)[0] != NO_POWER else ""
    steps = tuple(float(d) for d in steps)
    v = decide(rule_, lo, hi, verdicts, df=df, degenerate=why, steps=steps)
    if v == NOT_MONOTONE:
        reason = f"{reason}; not monotone: adjacent steps {', '.join(f'{d:+.3g}' for d in steps)} differ in sign"
    _, _, requires = parse_rule(rule_)
    missing = [r for r in requires if (verdicts or {}).get(r) != "supported"]
    if missing and v == "inconclusive":
        reason = f"{reason}; inconclusive because not supported: {', '.join(missing)}"
    if why:
        reason = f"{reason}; no power: {why}" if reason else f"no power: {why}"
    return Claim(name, statistic, float(value), float(lo), float(hi), v, reason.lstrip("; "), rule_,
                 _num(df) if df is not None else math.nan, why, steps)


def check_claims(claims: Iterable[Claim], verdicts: Mapping[str, str] | None = None) -> list[str]:
    """Rows whose verdict is not decide(rule, ci_lo, ci_hi, df, degenerate) (requirements looked up among
    `claims` and `verdicts`), or that carry no rule / an unknown verdict: one line each; [] when all agree."""
    claims = list(claims)
    known = {**(verdicts or {}), **{c.name: c.verdict for c in claims}}
    bad = []
    for c in claims:
        if c.verdict not in ALL_VERDICTS:
            bad.append(f"{c.name}: unknown verdict {c.verdict!r}")
        elif not c.rule:
            bad.append(f"{c.name}: no rule")
        elif (want := decide(c.rule, c.ci_lo, c.ci_hi, known, df=c.df, degenerate=c.degenerate,
                             steps=c.steps)) != c.verdict:
            bad.append(f"{c.name}: verdict {c.verdict!r} but rule {c.rule!r} on [{c.ci_lo:.4g}, {c.ci_hi:.4g}] "
                       f"gives {want!r}")
    return bad


def holm(p) -> np.ndarray:
    """Holm-adjusted p-values (step-down, monotone, capped at 1)."""
    p = np.asarray(p, float)
    m = len(p)
    order = np.argsort(p)
    adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return out


# ---------------------------------------------------------------- equivalence, power, families of claims


def decide_equivalence(margin: float, lo90: float, hi90: float, *, df: float | None = None,
                       degenerate: str = "") -> str:
    """The equivalence verdict (a field beside decide's): 'equivalent within ±margin' when the 90% CI lies inside
    (-margin, margin), else 'not shown equivalent' (also when nothing measures the noise); '' without a margin."""
    if not (_num(margin) > 0):
        return ""
    if no_power_reason(lo90, hi90, df, degenerate) or not (math.isfinite(lo90) and math.isfinite(hi90)):
        return NOT_EQUIVALENT
    return f"equivalent within ±{margin:g}" if -margin < lo90 and hi90 < margin else NOT_EQUIVALENT


def one_sided_p(c: Claim) -> tuple[float, float]:
    """(p on the claimed side, p on the other side) of a claim's 95% CI read as a t interval on its df (normal
    when df is not finite, e.g. a bootstrap interval: its half-width as 1.96 SE); for a '!= t' rule the claimed
    side is the side of the value. NaN, NaN without a rule or a finite CI."""
    from scipy import stats as st  # lazy: scipy.stats (~0.3 s) off every process that imports stats (training, sweep workers)

    try:
        op, t, _ = parse_rule(c.rule)
    except ValueError:
        return math.nan, math.nan
    if op == NO_POWER or not (math.isfinite(c.ci_lo) and math.isfinite(c.ci_hi)) or c.ci_hi <= c.ci_lo:
        return math.nan, math.nan
    dist = st.t(c.df) if math.isfinite(c.df) and c.df >= 1 else st.norm()
    up = float(dist.sf((c.value - t) / ((c.ci_hi - c.ci_lo) / (2 * float(dist.ppf(0.975))))))  # p of "above t"
    if op == "!=":
        return min(up, 1 - up), max(up, 1 - up)
    return (up, 1 - up) if op in (">", ">=") else (1 - up, up)


def holm_verdicts(claims: Iterable[Claim], alpha: float = 0.05) -> tuple[list[str], str]:
    """Holm-adjusted verdicts beside the claims' own (never instead of them), and the family's line (module
    docstring). Each claim's two-sided p (twice the smaller one-sided p of its CI, `one_sided_p`) is adjusted by
    Holm over the claims that have one (statsmodels' multipletests); a claim keeps its own verdict where its
    adjusted p < alpha, else a decided verdict reads 'inconclusive'; 'no power' and claims without a rule stay."""
    from statsmodels.stats.multitest import multipletests  # lazy: statsmodels (~1 s, with pandas) only for a family's Holm line

    claims = list(claims)
    ps = [one_sided_p(c) for c in claims]
    idx = [i for i, (a, _) in enumerate(ps) if math.isfinite(a) and claims[i].verdict != NO_POWER]
    out = [c.verdict for c in claims]
    if idx:
        adj = multipletests([min(1.0, 2 * min(ps[i])) for i in idx], alpha, method="holm")[1]
        for i, p in zip(idx, adj):
            if p >= alpha and out[i] in ("supported", "not supported", NOT_MONOTONE):
                out[i] = "inconclusive"
    # what the rule alone gives when no effect is real: 2.5% each (one side of the 95% CI), 5% for '!=' rules
    chance = sum(0.05 if parse_rule(claims[i].rule)[0] == "!=" else 0.025 for i in idx)
    line = (f"{sum(c.verdict == 'supported' for c in claims)} of {len(claims)} claims supported; with no real effect "
            f"the rule (a 95% CI on the claimed side) would call about {chance:.2g} of the {len(idx)} tested supported "
            f"by chance; Holm-adjusted (family-wise {alpha:.0%}): {sum(v == 'supported' for v in out)} supported, "
            f"{sum(v == 'not supported' for v in out)} not supported"
            + (f", {sum(v == NOT_MONOTONE for v in out)} not monotone" if NOT_MONOTONE in out else ""))
    return out, line


def jsonable(x: Any) -> Any:
    """Recursively: dataclasses/dicts/lists -> plain Python, numpy -> Python, NaN/inf -> None."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x
