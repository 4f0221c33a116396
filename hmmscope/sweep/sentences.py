"""An effect said in words, named first (`sentence`): its estimate with its CI and replicates, what it means for the
metric (grows / falls with the key, higher / lower with one level than another, not one way), its verdict, and for an
inconclusive effect what it excludes and the seeds it would need. The sweep comparison's and the report's answer
lines. Imports `effects` (the `Effect` it words) and `units`.
"""

from __future__ import annotations

from ..units import metric_words, replicates, value_ci
from .effects import Effect


def sentence(e: Effect) -> str:
    """The effect in words, named first: 'hmm.gamma: 0.9 - 0.5 = +0.54 [+0.30, +0.78] nats/token, 2 seeds: excess
    CE (seen tasks) grows with gamma (supported)'; an inconclusive effect says what it excludes and the seeds it would
    need, a slope its steps."""
    c, key, direction, ordered = e.claim, e.key, e.direction, e.ordered
    short = key.rsplit(".", 1)[-1]
    what = metric_words(e.metric)
    if e.why:
        return f"{key}: {e.label or 'effect'} not estimated ({e.why})"
    head = f"{key}: {e.label} = {value_ci(c.value, c.ci_lo, c.ci_hi, e.unit, signed=True)}, " \
           f"{replicates(e.n, e.unit_of_replication)}"
    up = c.value > 0
    if c.verdict == "supported":
        if ordered:
            words = f"{what} {'grows' if up else 'falls'} with {short}"
        else:
            b, a = e.label.split(" - ", 1)
            better = ("" if not direction else
                      f", {b} better" if up == (direction == "maximize") else f", {b} worse")
            words = f"{what} {'higher' if up else 'lower'} with {b} than {a}{better}"
    elif c.verdict == "not monotone":
        words = f"{what} changes with {short}, but not one way: steps " + ", ".join(
            f"{lab} {value_ci(s.claim.value, s.claim.ci_lo, s.claim.ci_hi, signed=True)}" for lab, s in e.steps)
    elif c.verdict == "inconclusive":
        words = "no detectable difference"
    else:
        words = (c.degenerate or c.reason or "no interval").removeprefix("no power: ")
    text = f"{head}: {words} ({c.verdict})"
    q = e.equivalence
    if q is not None and q.verdict and (c.verdict == "inconclusive" or not q.verdict.startswith("not")):
        text += f"; {q.verdict}" + (f" within ±{e.margin:.2g}" if q.verdict.startswith("not") else "")
    extra = e.power_text()
    return text + (f"; {extra}" if extra else "")
