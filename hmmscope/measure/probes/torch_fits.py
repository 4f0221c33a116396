"""The probes' fits in torch, on any device (on a GPU, so that Figure 3's fits at the paper's scale are quick).

Twins of `fits`' scikit-learn fits, with the same inputs and outputs:

- `ridge`: sklearn's Ridge(alpha, fit_intercept=True) in closed form, float64: the training rows centred,
  X'X = V diag(s) V' once per fit, W(alpha) = V diag(1 / (s + alpha)) V' X'Y for every alpha of the grid at the
  cost of one product each; alpha chosen on the inner validation rows as `fits._ridge` does, then refitted on all
  training rows. The same solution as sklearn's (its cholesky solver) up to float64 rounding: R^2 agrees to ~1e-9.
- `fit_predict`: LogisticRegression(C, lbfgs, max_iter, tol)'s multinomial model, the same objective as
  sklearn >= 1.1 (mean cross-entropy over the training rows + ||W||^2 / (2 C n), intercept not penalized),
  minimized by torch's L-BFGS (strong Wolfe line search, at most max_iter iterations, stopping when the largest
  gradient entry is below tol), in float32. The per-group probes (one classifier per task) are fitted at once: one
  weight block per group, the logits of classes a group's training rows lack masked off, the groups' objectives
  summed (independent, so each block reaches its own group's optimum). A group with one training class predicts it,
  a group with no training rows predicts -1, as in `fits._fit_predict`. Optima are the same as sklearn's; where
  either stops short of it (max_iter) a few predictions may differ: tests/test_probes_torch.py checks accuracy
  and R^2 against scikit-learn's on the CPU, and that the claims' verdicts agree.

Imports torch at module level: `fits` imports this module only inside a fit with a torch device (its worker
processes never do).
"""

from __future__ import annotations

import numpy as np
import torch


def _t(x, device, dtype=torch.float32) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(device, dtype)
    return torch.as_tensor(np.ascontiguousarray(x), device=device).to(dtype)


def _ridge_solutions(X: torch.Tensor, Y: torch.Tensor, alphas) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Ridge weights for every alpha on (X, Y) with an intercept: ([W (D, S)], x mean, y mean), float64."""
    mx, my = X.mean(0), Y.mean(0)
    Xc, Yc = X - mx, Y - my
    s, V = torch.linalg.eigh(Xc.T @ Xc)
    s = s.clamp_min(0.0)
    VtXtY = V.T @ (Xc.T @ Yc)
    return [V @ (VtXtY / (s + a)[:, None]) for a in alphas], mx, my


def ridge(Xtr, Ytr, val, Xte, alphas, device) -> tuple[np.ndarray, float]:
    """fits._ridge in closed form on `device`: predictions for Xte, alpha chosen on the rows `val` of the training
    rows, then refitted on all of them."""
    X, Y = _t(Xtr, device, torch.float64), _t(Ytr, device, torch.float64)
    v = torch.as_tensor(val, device=device)
    Ws, mx, my = _ridge_solutions(X[~v], Y[~v], alphas)
    Xv, Yv = X[v], Y[v]
    sse = [float((((Xv - mx) @ W + my - Yv) ** 2).sum()) for W in Ws]
    best = float(alphas[int(np.argmin(sse))])
    (W,), mx, my = _ridge_solutions(X, Y, [best])
    pred = (_t(Xte, device, torch.float64) - mx) @ W + my
    return pred.cpu().numpy(), best


def _lbfgs(params: list[torch.Tensor], loss_fn, max_iter: int, tol: float) -> None:
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, tolerance_grad=tol, tolerance_change=1e-12,
                            history_size=10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        return loss

    opt.step(closure)


STATS = {"evals": 0, "flops": 0.0}  # objective evaluations and their matmul FLOPs, for probe_cost.py's prediction


def _multinomial(X: torch.Tensor, y: torch.Tensor, gid: torch.Tensor, allowed: torch.Tensor, n_per: torch.Tensor,
                 C: float, max_iter: int, tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (G, D, K) and intercepts (G, K) of G independent multinomial logistic regressions fitted at once:
    row i belongs to group gid[i] with class index y[i]; allowed (G, K) bool: the classes group g may predict;
    n_per (G,): its training rows (each group's objective is its own mean, as sklearn's). The groups' rows are
    padded into one (G, rows, D) batch, so an evaluation is a few kernels whatever G (one bmm forward)."""
    G, K = allowed.shape
    D = X.shape[1]
    order = torch.argsort(gid, stable=True)
    counts = torch.bincount(gid, minlength=G)
    n_max = int(counts.max())
    slot = torch.arange(len(gid), device=X.device) - (torch.cumsum(counts, 0) - counts)[gid[order]]
    Xp = torch.zeros((G, n_max, D), device=X.device)
    yp = torch.full((G, n_max), -100, dtype=torch.long, device=X.device)  # -100: padding, ignored
    Xp[gid[order], slot] = X[order]
    yp[gid[order], slot] = y[order]
    wp = (1.0 / n_per)[:, None].expand(G, n_max)
    W = torch.zeros((G, D, K), device=X.device, requires_grad=True)
    b = torch.zeros((G, K), device=X.device, requires_grad=True)
    off = torch.where(allowed, 0.0, float("-inf"))[:, None, :]
    flops = 6.0 * G * n_max * D * K  # forward bmm and its two backward products

    def loss_fn():
        z = torch.baddbmm(b[:, None, :], Xp, W) + off  # (G, n_max, K)
        ce = torch.nn.functional.cross_entropy(z.reshape(-1, K), yp.reshape(-1), reduction="none")
        STATS["evals"] += 1
        STATS["flops"] += flops
        return (ce * wp.reshape(-1)).sum() + ((W ** 2).sum((1, 2)) / (2 * C * n_per)).sum()

    _lbfgs([W, b], loss_fn, max_iter, tol)
    return W.detach(), (b + off[:, 0]).detach()


