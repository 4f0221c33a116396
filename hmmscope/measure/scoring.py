"""Scoring a model beside the references: its predictive distributions and the per-token metrics with their CIs
(SCIENCE.md 6, 9), what Figure 1 (measure.evaluate), the emergence curves and fixed memory read.

Conventions (shared with hmmscope.oracles.inference and hmmscope.oracles.baselines): ``pred[i, t, v] = p(token_t = v |
tokens_<t)``, an (N, T, V) tensor over the V observation ids, NaN rows where no prediction is scored (t = 0
for the model, and every non-observation token). The model's row t is the softmax of its logits at t - 1
*restricted to the V observation ids* (the delimiter/padding logits are dropped and the rest renormalized):
the delimiter is never a target, so the predictors are compared on the same simplex. (train.evaluate_loss
takes the argmax over the full vocabulary; the two agree unless the model puts its top logit on the
delimiter.) Accuracy is argmax == token, ties to the lowest id, for every predictor.

Statistics: per-episode means over the scored tokens, then the mean over episodes with a 95% normal CI
(mean +- 1.96 sd / sqrt(N)), `metric_rows`; per-position tables average over episodes at each test position.
KL(p || q) = sum_v p log(p / q) in nats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

__all__ = ["model_predictive", "mean_ci", "token_metrics", "metric_rows", "METRICS"]

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


def mean_ci(x: np.ndarray, axis: int = 0):
    """Mean and 95% normal CI along axis (NaN half-width when fewer than 2 values)."""
    n = x.shape[axis]
    m = x.mean(axis)
    se = x.std(axis, ddof=1) / math.sqrt(n) if n > 1 else np.full_like(m, np.nan)
    return m, m - _Z * se, m + _Z * se


def _kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last axis (terms with p = 0 are 0; q = 0 where p > 0 gives inf)."""
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(-1)


def token_metrics(pred: torch.Tensor, y: torch.Tensor, ref: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Per-token (N, P) arrays: hit, nll, kl_mix (against the mixture reference), kl_task, for predictions pred
    (N, P, V) of tokens y."""
    p_y = pred.gather(-1, y[..., None])[..., 0]
    return {"acc": (pred.argmax(-1) == y).double().numpy(), "ce": (-torch.log(p_y)).numpy(),
            "kl_mix": _kl(ref["mixture"], pred).numpy(), "kl_task": _kl(ref["task_oracle"], pred).numpy()}


METRICS = ("acc", "ce", "kl_mix", "kl_task", "excess_ce", "excess_ce_task")


def metric_rows(per_token: dict[str, dict[str, np.ndarray]], base: dict, by_position: bool, mixture: str,
          positions=None, bad: Mapping[str, str] | None = None) -> list[dict]:
    """Table rows: one per predictor (and per position if by_position), metrics with 95% CIs; excess_ce and kl_mix
    are against the mixture reference `mixture` (EvalSet.meta["mixture_reference"]), NaN where it is degenerate;
    bad: {predictor: why it is degenerate at this k} (column "degenerate", "" when it is not)."""
    out = []
    bad = bad or {}
    for name, m in per_token.items():
        nan = np.full_like(m["ce"], np.nan)
        m = {**m, "excess_ce": nan if bad.get(mixture) else m["ce"] - per_token[mixture]["ce"],
             "excess_ce_task": m["ce"] - per_token["task_oracle"]["ce"]}
        if bad.get(mixture):
            m["kl_mix"] = nan
        base = {**base, "degenerate": bad.get(name, "")}
        if by_position:  # statistics over episodes at each test position
            stats = {key: mean_ci(m[key], 0) for key in METRICS}
            for j, p in enumerate(positions):
                row = {**base, "position": int(p), "predictor": name, "n_episodes": m["acc"].shape[0]}
                for key in METRICS:
                    row.update({key: float(stats[key][0][j]), f"{key}_lo": float(stats[key][1][j]),
                                f"{key}_hi": float(stats[key][2][j])})
                out.append(row)
        else:  # per-episode means, then statistics over episodes
            row = {**base, "predictor": name, "n_episodes": m["acc"].shape[0], "n_tokens": m["acc"].shape[1]}
            for key in METRICS:
                mean, lo, hi = mean_ci(m[key].mean(1))
                row.update({key: float(mean), f"{key}_lo": float(lo), f"{key}_hi": float(hi)})
            out.append(row)
    return out
