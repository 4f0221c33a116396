"""The report's first section: the answer, for every swept key, in words (issue 46.1).

First, in bold, one sentence per swept key (`sweep.compare.answers`): its effect over seeds with the unit, 95% CI,
replicates and verdict, e.g. "hmm.gamma: 0.9 - 0.5 = +0.54 [+0.30, +0.78] nats/token, 2 seeds: excess CE (seen
tasks) grows with gamma (supported)"; an inconclusive one says what the design excludes and the seeds it would need;
the best setting follows, for the keys a user tunes only, marked as such. A spec's [report] reference (a sweep that
holds this one's base cell) joins its matching trials as one more level (`sweep.compare.with_reference`), and the
section says which. Then what the numbers are over (seeds as the unit; with one seed the blocks, said so), the
effects table (`sweep.effects`: the contrast or slope, CI, df, rule, verdict, the Holm-adjusted verdict beside it,
the TOST's 90% CI and p, the equivalence verdict, what the design excludes, the seeds needed; a slope's steps as
rows of their own) with the family's line (`stats.holm_verdicts`), the objective per setting (the pivot table), its
figure, and one sentence per verdict of the report's other sections, with their family line.

The numbers are the same implementation as the analysis records' effects.csv (analysis/inference_ablations.py).
"""

from __future__ import annotations

import math
from pathlib import Path

from ..stats import holm_verdicts
from ..sweep import load_study, spec_of_study
from ..sweep.compare import FIGURE, answers, figure, pivot, pivot_rows, trial_frame, with_reference
from ..sweep.effects import options
from ..sweep.spec import SweepSpec
from ..units import fmt_ci, fmt_num, fmt_p, metric_units, replicates
from .common import Notes, Section, verdict_sentence


def effects_blocks(effs: list) -> list:
    """The effects table (module docstring) with its family line and notes: blocks of a Section."""
    if not effs:
        return []
    notes = Notes()
    holm, line = holm_verdicts([e.claim for e in effs])
    rows = []
    for e, hv in zip(effs, holm):
        rows.append(_row(e, e.key, e.label, hv, notes))
        rows += [_row(s, "", f"step {lab}", "-", notes) for lab, s in e.steps]
    return [("h", 3, "Effect of each swept key (seeds as the unit)"),
            ("table", ["key", "contrast", "estimate [95% CI]", "unit", "df", "units", "rule", "verdict",
                       "Holm (family)", "TOST 90% CI", "TOST p", "equivalence", "excluded beyond", "seeds needed"],
             rows),
            ("p", f"Family of {len(effs)} effects: {line}. The rule '!= 0' reads 'supported' when the 95% CI "
                  "excludes 0 on either side; a slope over three or more levels is 'supported' only when every "
                  "adjacent step lies on its side ('not monotone' otherwise). Equivalence: the TOST at the margin "
                  "(two one-sided t tests at 5%: 'equivalent within ±margin' when the 90% CI lies inside it); "
                  "'excluded beyond': effects beyond it are rejected, each side at 95%; 'seeds needed': to decide an "
                  "effect of the margin with 80% power, from the SD of the seed-level values."),
            *notes.blocks()]


def _row(e, key: str, label: str, holm: str, notes: Notes) -> list:
    c, q = e.claim, e.equivalence
    if e.why:
        return [key, label, "not estimated", e.unit, "-", "-", c.rule, c.verdict, holm, "-", "-", "-", "-",
                notes.short(e.why)]
    need = "-" if e.seeds_needed is None else f"{e.seeds_needed} (±{e.margin:.2g}, SD {e.sd:.2g})"
    return [key, label, f"{fmt_num(c.value)} {fmt_ci(c.ci_lo, c.ci_hi)}", e.unit, fmt_num(c.df),
            replicates(e.n, e.unit_of_replication), c.rule, c.verdict, holm,
            fmt_ci(q.lo90, q.hi90) if q else "-", fmt_p(q.p) if q and math.isfinite(q.p) else "-",
            (q.verdict or "no margin") if q else "-", fmt_num(q.excluded_beyond) if q else "-", need]


