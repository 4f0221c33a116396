"""The positional encoding's effect across a sweep's trials: rope - absolute, paired within blocks of the other
swept factors, seeds as the unit (the method: stats.paired_effect; the choices: report/posenc.py's docstring).

A trial table here is one row per trial with `param:<key>` columns (`param:model.pos_enc` among them), a seed column
and metric columns, as `compare.trial_frame` and the report's reader build it. `choose_blocks` picks the factors to
pair within (a factor confounded with pos_enc is left out, with the reason), `pos_enc_effect` estimates the pooled
effect, `per_level_effects` the effect at each level of each blocking factor, `level_order` sorts levels.

Shared by the sweep parent run's pivot table (`compare`) and the report's positional-encoding section
(`report.posenc`), so both compute the same numbers; the report imports the sweep package, so this lives here.
Imports `stats` only (pandas frames are handed in).
"""

from __future__ import annotations

from ..stats import Estimate, paired_effect


def block_labels(d, cols: list[str]) -> list[tuple[str, ...]] | None:
    """Each trial's block: its levels of the blocking factors `cols` (None without blocks)."""
    return [tuple(str(v) for v in r) for r in d[cols].itertuples(index=False)] if cols else None


def pos_enc_effect(d, y: str, blocks: list[str], seed_col: str | None) -> Estimate | str:
    """rope - absolute on column `y`: paired within (seed, block) cells, t over seeds (stats.paired_effect); a
    string saying why when it cannot be estimated."""
    return paired_effect(d[y].astype(float).to_numpy(), (d["param:model.pos_enc"] == "rope").to_numpy(),
                         d[seed_col].astype(str).to_numpy() if seed_col else None, block_labels(d, blocks))


def choose_blocks(d, y: str, factors: list[str], seed_col: str | None):
    """(blocks, {factor: fate}): confounded factors out; others in while the paired design keeps >= 2 units."""
    rope = d["param:model.pos_enc"] == "rope"
    fate, blocks = {}, []
    if rope.nunique() < 2:
        return blocks, fate
    for f in factors:
        lv = d[f].astype(str)
        if lv.nunique() < 2:  # one level among the trials with this metric: nothing to block on
            continue
        if all(rope[lv == v].nunique() == 1 for v in lv.unique()):
            fate[f] = "left out: confounded with pos_enc (every level occurs with one encoding only)"
            continue
        got = pos_enc_effect(d, y, [*blocks, f], seed_col)
        if isinstance(got, Estimate) and got.n >= 2 and "paired" in got.method:
            blocks.append(f)
            fate[f] = "paired within (a block)"
        else:
            fate[f] = "left out: no seed holds both encodings within its levels"
    return blocks, fate


def per_level_effects(dm, m: str, blocks: list[str], seed_col: str | None) -> list[tuple[str, str, Estimate | str]]:
    """[(factor, level, rope - absolute there)] for each level of each blocking factor, the other blocks paired
    within (`pos_enc_effect`): the report's per-level rows, and the sweep parent run's pivot table (compare.py)."""
    out = []
    for f in blocks:
        for lv in sorted(dm[f].astype(str).unique(), key=level_order):
            sub = dm[dm[f].astype(str) == lv]
            out.append((f, lv, pos_enc_effect(sub, m, [b for b in blocks if b != f], seed_col)))
    return out


def level_order(v: str) -> tuple[int, float, str]:
    """Sort key of a factor's levels (as strings): numbers by value first, then the rest by name."""
    try:
        return (0, float(v), v)
    except ValueError:
        return (1, 0.0, v)
