"""In-context evaluation: the paper's Figure 1 with its ceiling and the regime references (SCIENCE.md 6, 8),
and fixed memory (4).

Conventions (shared with hmmscope.inference and hmmscope.baselines): ``pred[i, t, v] = p(token_t = v |
tokens_<t)``, an (N, T, V) tensor over the V observation ids, NaN rows where no prediction is scored (t = 0
for the model, and every non-observation token). The model's row t is the softmax of its logits at t - 1
*restricted to the V observation ids* (the delimiter/padding logits are dropped and the rest renormalized):
the delimiter is never a target, so the predictors are compared on the same simplex. (train.evaluate_loss
takes the argmax over the full vocabulary; the two agree unless the model puts its top logit on the
delimiter.) Accuracy is argmax == token, ties to the lowest id, for every predictor.

Scored tokens. Figure 1 scores every predictor on the tokens that have a model prediction: the test segment
at positions t >= 1 of the (truncated) episode. With k >= 1 demos that is every test token (the first one
is predicted from the delimiter before it); with k = 0 the first test token is episode token 0, which no
predictor of the training objective ever sees as a target, so it is dropped for all predictors alike (the
k = 0 row scores l_test - 1 tokens; ``n_tokens`` says so).

Accuracy vs the number of demonstrations k is measured on a model trained with n_demos demos by keeping
only the LAST k demo blocks of each episode (``truncate_demos``); the test segment is unchanged, so the task
oracle is the same for every k, and every other predictor sees only the k kept demos (and the test prefix).

Predictors (rows of the tables, column ``predictor``): the model; the task oracle (true parameters: the
ceiling); the mixture oracle over the training tasks (the Bayes predictor of the pretraining objective:
the ceiling on seen tasks, a reference on unseen ones); and the references of SCIENCE.md 8, none of which
knows a training task except the first: ``other_mixture_oracle`` (the Bayes predictor of a mixture of
n_tasks OTHER tasks of the family, hmm.make_mixture(stream="other"): what knowing the family's typical tasks
gives without the training tasks), ``incontext_unigram`` and ``incontext_bigram`` (add-one counting over the
episode, baselines.py), ``incontext_hmm`` (an HMM fit by EM to the episode's demonstrations, baselines.py;
uniform at k = 0). Every predictor has a row at every k evaluated, k = 0 included (the mixture oracle at
k = 0 is what memorized tasks give without demonstrations).

Tasks (column ``tasks``): "seen" = held-out episodes of the training tasks (split "eval"); "unseen" = episodes
of fresh tasks of the same family that no training episode uses (episodes.unseen_episodes, one task per
episode), scored against their task oracle.

Statistics: per-episode means over the scored tokens, then the mean over episodes with a 95% normal CI
(mean +- 1.96 sd / sqrt(N)); per-position tables average over episodes at each test position. KL(p || q) =
sum_v p log(p / q) in nats. The retrieval gap (SCIENCE.md 8) = mean over unseen episodes of (model CE - task
oracle CE) minus the same over seen episodes, on the test segment at k = k_max; seen and unseen episodes are
independent samples, so its 95% CI is gap +- 1.96 sqrt(s_u^2 / n_u + s_s^2 / n_s). It is a claim with rule
"> 0" (the model does better, relative to the ceiling, on the tasks it trained on: retrieval), decided by
stats.decide.

Cost. The references of one task set are computed once (``eval_set``) and kept; scoring a model on them
(``score_by_k``, ``figure1_tables``) costs only the model's forward passes, so training can call it at every
evaluation step.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .baselines import DEFAULT_LEARNER, HMMLearner, incontext_bigram, incontext_hmm, incontext_unigram
from .episodes import Episodes, truncate_demos
from .hmm import Mixture
from .inference import memory_error, mixture_oracle, task_oracle
from .stats import claim, jsonable, rule

__all__ = ["model_predictive", "truncate_demos", "eval_set", "EvalSet", "score_by_k", "figure1_tables", "figure1",
           "Figure1Result", "retrieval_gap", "build_figure1", "plot_figure1", "memory_comparison", "receptive_field",
           "PREDICTORS", "REFERENCES", "BASELINES", "TASKS"]

REFERENCES = ("task_oracle", "mixture_oracle", "other_mixture_oracle", "incontext_unigram", "incontext_bigram",
              "incontext_hmm")
PREDICTORS = ("model", *REFERENCES)
BASELINES = REFERENCES[2:]  # logged under baseline/<tasks>/<name>/...
TASKS = ("seen", "unseen")
_Z = 1.96


@torch.no_grad()
def model_predictive(model: torch.nn.Module, tokens, device="cpu", batch_size: int = 64, *,
                     n_obs: int | None = None, dtype=torch.float32) -> torch.Tensor:
    """The model's p(token_t | tokens_<t) over the n_obs observation ids: (N, T, n_obs) on the CPU.

    Feeds ``tokens[:, :-1]`` (as training does) and takes softmax(logits[:, t-1, :n_obs]) for row t;
    row 0 and rows whose token is not an observation (delimiter, padding) are NaN, as in the oracles.
    n_obs defaults to ``model.vocab_size - 1`` (observations plus one delimiter).
    """
    tok = torch.as_tensor(np.asarray(tokens).astype(np.int64)) if not isinstance(tokens, torch.Tensor) else tokens
    tok = tok.long().cpu()
    V = int(n_obs if n_obs is not None else model.vocab_size - 1)
    N, T = tok.shape
    out = torch.full((N, T, V), float("nan"), dtype=dtype)
    was_training = model.training
    model.eval()
    try:
        for lo in range(0, N, batch_size):
            logits, _ = model(tok[lo:lo + batch_size, :-1].to(device))
            out[lo:lo + batch_size, 1:] = torch.softmax(logits[..., :V].double(), -1).to("cpu", dtype)
    finally:
        model.train(was_training)
    out[(tok < 0) | (tok >= V)] = float("nan")
    return out


# ---------------------------------------------------------------- statistics


def _mean_ci(x: np.ndarray, axis: int = 0):
    """Mean and 95% normal CI along axis (NaN half-width when fewer than 2 values)."""
    n = x.shape[axis]
    m = x.mean(axis)
    se = x.std(axis, ddof=1) / math.sqrt(n) if n > 1 else np.full_like(m, np.nan)
    return m, m - _Z * se, m + _Z * se


def _kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last axis (terms with p = 0 are 0; q = 0 where p > 0 gives inf)."""
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(-1)


