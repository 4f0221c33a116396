"""Headroom of a family and an episode layout above counting, before any training (SCIENCE.md 9).

A model can only show in-context inference beyond counting where the family leaves room above the best counting
predictor. ``headroom(cfg)`` measures a lower bound on that room with the package's own references on unseen tasks,
per number of demonstrations k (the last k demonstrations kept, as Figure 1 does), and trains nothing:

- the task oracle (the ceiling: the true parameters of each unseen task);
- every counting baseline: add-one unigram and bigram, and the n-gram and CTW fitted on fit-task episodes
  (eval.fit_episodes, the "fit" stream; never the evaluation episodes) with ``best_counting`` per k;
- the legitimate learners: the EM-fitted HMM (``incontext_hmm``, eval.em_states states: it knows nothing of the
  family) and ``family_bayes`` (the mixture oracle over M tasks of the family's own stream: the ideal in-context
  learner of the family as M grows; at finite M its CE is an upper bound on the ideal's). Family Bayes is shown at
  M/4, M/2 and M, averaged over ``draws`` independent draws of the M tasks (draw 0 is Figure 1's), with its drop
  from M/2 to M: "converged" when the drop is below ``tolerance`` nats/token.
- a reference whose CE is above a uniform guess (ln V) at some k, or whose in-context gain on the same tokens
  (CE at k = 0 minus at k_max) is negative, is degenerate: shown, flagged, never used for a room.
- the room at each k: CE(best_counting) minus the CE of the best legitimate learner on the same episodes (paired
  per episode), where legitimate means the EM learner (always, unless degenerate) and family Bayes at M where it has
  converged and is not degenerate. It is a lower bound on the room. Its 95% CI covers the episodes and, when family
  Bayes sets it, the draw of the family tasks: half-width 1.96 sqrt(s_e^2 / N + s_d^2 / D), s_e the sd over episodes
  of the draw-averaged difference, s_d the sd over the D draws of their mean differences. The word at k_max:
  "room" (CI above 0), "no room" (family Bayes converged and no learner shown to beat counting), else
  "undetermined" (no learner shown to beat counting, family Bayes not converged or degenerate: the room may be
  larger than any shown).
- beside it, whether or not family Bayes has converged, best counting minus family Bayes at M (draw-averaged, the CI
  over episodes and draws): family Bayes at finite M is worse than the ideal learner in expectation over the draw of
  its tasks (the Bayes predictor minimizes the expected log loss), so this is also a lower bound on the room, in
  expectation. Where the legitimate learners show no room but this bound is above 0 on its CI, the word reads
  "room shown by family Bayes only (not converged ...)" (``BOUND_WORD``), never "room" or "no room".

- the Bayes-optimal reference (``bayes``, SCIENCE.md 10, oracles/bayes.py) where the family allows it and its
  Monte Carlo part converged (eval.bayes, eval.bayes_tol): a row at every k (its CE with a CI over episodes and its
  Monte Carlo standard error, ``mc_se``), and then the room is exact: CE(best counting) - CE(bayes), paired per
  episode, set_by "bayes", the word "room" (CI above 0), "no room shown" (CI reaching 0), or a FAULT where best
  counting is below it beyond its Monte Carlo error (never a finding: Bayes is optimal); family Bayes and the
  EM learner keep their rows for what they are, lower bounds, with their distance above bayes in the room row
  (family_above_bayes, em_above_bayes). Where it cannot be computed the headroom says so in one line
  (``meta["bayes"]``) and shows only the bounds, as above.

Sign convention: room = CE(best counting) - CE(learner), nats/token; positive means a learner beats counting. The one
line (`HeadroomResult.line`) says a negative room in words: "no room shown: EM is 0.161 [0.033, 0.289] nats/token worse
than counting ...".

The unseen tasks are episodes.unseen_episodes' (n_episodes tasks, one episode each, the stream of data.seed), so a
headroom and a trained model's Figure 1 with the same config and n_episodes score the same episodes. Everything
is evaluate.eval_set's: one implementation of the scored tokens, the references and their statistics.

Cost: per k and family draw, one mixture-oracle pass over the M tasks (the CPU kernel reads M/4 and M/2 off the
same pass: inference.nested_mixture_oracles), the counting grid on the fit episodes, and the EM fits;
``hmmscope bench headroom`` states it against one mixture-oracle pass over the same M tasks and episodes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import Config, em_states
from ..data.episodes import family_tasks as draw_family
from ..data.episodes import unseen_episodes
from ..oracles.bayes_structures import why_not
from ..oracles.em_learner import HMMLearner
from ..oracles.inference import nested_mixture_oracles
from ..stats import jsonable
from .bayes_gap import bayes_spec
from .evaluate import eval_set, references
from .regimes import degenerate

COLUMNS = ("k", "predictor", "M", "ce", "ce_lo", "ce_hi", "acc", "n_episodes", "degenerate", "mc_se")
LEARNERS = ("incontext_hmm", "family_bayes")  # the legitimate learners (SCIENCE.md 9)
TOLERANCE = 0.005  # nats/token: family Bayes "converged" when its CE drops less than this from M/2 to M
BOUND_WORD = ("room shown by family Bayes only (not converged: best counting - family Bayes at M is a lower bound on "
              "the room in expectation over the draw of its M tasks; no legitimate learner shows room)")
PLUS_MINUS = "± is the half-width of the 95% CI over the unseen episodes (and the family draws, for family Bayes)"
SIGN = "room = CE(best counting) - CE(best legitimate learner), nats/token: positive means a learner beats counting"


@dataclass
class HeadroomResult:
    """rows: one per (k, predictor[, M]) with CE and accuracy (mean, 95% CI) and a degenerate reason ("" if none);
    room: one per k (module docstring: the room, its CI, the learner that sets it, family Bayes' convergence);
    counting: the fitted settings; meta: the config's family and layout, M, draws, episodes, seconds."""

    rows: list[dict]
    room: list[dict]
    counting: dict
    meta: dict = field(default_factory=dict)
    fitted: dict = field(default_factory=dict)  # the fitted counting settings (CountingFit.fitted: metrics and tags)

    @property
    def k_max(self) -> int:
        return max(r["k"] for r in self.room)

    def at(self, k: int | None = None) -> dict:
        k = self.k_max if k is None else k
        return next(r for r in self.room if r["k"] == k)

    def line(self) -> str:
        """The one line: the room above counting at k_max, who sets it, and its reading."""
        r = self.at()
        n, d = self.meta["n_episodes"], self.meta["draws"]
        conv = (f"family Bayes over M = {r['M']} tasks {r['family_ce']:.3f}, "
                f"{'converged' if r['converged'] else 'not converged'} ("
                + (f"drop {r['family_drop']:+.3f} from M/2 to M" if math.isfinite(r["family_drop"]) else "no M/2 to compare")
                + f", tolerance {self.meta['tolerance']:g})" + (f", degenerate: {r['family_degenerate']}"
                                                             if r["family_degenerate"] else ""))
        if math.isfinite(r["family_bound"]):
            conv += (f"; best counting - family Bayes {r['family_bound']:+.3f} [{r['family_bound_lo']:+.3f}, "
                     f"{r['family_bound_hi']:+.3f}]")
        if r["set_by"] == "bayes":
            b = self.meta["bayes"]["by_k"][str(r["k"])]
            em = (f", the EM learner {r['em_above_bayes']:+.3f}" if math.isfinite(r.get("em_above_bayes", math.nan))
                  else "")
            return (f"room above counting at k_max = {r['k']}: {r['room']:+.3f} [{r['room_lo']:+.3f}, "
                    f"{r['room_hi']:+.3f}] nats/token, exact (set by the Bayes-optimal predictor {r['learner_ce']:.3f}, "
                    f"Monte Carlo se {b['mc_se']:.4f}, vs best counting {r['best']} {r['best_ce']:.3f}; above it: "
                    f"family Bayes over M = {r['M']} tasks {r['family_above_bayes']:+.3f}{em}; 95% CI over {n} "
                    f"unseen episodes): {r['word']}")
        if not self.meta.get("bayes", {}).get("computed", True):
            conv += f"; Bayes-optimal reference {self.meta['bayes']['reason']}"
        if r["set_by"] is None:
            return (f"room above counting at k_max = {r['k']}: none measurable [no legitimate learner] nats/token "
                    f"(best counting {r['best']} {r['best_ce']:.3f}; {conv}; {n} unseen episodes): {r['word']}")
        if r["room"] < 0 and r["word"] != BOUND_WORD:  # the best learner is worse than counting: no room shown, in words
            who = {"incontext_hmm": "EM", "family_bayes": "family Bayes"}[r["set_by"]]
            return (f"no room shown: {who} is {-r['room']:.3f} [{-r['room_hi']:.3f}, {-r['room_lo']:.3f}] nats/token "
                    f"worse than counting at k_max = {r['k']} ({who} {r['learner_ce']:.3f} vs best counting {r['best']} "
                    f"{r['best_ce']:.3f}; {conv}; 95% CI over {r['ci']}; {n} unseen episodes, {d} family "
                    f"draw{'s' if d != 1 else ''})" + ("" if r["word"] == "no room" else f": {r['word']}"))
        return (f"room above counting at k_max = {r['k']}: {r['room']:+.3f} [{r['room_lo']:+.3f}, {r['room_hi']:+.3f}] "
                f"nats/token (set by {r['set_by']} {r['learner_ce']:.3f} vs best counting {r['best']} "
                f"{r['best_ce']:.3f}; {conv}; 95% CI over {r['ci']}; {n} unseen episodes, {d} family "
                f"draw{'s' if d != 1 else ''}): {r['word']}")

    def metrics(self) -> dict[str, float]:
        """MLflow metrics: headroom/room (at k_max, with _lo / _hi), headroom/room/k<k>, headroom/<predictor>/ce/k<k>
        (family_bayes at M also as headroom/family_bayes_M<M'>/ce/k<k> for M' < M), headroom/family_drop/k<k>,
        headroom/family_converged/k<k> (0/1), headroom/set_by_family/k<k> (1 when family Bayes sets the room)."""
        out = {}
        for r in self.room:
            k = r["k"]
            out.update({f"headroom/room/k{k}": r["room"], f"headroom/room/k{k}_lo": r["room_lo"],
                        f"headroom/room/k{k}_hi": r["room_hi"], f"headroom/family_drop/k{k}": r["family_drop"],
                        f"headroom/family_converged/k{k}": float(r["converged"]),
                        f"headroom/set_by_family/k{k}": float(r["set_by"] == "family_bayes"),
                        f"headroom/set_by_bayes/k{k}": float(r["set_by"] == "bayes"),
                        f"headroom/family_bound/k{k}": r["family_bound"],
                        f"headroom/family_bound/k{k}_lo": r["family_bound_lo"],
                        f"headroom/family_bound/k{k}_hi": r["family_bound_hi"]})
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
                         "line": self.line(), "plus_minus": PLUS_MINUS, "sign": SIGN})

    def table(self) -> list[str]:
        """Plain text: CE per predictor (rows) and k (columns), degenerate references marked, then the room row and
        the learner that sets it."""
        ks = sorted({r["k"] for r in self.room})
        names = list(dict.fromkeys((r["predictor"], r["M"]) for r in self.rows))
        w = max(len(self._label(n, m)) for n, m in names) + 2
        lines = [f"{'CE (nats/token)':<{w}}" + "".join(f"{'k = ' + str(k):>16}" for k in ks)]
        for n, m in names:
            cells = {r["k"]: r for r in self.rows if r["predictor"] == n and r["M"] == m}
            bad = _degenerate_note(cells)
            lines.append(f"{self._label(n, m):<{w}}" + "".join(
                (f"{cells[k]['ce']:>7.3f}{'*' if cells[k]['degenerate'] else ' '}± "
                 f"{(cells[k]['ce_hi'] - cells[k]['ce_lo']) / 2:.3f}") if k in cells
                else f"{'':>16}" for k in ks) + (f"   * DEGENERATE ({'; '.join(bad)})" if bad else ""))
        by = sorted(self.room, key=lambda r: r["k"])
        lines.append(f"{'room':<{w}}" + "".join(
            f"{r['room']:>+8.3f} ± {(r['room_hi'] - r['room_lo']) / 2:.3f}" if r["set_by"] else f"{'-':>16}" for r in by))
        lines.append(f"{'  set by':<{w}}" + "".join(f"{_short(r['set_by']):>16}" for r in by))
        lines.append(f"{'  bound: family Bayes':<{w}}" + "".join(
            f"{r['family_bound']:>+8.3f} ± {(r['family_bound_hi'] - r['family_bound_lo']) / 2:.3f}"
            if math.isfinite(r["family_bound"]) else f"{'-':>16}" for r in by))
        lines.append(f"{'  family Bayes':<{w}}" + "".join(
            f"{'converged' if r['converged'] else 'not conv.':>16}" for r in by))
        return lines

    @staticmethod
    def _label(name: str, M: int | None) -> str:
        return f"{name} (M = {M})" if M else name


