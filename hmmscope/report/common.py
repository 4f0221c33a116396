"""Shared pieces of the report: the Section block list, number formatting, claim sides, power notes.

A Section is a title and a list of blocks: ("h", level, text) | ("p", text) | ("strong", text: a paragraph in
bold) | ("table", headers, rows) | ("img", filename, alt) | ("ul", items); render.py turns them into Markdown and
HTML.

Notes. A table cell that would repeat a long text on every row (the method of an estimate, a power note) holds
a reference `[n]` instead, and the text is listed once below the table (`Notes`).

Verdicts in words. `verdict_sentence` says a claim in one sentence with its unit, CI and replicates, a RoPE -
absolute effect as the same signed difference the tables and figures show, e.g. "RoPE - absolute on
eval/seen/excess_ce: -0.059 [-0.108, -0.010] nats/token, 3 seeds: RoPE better" (`units.value_ci`: the value and CI to the CI's
precision): the report's Answer lists one per verdict.

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

from ..units import fmt_num, metric_units, replicates, value_ci

NAN = float("nan")
Block = tuple  # ("h", level, text) | ("p", text) | ("strong", text) | ("table", headers, rows) | ("img", filename, alt)
#               | ("ul", items)

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


_EFFECT_WORDS = {"supported": "RoPE better", "not supported": "RoPE worse", "inconclusive": "no detectable difference"}
_SETTING_CLAIMS = {"retrieval_gap": "retrieval gap (unseen minus seen tasks, model - task oracle)",
                   "icl_gain": "in-context gain on unseen tasks (CE at k = 0 minus at k_max, same tokens)",
                   "inference_beyond_counting": "model - best counting on unseen tasks",
                   "room above counting": "room above counting (CE(best counting) - CE(family Bayes))"}


def _units_of(c) -> str:
    """'2 seeds' from a claim's statistic ('...; 2 seed units', 'mean over 3 seeds', 'of the one run'), else ''."""
    m = re.search(r"(\d+) (seed|block \(one seed\)) units", c.statistic or "")
    if m:
        return replicates(int(m.group(1)), m.group(2))
    m = re.search(r"(?:mean over|t over) (\d+) seeds", c.statistic or "")
    if m:
        return replicates(int(m.group(1)), "seed")
    if re.search(r"one run|one seed", c.statistic or ""):
        return "one run (its CI over episodes)"
    return ""


def verdict_sentence(c) -> str:
    """One sentence for a claim (module docstring), its number with its unit, 95% CI and replicates: a RoPE -
    absolute effect as the difference the tables and figures show ('RoPE - absolute on eval/seen/excess_ce:
    -0.006 [-0.233, 0.221] nats/token, 2 seeds: no detectable difference'); a setting's regime claim ('gamma = 0.5,
    pos_enc = rope: retrieval gap (...) 0.41 [0.29, 0.52] nats/token, 2 seeds: supported'); else the claim's value,
    CI and unit."""
    name, v, lo, hi = c.name, float(c.value), float(c.ci_lo), float(c.ci_hi)
    reps = _units_of(c)
    m = re.fullmatch(r"RoPE improves (.+)", name)
    if m and not m.group(1).startswith("claim "):
        key = m.group(1)
        if not math.isfinite(v):
            return f"RoPE - absolute on {key}: not estimated: {c.verdict}"
        word = _EFFECT_WORDS.get(c.verdict, c.verdict) if METRIC_DIRECTION.get(key, 0) else \
            {"supported": "differs"}.get(c.verdict, c.verdict)
        return (f"RoPE - absolute on {key}: {value_ci(v, lo, hi, metric_units(key))}"
                f"{', ' + reps if reps else ''}: {word}")
    m = re.fullmatch(r"(.+): (retrieval_gap|icl_gain|inference_beyond_counting|room above counting)", name)
    if m:
        setting = ", ".join(part.replace("=", " = ", 1) for part in m.group(1).split(", "))
        return (f"{setting}: {_SETTING_CLAIMS[m.group(2)]} {value_ci(v, lo, hi, 'nats/token')}"
                f"{', ' + reps if reps else ''}: {c.verdict}")
    unit = metric_units(name)
    return f"{name}: {value_ci(v, lo, hi, unit)}{', ' + reps if reps else ''}: {c.verdict}"


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
