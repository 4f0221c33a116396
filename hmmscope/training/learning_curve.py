"""The learning curve's numbers: a model's cross-entropy and accuracy on held-out episodes (`evaluate_loss`: val/*),
and a mixture oracle's on the same targets (`oracle_metrics`: the pipeline's oracle/*).

Inputs tokens[:, :-1], targets tokens[:, 1:], scored on the Episodes' `target_mask` (the next token is an
observation; the delimiter is never a target): cross-entropy over the full vocabulary pooled over tokens, accuracy
as the argmax over the observation ids (as in measure/evaluate.py), over all targets and over the test segment's.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..data.episodes import Episodes
from ..oracles.inference import mixture_oracle
from .device import autocast


def next_token_batch(ep: Episodes, idx, device: torch.device | str = "cpu"):
    """(inputs, targets, loss_mask) for episodes idx: tokens[:, :-1], tokens[:, 1:], target_mask[:-1]."""
    tok = torch.as_tensor(np.asarray(ep.tokens[idx]).astype(np.int64), device=device)
    mask = torch.as_tensor(ep.target_mask[:-1], device=device).expand(tok.shape[0], -1)
    return tok[:, :-1], tok[:, 1:], mask


def episode_batches(ep: Episodes, batch_size: int, device: torch.device | str = "cpu"):
    """Yield next_token_batch over ep in order (evaluation)."""
    for lo in range(0, len(ep), batch_size):
        yield next_token_batch(ep, np.arange(lo, min(lo + batch_size, len(ep))), device)


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, ep: Episodes, device: torch.device | str = "cpu",
                  batch_size: int = 64, precision: str = "auto") -> dict[str, float]:
    """Mean CE (nats, full vocabulary) and accuracy (argmax over the observation ids, as in measure/evaluate.py)
    over all observation targets and over test-segment targets; the forward runs in `precision`."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    test = torch.as_tensor(ep.test_target_mask[:-1], device=device)
    sums = torch.zeros(6, dtype=torch.float64, device=device)  # ce, correct, n, test ce, test correct, test n
    try:
        for x, y, m in episode_batches(ep, batch_size, device):
            with autocast(device, precision):
                logits, _ = model(x)
            logits = logits.float()
            ce = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (B, T-1)
            hit = (logits[..., :ep.n_tokens].argmax(-1) == y).double()  # argmax over observations
            mt = m & test
            sums += torch.stack([ce[m].double().sum(), hit[m].sum(), m.sum().double(),
                                 ce[mt].double().sum(), hit[mt].sum(), mt.sum().double()])
    finally:
        model.train(was_training)
    s = sums.tolist()
    return {"loss": s[0] / s[2], "acc": s[1] / s[2], "test_loss": s[3] / s[5], "test_acc": s[4] / s[5]}


def oracle_metrics(mix, ep: Episodes, device: torch.device | str = "cpu") -> dict[str, float]:
    """The mixture oracle (Bayes-optimal predictor) scored on the same targets as evaluate_loss."""
    device = torch.device(device)
    pred = mixture_oracle(mix, ep, dtype=torch.float64, device=device if device.type == "cuda" else "cpu").pred
    pred = pred.cpu()[:, 1:]  # row t predicts token t; targets are tokens 1..T-1
    y = torch.as_tensor(np.asarray(ep.tokens[:, 1:]).astype(np.int64))
    m = torch.as_tensor(ep.target_mask[:-1]).expand_as(y)
    mt = m & torch.as_tensor(ep.test_target_mask[:-1])
    p = pred.gather(-1, y.clamp(max=pred.shape[-1] - 1)[..., None])[..., 0]
    nll, hit = -torch.log(p), (pred.argmax(-1) == y).double()
    return {"loss": nll[m].mean().item(), "acc": hit[m].mean().item(),
            "test_loss": nll[mt].mean().item(), "test_acc": hit[mt].mean().item()}
