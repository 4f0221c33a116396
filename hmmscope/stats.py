"""Small shared pieces of the statistical reporting: claims with verdicts, JSON-safe conversion.

Every claim hmmscope checks (SCIENCE.md 6) is a `Claim`: a named statistic with a 95%
confidence interval and a verdict (supported / not supported / inconclusive) with its reason.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

VERDICTS = ("supported", "not supported", "inconclusive")


@dataclass(frozen=True)
class Claim:
    name: str
    statistic: str
    value: float
    ci_lo: float
    ci_hi: float
    verdict: str  # supported | not supported | inconclusive
    reason: str


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
