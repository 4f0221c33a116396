"""Fixed memory (SCIENCE.md 4, practice side): a windowed model's excess error beside eps(L) at its receptive field.

evaluate re-exports receptive_field and memory_comparison (their home before the split).
"""

from __future__ import annotations

import numpy as np
import torch

from ..data.episodes import Episodes
from ..data.hmm import Mixture
from ..oracles.bayes import bayes_oracle, windowed_bayes
from ..oracles.bayes_structures import why_not
from ..oracles.inference import mixture_oracle, task_oracle
from ..oracles.memory import memory_error, memory_predictor
from .scoring import mean_ci, model_predictive


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
                      min_burn_in: int = 100, reference: Mixture | None = None, bayes=None) -> dict:
    """A windowed model's excess error beside eps(L) at its receptive field L = R (SCIENCE.md 4, practice side).

    Receptive field. A model of n_layers banded layers of width w predicts token j from the
    R = n_layers (w - 1) + 1 tokens before it (`receptive_field`), not from w: with 4 layers of width 4 it
    sees 13 tokens. We compare it with eps(R), on the test positions j >= R, where those R tokens are all
    test tokens (eps at the model's true receptive field; the model is evaluated on its ordinary episodes).
    n_layers defaults to model.cfg.n_layers.

    model_tv: mean over episodes of the mean, over test positions j >= R, of TV(task oracle with the full
    history, model), with a 95% CI over episodes. mix_tv: the same for the mixture oracle (the part of the
    model's error that task uncertainty alone forces); with `reference` (fresh tasks: the family-Bayes tasks,
    which are none of the episodes' own) the mixture oracle over those tasks instead of over mix. lmem_tv: the
    same for the L-memory predictor at L = R (oracles.memory.memory_predictor of each episode's own task over the R
    tokens before j): eps(R) measured on exactly these tokens, the floor any model with this receptive field
    and the task's parameters has. eps: eps(R) from oracles.memory.memory_error (stationary histories) averaged
    over tasks 0..n_tasks_theory-1 (theory_kw: n_histories, burn_in, seed), eps_se its standard error.
    eps is defined on *stationary* histories: like-for-like only when data.test_start == "midstream" with
    burn_in >= min_burn_in (``comparable``). Even then model_tv also contains the model's task uncertainty
    and approximation error, so it is an upper-side comparison, not a test of equality. When R >= l_test
    no test position has a test-only receptive field: the dict says so (n_positions 0, comparable False,
    reason) and carries no model_tv / eps.

    With `bayes` (evaluate's BayesSpec, fresh tasks, where the family allows it: SCIENCE.md 10) the windowed
    Bayes reference at R (oracles.bayes.windowed_bayes: Bayes given only the R positions before each token) and the
    full-history Bayes reference join: bayes_tv, wbayes_tv (TV to the task oracle at the positions above), and on
    every scored test token (Figure 1's at k_max) the CE split of the model's deficit: model_ce, bayes_ce, wbayes_ce,
    window_forced = wbayes_ce - bayes_ce (what any predictor that sees R tokens loses) and model_own = model_ce -
    wbayes_ce (the model's own), each paired over episodes with a 95% CI; bayes_note says where it is not computed.
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
    if reference is None:
        mixp = mixture_oracle(mix, ep, dtype=torch.float64, device=device).pred[:, cols].cpu()
    else:  # tasks that are none of the episodes' own: their ids must not be looked at
        anon = ep.subset(np.arange(len(ep)))
        anon.task_ids = np.full(len(ep), -1)
        mixp = mixture_oracle(reference, anon, dtype=torch.float64, device=device).pred[:, cols].cpu()
    modp = model_predictive(model, ep.tokens, device, batch_size, n_obs=mix.n_tokens, dtype=torch.float64)[:, cols]
    lmem = torch.as_tensor(np.stack([
        memory_predictor(mix.task(int(t)), ep.tokens[i][None].astype(np.int64).clip(-1, None), R)[0]
        for i, t in enumerate(ep.task_ids)]))[:, cols]  # (N, P, V): each episode's own task, the R tokens before j
    for name, p in (("model_tv", modp), ("mix_tv", mixp), ("lmem_tv", lmem)):
        m, lo, hi = mean_ci((0.5 * (p - task).abs().sum(-1)).mean(1).numpy())
        out.update({name: float(m), f"{name}_lo": float(lo), f"{name}_hi": float(hi)})
    if bayes is not None:
        out.update(_bayes_split(bayes, ep, R, cols, task, model, device, batch_size, mix.n_tokens))
    tasks = list(range(min(n_tasks_theory, mix.n_tasks)))
    res = [memory_error(mix.task(i), [R], **kw) for i in tasks]
    eps = np.array([r.eps[0] for r in res])
    out.update({"eps": float(eps.mean()), "eps_L": R,
                "eps_se": float(np.sqrt(sum(r.stderr[0] ** 2 for r in res)) / len(res)),
                "eps_per_task": eps.tolist(), "eps_tasks": tasks, "theory_kw": kw,
                "comparable": bool(ep.test_start == "midstream" and ep.burn_in >= min_burn_in)})
    return out


def _bayes_split(bayes, ep: Episodes, R: int, cols: np.ndarray, task: torch.Tensor, model, device, batch_size: int,
                 V: int) -> dict:
    """The windowed and full Bayes references beside a windowed model (memory_comparison's docstring)."""
    reason = why_not(bayes.hmm)
    if reason:
        return {"bayes_note": f"not computed: {reason}"}
    full = bayes_oracle(bayes.hmm, ep, tol=bayes.tol, seed=bayes.seed)
    scored = np.flatnonzero(ep.test_mask & (np.arange(ep.seq_len) >= 1))  # Figure 1's tokens at k_max
    wpred, wres = windowed_bayes(bayes.hmm, ep, R, scored, tol=bayes.tol, seed=bayes.seed)
    if not (full.converged and wres.converged):
        return {"bayes_note": f"not converged to {bayes.tol:g} nats/token: left out"}
    out: dict = {"bayes_mc_se": full.mc_se, "wbayes_mc_se": wres.mc_se, "wbayes_draws": wres.n_draws}
    at = np.searchsorted(scored, cols)  # the TV positions among the scored ones
    for name, p in (("bayes_tv", full.pred[:, cols]), ("wbayes_tv", torch.as_tensor(wpred[:, at]))):
        m, lo, hi = mean_ci((0.5 * (p - task).abs().sum(-1)).mean(1).numpy())
        out.update({name: float(m), f"{name}_lo": float(lo), f"{name}_hi": float(hi)})
    y = torch.as_tensor(np.asarray(ep.tokens)[:, scored].astype(np.int64))[..., None]
    mod = model_predictive(model, ep.tokens, device, batch_size, n_obs=V, dtype=torch.float64)[:, scored]
    ce = {n: (-torch.log(p.gather(-1, y)[..., 0])).mean(1).numpy()
          for n, p in (("model", mod), ("bayes", full.pred[:, scored]), ("wbayes", torch.as_tensor(wpred)))}
    for name, v in (("model_ce", ce["model"]), ("bayes_ce", ce["bayes"]), ("wbayes_ce", ce["wbayes"]),
                    ("window_forced", ce["wbayes"] - ce["bayes"]), ("model_own", ce["model"] - ce["wbayes"])):
        m, lo, hi = mean_ci(v)
        out.update({name: float(m), f"{name}_lo": float(lo), f"{name}_hi": float(hi)})
    return out
