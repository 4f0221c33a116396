"""Headroom of a family and an episode layout above counting, before any training (SCIENCE.md 9, issue 27.1).

A model can only show in-context inference beyond counting where the family leaves room above the best counting
predictor. ``headroom(cfg)`` measures that room with the package's own references on unseen tasks, per number
of demonstrations k (the last k demonstrations kept, as Figure 1 does), and trains nothing:

- the task oracle (the ceiling: the true parameters of each unseen task);
- ``family_bayes`` at M/4, M/2 and M (the mixture oracle over the first M' of M tasks of the family's "family"
  stream, eval.family_tasks or ``family_tasks``): the ideal in-context learner of the family, an upper bound on
  its CE for finite M, so that its convergence in M shows;
- every counting baseline: add-one unigram and bigram, and the n-gram and CTW fitted on fit-task episodes
  (eval.fit_episodes, the "fit" stream; never the evaluation episodes) with ``best_counting`` per k;
- the EM-fitted HMM learner (eval.em_states states; ``em=False`` leaves it out);
- the headroom CE(best_counting) - CE(family_bayes at M), per episode on the same tokens, then the mean over
  episodes with a 95% normal CI (paired). Positive: a learner of the family can beat counting. With small M it is
  an underestimate (family_bayes is worse than the ideal learner).

The unseen tasks are episodes.unseen_episodes' (n_episodes tasks, one episode each, the stream of data.seed), so a
headroom and a trained model's Figure 1 with the same config and n_episodes score the same episodes. Everything
is evaluate.eval_set's: one implementation of the scored tokens, the references and their statistics.

Cost: (k_max + 1) x (1 + 3/4 + 1/2) mixture-oracle passes over the family's M tasks (the oracle at M, M/2 and
M/4), the counting grid on the fit episodes, and the EM fits; ``hmmscope bench headroom`` states it against one
mixture-oracle pass over the same M tasks and episodes (the peer).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..config import Config, em_states
from ..stats import jsonable

COLUMNS = ("k", "predictor", "M", "ce", "ce_lo", "ce_hi", "acc", "n_episodes")


@dataclass
class HeadroomResult:
    """rows: one per (k, predictor[, M]) with CE and accuracy (mean, 95% CI over episodes); room: one per k, the
    headroom (best_counting - family_bayes at M, paired) with its CI and the best counting setting there;
    counting: the fitted settings; meta: the config's family and layout, M, episodes, seconds."""

    rows: list[dict]
    room: list[dict]
    counting: dict
    meta: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)  # the fitted counting settings as MLflow params (CountingFit.params)

    @property
    def k_max(self) -> int:
        return max(r["k"] for r in self.room)

    def at(self, k: int | None = None) -> dict:
        k = self.k_max if k is None else k
        return next(r for r in self.room if r["k"] == k)

    def line(self) -> str:
        """The one line: room above counting at k_max."""
        r = self.at()
        return (f"room above counting at k_max = {r['k']}: {r['room']:+.3f} [{r['room_lo']:+.3f}, {r['room_hi']:+.3f}] "
                f"nats/token (best counting {r['best']} {r['best_ce']:.3f} vs family Bayes over M = {r['M']} tasks "
                f"{r['family_ce']:.3f}; {self.meta['n_episodes']} unseen episodes)")

    def metrics(self) -> dict[str, float]:
        """MLflow metrics: headroom/room (at k_max, with _lo / _hi), headroom/room/k<k>, headroom/<predictor>/ce/k<k>
        (family_bayes at M also as headroom/family_bayes_M<M'>/ce/k<k> for M' < M)."""
        out = {}
        for r in self.room:
            out.update({f"headroom/room/k{r['k']}": r["room"], f"headroom/room/k{r['k']}_lo": r["room_lo"],
                        f"headroom/room/k{r['k']}_hi": r["room_hi"]})
        top = self.at()
        out.update({"headroom/room": top["room"], "headroom/room_lo": top["room_lo"], "headroom/room_hi": top["room_hi"]})
        M = self.meta["family_tasks"]
        for r in self.rows:
            name = r["predictor"] if r["predictor"] != "family_bayes" or r["M"] == M else f"family_bayes_M{r['M']}"
            out[f"headroom/{name}/ce/k{r['k']}"] = r["ce"]
        out["headroom/seconds"] = self.meta["seconds"]
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}

    def to_dict(self) -> dict:
        return jsonable({"rows": self.rows, "room": self.room, "counting": self.counting, "meta": self.meta,
                         "line": self.line()})

    def table(self) -> list[str]:
        """Plain text: CE per predictor (rows) and k (columns), then the headroom row."""
        ks = sorted({r["k"] for r in self.room})
        names = list(dict.fromkeys((r["predictor"], r["M"]) for r in self.rows))
        w = max(len(self._label(n, m)) for n, m in names) + 2
        lines = [f"{'CE (nats/token)':<{w}}" + "".join(f"{'k = ' + str(k):>16}" for k in ks)]
        for n, m in names:
            cells = {r["k"]: r for r in self.rows if r["predictor"] == n and r["M"] == m}
            lines.append(f"{self._label(n, m):<{w}}" + "".join(
                f"{cells[k]['ce']:>8.3f} ± {(cells[k]['ce_hi'] - cells[k]['ce_lo']) / 2:.3f}" if k in cells
                else f"{'':>16}" for k in ks))
        lines.append(f"{'headroom':<{w}}" + "".join(
            f"{r['room']:>+8.3f} ± {(r['room_hi'] - r['room_lo']) / 2:.3f}" for r in sorted(self.room, key=lambda r: r["k"])))
        return lines

    @staticmethod
    def _label(name: str, M: int | None) -> str:
        return f"{name} (M = {M})" if M else name


