"""Shared pieces of the report: the Section block list, number formatting, claim sides, power notes.

A Section is a title and a list of blocks: ("h", level, text) | ("p", text) | ("table", headers, rows) |
("img", filename, alt); render.py turns them into Markdown and HTML.

Power. `underpowered(...)` says plainly when a design cannot answer its question: fewer than 2 replicates
per cell (nothing estimates the noise within a cell), no finite CI, or, for an inconclusive verdict, a
95% CI wider than the effect it tests (|value - threshold|), with the smallest effect the design could
resolve (about the CI half-width; it shrinks as 1/sqrt(replicates)). The note never changes a verdict:
verdicts are stats.decide's, from the CI printed beside them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..stats import decide, rule

NAN = float("nan")
Block = tuple  # ("h", level, text) | ("p", text) | ("table", headers, rows) | ("img", filename, alt)

# better direction for "RoPE improves <metric>": +1 higher is better, -1 lower is better (the un-namespaced eval/*
# keys are those of runs recorded before seen and unseen tasks were evaluated apart: old stores keep them)
METRIC_DIRECTION = {"eval/seen/test_acc": +1, "eval/seen/excess_ce": -1, "eval/seen/kl_mix": -1,
                    "eval/test_acc": +1, "eval/excess_ce": -1, "eval/kl_mix": -1}
# the side of 0 a layerwise claim's value lies on when the claim holds (names as logged: safe_key'd)
# (the statistics of probes.py and shuffle.py; the runs' logged rules decide the pooled verdicts)
_CLAIM_SIDE = [(r"upper layers change less", -1), (r"_beats_control$", +1), (r"_beats_baseline$", +1),
               (r"_beats_token_stats$", +1), (r"rises_then_falls$", +1), (r"peak_moves_up$", +1),
               (r"acc_falls_with_k$", -1), (r"state_before_task(_reach\d+|_layer0)?$", +1)]


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)


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


def _side_verdict(lo: float, hi: float, side: int, *, df: float | None = None, degenerate: str = "") -> str:
    """Claim: the quantity lies on `side` of 0 (+1 above, -1 below: stats.decide with '> 0' / '< 0');
    side 0: two-sided 'differs from 0' (supported if decide finds the CI on either side, no power if decide
    says so, else inconclusive)."""
    if side == 0:
        v = [decide(rule(op, 0), lo, hi, df=df, degenerate=degenerate) for op in (">", "<")]
        return "no power" if "no power" in v else "supported" if "supported" in v else "inconclusive"
    return decide(rule(">" if side > 0 else "<", 0), lo, hi, df=df, degenerate=degenerate)


def claim_side(name: str, per_run: list[tuple[float, str]] | None = None) -> int:
    """+1 / -1: the side of 0 where claim `name` holds; else inferred from supported runs; 0 if unknown."""
    for pat, side in _CLAIM_SIDE:
        if re.search(pat, name):
            return side
    signs = {int(np.sign(v)) for v, verdict in (per_run or []) if verdict == "supported" and math.isfinite(v) and v}
    return signs.pop() if len(signs) == 1 else 0


def underpowered(value: float, lo: float, hi: float, verdict: str, *, threshold: float = 0.0,
                 replicates: int | None = None, unit: str = "replicate") -> str:
    """'' when the design answers; else 'underpowered: <why>' (module docstring). Never changes a verdict."""
    why = []
    if replicates is not None and replicates < 2:
        why.append(f"{replicates} {unit}{'s' if replicates != 1 else ''} per cell (< 2): "
                   f"nothing measures the noise between {unit}s")
    if not (math.isfinite(lo) and math.isfinite(hi)):
        why.append("no finite 95% CI")
    elif verdict == "inconclusive" and math.isfinite(value):
        eff, width = abs(value - threshold), hi - lo
        if width > eff:
            why.append(f"95% CI width {_f(width, 3)} > |effect| {_f(eff, 3)}: only an effect beyond about "
                       f"{_f(width / 2, 3)} (the CI half-width) could be resolved with these replicates")
    return "underpowered: " + "; ".join(why) if why else ""
