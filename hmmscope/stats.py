"""Claims and the one place their verdicts are decided (SCIENCE.md 6); JSON-safe conversion.

Every claim hmmscope checks is a `Claim`: a named statistic, its value, a 95% confidence interval
[ci_lo, ci_hi], a `rule`, and a verdict that is `decide(rule, ci_lo, ci_hi)`: a function of the row
alone. Build claims with `claim(...)`, which computes the verdict; nothing else assigns one.

Verdicts (VERDICTS):
- supported: the CI lies on the claimed side of the threshold;
- not supported: the CI lies on the other side;
- inconclusive: the CI straddles the threshold or is not finite, or a required claim is not supported;
- no power: the check cannot fail whatever the data (rule "no power"; the reason says why, e.g. a
  bound that exceeds 1 at every measured point). Such a check is never "supported".

Rules are short strings, so they travel unchanged through MLflow tags, CSV and JSON:

    "> t"   supported if ci_lo >  t, not supported if ci_hi <= t
    ">= t"  supported if ci_lo >= t, not supported if ci_hi <  t
    "< t"   supported if ci_hi <  t, not supported if ci_lo >= t
    "<= t"  supported if ci_hi <= t, not supported if ci_lo >  t
    "no power"

A rule may end in "; requires A, B": then the verdict is "inconclusive" unless the claims named A and
B are "supported" (e.g. "the state is decodable before the task" needs both to be decodable at all);
`decide` takes the verdicts of the other claims for this. `check_claims` recomputes every verdict
from its row and returns the rows that disagree (the tests enumerate every claim kind with it).
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
NO_POWER = "no power"
_OPS = (">=", "<=", ">", "<")
_RULE = re.compile(r"^\s*(>=|<=|>|<)\s*([-+0-9.eEinfa]+)\s*$")


@dataclass(frozen=True)
class Claim:
    name: str
    statistic: str
    value: float
    ci_lo: float
    ci_hi: float
    verdict: str  # one of VERDICTS: decide(rule, ci_lo, ci_hi) for claims built with `claim`
    reason: str
    rule: str = ""  # see the module docstring; "" for claims that predate rules


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


def decide(rule_: str, lo: float, hi: float, verdicts: Mapping[str, str] | None = None) -> str:
    """The verdict of a claim with this rule and 95% CI [lo, hi] (module docstring)."""
    op, t, requires = parse_rule(rule_)
    if op == NO_POWER:
        return NO_POWER
    if requires and any((verdicts or {}).get(r) != "supported" for r in requires):
        return "inconclusive"
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if op == ">":
        return "supported" if lo > t else "not supported" if hi <= t else "inconclusive"
    if op == ">=":
        return "supported" if lo >= t else "not supported" if hi < t else "inconclusive"
    if op == "<":
        return "supported" if hi < t else "not supported" if lo >= t else "inconclusive"
    return "supported" if hi <= t else "not supported" if lo > t else "inconclusive"  # "<="


def claim(name: str, statistic: str, value: float, lo: float, hi: float, rule_: str, reason: str,
          verdicts: Mapping[str, str] | None = None) -> Claim:
    """A Claim whose verdict is decide(rule_, lo, hi, verdicts); a requirement that fails is named in the reason."""
    v = decide(rule_, lo, hi, verdicts)
    _, _, requires = parse_rule(rule_)
    missing = [r for r in requires if (verdicts or {}).get(r) != "supported"]
    if missing and v == "inconclusive":
        reason = f"{reason}; inconclusive because not supported: {', '.join(missing)}"
    return Claim(name, statistic, float(value), float(lo), float(hi), v, reason, rule_)


def check_claims(claims: Iterable[Claim], verdicts: Mapping[str, str] | None = None) -> list[str]:
    """Rows whose verdict is not decide(rule, ci_lo, ci_hi) (requirements looked up among `claims`
    and `verdicts`), or that carry no rule / an unknown verdict: one line each; [] when all agree."""
    claims = list(claims)
    known = {**(verdicts or {}), **{c.name: c.verdict for c in claims}}
    bad = []
    for c in claims:
        if c.verdict not in VERDICTS:
            bad.append(f"{c.name}: unknown verdict {c.verdict!r}")
        elif not c.rule:
            bad.append(f"{c.name}: no rule")
        elif (want := decide(c.rule, c.ci_lo, c.ci_hi, known)) != c.verdict:
            bad.append(f"{c.name}: verdict {c.verdict!r} but rule {c.rule!r} on [{c.ci_lo:.4g}, {c.ci_hi:.4g}] "
                       f"gives {want!r}")
    return bad


def percentile_ci(b, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the finite values of b (NaN, NaN when none)."""
    b = np.asarray(b, float)
    b = b[np.isfinite(b)]
    if len(b) == 0:
        return math.nan, math.nan
    a = 100 * (1 - level) / 2
    lo, hi = np.percentile(b, [a, 100 - a])
    return float(lo), float(hi)


def holm(p) -> np.ndarray:
    """Holm-adjusted p-values (step-down, monotone, capped at 1)."""
    p = np.asarray(p, float)
    m = len(p)
    order = np.argsort(p)
    adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return out


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