def headroom(cfg: Config, *, n_episodes: int = 256, family_tasks: int | None = None, em: bool = True,
             device: str = "cpu", ks=None) -> HeadroomResult:
    """The headroom of cfg's family and layout (module docstring): n_episodes unseen episodes, family_tasks tasks in
    family_bayes (default eval.family_tasks, which must then be >= 1), the counting baselines fitted on
    eval.fit_episodes (>= 8) fit-task episodes, at every k in ks (default 0..data.n_demos)."""
    from ..data.episodes import unseen_episodes
    from ..oracles.baselines import HMMLearner
    from .evaluate import eval_set, references

    M = int(cfg.eval.family_tasks if family_tasks is None else family_tasks)
    if M < 1:
        raise ValueError(f"the headroom needs family_bayes: family_tasks must be >= 1, got {M}")
    if cfg.eval.fit_episodes < 8:
        raise ValueError(f"the headroom needs the fitted counting baselines: eval.fit_episodes must be >= 8, got "
                         f"{cfg.eval.fit_episodes}")
    if n_episodes < 2:
        raise ValueError(f"n_episodes must be >= 2 (a CI over episodes), got {n_episodes}")
    ks = sorted(range(cfg.data.n_demos + 1) if ks is None else {int(k) for k in ks})
    t0 = time.perf_counter()
    ev = dataclasses.replace(cfg.eval, family_tasks=M)
    family, counting = references(cfg.hmm, cfg.data, ev, ks)
    t_ref = time.perf_counter()
    umix, uep = unseen_episodes(cfg.hmm, cfg.data, n_episodes)
    sizes = sorted({m for m in (M // 4, M // 2) if m >= 1})
    es = eval_set(None, uep, tasks="unseen", task_mix=umix, family=family, counting=counting,
                  learner=HMMLearner(n_states=em_states(cfg)) if em else None, ks=ks, device=device,
                  family_sizes=sizes, family_sizes_at=ks)
    rows, room = [], []
    for k in ks:
        refs = es.by_k[k].references
        for name, m in refs.items():
            if name == "family_bayes":
                continue
            ce, lo, hi = _ci(m["ce"].mean(1))
            rows.append({"k": k, "predictor": name, "M": None, "ce": ce, "ce_lo": lo, "ce_hi": hi,
                         "acc": float(m["acc"].mean()), "n_episodes": len(m["ce"])})
        for m in (*sizes, M):
            ce_ep = es.family_episodes[(m, k)]
            ce, lo, hi = _ci(ce_ep)
            acc = float(refs["family_bayes"]["acc"].mean()) if m == M else math.nan
            rows.append({"k": k, "predictor": "family_bayes", "M": m, "ce": ce, "ce_lo": lo, "ce_hi": hi, "acc": acc,
                         "n_episodes": len(ce_ep)})
        best = counting.by_k[k]["best_counting"]
        d = refs["best_counting"]["ce"].mean(1) - es.family_episodes[(M, k)]
        r, rlo, rhi = _ci(d)
        room.append({"k": k, "room": r, "room_lo": rlo, "room_hi": rhi, "best": best,
                     "best_ce": float(refs["best_counting"]["ce"].mean(1).mean()),
                     "family_ce": float(es.family_episodes[(M, k)].mean()), "M": M, "n_episodes": len(d)})
    h, dd = cfg.hmm, cfg.data
    meta = {"family": h.family, "n_states": h.n_states, "n_tokens": h.n_tokens, "rank": h.rank, "gamma": h.gamma,
            "rho": h.rho, "alpha": h.alpha, "hmm_seed": h.seed, "data_seed": dd.seed, "n_demos": dd.n_demos,
            "l_demo": dd.l_demo, "l_test": dd.l_test, "test_start": dd.test_start, "family_tasks": M,
            "fit_episodes": cfg.eval.fit_episodes, "n_episodes": n_episodes, "em_states": em_states(cfg) if em else None,
            "seconds": time.perf_counter() - t0, "references_s": t_ref - t0}
    return HeadroomResult(rows, room, counting.describe(), meta, counting.params())


def _ci(x) -> tuple[float, float, float]:
    x = np.asarray(x, float)
    m = float(x.mean())
    h = 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else math.nan
    return m, m - h, m + h