def _token_metrics(pred: torch.Tensor, y: torch.Tensor, ref: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Per-token (N, P) arrays: hit, nll, kl_mix, kl_task for predictions pred (N, P, V) of tokens y."""
    p_y = pred.gather(-1, y[..., None])[..., 0]
    return {"acc": (pred.argmax(-1) == y).double().numpy(), "ce": (-torch.log(p_y)).numpy(),
            "kl_mix": _kl(ref["mixture_oracle"], pred).numpy(), "kl_task": _kl(ref["task_oracle"], pred).numpy()}


_METRICS = ("acc", "ce", "kl_mix", "kl_task", "excess_ce", "excess_ce_task")


def _rows(per_token: dict[str, dict[str, np.ndarray]], base: dict, by_position: bool, positions=None) -> list[dict]:
    """Table rows: one per predictor (and per position if by_position), metrics with 95% CIs."""
    out = []
    for name, m in per_token.items():
        m = {**m, "excess_ce": m["ce"] - per_token["mixture_oracle"]["ce"],
             "excess_ce_task": m["ce"] - per_token["task_oracle"]["ce"]}
        if by_position:  # statistics over episodes at each test position
            stats = {key: _mean_ci(m[key], 0) for key in _METRICS}
            for j, p in enumerate(positions):
                row = {**base, "position": int(p), "predictor": name, "n_episodes": m["acc"].shape[0]}
                for key in _METRICS:
                    row.update({key: float(stats[key][0][j]), f"{key}_lo": float(stats[key][1][j]),
                                f"{key}_hi": float(stats[key][2][j])})
                out.append(row)
        else:  # per-episode means, then statistics over episodes
            row = {**base, "predictor": name, "n_episodes": m["acc"].shape[0], "n_tokens": m["acc"].shape[1]}
            for key in _METRICS:
                mean, lo, hi = _mean_ci(m[key].mean(1))
                row.update({key: float(mean), f"{key}_lo": float(lo), f"{key}_hi": float(hi)})
            out.append(row)
    return out


# ---------------------------------------------------------------- evaluation sets (references computed once)


@dataclass
class KSet:
    """One k of one evaluation set: the truncated episodes, the scored columns and tokens, the two oracles'
    predictions there (the model's KL needs them) and every reference predictor's per-token metrics."""

    k: int
    episodes: Episodes
    cols: np.ndarray  # (P,) scored columns of the truncated episodes
    y: torch.Tensor  # (N, P) scored tokens
    oracles: dict[str, torch.Tensor]  # task_oracle, mixture_oracle: (N, P, V) float64
    references: dict[str, dict[str, np.ndarray]]  # predictor -> per-token (N, P) acc, ce, kl_mix, kl_task
    p_true: float  # mean mixture posterior of the true task at the test start (NaN on unseen tasks)


@dataclass
class EvalSet:
    """The references of one task set ("seen" / "unseen") at every k in ks (``eval_set``)."""

    tasks: str
    ks: list[int]
    by_k: dict[int, KSet]
    meta: dict = field(default_factory=dict)

    @property
    def n_episodes(self) -> int:
        return int(self.by_k[self.ks[0]].y.shape[0])


def eval_set(mix: Mixture, ep: Episodes, *, tasks: str = "seen", task_mix: Mixture | None = None,
             other: Mixture | None = None, learner: HMMLearner | None = DEFAULT_LEARNER, ks=None, device="cpu",
             chunk_tasks: int | None = None, oracle_dtype=torch.float64) -> EvalSet:
    """Every reference prediction Figure 1 needs on episodes ep, at each k in ks (default 0..n_demos).

    mix: the training mixture (its mixture oracle). task_mix: the mixture ep's task_ids index, for the task
    oracle (default mix, the seen tasks; for unseen tasks, the mixture episodes.unseen_episodes returned).
    other: the other-tasks mixture (row other_mixture_oracle; None leaves the row out). learner: the EM
    learner's settings (None leaves incontext_hmm out). The counting baselines are always there.
    """
    if tasks not in TASKS:
        raise ValueError(f"tasks must be one of {TASKS}, got {tasks!r}")
    task_mix = mix if task_mix is None else task_mix
    seen = task_mix is mix
    ks = sorted(range(ep.n_demos + 1) if ks is None else {int(k) for k in ks})
    hmm_preds = incontext_hmm(ep, ks, learner) if learner is not None else {}
    by_k = {}
    for k in ks:
        e = truncate_demos(ep, k)
        cols = np.flatnonzero(e.test_mask & (np.arange(e.seq_len) >= 1))
        y = torch.as_tensor(np.asarray(e.tokens[:, cols]).astype(np.int64))
        # an oracle over tasks other than the episodes' own must not see their ids (the CPU kernel orders by them)
        anon = e if seen else Episodes(e.tokens, e.states, np.full(len(e), -1, np.int64), e.segment, e.position,
                                       e.n_tokens, e.n_demos, e.l_demo, e.l_test, e.meta)
        mix_pred, post = mixture_oracle(mix, anon, chunk_tasks=chunk_tasks, posterior_at="test_start",
                                        dtype=oracle_dtype, device=device)
        preds = {"task_oracle": task_oracle(task_mix, e, dtype=oracle_dtype, device=device), "mixture_oracle": mix_pred}
        if other is not None:
            preds["other_mixture_oracle"] = mixture_oracle(other, Episodes(
                e.tokens, e.states, np.full(len(e), -1, np.int64), e.segment, e.position, e.n_tokens, e.n_demos,
                e.l_demo, e.l_test, e.meta), chunk_tasks=chunk_tasks, dtype=oracle_dtype, device=device)[0]
        preds["incontext_unigram"] = incontext_unigram(e)
        preds["incontext_bigram"] = incontext_bigram(e)
        if k in hmm_preds:
            preds["incontext_hmm"] = hmm_preds[k]
        preds = {n: p[:, cols].to("cpu", torch.float64) for n, p in preds.items()}
        oracles = {n: preds[n] for n in ("task_oracle", "mixture_oracle")}
        refs = {n: _token_metrics(p, y, oracles) for n, p in preds.items()}
        p_true = (float(post.cpu()[torch.arange(len(e)), torch.as_tensor(e.task_ids)].double().mean()) if seen
                  else float("nan"))
        by_k[k] = KSet(k, e, cols, y, oracles, refs, p_true)
    meta = {"tasks": tasks, "n_episodes": len(ep), "dataset_hash": ep.meta.get("dataset_hash"),
            "n_task_params": int(task_mix.n_tasks), "other_tasks": None if other is None else int(other.n_tasks),
            "incontext_hmm": None if learner is None else learner.describe()}
    return EvalSet(tasks, ks, by_k, meta)


def _model_tokens(model, es: EvalSet, *, device="cpu", batch_size: int = 64) -> dict[int, dict[str, np.ndarray]]:
    """The model's per-token metrics (N, P) at each k of es."""
    out = {}
    V = next(iter(es.by_k.values())).oracles["task_oracle"].shape[-1]
    for k, ks in es.by_k.items():
        p = model_predictive(model, ks.episodes.tokens, device, batch_size, n_obs=V, dtype=torch.float64)[:, ks.cols]
        out[k] = _token_metrics(p, ks.y, ks.oracles)
    return out


@torch.no_grad()
def score_by_k(model: torch.nn.Module, es: EvalSet, *, device="cpu", batch_size: int = 64) -> dict[int, dict]:
    """The model's test-segment CE and accuracy at each k of es: {k: {"ce", "acc", "excess_ce_task"}} (means over
    episodes of per-episode means). Only the model's forward passes are computed (the references are in es)."""
    out = {}
    for k, m in _model_tokens(model, es, device=device, batch_size=batch_size).items():
        t = es.by_k[k].references["task_oracle"]
        out[k] = {"ce": float(m["ce"].mean(1).mean()), "acc": float(m["acc"].mean(1).mean()),
                  "excess_ce_task": float((m["ce"] - t["ce"]).mean(1).mean())}
    return out


def retrieval_gap(seen: np.ndarray, unseen: np.ndarray):
    """The retrieval-gap claim from per-episode excess CE over the task oracle on seen and unseen episodes
    (module docstring): stats.Claim with rule '> 0', plus the numbers as a dict."""
    seen, unseen = np.asarray(seen, float), np.asarray(unseen, float)
    value = float(unseen.mean() - seen.mean())
    se = math.sqrt(unseen.var(ddof=1) / len(unseen) + seen.var(ddof=1) / len(seen)) \
        if min(len(seen), len(unseen)) > 1 else float("nan")
    lo, hi = value - _Z * se, value + _Z * se
    c = claim("retrieval_gap", "(model CE - task-oracle CE) on unseen tasks minus on seen tasks, test segment, "
              "k = k_max, nats/token (difference of means over independent episodes, 95% normal CI)",
              value, lo, hi, rule(">", 0),
              "positive: the model is closer to the ceiling on the tasks it trained on than on fresh tasks of the "
              "same family (retrieval of memorized tasks); near 0: in-context inference")
    return c, {"value": value, "lo": lo, "hi": hi, "n_seen": len(seen), "n_unseen": len(unseen),
               "seen_excess_ce_task": float(seen.mean()), "unseen_excess_ce_task": float(unseen.mean())}


@dataclass
class Figure1Result:
    """Figure 1 tables as lists of dicts. by_k: one row per (tasks, k, predictor); by_position: one row per
    (tasks, test position, predictor) at k = k_max (the largest k evaluated, normally n_demos).
    Columns: tasks (seen / unseen), k, [position], predictor, n_episodes, [n_tokens], p_true_task (mixture
    posterior of the true task at the test start, same on every predictor row; empty on unseen tasks), and for
    each metric acc, ce, kl_mix (KL(mixture oracle || predictor)), kl_task (KL(task oracle || predictor)),
    excess_ce (CE - mixture oracle CE), excess_ce_task (CE - task oracle CE): the mean and its 95% CI as
    <metric>_lo/_hi. (A row's n_tokens counts the scored tokens; meta['n_tokens'] is V.) claims: the
    retrieval gap (when both task sets were evaluated); retrieval: its numbers."""

    by_k: list[dict]
    by_position: list[dict]
    k_max: int
    meta: dict = field(default_factory=dict)
    claims: list = field(default_factory=list)
    retrieval: dict | None = None

    @property
    def tasks(self) -> list[str]:
        return [t for t in TASKS if any(r["tasks"] == t for r in self.by_k)]

    def row(self, predictor: str, k: int | None = None, tasks: str = "seen") -> dict:
        k = self.k_max if k is None else k
        return next(r for r in self.by_k if r["k"] == k and r["predictor"] == predictor and r["tasks"] == tasks)

    def headline(self) -> dict[str, float]:
        """Scalar metrics at k = k_max for MLflow: eval/<tasks>/... (the model and the two oracles),
        baseline/<tasks>/<reference>/{ce, acc, ce_k0, acc_k0} (the references; the mixture oracle's k = 0 values
        as baseline/<tasks>/mixture_oracle/{ce_k0, acc_k0}), eval/retrieval_gap with _lo / _hi."""
        out: dict[str, float] = {}
        names = {r["predictor"] for r in self.by_k}
        k0 = 0 in {r["k"] for r in self.by_k}
        for tasks in self.tasks:
            m, t, x = (self.row(n, tasks=tasks) for n in ("model", "task_oracle", "mixture_oracle"))
            p = f"eval/{tasks}/"
            out.update({p + "test_acc": m["acc"], p + "test_ce": m["ce"],
                        p + "oracle_mix_test_acc": x["acc"], p + "oracle_mix_test_ce": x["ce"],
                        p + "oracle_task_test_acc": t["acc"], p + "oracle_task_test_ce": t["ce"],
                        p + "kl_mix": m["kl_mix"], p + "kl_task": m["kl_task"], p + "excess_ce": m["excess_ce"],
                        p + "excess_ce_task": m["excess_ce_task"], p + "gap_to_mix": x["acc"] - m["acc"],
                        p + "gap_to_task": t["acc"] - m["acc"]})
            if tasks == "seen":
                out[p + "p_true_task"] = m["p_true_task"]
            for name in [n for n in BASELINES if n in names]:
                r = self.row(name, tasks=tasks)
                out.update({f"baseline/{tasks}/{name}/ce": r["ce"], f"baseline/{tasks}/{name}/acc": r["acc"]})
            for name in [n for n in ("mixture_oracle", *BASELINES) if n in names] if k0 else []:
                r = self.row(name, 0, tasks)
                out.update({f"baseline/{tasks}/{name}/ce_k0": r["ce"], f"baseline/{tasks}/{name}/acc_k0": r["acc"]})
        if self.retrieval is not None:
            g = self.retrieval
            out.update({"eval/retrieval_gap": g["value"], "eval/retrieval_gap_lo": g["lo"],
                        "eval/retrieval_gap_hi": g["hi"]})
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}

    def to_dict(self) -> dict:
        """JSON-safe (NaN / inf -> None)."""
        return jsonable({"by_k": self.by_k, "by_position": self.by_position, "k_max": self.k_max,
                         "meta": self.meta, "headline": self.headline(), "claims": self.claims,
                         "retrieval": self.retrieval})

    def to_csv(self, directory) -> list[Path]:
        """Write figure1_by_k.csv and figure1_by_position.csv into directory; returns the paths."""
        from .safe_output import atomic_open, make_dir

        d = make_dir(directory)
        paths = []
        for name, rows in (("figure1_by_k.csv", self.by_k), ("figure1_by_position.csv", self.by_position)):
            with atomic_open(d / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                            for r in rows)
            paths.append(d / name)
        return paths


@torch.no_grad()
def figure1_tables(model: torch.nn.Module, sets: list[EvalSet], *, device="cpu", batch_size: int = 64,
                   meta: dict | None = None) -> Figure1Result:
    """Figure 1 from precomputed evaluation sets (``eval_set``): the model is scored on each, beside every
    reference; with a "seen" and an "unseen" set, the retrieval gap claim is added."""
    by_k, by_pos, excess = [], [], {}
    k_max = min(max(es.ks) for es in sets)
    for es in sets:
        model_tok = _model_tokens(model, es, device=device, batch_size=batch_size)
        for k in es.ks:
            ks = es.by_k[k]
            per_token = {"model": model_tok[k], **ks.references}
            base = {"tasks": es.tasks, "k": k, "p_true_task": ks.p_true}
            by_k += _rows(per_token, base, by_position=False)
            if k == max(es.ks):
                by_pos += _rows(per_token, base, by_position=True, positions=ks.episodes.position[ks.cols])
        km = es.by_k[max(es.ks)]
        excess[es.tasks] = (model_tok[max(es.ks)]["ce"] - km.references["task_oracle"]["ce"]).mean(1)
    claims, gap = [], None
    if {"seen", "unseen"} <= set(excess):
        c, gap = retrieval_gap(excess["seen"], excess["unseen"])
        claims.append(c)
    return Figure1Result(by_k, by_pos, k_max, {**(meta or {}), "sets": {es.tasks: es.meta for es in sets}},
                         claims, gap)


def figure1(model: torch.nn.Module, mix: Mixture, ep: Episodes, *, device="cpu", ks=None, batch_size: int = 64,
            chunk_tasks: int | None = None, oracle_dtype=torch.float64, unseen: tuple[Mixture, Episodes] | None = None,
            other: Mixture | None = None, learner: HMMLearner | None = DEFAULT_LEARNER) -> Figure1Result:
    """Next-token accuracy, CE and KL on the test segment vs k (demos kept, default 0..n_demos) and vs test
    position (at the largest k) for the model and every reference predictor (module docstring), on the seen
    tasks' episodes ep and, with unseen = (unseen tasks' mixture, their episodes), on unseen tasks too."""
    kw = dict(other=other, learner=learner, ks=ks, device=device, chunk_tasks=chunk_tasks, oracle_dtype=oracle_dtype)
    sets = [eval_set(mix, ep, tasks="seen", **kw)]
    if unseen is not None:
        sets.append(eval_set(mix, unseen[1], tasks="unseen", task_mix=unseen[0], **kw))
    meta = {"n_tokens": mix.n_tokens, "n_demos": ep.n_demos, "l_demo": ep.l_demo, "l_test": ep.l_test,
            "n_episodes": len(ep), "ks": sets[0].ks, "test_start": ep.test_start, "burn_in": ep.burn_in,
            "dataset_hash": ep.meta.get("dataset_hash"), "predictors": list(dict.fromkeys(
                ["model", *sets[0].by_k[sets[0].ks[0]].references])),
            "incontext_hmm": None if learner is None else learner.describe()}
    return figure1_tables(model, sets, device=device, batch_size=batch_size, meta=meta)


_STYLE = {"model": ("C0", "-", "model", 2.0), "task_oracle": ("C2", "--", "task oracle", 1.4),
          "mixture_oracle": ("C3", "-", "mixture oracle (training tasks)", 1.4),
          "other_mixture_oracle": ("C1", ":", "mixture oracle (other tasks)", 1.4),
          "incontext_unigram": ("C7", "-.", "in-context unigram", 1.2),
          "incontext_bigram": ("C5", "-.", "in-context bigram", 1.2),
          "incontext_hmm": ("C4", "--", "in-context HMM (EM)", 1.2)}


def _finite(vals) -> list[float]:
    return [v for v in vals if v is not None and isinstance(v, (int, float)) and math.isfinite(v)]


def build_figure1(result: Figure1Result, title: str | None = None):
    """Figure 1 as a matplotlib Figure: one row per task set (seen, unseen), three panels each: accuracy vs k,
    CE vs k, accuracy vs test position (k = k_max), every predictor with its 95% CI band. The accuracy panels
    draw chance (1 / V, dotted gray; V = meta['n_tokens']) and span 0 to above the highest upper CI of any
    predictor, so the oracles' ceiling is always in view; the CE panel draws log V (a uniform guess). The
    title carries the run (`title`) and the retrieval gap with its verdict."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    tasks = result.tasks
    fig = Figure(figsize=(16, 4.4 * len(tasks) + 0.6), layout="constrained")
    axes = fig.subplots(len(tasks), 3, squeeze=False)
    V = result.meta.get("n_tokens")
    chance = 1.0 / V if V else None
    for row, t in zip(axes, tasks):
        top = 0.0
        for name, (c, ls, label, lw) in _STYLE.items():
            for a, rows, xkey, key in ((row[0], result.by_k, "k", "acc"), (row[1], result.by_k, "k", "ce"),
                                       (row[2], result.by_position, "position", "acc")):
                r = [q for q in rows if q["predictor"] == name and q["tasks"] == t]
                if not r:
                    continue
                x = [q[xkey] for q in r]
                a.plot(x, [q[key] for q in r], marker="o" if xkey == "k" else None, ls=ls, color=c, lw=lw, ms=3,
                       label=label, zorder=3 if name == "model" else 2)  # the model on top
                a.fill_between(x, [q[f"{key}_lo"] for q in r], [q[f"{key}_hi"] for q in r], color=c, alpha=0.12)
                if key == "acc":
                    top = max([top, *_finite(q["acc_hi"] for q in r)])
        for a in (row[0], row[2]):
            if chance is not None:
                a.axhline(chance, color="gray", ls=":", lw=1.2, label=f"chance (1/V = {chance:.3g})")
            a.set_ylim(0.0, min(1.02, max(top, chance or 0.0) * 1.06 + 0.02))
        if V:
            row[1].axhline(math.log(V), color="gray", ls=":", lw=1.2, label=f"uniform (log V = {math.log(V):.3g})")
        ceiling = "mixture and task oracles = ceiling" if t == "seen" else "task oracle = ceiling"
        row[0].set(xlabel="demonstrations k", ylabel="test next-token accuracy", title=f"{t} tasks: accuracy vs k ({ceiling})")
        row[1].set(xlabel="demonstrations k", ylabel="test cross-entropy (nats / token)", title=f"{t} tasks: CE vs k")
        row[2].set(xlabel="test position", ylabel="next-token accuracy",
                   title=f"{t} tasks: accuracy vs position (k = {result.k_max})")
        for a in row:
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
            a.grid(alpha=0.3)
        row[0].legend(fontsize=7, loc="best")
        row[1].legend(handles=row[1].get_lines()[-1:], fontsize=7, loc="upper right")
        row[2].legend(handles=row[2].get_lines()[-1:], fontsize=7, loc="lower right")
    n = result.meta.get("n_episodes")
    head = "Figure 1: in-context next-token prediction" + (f", {title}" if title else "") \
        + (f" ({n} held-out episodes per task set, 95% CIs)" if n else "")
    if result.retrieval is not None and result.claims:
        g, c = result.retrieval, result.claims[0]
        head += (f"\nretrieval gap (model - task oracle CE, unseen minus seen, k = {result.k_max}): {g['value']:.3g} "
                 f"[{g['lo']:.3g}, {g['hi']:.3g}] nats/token, rule {c.rule}: {c.verdict}")
    fig.suptitle(head)
    return fig


def plot_figure1(result: Figure1Result, path, title: str | None = None) -> list[Path]:
    """Write Figure 1 (`build_figure1`) as <path>.png and <path>.pdf; returns [png, pdf]."""
    from .figures import save

    return save(build_figure1(result, title), path)


# ---------------------------------------------------------------- fixed memory


def receptive_field(n_layers: int, window: int) -> int:
    """Tokens a stack of n_layers banded attention layers of width `window` sees: n_layers (window - 1) + 1.

    Query t of one layer sees keys t - window + 1 .. t; each further layer reaches window - 1 further back
    through the residual stream (MLPs and norms act per position). 0 (full causal attention) -> 0 (unbounded).
    """
    if window < 0 or n_layers < 1:
        raise ValueError(f"need window >= 0 and n_layers >= 1, got window={window}, n_layers={n_layers}")
    return 0 if window == 0 else n_layers * (window - 1) + 1


def memory_comparison(model: torch.nn.Module, mix: Mixture, ep: Episodes, window: int, *, n_layers: int | None = None,
                      n_tasks_theory: int = 4, theory_kw: dict | None = None, device="cpu", batch_size: int = 64,
                      min_burn_in: int = 100) -> dict:
    """A windowed model's excess error beside eps(L) at its receptive field L = R (SCIENCE.md 4, practice side).

    Receptive field. A model of n_layers banded layers of width w predicts token j from the
    R = n_layers (w - 1) + 1 tokens before it (`receptive_field`), not from w: with 4 layers of width 4 it
    sees 13 tokens. We compare it with eps(R), on the test positions j >= R, where those R tokens are all
    test tokens (option 1 of issue 8: eps at the model's true receptive field; the model is evaluated on
    its ordinary episodes). n_layers defaults to model.cfg.n_layers.

    model_tv: mean over episodes of the mean, over test positions j >= R, of TV(task oracle with the full
    history, model), with a 95% CI over episodes. mix_tv: the same for the mixture oracle (the part of the
    model's error that task uncertainty alone forces). eps: eps(R) from inference.memory_error averaged
    over tasks 0..n_tasks_theory-1 (theory_kw: n_histories, burn_in, seed), eps_se its standard error.
    eps is defined on *stationary* histories: like-for-like only when data.test_start == "midstream" with
    burn_in >= min_burn_in (``comparable``). Even then model_tv also contains the model's task uncertainty
    and approximation error, so it is an upper-side comparison, not a test of equality. When R >= l_test
    no test position has a test-only receptive field: the dict says so (n_positions 0, comparable False,
    reason) and carries no model_tv / eps.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if n_layers is None:
        n_layers = getattr(getattr(model, "cfg", None), "n_layers", None)
        if n_layers is None:
            raise ValueError("n_layers is required when the model has no cfg.n_layers")
    R = receptive_field(int(n_layers), int(window))
    kw = {"n_histories": 500, "burn_in": 200, "seed": 0, **(theory_kw or {})}
    cols = np.flatnonzero(ep.test_mask & (ep.position >= R) & (np.arange(ep.seq_len) >= 1))
    out = {"window": int(window), "n_layers": int(n_layers), "receptive_field": R, "n_positions": int(len(cols)),
           "n_episodes": len(ep), "test_start": ep.test_start, "burn_in": ep.burn_in}
    if len(cols) == 0:
        return {**out, "comparable": False,
                "reason": f"receptive field {R} = {n_layers} x ({window} - 1) + 1 >= l_test = {ep.l_test}: no test "
                          "position sees test tokens only"}
    task = task_oracle(mix, ep, dtype=torch.float64, device=device)[:, cols].cpu()
    mixp = mixture_oracle(mix, ep, dtype=torch.float64, device=device)[0][:, cols].cpu()
    modp = model_predictive(model, ep.tokens, device, batch_size, n_obs=mix.n_tokens, dtype=torch.float64)[:, cols]
    for name, p in (("model_tv", modp), ("mix_tv", mixp)):
        m, lo, hi = _mean_ci((0.5 * (p - task).abs().sum(-1)).mean(1).numpy())
        out.update({name: float(m), f"{name}_lo": float(lo), f"{name}_hi": float(hi)})
    tasks = list(range(min(n_tasks_theory, mix.n_tasks)))
    res = [memory_error(mix.task(i), [R], **kw) for i in tasks]
    eps = np.array([r.eps[0] for r in res])
    out.update({"eps": float(eps.mean()), "eps_L": R,
                "eps_se": float(np.sqrt(sum(r.stderr[0] ** 2 for r in res)) / len(res)),
                "eps_per_task": eps.tolist(), "eps_tasks": tasks, "theory_kw": kw,
                "comparable": bool(ep.test_start == "midstream" and ep.burn_in >= min_burn_in)})
    return out
