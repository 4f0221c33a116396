"""A record's effects, each computed by the report's implementation (hmmscope.sweep.effects: a stats.Claim with its
rule fixed before the data, its TOST at the margin, what the design excludes, the seeds needed; a slope with its
adjacent steps), and their table with a Holm-adjusted verdict over the family (stats.holm_verdicts). Nothing here
re-implements a statistic: it fixes the record scripts' common arguments (nats/token, the default margin, seeds the
unit) in one place. Used by ablations_tables and ablations_bayes; the package never imports this folder.
"""
from __future__ import annotations

import math

from hmmscope.stats import DEFAULT_MARGIN, holm_verdicts, paired_effect
from hmmscope.sweep.effects import effect, effect_row, ordered_effect

UNIT = "nats/token"
MARGIN = DEFAULT_MARGIN[UNIT]  # stats.DEFAULT_MARGIN: 0.01 nats/token


def add(out: list, name: str, est_or_why, rule_: str, what: str) -> None:
    """An effect of an estimate (or the reason there is none), appended to `out`."""
    out.append(effect(name, est_or_why, rule_, what, unit=UNIT, margin=MARGIN))


def slope(out: list, name: str, rows: list[dict], key: str, ykey, rule_: str, what: str, per: str) -> None:
    """The slope of `ykey` (a column, or a function of the row) on `key` within a seed, t over seeds, with its
    adjacent steps (sweep.effects.ordered_effect), appended to `out`."""
    y = ykey if callable(ykey) else (lambda r: float(r[ykey]))
    rows = [r for r in rows if math.isfinite(y(r))]
    out.append(ordered_effect(name, [float(r[key]) for r in rows], [y(r) for r in rows], [int(r["seed"]) for r in rows],
                              None, rule_, f"OLS slope within a seed, t over seeds: {what}", unit=UNIT, margin=MARGIN,
                              per=per))


def paired(rows: list[dict], ykey: str, key: str, a, blocks=None):
    """stats.paired_effect of `ykey` between the rows whose `key` is `a` and the others, paired by seed (within
    `blocks`, a column, where given)."""
    return paired_effect([r[ykey] for r in rows], [r[key] == a for r in rows], [int(r["seed"]) for r in rows],
                         *([[r[blocks] for r in rows]] if blocks else []))


def table(effects: list, csv: str) -> list[dict]:
    """effects.csv's rows (sweep.effects.effect_row) with holm_verdict, the family being every effect here; the
    family's line printed."""
    holm, line = holm_verdicts([e.claim for e in effects])
    print(f"{csv}, the family of {len(effects)} effects: {line}")
    return [{**effect_row(e), "holm_verdict": h} for e, h in zip(effects, holm)]