def answer_section(t, study, spec, found_in: str | None, claims: list, out_dir: Path,
                   figs: dict) -> tuple[Section, str, list]:
    """(the section, its sentences joined by '; ' (the report's `answer`), the effects)."""
    sec = Section("Answer")
    unit = metric_units(t.objective)
    n, total = t.counts["complete"], sum(v for k, v in t.counts.items() if k != "retried")
    said, effs, df, note = [], [], None, ""
    if spec is not None and n:
        metrics = {r.info.run_id: dict(r.data.metrics) for r in t.complete}
        df = trial_frame(spec, study, lambda rid: metrics.get(rid) or {})
        opts = options(spec)
        if opts.reference and not df.empty:
            df, note = _join_reference(spec, df, opts.reference, found_in)
        said, effs = answers(spec, df, opts)
    own = next((c for c in claims if c.name == f"RoPE improves {t.objective}"), None)
    if not said and own is not None:  # no stored spec: the objective's own verdict
        said = [verdict_sentence(own)]
    sec.blocks += [("strong", s) for s in said]
    swept = {p.key for p in spec.space} if isinstance(spec, SweepSpec) else set()
    seeds = int(df[[c for c in df.columns if c.endswith(".seed")][0]].astype(str).nunique()) \
        if df is not None and not df.empty and any(c.endswith(".seed") for c in df.columns) else 0
    over = ("Means are over seeds with a 95% t interval, seeds as the unit (G seeds: G - 1 df)" if seeds != 1 else
            "One seed: a mean has no interval over seeds; an effect's units are then the blocks (the levels of the "
            "other swept keys), as each sentence says")
    sec.blocks.append(("p", f"Objective {t.objective}{f' ({unit})' if unit else ''}"
                            f"{f', {spec.direction}' if isinstance(spec, SweepSpec) else ''}; {n} complete trial"
                            f"{'s' if n != 1 else ''} of {total}. {over}"
                            + ("; rope - absolute < 0 means RoPE is lower." if "model.pos_enc" in swept or
                               (not swept and own is not None) else ".")))
    if note:
        sec.blocks.append(("p", f"Reference: {note}."))
    sec.blocks += effects_blocks(effs)
    if spec is not None and spec.kind == "train" and df is not None and not df.empty:
        head, body = pivot_rows(pivot(spec, df))
        sec.blocks += [("h", 3, "The objective per setting"),
                       ("table", [h + (f" ({unit})" if unit and "[95% CI]" in h else "") for h in head], body)]
        saved = figure(spec, df, out_dir / FIGURE)  # the pivot's picture (pivot.png) is the parent run's alone
        figs.update({"objective": str(saved[0]), "objective_pdf": str(saved[1])})
        sec.blocks.append(("img", saved[0].name, f"{t.objective} against each swept parameter"))
    if claims:
        first = sorted(claims, key=lambda c: c is not own)  # the objective's verdict first
        sec.blocks += [("h", 3, "Verdicts in words"), ("ul", [verdict_sentence(c) for c in first]),
                       ("p", f"Family of the report's {len(claims)} claims: {holm_verdicts(claims)[1]}.")]
    return sec, "; ".join(said), effs


def _join_reference(spec, df, reference: str, storage: str | None):
    """The reference sweep's matching trials joined (`sweep.compare.with_reference`), or a note saying why not."""
    try:
        ref_spec = spec_of_study(reference, storage)
        return with_reference(spec, df, ref_spec, trial_frame(ref_spec, load_study(reference, storage)))
    except Exception as e:  # a reference not in this storage: the answer stands on this sweep alone, said so
        return df, f"reference sweep {reference} could not be read ({type(e).__name__}: {str(e).splitlines()[0]})"
