"""In-context evaluation: the paper's Figure 1 with its ceiling and the regime references (SCIENCE.md 6, 8, 9),
and fixed memory (4).

Conventions (``pred[i, t, v]``, the model's row t restricted to the observation ids, accuracy's ties) and the
per-token metrics with their CIs: measure.scoring. The result's tables and headline metrics: measure.figure1_result.

Scored tokens. Figure 1 scores every predictor on the tokens that have a model prediction: the test segment
at positions t >= 1 of the (truncated) episode. With k >= 1 demos that is every test token (the first one
is predicted from the delimiter before it); with k = 0 the first test token is episode token 0, which no
predictor of the training objective ever sees as a target, so it is dropped for all predictors alike (the
k = 0 row scores l_test - 1 tokens; ``n_tokens`` says so).

In-context gain on the same tokens (SCIENCE.md 9): CE(k = 0) - CE(k = k_max), both over exactly the
same test tokens, the test positions 1..l_test - 1 (``KSet.same``), per episode, then the mean over episodes
with a 95% normal CI (a paired difference: the same episodes at both k). The task oracle's gain is then exactly
0 (its prediction of a test token does not depend on the demonstrations). (The by-k CE rows keep every scored
token; comparing them across k would mix in test position 0 at k >= 1 only, and bias the gain.)

Accuracy vs the number of demonstrations k is measured on a model trained with n_demos demos by keeping
only the LAST k demo blocks of each episode (``truncate_demos``); the test segment is unchanged, so the task
oracle is the same for every k, and every other predictor sees only the k kept demos (and the test prefix).

Predictors (rows of the tables, column ``predictor``): the model; the task oracle (true parameters: the
ceiling); the mixture oracle over the training tasks (the Bayes predictor of the pretraining objective:
the ceiling on seen tasks, a reference on unseen ones; absent when training on fresh tasks, hmm.n_tasks = 0);
and the references of SCIENCE.md 8-9, none of which knows a training task:
- ``family_bayes``: the mixture oracle over M tasks of the family's own stream (episodes.family_tasks,
  eval.family_tasks; 0 leaves it out): the ideal in-context learner of the family, an upper bound on that
  learner's CE for finite M; its CE at M/4 and M/2 (the first tasks of the same draw) at k = k_max is in
  ``meta["family_bayes_convergence"]`` so its convergence shows.
- ``bayes`` (unseen tasks): the Bayes-optimal predictor for a task drawn from the family's own prior (SCIENCE.md
  10, oracles/bayes.py), where the family allows it (``eval.bayes``; oracles.bayes.why_not says where not, and
  ``meta["bayes"]`` says so in one line) and only where its Monte Carlo part converged to eval.bayes_tol at that k.
  It is the ideal in-context learner: the Bayes gap of a model is its CE minus bayes' on the same episodes
  (``Figure1Result.bayes``), the room above counting best_counting - bayes, the share of it a model closes (best
  counting - model) / room. A model below bayes beyond the reference's Monte Carlo error is a fault of the reference
  or the scoring (``bayes["fault"]``), never a finding.
- ``incontext_unigram``, ``incontext_bigram``: add-one counting over the episode (oracles/baselines.py, SCIENCE.md 8).
- ``incontext_ngram``, ``incontext_ctw``, ``best_counting``: the fair counting baselines of SCIENCE.md 9 with
  their order / depth and alpha fitted per k on episodes of fit tasks (episodes.fit_episodes, never the
  evaluation episodes; baselines.fit_counting), and per k the better of the two on the fit episodes.
- ``incontext_hmm``: an HMM fit by EM to the episode's demonstrations (oracles/baselines.py; uniform at k = 0).
Every predictor has a row at every k evaluated, k = 0 included (the mixture oracle at k = 0 is what memorized
tasks give without demonstrations).

The mixture reference (``EvalSet.meta["mixture_reference"]``): the predictor that kl_mix and excess_ce are
measured against: the mixture oracle when there is a training mixture, else bayes (fresh tasks, where it is
computed at every k), else family_bayes, else the task oracle.

Tasks (column ``tasks``): "seen" = held-out episodes of the training tasks (split "eval"); "unseen" = episodes
of fresh tasks of the same family that no training episode uses (episodes.unseen_episodes, one task per
episode, a stream that depends on data.seed), scored against their task oracle. With fresh training tasks
there is no "seen" set: its rows and metrics are absent.

Statistics: per-episode means over the scored tokens, then the mean over episodes with a 95% normal CI
(mean +- 1.96 sd / sqrt(N)); per-position tables average over episodes at each test position. KL(p || q) =
sum_v p log(p / q) in nats. Paired comparisons (``Figure1Result.paired``): model minus each baseline, per
episode on the same scored tokens, mean over episodes with a 95% normal CI. The retrieval gap (SCIENCE.md 8) =
mean over unseen episodes of (model CE - task oracle CE) minus the same over seen episodes, on the test segment at
k = k_max; seen and unseen episodes are independent samples, so its 95% CI is gap +- 1.96 sqrt(s_u^2 / n_u +
s_s^2 / n_s).

Claims (stats.decide), on unseen tasks at k = k_max: ``retrieval_gap`` (rule "> 0": retrieval of memorized
tasks; needs both task sets), ``icl_gain`` (the model's in-context gain on the same tokens, rule "> 0") and
``inference_beyond_counting`` (model CE minus best_counting CE, paired, rule "< 0; requires icl_gain"). The
regime word (SCIENCE.md 9, ``regime``) follows from them: "retrieval" if the retrieval gap is supported, else
"inference beyond counting" if that claim is supported, else "worse than counting" where the model's CE is above
best_counting's on its paired CI (lower end > 0), "counting" where it is level (the CI contains 0), else
"undetermined" (below best_counting with no in-context gain shown).

Cost. The references of one task set are computed once (``eval_set``) and kept; scoring a model on them
(``score_by_k``, ``figure1_tables``) costs only the model's forward passes, so training can call it at every
evaluation step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data.episodes import Episodes, family_tasks, fit_episodes, truncate_demos
from ..data.hmm import Mixture
from ..oracles.baselines import fit_counting, incontext_bigram, incontext_unigram
from ..oracles.em_learner import DEFAULT_LEARNER, HMMLearner, incontext_hmm
from ..oracles.inference import mixture_oracle, nested_mixture_oracles, task_oracle
from . import regimes
from .bayes_gap import BayesComputed, BayesSpec, bayes_gap, bayes_preds
from .figure1_result import BASELINES, TASKS, Figure1Result
from .regimes import paired_ci, regime, regime_claims, retrieval_gap
from .scoring import mean_ci, metric_rows, model_predictive, token_metrics

__all__ = ["eval_set", "EvalSet", "KSet", "score_by_k", "figure1_tables", "figure1", "references", "anonymous"]

# how the EM learner's restarts are seeded (em_learner.py), written into Figure 1's meta with the learner's settings
_EM_SEEDING = "per fit: SeedSequence([seed, tag, k, l_demo, sha256 of the k demonstrations])"

# ---------------------------------------------------------------- evaluation sets (references computed once)


@dataclass
class KSet:
    """One k of one evaluation set: the truncated episodes, the scored columns and tokens, the oracles'
    predictions there (the model's KL needs them: task_oracle and the mixture reference, key "mixture") and every
    reference predictor's per-token metrics."""

    k: int
    episodes: Episodes
    cols: np.ndarray  # (P,) scored columns of the truncated episodes
    y: torch.Tensor  # (N, P) scored tokens
    oracles: dict[str, torch.Tensor]  # task_oracle, mixture (the mixture reference): (N, P, V) float64
    references: dict[str, dict[str, np.ndarray]]  # predictor -> per-token (N, P) acc, ce, kl_mix, kl_task
    p_true: float  # mean mixture posterior of the true task at the test start (NaN on unseen tasks)
    same: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (Q,) indices into cols: test positions >= 1


@dataclass
class EvalSet:
    """The references of one task set ("seen" / "unseen") at every k in ks (``eval_set``)."""

    tasks: str
    ks: list[int]
    by_k: dict[int, KSet]
    meta: dict = field(default_factory=dict)
    family_episodes: dict = field(default_factory=dict)  # {(M, k): per-episode family_bayes CE (N,)} (eval_set)
    family_tokens: dict = field(default_factory=dict)  # {(M, k): per-token family_bayes CE (N, P)} (eval_set)

    @property
    def n_episodes(self) -> int:
        return int(self.by_k[self.ks[0]].y.shape[0])

    @property
    def mixture_reference(self) -> str:
        return self.meta.get("mixture_reference", "mixture_oracle")


def anonymous(e: Episodes) -> Episodes:
    """e with task ids -1: an oracle over tasks other than the episodes' own must not see their ids (the CPU kernel
    orders by them)."""
    return Episodes(e.tokens, e.states, np.full(len(e), -1, np.int64), e.segment, e.position, e.n_tokens, e.n_demos,
                    e.l_demo, e.l_test, e.meta)


def eval_set(mix: Mixture | None, ep: Episodes, *, tasks: str = "seen", task_mix: Mixture | None = None,
             family: Mixture | None = None, counting=None, learner: HMMLearner | None = DEFAULT_LEARNER, ks=None,
             device="cpu", chunk_tasks: int | None = None, oracle_dtype=torch.float64,
             family_sizes: Iterable[int] = (), family_sizes_at: Iterable[int] | None = None,
             bayes: BayesSpec | BayesComputed | None = None) -> EvalSet:
    """Every reference prediction Figure 1 needs on episodes ep, at each k in ks (default 0..n_demos).

    mix: the training mixture (its mixture oracle), or None when training on fresh tasks (then tasks must be
    "unseen"). task_mix: the mixture ep's task_ids index, for the task oracle (default mix, the seen tasks; for
    unseen tasks, the mixture episodes.unseen_episodes returned). family: the family-Bayes tasks
    (episodes.family_tasks; None leaves family_bayes out); family_sizes: smaller M (the first M tasks of family)
    whose family_bayes CE goes to meta["family_bayes_convergence"] at each k of family_sizes_at (default: k_max only),
    per-episode arrays in EvalSet.family_episodes ({(M, k): (N,)}; headroom.py uses them). bayes: the Bayes reference's
    settings (``bayes_spec``; unseen tasks only, where the family allows it: module docstring). counting: the fitted counting
    baselines (baselines.fit_counting on fit-task episodes; None leaves incontext_ngram, incontext_ctw and
    best_counting out). learner: the EM learner's settings (None leaves incontext_hmm out). The add-one counting
    baselines are always there.
    """
    if tasks not in TASKS:
        raise ValueError(f"tasks must be one of {TASKS}, got {tasks!r}")
    if mix is None and (task_mix is None or tasks != "unseen"):
        raise ValueError("without a training mixture (fresh tasks) only unseen tasks, with their task_mix, are scored")
    task_mix = mix if task_mix is None else task_mix
    seen = task_mix is mix
    ks = sorted(range(ep.n_demos + 1) if ks is None else {int(k) for k in ks})
    hmm_preds = incontext_hmm(ep, ks, learner) if learner is not None else {}
    by_bayes, bayes_meta = (bayes_preds(bayes, ep, ks) if tasks == "unseen" else
                               ({}, {"computed": False, "reason": "seen tasks (the reference is for fresh tasks)"}))
    mixture = ("mixture_oracle" if mix is not None else "bayes" if bayes_meta["computed"] else "family_bayes"
               if family is not None else "task_oracle")
    convergence, conv_ep, conv_tok = [], {}, {}
    conv_ks = {max(ks)} if family_sizes_at is None else {int(k) for k in family_sizes_at}
    by_k = {}
    for k in ks:
        e = truncate_demos(ep, k)
        cols = np.flatnonzero(e.test_mask & (np.arange(e.seq_len) >= 1))
        same = np.flatnonzero(e.position[cols] >= 1)
        y = torch.as_tensor(np.asarray(e.tokens[:, cols]).astype(np.int64))
        anon = e if seen else anonymous(e)
        preds = {"task_oracle": task_oracle(task_mix, e, dtype=oracle_dtype, device=device)}
        post = None
        if mix is not None:
            preds["mixture_oracle"], post = mixture_oracle(mix, anon, chunk_tasks=chunk_tasks, posterior_at="test_start",
                                                           dtype=oracle_dtype, device=device)
        if family is not None:
            sizes = sorted({int(m) for m in family_sizes if 1 <= int(m) < family.n_tasks}) if k in conv_ks else []
            fam = nested_mixture_oracles(family, anonymous(e), sizes, chunk_tasks=chunk_tasks, dtype=oracle_dtype,
                                         device=device)  # M and every smaller size in one pass (CPU kernel)
            preds["family_bayes"] = fam[family.n_tasks]
            for m in sizes:
                p = fam[m][:, cols].to("cpu", torch.float64)
                tok_ce = (-torch.log(p.gather(-1, y[..., None])[..., 0])).numpy()  # (N, P)
                mean, lo, hi = mean_ci(tok_ce.mean(1))
                conv_ep[(m, k)], conv_tok[(m, k)] = tok_ce.mean(1), tok_ce
                convergence.append({"M": m, "k": k, "ce": float(mean), "ce_lo": float(lo), "ce_hi": float(hi)})
        if k in by_bayes:
            preds["bayes"] = by_bayes[k]
        preds["incontext_unigram"] = incontext_unigram(e)
        preds["incontext_bigram"] = incontext_bigram(e)
        if counting is not None:
            preds.update(counting.predict(e, k))
        if k in hmm_preds:
            preds["incontext_hmm"] = hmm_preds[k]
        preds = {n: p[:, cols].to("cpu", torch.float64) for n, p in preds.items()}
        oracles = {"task_oracle": preds["task_oracle"], "mixture": preds[mixture]}
        refs = {n: token_metrics(p, y, oracles) for n, p in preds.items()}
        p_true = (float(post.cpu()[torch.arange(len(e)), torch.as_tensor(e.task_ids)].double().mean())
                  if seen and post is not None else float("nan"))
        by_k[k] = KSet(k, e, cols, y, oracles, refs, p_true, same)
    if family is not None:
        smaller = bool(convergence)
        for k in sorted(conv_ks & set(ks)):
            full = by_k[k].references["family_bayes"]["ce"].mean(1)
            mean, lo, hi = mean_ci(full)
            conv_ep[(int(family.n_tasks), k)] = full
            conv_tok[(int(family.n_tasks), k)] = by_k[k].references["family_bayes"]["ce"]
            if smaller:
                convergence.append({"M": int(family.n_tasks), "k": k, "ce": float(mean), "ce_lo": float(lo),
                                    "ce_hi": float(hi)})
    V = int(ep.n_tokens)
    degenerate = {name: regimes.degenerate({k: by_k[k].references[name]["ce"] for k in ks},
                                           {k: by_k[k].same for k in ks}, V)
                  for name in by_k[ks[0]].references if name != "task_oracle"}
    meta = {"tasks": tasks, "n_episodes": len(ep), "dataset_hash": ep.meta.get("dataset_hash"),
            "degenerate": {n: {k: why for k, why in d.items() if why} for n, d in degenerate.items()
                           if any(d.values())},
            "n_task_params": int(task_mix.n_tasks), "family_tasks": None if family is None else int(family.n_tasks),
            "family_bayes_convergence": convergence, "mixture_reference": mixture, "bayes": bayes_meta,
            "counting": None if counting is None else counting.describe(),
            "incontext_hmm": None if learner is None else learner.describe()}
    return EvalSet(tasks, ks, by_k, meta, conv_ep, conv_tok)


def references(hmm, data, ev, ks=None) -> tuple[Mixture | None, object | None]:
    """The references that need their own task streams, for a run with configuration sections hmm, data and ev
    (config.EvalConfig): (family-Bayes tasks or None, fitted counting baselines or None).

    family: episodes.family_tasks(hmm, data, ev.family_tasks) (None when it is 0). counting:
    baselines.fit_counting on ev.fit_episodes episodes of fit tasks (episodes.fit_episodes; None when it is 0), at
    every k in ks (default 0..data.n_demos). Neither stream is the training, unseen-evaluation or other's (data/hmm.py)."""
    family = family_tasks(hmm, data, ev.family_tasks) if ev.family_tasks else None
    counting = None
    if ev.fit_episodes:
        _, fep = fit_episodes(hmm, data, ev.fit_episodes)
        counting = fit_counting(fep, sorted(range(data.n_demos + 1) if ks is None else {int(k) for k in ks}))
    return family, counting


def _model_tokens(model, es: EvalSet, *, device="cpu", batch_size: int = 64) -> dict[int, dict[str, np.ndarray]]:
    """The model's per-token metrics (N, P) at each k of es."""
    out = {}
    V = next(iter(es.by_k.values())).oracles["task_oracle"].shape[-1]
    for k, ks in es.by_k.items():
        p = model_predictive(model, ks.episodes.tokens, device, batch_size, n_obs=V, dtype=torch.float64)[:, ks.cols]
        out[k] = token_metrics(p, ks.y, ks.oracles)
    return out


def _same_ce(es: EvalSet, k: int, per_token: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per-episode mean CE over the same tokens at every k (test positions >= 1): (N,)."""
    return per_token["ce"][:, es.by_k[k].same].mean(1)


def _gain(es: EvalSet, tokens: Mapping[int, Mapping[str, np.ndarray]]) -> np.ndarray | None:
    """Per-episode in-context gain on the same tokens, CE(k = 0) - CE(k = k_max) (module docstring); None without
    k = 0 or with one k only."""
    if 0 not in es.ks or max(es.ks) == 0:
        return None
    return _same_ce(es, 0, tokens[0]) - _same_ce(es, max(es.ks), tokens[max(es.ks)])


@torch.no_grad()
def score_by_k(model: torch.nn.Module, es: EvalSet, *, device="cpu", batch_size: int = 64) -> dict[int, dict]:
    """The model's test-segment CE and accuracy at each k of es: {k: {"ce", "acc", "excess_ce_task", "ce_same",
    "vs_best_counting", "vs_bayes" (where best_counting, bayes are in es)}} (means over episodes of per-episode
    means; ce_same over the same tokens at every k, the in-context gain's). Only the model's forward passes run."""
    out = {}
    for k, m in _model_tokens(model, es, device=device, batch_size=batch_size).items():
        refs = es.by_k[k].references
        t = refs["task_oracle"]
        out[k] = {"ce": float(m["ce"].mean(1).mean()), "acc": float(m["acc"].mean(1).mean()),
                  "excess_ce_task": float((m["ce"] - t["ce"]).mean(1).mean()),
                  "ce_same": float(_same_ce(es, k, m).mean())}
        for name in ("best_counting", "bayes"):
            if name in refs:
                out[k][f"vs_{name}"] = float((m["ce"] - refs[name]["ce"]).mean(1).mean())
    return out



@torch.no_grad()
def figure1_tables(model: torch.nn.Module, sets: list[EvalSet], *, device="cpu", batch_size: int = 64,
                   meta: dict | None = None) -> Figure1Result:
    """Figure 1 from precomputed evaluation sets (``eval_set``): the model is scored on each, beside every
    reference; paired comparisons and in-context gains; with a "seen" and an "unseen" set, the retrieval gap claim,
    and on the unseen set with best_counting the regime claims (module docstring)."""
    by_k, by_pos, excess, paired, gains = [], [], {}, [], []
    claims: list = []
    gap, per_episode = None, {}
    k_max = min(max(es.ks) for es in sets)
    for es in sets:
        model_tok = _model_tokens(model, es, device=device, batch_size=batch_size)
        km = max(es.ks)
        for k in es.ks:
            ks = es.by_k[k]
            per_token = {"model": model_tok[k], **ks.references}
            base = {"tasks": es.tasks, "k": k, "p_true_task": ks.p_true}
            bad = {n: d[k] for n, d in es.meta.get("degenerate", {}).items() if d.get(k)}
            by_k += metric_rows(per_token, base, by_position=False, mixture=es.mixture_reference, bad=bad)
            if k == km:
                by_pos += metric_rows(per_token, base, by_position=True, mixture=es.mixture_reference,
                                positions=ks.episodes.position[ks.cols], bad=bad)
            model_ce = model_tok[k]["ce"].mean(1)
            for name in ("model", *ks.references):
                per_episode[f"{es.tasks}/k{k}/{name}"] = (model_ce if name == "model"
                                                          else ks.references[name]["ce"].mean(1)).astype(np.float32)
            for name in (n for n in BASELINES if n in ks.references):
                diff, lo, hi = paired_ci(model_ce - ks.references[name]["ce"].mean(1))
                paired.append({"tasks": es.tasks, "k": k, "baseline": name, "diff": diff, "diff_lo": lo, "diff_hi": hi,
                               "n_episodes": len(model_ce), "degenerate": bad.get(name, "")})
        gain_tokens = {name: {k: (model_tok[k] if name == "model" else es.by_k[k].references[name]) for k in es.ks}
                       for name in ("model", *es.by_k[km].references)}
        for name, tok in gain_tokens.items():
            g = _gain(es, tok)
            if g is not None:
                v, lo, hi = paired_ci(g)
                gains.append({"tasks": es.tasks, "predictor": name, "icl_gain": v, "icl_gain_lo": lo, "icl_gain_hi": hi,
                              "k_max": km, "n_episodes": len(g), "n_tokens": int(len(es.by_k[km].same))})
        excess[es.tasks] = (model_tok[km]["ce"] - es.by_k[km].references["task_oracle"]["ce"]).mean(1)
        if (es.tasks == "unseen" and "best_counting" in es.by_k[km].references and _gain(es, model_tok) is not None
                and not es.meta.get("degenerate", {}).get("best_counting", {}).get(km)):  # never a verdict from it
            vs = model_tok[km]["ce"].mean(1) - es.by_k[km].references["best_counting"]["ce"].mean(1)
            claims += regime_claims(_gain(es, model_tok), vs, km)
        if es.tasks == "unseen" and "bayes" in es.by_k[km].references:
            refs = es.by_k[km].references
            bc = refs["best_counting"]["ce"].mean(1) if "best_counting" in refs else None
            b_k = es.meta["bayes"]["by_k"][km]
            gap = bayes_gap(model_tok[km]["ce"].mean(1), refs["bayes"]["ce"].mean(1), bc, b_k["mc_se"],
                            b_k.get("last_move", 0.0))
    retrieval = None
    if {"seen", "unseen"} <= set(excess):
        c, retrieval = retrieval_gap(excess["seen"], excess["unseen"])
        claims.insert(0, c)
    return Figure1Result(by_k, by_pos, k_max, {**(meta or {}), "sets": {es.tasks: es.meta for es in sets}},
                         claims, retrieval, paired, gains, regime(claims), gap, per_episode)


def figure1(model: torch.nn.Module, mix: Mixture | None, ep: Episodes | None, *, device="cpu", ks=None,
            batch_size: int = 64, chunk_tasks: int | None = None, oracle_dtype=torch.float64,
            unseen: tuple[Mixture, Episodes] | None = None, family: Mixture | None = None, counting=None,
            family_sizes: Iterable[int] = (), learner: HMMLearner | None = DEFAULT_LEARNER,
            bayes: BayesSpec | None = None) -> Figure1Result:
    """Next-token accuracy, CE and KL on the test segment vs k (demos kept, default 0..n_demos) and vs test
    position (at the largest k) for the model and every reference predictor (module docstring), on the seen
    tasks' episodes ep and, with unseen = (unseen tasks' mixture, their episodes), on unseen tasks too. With fresh
    training tasks, mix and ep are None and only the unseen tasks are scored."""
    kw = dict(family=family, counting=counting, learner=learner, ks=ks, device=device, chunk_tasks=chunk_tasks,
              oracle_dtype=oracle_dtype)
    sets = []
    if mix is not None and ep is not None:
        sets.append(eval_set(mix, ep, tasks="seen", **{**kw, "family": None}))
    if unseen is not None:
        sets.append(eval_set(mix, unseen[1], tasks="unseen", task_mix=unseen[0], family_sizes=family_sizes, bayes=bayes,
                             **kw))
    if not sets:
        raise ValueError("figure1 needs seen episodes (mix, ep) or unseen = (mixture, episodes)")
    first = sets[0]
    e0 = first.by_k[first.ks[0]].episodes
    meta = {"n_tokens": e0.n_tokens, "n_demos": (ep if ep is not None else unseen[1]).n_demos, "l_demo": e0.l_demo,
            "l_test": e0.l_test, "n_episodes": first.n_episodes, "ks": first.ks, "test_start": e0.test_start,
            "burn_in": e0.burn_in, "dataset_hash": (ep if ep is not None else unseen[1]).meta.get("dataset_hash"),
            "predictors": list(dict.fromkeys(["model", *(n for es in sets for n in es.by_k[es.ks[0]].references)])),
            "incontext_hmm": None if learner is None else {**learner.describe(), "seeding": _EM_SEEDING},
            "counting": None if counting is None else counting.describe()}
    return figure1_tables(model, sets, device=device, batch_size=batch_size, meta=meta)

