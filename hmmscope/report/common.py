"""Shared pieces of the report: the Section block list, number formatting, claim sides, power notes.

A Section is a title and a list of blocks: ("h", level, text) | ("p", text) | ("table", headers, rows) |
("img", filename, alt) | ("ul", items); render.py turns them into Markdown and HTML.

Notes. A table cell that would repeat a long text on every row (the method of an estimate, a power note) holds
a reference `[n]` instead, and the text is listed once below the table (`Notes`).

Verdicts in words. `verdict_sentence` says a claim in one sentence with its sign in words, units and CI, e.g.
"RoPE lower excess CE (seen tasks) by 0.059 nats/token [0.01, 0.108]: supported (RoPE better)": the
report opens with one per verdict.

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
from ..units import fmt_num, metric_units, metric_words

NAN = float("nan")
Block = tuple  # ("h", level, text) | ("p", text) | ("table", headers, rows) | ("img", filename, alt) | ("ul", items)

# better direction for "RoPE improves <metric>": +1 higher is better, -1 lower is better (the un-namespaced eval/*
# keys are those of runs recorded before seen and unseen tasks were evaluated apart: old stores keep them)
METRIC_DIRECTION = {"eval/seen/test_acc": +1, "eval/seen/excess_ce": -1, "eval/seen/kl_mix": -1,
                    "eval/test_acc": +1, "eval/excess_ce": -1, "eval/kl_mix": -1}
# the side of 0 a layerwise claim's value lies on when the claim holds (names as logged: safe_key'd)
# (the statistics of measure/probes/ and measure/shuffle.py; the runs' logged rules decide the pooled verdicts)
_CLAIM_SIDE = [(r"upper layers change less", -1), (r"_beats_control$", +1), (r"_beats_baseline$", +1),
               (r"_beats_token_stats$", +1), (r"rises_then_falls$", +1), (r"peak_moves_up$", +1),
               (r"acc_falls_with_k$", -1), (r"state_before_task(_reach\d+|_layer0)?$", +1)]


def _g(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else "-"


def verdict_sentence(c) -> str:
    """One sentence for a claim (module docstring): a RoPE - absolute effect with its sign in words ('RoPE lower
    excess CE ... by X unit [lo, hi]', the CI of the magnitude), else the claim's value, CI and unit."""
    name, v, lo, hi = c.name, float(c.value), float(c.ci_lo), float(c.ci_hi)
    m = re.fullmatch(r"RoPE improves (.+)", name)
    if m and not m.group(1).startswith("claim "):
        key = m.group(1)
        unit = metric_units(key)
        if not math.isfinite(v):
            return f"RoPE vs absolute on {metric_words(key)}: not estimated: {c.verdict}"
        side = METRIC_DIRECTION.get(key, 0)
        word = {"supported": "RoPE better" if side else "differs", "not supported": "RoPE worse",
                "inconclusive": "no detectable difference"}.get(c.verdict, "")
        direction, (a, b) = ("lower", (-hi, -lo)) if v < 0 else ("higher", (lo, hi))
        unit = f"({unit})" if unit and "/" not in unit else unit  # "nats/token", "(fraction of test tokens)"
        return (f"RoPE {direction} {metric_words(key)} by {_g(abs(v))}{' ' + unit if unit else ''} "
                f"[{_g(a)}, {_g(b)}]: {c.verdict}" + (f" ({word})" if word else ""))
    unit = metric_units(name)
    return f"{name}: {_g(v)}{' ' + unit if unit else ''} [95% CI {_g(lo)}, {_g(hi)}]: {c.verdict}"


class Notes:
    """Long texts a table would repeat on every row, listed once below it: `ref(text)` -> '[n]' (the same text,
    the same n); `short(text)` keeps a text of at most `limit` characters in its cell, else refers to it;
    `blocks()` -> the list under the table of the texts not listed yet (nothing if there is none): one Notes
    for several tables numbers their texts once, each listed under the first table that refers to it."""

    def __init__(self, limit: int = 60, title: str = "Notes"):
        self.items: list[str] = []
        self.limit, self.title, self.listed = limit, title, 0

    def ref(self, text: str) -> str:
        text = " ".join(str(text).split())
        if not text:
            return ""
        if text not in self.items:
            self.items.append(text)
        return f"[{self.items.index(text) + 1}]"

    def short(self, text: str, sep: str | None = None) -> str:
        """`text` if short, else its reference; with `sep` (e.g. '; '), part by part."""
        text = " ".join(str(text).split())
        if sep is not None:
            return sep.join(self.short(t) for t in text.split(sep) if t)
        return text if len(text) <= self.limit else self.ref(text)

    def blocks(self) -> list:
        new = [f"[{i}] {t}" for i, t in enumerate(self.items, 1) if i > self.listed]
        self.listed = len(self.items)
        return [("ul", new)] if new else []


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)


def param_number(s: Any) -> Any:
    """A param string as a number when it is one."""
    try:
        x = float(s)
    except (TypeError, ValueError):
        return s
    return int(x) if x.is_integer() and re.fullmatch(r"-?\d+", str(s).strip()) else x


def side_verdict(lo: float, hi: float, side: int, *, df: float | None = None, degenerate: str = "") -> str:
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
            why.append(f"95% CI width {fmt_num(width, 3)} > |effect| {fmt_num(eff, 3)}: only an effect beyond about "
                       f"{fmt_num(width / 2, 3)} (the CI half-width) could be resolved with these replicates")
    return "underpowered: " + "; ".join(why) if why else ""