def _degenerate_note(cells: dict[int, dict]) -> list[str]:
    """Why a row is degenerate, each reason once with the k it holds at ("at every k" when all; before: the same
    reason once per k)."""
    at: dict[str, list[int]] = {}
    for k, r in sorted(cells.items()):
        if r["degenerate"]:
            at.setdefault(r["degenerate"], []).append(k)
    return [f"{why} at {'every k' if len(ks) == len(cells) > 1 else 'k = ' + ', '.join(map(str, ks))}"
            for why, ks in at.items()]


def _short(name: str | None) -> str:
    return {"incontext_hmm": "EM learner", "family_bayes": "family Bayes", "bayes": "Bayes (exact)", None: "none"}[name]


def headroom(cfg: Config, *, n_episodes: int = 256, family_tasks: int | None = None, em: bool = True,
             device: str = "cpu", ks=None, draws: int = 2, tolerance: float = TOLERANCE,
             progress: Callable[[str], None] | None = None) -> HeadroomResult:
    """The headroom of cfg's family and layout (module docstring): n_episodes unseen episodes, family_tasks tasks in
    family_bayes (default eval.family_tasks, which must then be >= 1) in `draws` independent draws, the counting
    baselines fitted on eval.fit_episodes (>= 8) fit-task episodes, at every k in ks (default 0..data.n_demos).
    progress(msg) is called as each phase starts."""
    say = progress or (lambda msg: None)
    M = int(cfg.eval.family_tasks if family_tasks is None else family_tasks)
    if M < 1:
        raise ValueError(f"the headroom needs family_bayes: family_tasks must be >= 1, got {M}")
    if cfg.eval.fit_episodes < 8:
        raise ValueError(f"the headroom needs the fitted counting baselines: eval.fit_episodes must be >= 8, got "
                         f"{cfg.eval.fit_episodes}")
    if n_episodes < 2:
        raise ValueError(f"n_episodes must be >= 2 (a CI over episodes), got {n_episodes}")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise ValueError(f"tolerance must be a positive number of nats/token, got {tolerance}")
    ks = sorted(range(cfg.data.n_demos + 1) if ks is None else {int(k) for k in ks})
    t0 = time.perf_counter()
    say(f"fitting the counting baselines on {cfg.eval.fit_episodes} fit-task episodes; drawing {M} family tasks")
    ev = dataclasses.replace(cfg.eval, family_tasks=M)
    family, counting = references(cfg.hmm, cfg.data, ev, ks)
    t_ref = time.perf_counter()
    umix, uep = unseen_episodes(cfg.hmm, cfg.data, n_episodes)
    sizes = sorted({m for m in (M // 4, M // 2) if m >= 1 and m < M})
    say(f"scoring {n_episodes} unseen episodes at k = {ks[0]}..{ks[-1]}: oracles, counting"
        + (", EM learner" if em else "") + f", family Bayes (draw 1 of {draws})"
        + (", the Bayes-optimal reference" if cfg.eval.bayes and why_not(cfg.hmm) is None else ""))
    es = eval_set(None, uep, tasks="unseen", task_mix=umix, family=family, counting=counting,
                  learner=HMMLearner(n_states=em_states(cfg)) if em else None, ks=ks, device=device,
                  family_sizes=sizes, family_sizes_at=ks, bayes=bayes_spec(cfg))
    bmeta = es.meta["bayes"]
    # per-token family-Bayes CE {(M', k): [(N, P) per draw]}, draw 0 from eval_set
    fam_tok = {(m, k): [es.family_tokens[(m, k)]] for k in ks for m in (*sizes, M)}
    for j in range(1, draws):
        say(f"family Bayes, draw {j + 1} of {draws} ({M} tasks)")
        fam_j = draw_family(cfg.hmm, cfg.data, M, draw=j)
        for k in ks:
            ksd = es.by_k[k]
            preds = nested_mixture_oracles(fam_j, ksd.episodes, sizes, device=device, dtype=torch.float64)
            for m, p in preds.items():
                p = p[:, ksd.cols].to("cpu", torch.float64)
                fam_tok[(m, k)].append((-torch.log(p.gather(-1, ksd.y[..., None])[..., 0])).numpy())
    V = cfg.hmm.n_tokens
    k0, kmax = min(ks), max(ks)
    same = {k: es.by_k[k].same for k in ks}

    def bad_at(tok: dict[int, np.ndarray]) -> dict[int, str]:
        return degenerate(tok, same, V)

    refs_tok = {name: {k: es.by_k[k].references[name]["ce"] for k in ks} for name in es.by_k[k0].references
                if name != "family_bayes" and all(name in es.by_k[k].references for k in ks)}
    bad = {name: bad_at(tok) for name, tok in refs_tok.items()}
    fam_mean = {(m, k): np.mean(v, 0) for (m, k), v in fam_tok.items()}  # draw-averaged (N, P)
    bad_fam = {m: bad_at({k: fam_mean[(m, k)] for k in ks}) for m in (*sizes, M)}
    rows, room = [], []
    for k in ks:
        refs = es.by_k[k].references
        for name, m in refs.items():
            if name == "family_bayes":
                continue
            ce, lo, hi = _ci(m["ce"].mean(1))
            rows.append({"k": k, "predictor": name, "M": None, "ce": ce, "ce_lo": lo, "ce_hi": hi,
                         "acc": float(m["acc"].mean()), "n_episodes": len(m["ce"]), "degenerate": bad.get(name, {}).get(k, ""),
                         "mc_se": bmeta["by_k"][k]["mc_se"] if name == "bayes" else math.nan})
        for m in (*sizes, M):
            ce, lo, hi = _ci_draws([t.mean(1) for t in fam_tok[(m, k)]])
            acc = float(refs["family_bayes"]["acc"].mean()) if m == M and draws == 1 else math.nan
            rows.append({"k": k, "predictor": "family_bayes", "M": m, "ce": ce, "ce_lo": lo, "ce_hi": hi, "acc": acc,
                         "n_episodes": n_episodes, "degenerate": bad_fam[m][k]})
        room.append(_room(k, refs, counting.by_k[k]["best_counting"], [t.mean(1) for t in fam_tok[(M, k)]],
                          fam_mean[(sizes[-1], k)].mean(1) if sizes else None, {n: b[k] for n, b in bad.items()},
                          bad_fam[M][k], M, tolerance,
                          em and "incontext_hmm" in refs, (bmeta.get("by_k") or {}).get(k, {}).get("mc_se", math.nan)))
    h, dd = cfg.hmm, cfg.data
    meta = {"family": h.family, "n_states": h.n_states, "n_tokens": h.n_tokens, "rank": h.rank, "gamma": h.gamma,
            "rho": h.rho, "alpha": h.alpha, "hmm_seed": h.seed, "data_seed": dd.seed, "n_demos": dd.n_demos,
            "l_demo": dd.l_demo, "l_test": dd.l_test, "test_start": dd.test_start, "family_tasks": M,
            "draws": draws, "tolerance": tolerance, "fit_episodes": cfg.eval.fit_episodes, "n_episodes": n_episodes,
            "em_states": em_states(cfg) if em else None, "seconds": time.perf_counter() - t0,
            "references_s": t_ref - t0,
            "family_draws_at_k_max": [float(t.mean()) for t in fam_tok[(M, kmax)]],
            "bayes": {"computed": bool(bmeta["computed"]), "reason": bmeta.get("reason", ""),
                      "by_k": {str(k): {n: v for n, v in b.items()} for k, b in (bmeta.get("by_k") or {}).items()}}}
    return HeadroomResult(rows, room, counting.describe(), meta, counting.fitted())


def _room(k, refs, best_name, fam_draws, fam_half, bad, bad_fam, M, tolerance, em, bayes_se=math.nan) -> dict:
    """The room at k (module docstring) from the per-episode CEs: refs (eval_set's), family Bayes at M per draw
    [(N,)], family Bayes at the largest smaller size (draw-averaged, (N,)) or None."""
    bc = refs["best_counting"]["ce"].mean(1)  # (N,)
    fam = np.mean(fam_draws, 0)
    drop = float(fam_half.mean() - fam.mean()) if fam_half is not None else math.nan
    converged = bool(math.isfinite(drop) and drop < tolerance)
    cands = {}
    if em and not bad["incontext_hmm"]:
        cands["incontext_hmm"] = refs["incontext_hmm"]["ce"].mean(1)
    if converged and not bad_fam:
        cands["family_bayes"] = fam
    fb, fb_lo, fb_hi = _ci_draws([bc - f for f in fam_draws]) if not bad_fam else (math.nan,) * 3
    out = {"k": k, "best": best_name, "best_ce": float(bc.mean()), "family_ce": float(fam.mean()),
           "family_drop": drop, "converged": converged, "family_degenerate": bad_fam, "M": M, "n_episodes": len(bc),
           "em_ce": float(refs["incontext_hmm"]["ce"].mean(1).mean()) if em else math.nan,
           "family_bound": fb, "family_bound_lo": fb_lo, "family_bound_hi": fb_hi}
    bound = not converged and fb_lo > 0  # family Bayes at M, not converged, beats counting on its CI
    if "bayes" in refs and not bad.get("bayes"):  # exact (module docstring): the bounds stay rows
        b = refs["bayes"]["ce"].mean(1)
        r, lo, hi = _ci(bc - b)
        se = float(bayes_se) if math.isfinite(bayes_se) else 0.0
        word = ("room" if lo > 0 else "FAULT: best counting below the Bayes-optimal reference beyond its Monte Carlo "
                "error (a fault of the reference or the scoring)" if hi + 3 * se < 0 else "no room shown (CI reaches 0)")
        return {**out, "room": r, "room_lo": lo, "room_hi": hi, "set_by": "bayes", "learner_ce": float(b.mean()),
                "ci": "episodes", "word": word,
                "family_above_bayes": float(fam.mean() - b.mean()),
                "em_above_bayes": out["em_ce"] - float(b.mean()) if em else math.nan}
    if not cands:
        return {**out, "room": math.nan, "room_lo": math.nan, "room_hi": math.nan, "set_by": None,
                "learner_ce": math.nan, "ci": "",
                "word": BOUND_WORD if bound else "undetermined (no legitimate learner)"}
    name = min(cands, key=lambda n: cands[n].mean())
    if name == "family_bayes":
        r, lo, hi = _ci_draws([bc - f for f in fam_draws])
        how = f"episodes and {len(fam_draws)} family draws" if len(fam_draws) > 1 else "episodes"
    else:
        r, lo, hi = _ci(bc - cands[name])
        how = "episodes"
    if lo > 0:
        word = "room"
    elif converged and not bad_fam:
        word = "no room"
    elif bound:
        word = BOUND_WORD
    else:
        word = "undetermined: no learner shown to beat counting, family Bayes " + (
            "degenerate" if bad_fam else "not converged") + " (the room may be larger than shown)"
    return {**out, "room": r, "room_lo": lo, "room_hi": hi, "set_by": name, "learner_ce": float(cands[name].mean()),
            "ci": how, "word": word}


def _ci(x) -> tuple[float, float, float]:
    """Mean and 95% normal CI over episodes."""
    x = np.asarray(x, float)
    m = float(x.mean())
    h = 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else math.nan
    return m, m - h, m + h


def _ci_draws(per_draw: list) -> tuple[float, float, float]:
    """Mean over D draws x N episodes of per-episode values [(N,)] and its 95% CI over the episodes and the draws:
    half-width 1.96 sqrt(s_e^2 / N + s_d^2 / D) (module docstring); with one draw, the CI over episodes."""
    a = np.asarray(per_draw, float)  # (D, N)
    if len(a) == 1:
        return _ci(a[0])
    m = float(a.mean())
    e = a.mean(0)
    se2 = float(e.var(ddof=1)) / a.shape[1] + float(a.mean(1).var(ddof=1)) / a.shape[0]
    h = 1.96 * math.sqrt(se2)
    return m, m - h, m + h