def fit_predict(X, y, a, b, group, C: float, max_iter: int, tol: float, device) -> np.ndarray:
    """fits._fit_predict with `make` = LogisticRegression(C, max_iter, tol): predicted labels of rows b from a
    classifier fitted on rows a, one per value of `group` when given (module docstring)."""
    Xt = _t(X, device)
    ya = y[a]
    if group is None:
        cls = np.unique(ya)
        if len(cls) == 1:
            return np.full(int(b.sum()), cls[0], y.dtype)
        yi = torch.as_tensor(np.searchsorted(cls, ya), device=device)
        W, bias = _multinomial(Xt[torch.as_tensor(a, device=device)], yi, torch.zeros(len(ya), dtype=torch.long,
                               device=device), torch.ones((1, len(cls)), dtype=torch.bool, device=device),
                               torch.tensor([float(len(ya))], device=device), C, max_iter, tol)
        z = Xt[torch.as_tensor(b, device=device)] @ W[0] + bias[0]
        return cls[z.argmax(1).cpu().numpy()]
    pred, gb = np.full(int(b.sum()), -1, y.dtype), group[b]
    groups = np.unique(gb)
    fit_g, fit_cls = [], []
    for g in groups:
        cls = np.unique(y[a & (group == g)])
        if len(cls) == 1:
            pred[gb == g] = cls[0]
        elif len(cls) > 1:
            fit_g.append(g)
            fit_cls.append(cls)
    if not fit_g:
        return pred
    cls_all = np.unique(np.concatenate(fit_cls))
    allowed = np.zeros((len(fit_g), len(cls_all)), bool)
    for i, cls in enumerate(fit_cls):
        allowed[i, np.searchsorted(cls_all, cls)] = True
    gidx = {g: i for i, g in enumerate(fit_g)}
    rows = a & np.isin(group, fit_g)
    gid = np.array([gidx[g] for g in group[rows]], np.int64)
    n_per = np.bincount(gid, minlength=len(fit_g)).astype(np.float32)
    W, bias = _multinomial(Xt[torch.as_tensor(rows, device=device)], torch.as_tensor(np.searchsorted(cls_all, y[rows]),
                           device=device), torch.as_tensor(gid, device=device), torch.as_tensor(allowed, device=device),
                           torch.as_tensor(n_per, device=device), C, max_iter, tol)
    Xb = Xt[torch.as_tensor(b, device=device)]
    for g in fit_g:
        sel = gb == g
        i = gidx[g]
        z = Xb[torch.as_tensor(sel, device=device)] @ W[i] + bias[i]
        pred[sel] = cls_all[z.argmax(1).cpu().numpy()]
    return pred
