"""The regime of each setting of a training sweep (SCIENCE.md 8, 9): Figure 1's claims pooled over seeds.

Every training run logs Figure 1's claims in its claims.json (measure/evaluate.py): ``retrieval_gap`` (with a training
mixture), ``icl_gain`` and ``inference_beyond_counting`` (unseen tasks, k = k_max, with the fitted counting
baselines). Here they are pooled per setting (the swept params but the replicate seeds) as the layerwise claims are:
the mean over seeds of each seed's mean over its runs, with a t interval on G - 1 df (stats.t_mean: the seed is the
unit; one seed: no interval, no verdict beyond the run's own), and the claim's own rule applied to the pooled CI
(stats.claim; inference_beyond_counting's requirement on icl_gain reads the pooled icl_gain of the same setting).
The regime word of each setting follows from the pooled claims exactly as for one run (evaluate.regime):
retrieval, inference beyond counting, counting, or undetermined.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from .. import tracking
from ..measure.regimes import regime
from ..stats import Claim, claim, parse_rule, rule, t_mean
from ..units import fmt_ci, fmt_num
from .common import NAN, Section

NAMES = ("retrieval_gap", "icl_gain", "inference_beyond_counting")
SEED_PARAMS = ("train.seed", "data.seed")


def _settings(runs: list) -> list[str]:
    """The params that vary across the runs, seeds excluded."""
    keys = sorted({k for r in runs for k in r.data.params})
    return [k for k in keys if k not in SEED_PARAMS and not k.startswith("counting.")
            and len({r.data.params.get(k) for r in runs}) > 1]


def _pooled_rule(r: str) -> str:
    op, t, req = parse_rule(r)
    return rule(op, t, req)


def regime_section(runs: list, uri: str) -> tuple[Section | None, list[Claim]]:
    """The section and its pooled claims (named '<setting>: <claim>'), or (None, []) when no run logged them."""
    rows = []
    for r in runs:
        nums, verdicts, rules = tracking.read_claims(uri, r)
        got = {n for n in NAMES if f"claim/{n}/value" in nums}
        if not got:
            continue
        rows.append((r, nums, rules))
    if not rows:
        return None, []
    keys = _settings([r for r, _, _ in rows])
    cells: dict[tuple, list] = defaultdict(list)
    for r, nums, rules in rows:
        cells[tuple(r.data.params.get(k, "") for k in keys)].append((r, nums, rules))
    table, claims, words = [], [], []
    for cell, members in sorted(cells.items()):
        label = ", ".join(f"{k.split('.')[-1]}={'fresh' if k == 'hmm.n_tasks' and str(v) == '0' else v}"
                          for k, v in zip(keys, cell)) or "all runs"
        pooled: dict[str, Claim] = {}
        for name in NAMES:
            by_seed: dict[str, list[float]] = defaultdict(list)
            rules = set()
            for r, nums, rl in members:
                if f"claim/{name}/value" in nums:
                    by_seed[r.data.params.get("train.seed", r.data.params.get("data.seed", "0"))].append(
                        nums[f"claim/{name}/value"])
                    rules.add(rl.get(name, ""))
            if not by_seed:
                continue
            seeds = sorted(by_seed)
            est = t_mean([float(np.mean(by_seed[s])) for s in seeds], seeds, unit="seed")
            rl = rules.pop() if len(rules) == 1 else ""
            if not rl:
                continue
            if est.n < 2:
                (r, nums, _), = [m for m in members if f"claim/{name}/value" in m[1]][:1]
                lo, hi, df, why = nums.get(f"claim/{name}/ci_lo", NAN), nums.get(f"claim/{name}/ci_hi", NAN), np.inf, ""
                stat = f"{name} of the one run (its own CI over episodes)"
            else:
                lo, hi, df, why = est.lo, est.hi, est.df, est.degenerate
                stat = f"{name}: mean over {est.n} seeds, t interval on {est.n - 1} df"
            c = claim(f"{label}: {name}", stat, est.value, lo, hi, _pooled_rule(rl), "pooled over seeds",
                      {k: v.verdict for k, v in pooled.items()}, df=df, degenerate=why)
            pooled[name] = Claim(name, c.statistic, c.value, c.ci_lo, c.ci_hi, c.verdict, c.reason, c.rule, c.df,
                                 c.degenerate)
            claims.append(c)
            table.append([label, name, str(est.n), fmt_num(est.value), fmt_ci(lo, hi), fmt_num(df), c.rule, c.verdict])
        word = regime(list(pooled.values()))
        words.append([label, str(len(members)), word])
    sec = Section("Regime (Figure 1's claims on unseen tasks, pooled over seeds)")
    sec.blocks.append(("p", "Per setting: retrieval_gap (model minus task-oracle CE, unseen minus seen tasks, > 0 = "
                            "retrieval), icl_gain (the model's CE at k = 0 minus at k = k_max on the same test tokens, "
                            "> 0) and inference_beyond_counting (model minus best fitted counting CE at k = k_max, < 0, "
                            "requires icl_gain), each the mean over seeds with a t interval over seeds (one seed: the "
                            "run's own CI over episodes). Regime: retrieval if the retrieval gap is supported, else "
                            "inference beyond counting if that claim is supported, else worse than counting where the "
                            "model's CE is above best counting's on its CI (lower end > 0), counting where it is level "
                            "(the CI contains 0), else undetermined: below best counting with no in-context gain shown "
                            "(SCIENCE.md 9)."))
    sec.blocks.append(("table", ["setting", "runs", "regime"], words))
    sec.blocks.append(("table", ["setting", "claim", "seeds", "pooled value", "95% CI", "df", "rule", "verdict"], table))
    return sec, claims


def headroom_section(runs: list) -> tuple[Section | None, list[Claim]]:
    """A headroom sweep (kind = "headroom", SCIENCE.md 9): per setting, the room above counting at k_max, a lower
    bound: CE(best counting) - CE(best legitimate learner: the EM learner, or family Bayes at M where it converged),
    pooled over the replicate seeds (data.seed: each draws its own unseen, fit and family tasks) by t on G - 1 df
    (stats.t_mean), with the claim "room > 0" (a legitimate learner beats counting); one seed: its own CI over
    episodes (and family draws where family Bayes sets it). Beside it: who sets it, family Bayes' drop from M/2 to M and
    in how many runs it converged, the family-Bayes bound (best counting - family Bayes at M, a lower bound on the room
    in expectation whether or not family Bayes converged; pooled the same way) and the reading: "room" (the claim
    supported), "room in every run (pooled CI inconclusive)" (each run's own CI above 0: a t interval on 1 df is wide),
    "no room" (family Bayes converged in every run and no run's learner beats counting on its own CI), "room shown by
    family Bayes only" (the bound above 0 pooled or in every run, family Bayes not converged), else "undetermined";
    where best counting's CE at
    k_max is above a uniform guess (ln V) in some run, best counting is degenerate (SCIENCE.md 9): the claim has no
    power and the reading is "undetermined (best counting degenerate)". Trials whose room was not measurable (no
    legitimate learner at k_max) FAIL and are not read here: the header counts them."""
    rows = [r for r in runs if "headroom/room" in r.data.metrics]
    if not rows:
        return None, []
    keys = [k for k in _settings(rows) if k != "data.seed"]
    cells: dict[tuple, list] = defaultdict(list)
    for r in rows:
        cells[tuple(r.data.params.get(k, "") for k in keys)].append(r)
    table, claims = [], []
    for cell, members in sorted(cells.items()):
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, cell)) or "all runs"
        km = max(int(k.rsplit("/k", 1)[1]) for k in members[0].data.metrics
                 if k.startswith("headroom/room/k") and k[-1].isdigit())
        seeds = [r.data.params.get("data.seed", "0") for r in members]

        def pooled(key, members=members, seeds=seeds):
            """(value, lo, hi, df, degenerate, how) of metric key pooled over seeds (module docstring)."""
            got = [(r.data.metrics[key], s) for r, s in zip(members, seeds) if key in r.data.metrics]
            if not got:
                return NAN, NAN, NAN, NAN, "", ""
            est = t_mean([v for v, _ in got], [s for _, s in got], unit="seed")
            if est.n >= 2:
                return est.value, est.lo, est.hi, est.df, est.degenerate, f"t over {est.n} seeds"
            m = next(r.data.metrics for r in members if key in r.data.metrics)
            return est.value, m.get(f"{key}_lo", NAN), m.get(f"{key}_hi", NAN), np.inf, "", "one seed: its own CI"

        value, lo, hi, df, why, how = pooled("headroom/room")
        bc_bad = sum(r.data.metrics.get(f"headroom/best_counting/ce/k{km}", 0.0)
                     > math.log(float(r.data.params.get("hmm.n_tokens", "nan"))) + 1e-9 for r in members)
        if bc_bad:
            why = f"best counting degenerate (CE above ln V at k_max in {bc_bad} of {len(members)} runs)"
        c = claim(f"{label}: room above counting", "CE(best counting) - CE(best legitimate learner: the EM learner, "
                  f"family Bayes where converged) at k_max, nats/token, a lower bound ({how})",
                  value, lo, hi, rule(">", 0), "positive: a learner beats counting here", df=df, degenerate=why)
        claims.append(c)
        b, blo, bhi, _, _, _ = pooled(f"headroom/family_bound/k{km}")
        avg = {q: float(np.mean([r.data.metrics.get(f"headroom/{q}/ce/k{km}", NAN) for r in members]))
               for q in ("best_counting", "family_bayes", "task_oracle", "incontext_hmm")}
        sizes = {int(k.split("_M")[1].split("/")[0]) for r in members for k in r.data.metrics
                 if k.startswith("headroom/family_bayes_M") and k.endswith(f"/ce/k{km}")}
        half = [r.data.metrics[f"headroom/family_bayes_M{max(sizes)}/ce/k{km}"] for r in members
                if f"headroom/family_bayes_M{max(sizes)}/ce/k{km}" in r.data.metrics] if sizes else []
        conv = [r.data.metrics.get(f"headroom/family_converged/k{km}") for r in members]
        by_fam = [r.data.metrics.get(f"headroom/set_by_family/k{km}") for r in members]
        drops = [r.data.metrics[f"headroom/family_drop/k{km}"] for r in members
                 if f"headroom/family_drop/k{km}" in r.data.metrics]
        fam = sum(f == 1 for f in by_fam)
        set_by = f"family Bayes {fam}/{len(members)}, EM learner {len(members) - fam}/{len(members)}"
        all_conv = bool(conv) and all(f == 1 for f in conv)
        own = [r.data.metrics for r in members]  # each run's own CIs (over its episodes and family draws)
        every_room = all(m.get("headroom/room_lo", NAN) > 0 for m in own)
        any_room = any(m.get("headroom/room_lo", NAN) > 0 for m in own)
        every_bound = all(m.get(f"headroom/family_bound/k{km}_lo", NAN) > 0 for m in own)
        word = ("undetermined (best counting degenerate)" if bc_bad else "room" if c.verdict == "supported" else
                "room in every run (pooled CI inconclusive)" if every_room else
                "no room" if all_conv and not any_room else
                "room shown by family Bayes only" if (np.isfinite(blo) and blo > 0) or every_bound else
                "undetermined")
        table.append([label, str(len(members)), fmt_num(value), fmt_ci(lo, hi), fmt_num(df), c.verdict, set_by,
                      fmt_num(avg["best_counting"]), fmt_num(avg["incontext_hmm"]), fmt_num(avg["family_bayes"]),
                      fmt_num(float(np.mean(half))) if half else "-", fmt_num(float(np.mean(drops))) if drops else "-",
                      _count(conv), fmt_num(b), fmt_ci(blo, bhi), word, fmt_num(avg["task_oracle"])])
    sec = Section("Headroom above counting (unseen tasks, before any training)")
    sec.blocks.append(("p", "Per setting: the room at k = k_max, best fitted counting minus the best legitimate "
                            "learner (the EM learner always; family Bayes at M tasks where it has converged, its drop "
                            "from M/2 to M below the tolerance), paired per unseen episode, pooled over seeds by t "
                            "(SCIENCE.md 9). It is a lower bound on the room: family Bayes at finite M is an upper "
                            "bound on the ideal learner's CE. 'set by' counts the runs whose room each learner sets; "
                            "'converged' the runs where family Bayes converged. The family-Bayes bound is best "
                            "counting minus family Bayes at M whether or not it converged: a lower bound on the room "
                            "in expectation over the draw of its M tasks, pooled the same way. Reading: room (a "
                            "learner beats counting: the claim supported), room in every run (each run's own CI above "
                            "0, the pooled 1-df CI not), no room (family Bayes converged in every run and no run's "
                            "learner beats counting on its own CI), room shown by family Bayes only (its bound above 0 "
                            "pooled or in every run, not converged), else undetermined. Degenerate references (CE "
                            "above ln V, or a "
                            "negative in-context gain) are never used; a trial with no legitimate learner at k_max "
                            "fails (its objective is not measurable) and is counted in the header, not here."))
    sec.blocks.append(("table", ["setting", "seeds", "room", "95% CI", "df", "verdict (> 0)", "set by",
                                 "best counting CE", "EM learner CE", "family Bayes CE", "family Bayes, M/2",
                                 "family Bayes drop M/2 -> M", "converged", "family-Bayes bound",
                                 "family-Bayes bound 95% CI", "reading", "task oracle CE"], table))
    return sec, claims


def _count(flags: list) -> str:
    """'a/b': how many of the runs' 0/1 metrics are 1 ('-' where the runs predate them)."""
    got = [f for f in flags if f is not None]
    return f"{sum(f == 1 for f in got)}/{len(got)}" if got else "-"
