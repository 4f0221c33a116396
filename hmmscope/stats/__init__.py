"""Statistics shared by every stage: claims and their verdicts, few-cluster estimates over seeds, threshold
crossings; JSON-safe conversion. A claim's verdict is decided in one place (`claims.decide`).

- `claims`: `Claim`, rules, `decide` (the one place a verdict is made), `side_verdict`, a slope's steps ("not
  monotone"), `decide_equivalence`, `holm_verdicts` (a family's line), `jsonable`;
- `estimates`: `Estimate`, `t_mean` (t over seeds), `paired_effect` (paired within-block differences), `percentile_ci`;
- `crossing`: `Crossing`, `interp_crossing`, `crossing_interval` (task diversity's n* with its seed-level confidence
  set).

This package's interface: callers import the names below from `hmmscope.stats`.
"""

from .claims import (
                     ALL_VERDICTS,
                     DEFAULT_MARGIN,
                     NO_POWER,
                     NOT_EQUIVALENT,
                     NOT_MONOTONE,
                     VERDICTS,
                     Claim,
                     check_claims,
                     claim,
                     decide,
                     decide_equivalence,
                     holm,
                     holm_verdicts,
                     jsonable,
                     no_power_reason,
                     one_sided_p,
                     parse_rule,
                     rule,
                     side_verdict,
)
from .crossing import Crossing, crossing_interval, interp_crossing
from .estimates import Estimate, paired_effect, percentile_ci, t_mean

__all__ = ["ALL_VERDICTS", "DEFAULT_MARGIN", "NO_POWER", "NOT_EQUIVALENT", "NOT_MONOTONE", "VERDICTS", "Claim",
           "Crossing", "Estimate", "check_claims", "claim", "crossing_interval", "decide", "decide_equivalence", "holm",
           "holm_verdicts", "interp_crossing", "jsonable", "no_power_reason", "one_sided_p", "paired_effect",
           "parse_rule", "percentile_ci", "rule", "side_verdict", "t_mean"]
