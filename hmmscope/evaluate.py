"""In-context evaluation: the paper's Figure 1 with its ceiling (SCIENCE.md 6), and fixed memory (4).

Conventions (shared with hmmscope.inference): ``pred[i, t, v] = p(token_t = v | tokens_<t)``, an
(N, T, V) tensor over the V observation ids, NaN rows where no prediction is scored (t = 0 for the
model, and every non-observation token). The model's row t is the softmax of its logits at t - 1
*restricted to the V observation ids* (the delimiter/padding logits are dropped and the rest
renormalized): the delimiter is never a target, so the predictors are compared on the same simplex.
(train.evaluate_loss takes the argmax over the full vocabulary; the two agree unless the model
puts its top logit on the delimiter.)

Scored tokens. Figure 1 scores every test token that has a model prediction: the test segment at
positions t >= 1 of the (truncated) episode. With k >= 1 demos that is every test token (the first
one is predicted from the delimiter before it); with k = 0 the first test token is episode token 0,
which no predictor of the training objective ever sees as a target, so it is dropped for all three
predictors alike (the k = 0 row scores l_test - 1 tokens; ``n_tokens`` says so).

Accuracy vs the number of demonstrations k is measured on a model trained with n_demos demos by
keeping only the LAST k demo blocks of each episode (``truncate_demos``); the test segment is
unchanged, so the task oracle is the same for every k and the mixture oracle's posterior over tasks
sees only the k kept demos. Statistics: per-episode means over the scored tokens, then the mean over
episodes with a 95% normal CI (mean +- 1.96 sd / sqrt(N)); per-position tables average over
episodes at each test position. KL(p || q) = sum_v p log(p / q) in nats.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .episodes import Episodes, layout
from .hmm import Mixture
from .inference import memory_error, mixture_oracle, task_oracle
from .stats import jsonable

__all__ = ["model_predictive", "truncate_demos", "figure1", "Figure1Result", "build_figure1", "plot_figure1",
           "memory_comparison", "receptive_field", "PREDICTORS"]

PREDICTORS = ("model", "task_oracle", "mixture_oracle")
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


def truncate_demos(ep: Episodes, k: int) -> Episodes:
    """ep with only its LAST k demonstrations: the first n_demos - k demo blocks (each with its
    delimiter) are cut off the front; the test segment and all per-episode data are unchanged."""
    if not 0 <= k <= ep.n_demos:
        raise ValueError(f"k must be in [0, n_demos={ep.n_demos}], got {k}")
    start = (ep.n_demos - k) * (ep.l_demo + 1)
    seg, pos = layout(k, ep.l_demo, ep.l_test)
    meta = {**ep.meta, "n_demos_kept": k, "n_demos_original": ep.meta.get("n_demos_original", ep.n_demos)}
    return Episodes(tokens=ep.tokens[:, start:], states=ep.states[:, start:], task_ids=ep.task_ids, segment=seg,
                    position=pos, n_tokens=ep.n_tokens, n_demos=k, l_demo=ep.l_demo, l_test=ep.l_test, meta=meta)


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


@dataclass
class Figure1Result:
    """Figure 1 tables as lists of dicts. by_k: one row per (k, predictor); by_position: one row per
    (test position, predictor) at k = k_max (the largest k evaluated, normally n_demos).
    Columns: k, [position], predictor, n_episodes, [n_tokens], p_true_task (mixture posterior of the
    true task at the test start, same on every predictor row), and for each metric acc, ce, kl_mix
    (KL(mixture oracle || predictor)), kl_task (KL(task oracle || predictor)), excess_ce (CE - mixture
    oracle CE), excess_ce_task (CE - task oracle CE): the mean and its 95% CI as <metric>_lo/_hi.
    (A row's n_tokens counts the scored tokens; meta['n_tokens'] is V, the observation vocabulary.)"""

    by_k: list[dict]
    by_position: list[dict]
    k_max: int
    meta: dict = field(default_factory=dict)

    def row(self, predictor: str, k: int | None = None) -> dict:
        k = self.k_max if k is None else k
        return next(r for r in self.by_k if r["k"] == k and r["predictor"] == predictor)

    def headline(self) -> dict[str, float]:
        """Scalar metrics at k = k_max, namespaced for MLflow ('eval/...')."""
        m, t, x = self.row("model"), self.row("task_oracle"), self.row("mixture_oracle")
        return {"eval/test_acc": m["acc"], "eval/test_ce": m["ce"],
                "eval/oracle_mix_test_acc": x["acc"], "eval/oracle_mix_test_ce": x["ce"],
                "eval/oracle_task_test_acc": t["acc"], "eval/oracle_task_test_ce": t["ce"],
                "eval/kl_mix": m["kl_mix"], "eval/kl_task": m["kl_task"], "eval/excess_ce": m["excess_ce"],
                "eval/gap_to_mix": x["acc"] - m["acc"], "eval/gap_to_task": t["acc"] - m["acc"],
                "eval/p_true_task": m["p_true_task"]}

    def to_dict(self) -> dict:
        """JSON-safe (NaN / inf -> None)."""
        return jsonable({"by_k": self.by_k, "by_position": self.by_position, "k_max": self.k_max,
                           "meta": self.meta, "headline": self.headline()})

    def to_csv(self, directory) -> list[Path]:
        """Write figure1_by_k.csv and figure1_by_position.csv into directory; returns the paths."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, rows in (("figure1_by_k.csv", self.by_k), ("figure1_by_position.csv", self.by_position)):
            with open(d / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            paths.append(d / name)
        return paths


def figure1(model: torch.nn.Module, mix: Mixture, ep: Episodes, *, device="cpu", ks=None, batch_size: int = 64,
            chunk_tasks: int | None = None, oracle_dtype=torch.float64) -> Figure1Result:
    """Next-token accuracy, CE and KL on the test segment vs k (demos kept, default 0..n_demos) and
    vs test position (at the largest k) for the model, the task oracle and the mixture oracle."""
    ks = sorted(range(ep.n_demos + 1) if ks is None else {int(k) for k in ks})
    V, by_k, by_pos = mix.n_tokens, [], []
    for k in ks:
        e = truncate_demos(ep, k)
        cols = np.flatnonzero(e.test_mask & (np.arange(e.seq_len) >= 1))
        y = torch.as_tensor(np.asarray(e.tokens[:, cols]).astype(np.int64))
        mix_pred, post = mixture_oracle(mix, e, chunk_tasks=chunk_tasks, posterior_at="test_start",
                                        dtype=oracle_dtype, device=device)
        preds = {"model": model_predictive(model, e.tokens, device, batch_size, n_obs=V, dtype=torch.float64),
                 "task_oracle": task_oracle(mix, e, dtype=oracle_dtype, device=device),
                 "mixture_oracle": mix_pred}
        preds = {n: p[:, cols].to("cpu", torch.float64) for n, p in preds.items()}
        per_token = {n: _token_metrics(p, y, preds) for n, p in preds.items()}
        p_true = float(post.cpu()[torch.arange(len(e)), torch.as_tensor(e.task_ids)].double().mean())
        base = {"k": k, "p_true_task": p_true}
        by_k += _rows(per_token, base, by_position=False)
        if k == ks[-1]:
            by_pos = _rows(per_token, base, by_position=True, positions=e.position[cols])
    meta = {"n_tokens": V, "n_demos": ep.n_demos, "l_demo": ep.l_demo, "l_test": ep.l_test, "n_episodes": len(ep),
            "ks": ks, "test_start": ep.test_start, "burn_in": ep.burn_in, "dataset_hash": ep.meta.get("dataset_hash")}
    return Figure1Result(by_k, by_pos, ks[-1], meta)


_STYLE = {"model": ("C0", "-", "model"), "task_oracle": ("C2", "--", "task oracle"),
          "mixture_oracle": ("C3", "-", "mixture oracle")}


def build_figure1(result: Figure1Result, title: str | None = None):
    """Figure 1 as a matplotlib Figure: accuracy vs k, accuracy vs test position (k = k_max), excess CE and
    KL vs k. The accuracy panels draw chance (1 / V, dotted gray; V = meta['n_tokens']) and span 0 to above
    the highest upper CI of any predictor, so the oracles' ceiling is always in view; `title` (the run)
    heads the figure."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(15, 4.6), layout="constrained")
    ax = fig.subplots(1, 3)
    top = 0.0
    for name, (c, ls, label) in _STYLE.items():
        for a, rows, xkey in ((ax[0], result.by_k, "k"), (ax[1], result.by_position, "position")):
            r = [r for r in rows if r["predictor"] == name]
            x = [q[xkey] for q in r]
            a.plot(x, [q["acc"] for q in r], marker="o" if xkey == "k" else None, ls=ls, color=c, label=label, ms=4)
            a.fill_between(x, [q["acc_lo"] for q in r], [q["acc_hi"] for q in r], color=c, alpha=0.2)
            top = max([top, *(q["acc_hi"] for q in r if q["acc_hi"] is not None and math.isfinite(q["acc_hi"]))])
    V = result.meta.get("n_tokens")
    chance = 1.0 / V if V else None
    for a in ax[:2]:
        if chance is not None:
            a.axhline(chance, color="gray", ls=":", lw=1.2, label=f"chance (1/V = {chance:.3g})")
        a.set_ylim(0.0, min(1.02, max(top, chance or 0.0) * 1.06 + 0.02))
    m = [r for r in result.by_k if r["predictor"] == "model"]
    ks = [r["k"] for r in m]
    for key, c, label in (("excess_ce", "C0", "excess CE (model - mixture oracle)"),
                          ("kl_mix", "C3", "KL(mixture oracle || model)"),
                          ("kl_task", "C2", "KL(task oracle || model)")):
        ax[2].plot(ks, [r[key] for r in m], "o-", color=c, label=label, ms=4)
        ax[2].fill_between(ks, [r[f"{key}_lo"] for r in m], [r[f"{key}_hi"] for r in m], color=c, alpha=0.2)
    ax[0].set(xlabel="demonstrations k", ylabel="test next-token accuracy",
              title="accuracy vs k (oracles = ceiling)")
    ax[1].set(xlabel="test position", ylabel="next-token accuracy", title=f"accuracy vs position (k = {result.k_max})")
    ax[2].set(xlabel="demonstrations k", ylabel="nats / token", title="gap to the Bayes-optimal predictor")
    ax[2].axhline(0, color="gray", lw=0.8)
    for a in ax:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    n = result.meta.get("n_episodes")
    fig.suptitle("Figure 1: in-context next-token prediction" + (f", {title}" if title else "")
                 + (f" ({n} held-out episodes, 95% CIs)" if n else ""))
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
