"""Metrics and numbers as a reader sees them: a metric key's unit, axis label and words, the oracle drawn beside
it, and numbers, p-values and confidence intervals as text.

Shared by the report (`report/`) and the sweep parent run's comparison (`sweep.compare`), which is below the report
(the report reads sweeps); so these live below both. Pure functions: numpy only.
"""

from __future__ import annotations

import math
import re
import textwrap
from typing import Any

import numpy as np


def metric_units(key: str) -> str:
    """The unit of a metric, for axis labels and tables: nats/token for cross-entropies, KLs and their
    differences, 'fraction of test tokens' for accuracies, '1/L' for eps(L)'s decay rate; '' if unknown."""
    k = key.rsplit("/", 1)[-1]
    parts = set(k.split("_"))
    if key.startswith("theory/"):
        return "1/L (per token of memory)" if k in ("rate", "rate_lo", "rate_hi") else ""
    if "acc" in parts or k.startswith("gap_to_"):
        return "fraction of test tokens"
    if parts & {"ce", "loss", "kl"} or k.startswith(("retrieval_gap", "vs_best_counting")):
        return "nats/token"
    if k == "p_true_task":
        return "probability"
    if "norm_change" in key:
        return "relative logit change"
    return ""


def better(direction: str) -> str:
    """'lower is better' / 'higher is better' for an objective's direction (minimize / maximize); '' otherwise."""
    return {"minimize": "lower is better", "maximize": "higher is better"}.get(direction, "")


def wrap(text: str, inches: float, fontsize: float = 10) -> str:
    """`text` broken into lines that fit `inches` at `fontsize` points (about 0.55 em a character), each of its own
    lines apart: a title that would run past a figure's edge."""
    width = max(20, int(inches * 72 / (0.55 * fontsize)))
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def axis_label(key: str) -> str:
    """`key (unit)`, or the key alone when its unit is unknown."""
    u = metric_units(key)
    return f"{key} ({u})" if u else key


def oracle_reference(objective: str) -> tuple[float | str, str] | None:
    """The oracle beside an objective on a figure: (a constant, label) for a quantity the oracle sets to 0 by
    definition (excess CE, KL, the retrieval gap), (the trials' metric key that holds the oracle's value,
    label) for the model's own CE or accuracy; None when no oracle applies."""
    tasks = "unseen" if "/unseen/" in objective else "seen"
    k = objective.rsplit("/", 1)[-1]
    if k in ("excess_ce", "kl_mix"):
        return 0.0, f"mixture oracle ({k} = 0)"
    if k in ("excess_ce_task", "kl_task"):
        return 0.0, f"task oracle ({k} = 0)"
    if k.startswith("retrieval_gap"):
        return 0.0, "no retrieval gap (0)"
    which = "task" if tasks == "unseen" else "mix"
    name = "task oracle" if which == "task" else "mixture oracle"
    if objective.startswith("eval/") and k in ("test_acc", "test_ce"):
        return f"eval/{tasks}/oracle_{which}_{k}", name
    legacy = {"val/test_acc": "eval/seen/oracle_mix_test_acc", "val/test_loss": "eval/seen/oracle_mix_test_ce",
              "val/loss": "oracle/loss", "val/acc": "oracle/acc"}
    return (legacy[objective], "mixture oracle") if objective in legacy else None


_WORDS = {"excess_ce": "excess CE", "excess_ce_task": "excess CE over the task oracle", "kl_mix":
          "KL to the mixture oracle", "kl_task": "KL to the task oracle", "test_acc": "test accuracy",
          "test_ce": "test CE", "retrieval_gap": "retrieval gap", "vs_best_counting": "model - best counting",
          "icl_gain": "in-context gain"}


def metric_words(key: str) -> str:
    """A metric key in words: eval/seen/excess_ce -> 'excess CE (seen tasks)'; unknown keys as they are."""
    parts = key.split("/")
    words = _WORDS.get(parts[-1], parts[-1] if len(parts) > 1 else key)
    if words == parts[-1]:
        return key
    return f"{words} ({parts[1]} tasks)" if len(parts) == 3 and parts[1] in ("seen", "unseen") else words


def claim_words(name: str) -> str:
    """A claim's name as logged (MLflow's key rules turned its parentheses into '_': 'upper layers change less
    _slope_') as a reader sees it: 'upper layers change less (slope)'."""
    return re.sub(r" _([^_]+)_$", r" (\1)", name)


def fmt_num(v: Any, digits: int = 4) -> str:
    """A number to `digits` significant digits ('-' for None, nan or inf); anything else as str."""
    if v is None:
        return "-"
    if isinstance(v, (float, np.floating)):
        return "-" if not math.isfinite(v) else f"{v:.{digits}g}"
    return str(v)


def fmt_p(p: float) -> str:
    """A p-value ('< 1e-16' for 0)."""
    return "< 1e-16" if p == 0 else fmt_num(p, 3)


def fmt_ci(lo: float, hi: float) -> str:
    """A confidence interval: [lo, hi]."""
    return f"[{fmt_num(lo)}, {fmt_num(hi)}]"


def decimals(lo: float, hi: float) -> int | None:
    """Decimals that show a 95% CI [lo, hi] to about three digits of its half-width (0.227 -> 3: '-0.006 [-0.233,
    0.221]'), or None when it has no finite width (then: 3 significant digits)."""
    half = (hi - lo) / 2 if math.isfinite(lo) and math.isfinite(hi) else math.nan
    if not math.isfinite(half) or half <= 0:
        return None
    return max(0, min(8, 2 - math.floor(math.log10(half))))


def value_ci(v: float, lo: float, hi: float, unit: str = "", *, signed: bool = False) -> str:
    """'-0.006 [-0.233, 0.221] nats/token': a value and its 95% CI to the CI's precision (`decimals`), signs kept
    (the sign of the difference the table and the figure show), then the unit; '(no CI)' when there is none.
    `signed`: a difference, '+' before positive numbers ('+0.54 [+0.30, +0.78]')."""
    d = decimals(lo, hi)
    plus = "+" if signed else ""

    def num(x: float) -> str:
        if not math.isfinite(x):
            return "-"
        return f"{x:{plus}.{d}f}" if d is not None else f"{x:{plus}.3g}"

    ci = f" [{num(lo)}, {num(hi)}]" if math.isfinite(lo) and math.isfinite(hi) else " (no CI)"
    return f"{num(v)}{ci}{' ' + unit if unit else ''}"


def replicates(n: int, unit: str) -> str:
    """'2 seeds', 'one seed (2 blocks as the units)', '1 run': how many units a CI stands on, in words."""
    if unit == "seed":
        return f"{n} seed{'s' if n != 1 else ''}"
    if unit.startswith("block"):
        return f"one seed ({n} block{'s' if n != 1 else ''} as the units)"
    return f"{n} {unit}{'s' if n != 1 else ''}"
