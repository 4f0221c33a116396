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
    """A headroom sweep (kind = "headroom", SCIENCE.md 9): per setting, the room above counting at k_max,
    CE(best counting) - CE(family Bayes at M), pooled over the replicate seeds (data.seed: each draws its own unseen,
    fit and family tasks) by t on G - 1 df (stats.t_mean), with the claim "room > 0"; one seed: its own paired CI over
    episodes (each episode an unseen task of its own). Beside it best counting's and family Bayes' CE and the family
    Bayes CE at M/2 (how far from converged: the room is an underestimate while it still falls)."""
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
        room = [float(r.data.metrics["headroom/room"]) for r in members]
        est = t_mean(room, [r.data.params.get("data.seed", "0") for r in members], unit="seed")
        if est.n >= 2:
            lo, hi, df, why, how = est.lo, est.hi, est.df, est.degenerate, f"t over {est.n} seeds"
        else:
            m = members[0].data.metrics
            lo, hi, df, why, how = m.get("headroom/room_lo", NAN), m.get("headroom/room_hi", NAN), np.inf, "", \
                "one seed: its paired CI over episodes"
        c = claim(f"{label}: room above counting", "CE(best counting) - CE(best legitimate learner: the EM learner, "
                  f"family Bayes where converged) at k_max, nats/token, a lower bound ({how})",
                  est.value, lo, hi, rule(">", 0), "positive: a learner beats counting here", df=df,
                  degenerate=why)
        claims.append(c)
        km = max(int(k.rsplit("/k", 1)[1]) for k in members[0].data.metrics
                 if k.startswith("headroom/room/k") and k[-1].isdigit())
        avg = {q: float(np.mean([r.data.metrics.get(f"headroom/{q}/ce/k{km}", NAN) for r in members]))
               for q in ("best_counting", "family_bayes", "task_oracle")}
        sizes = {int(k.split("_M")[1].split("/")[0]) for r in members for k in r.data.metrics
                 if k.startswith("headroom/family_bayes_M") and k.endswith(f"/ce/k{km}")}
        half = [r.data.metrics[f"headroom/family_bayes_M{max(sizes)}/ce/k{km}"] for r in members
                if f"headroom/family_bayes_M{max(sizes)}/ce/k{km}" in r.data.metrics] if sizes else []
        conv = [r.data.metrics.get(f"headroom/family_converged/k{km}") for r in members]
        by_fam = [r.data.metrics.get(f"headroom/set_by_family/k{km}") for r in members]
        em = float(np.mean([r.data.metrics.get(f"headroom/incontext_hmm/ce/k{km}", NAN) for r in members]))
        table.append([label, str(est.n), fmt_num(est.value), fmt_ci(lo, hi), fmt_num(df), c.verdict,
                      fmt_num(avg["best_counting"]), fmt_num(em), fmt_num(avg["family_bayes"]),
                      fmt_num(float(np.mean(half))) if half else "-",
                      _count(conv), _count(by_fam), fmt_num(avg["task_oracle"])])
    sec = Section("Headroom above counting (unseen tasks, before any training)")
    sec.blocks.append(("p", "Per setting: the room at k = k_max, best fitted counting minus the best legitimate "
                            "learner (the EM learner always; family Bayes at M tasks where it has converged, its drop "
                            "from M/2 to M below the tolerance), paired per unseen episode, pooled over seeds by t "
                            "(SCIENCE.md 9). It is a lower bound on the room: family Bayes at finite M is an upper "
                            "bound on the ideal learner's CE. Degenerate references (CE above ln V, or a negative "
                            "in-context gain) are never used. Columns 'converged' and 'set by family Bayes' count the "
                            "runs."))
    sec.blocks.append(("table", ["setting", "seeds", "room", "95% CI", "df", "verdict (> 0)", "best counting CE",
                                 "EM learner CE", "family Bayes CE", "family Bayes, M/2", "converged",
                                 "set by family Bayes", "task oracle CE"], table))
    return sec, claims


def _count(flags: list) -> str:
    """'a/b': how many of the runs' 0/1 metrics are 1 ('-' where the runs predate them)."""
    got = [f for f in flags if f is not None]
    return f"{sum(f == 1 for f in got)}/{len(got)}" if got else "-"
