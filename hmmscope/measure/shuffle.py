"""Figure 2, the shuffle (decoupling) test (SCIENCE.md 6), as a library.

Permute the order of the k demonstration blocks of each episode (every demo keeps its
tokens and its delimiter; the test segment stays at the end) and measure how much the
pre-softmax attention logits from test queries to demo keys change, per layer and head.

Conventions.
- Input: the training input tokens[:, :-1] (the last token is never an input in
  training). Queries: test-segment positions; keys: demo observation tokens (no
  delimiters). Demo blocks have equal lengths, so queries keep their positions and each
  key is matched to its moved copy through `permute_demos`' key map.
- Layer l is the attention of block l (0-based). Logits are `hook_attn_scores`
  (q k^T / sqrt(Dh)) from the explicit path, in float32 (TF32 off on CUDA). Pairs that
  are masked (-inf, e.g. by a banded window; read from head 0, the mask being shared by
  all heads) in either run are left out (a NaN logit propagates); an episode with
  no valid pair gets NaN, and tables and claims use the episodes with finite values.
- Per episode e, layer l, head h: r[e,l,h] = mean over perms, queries, keys of
  |s_perm(q, moved k) - s(q, k)| divided by the mean |s(q, k)| of the original episode.
  The layer value r[e,l] pools the heads (mean |delta| over heads / mean |logit| over
  heads), so a head with near-zero logits cannot dominate. Tables report the mean over
  episodes with mean +- 1.96 se (se over episodes), plus `pooled` = ratio of the means
  over all episodes. Raw logits are compared (softmax is shift invariant per query, so a
  common offset counts in the denominator; the number is a relative change, not a KL).
- Permutations: n_perms per episode, uniform over the k! - 1 non-identity orders, from
  default_rng(SeedSequence([seed, tag])), drawn for all episodes before batching (the
  result does not depend on batch_size). Requires k >= 2 and l_test >= 2.
- Memory and passes: a forward holds B (1 + n_perms) rows, B <= batch_size episodes, cut further so
  one layer's scores (rows x H x T x T float32) fit in `max_bytes` (6 episodes x 5 rows x 16 heads x
  357^2 at the paper's scale and the 256 MiB default). Each layer's scores are reduced to their sums
  as the forward makes them (a hook), so one forward per batch runs through every layer (not one forward
  per layer and batch). The model is moved to `device` and back to its own (no copy when the caller moved it
  there first, as analyze does).

Claims ("upper layers change less"), from the per-episode layer values r[e, l]:
1. slope: OLS of r[e,l] on l over all (e, l), episode-clustered SE, t-based 95% CI.
2. contrast: mean over upper-half layers minus lower-half layers (the middle layer of an
   odd count is left out), paired per episode, t-based 95% CI.
Verdict (stats.claim, rule "< 0"): CI entirely below 0 -> supported; CI at or above 0 -> not
supported; else inconclusive. One layer, or fewer than 2 episodes -> NaN, inconclusive, with the reason.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import statsmodels.api as sm
import torch

from ..data import seeds
from ..data.episodes import Episodes
from ..data.episodes import layout as make_layout
from ..safe_output import write_tables
from ..stats import Claim, claim, jsonable, rule

_TAG = 0x53485546  # "SHUF"
NAN = float("nan")
_RULE = rule("<", 0)  # the claims' decision rule (stats.decide)


def _dims(segment) -> tuple[int, int, int]:
    """(k, l_demo, l_test) of a regular layout; raises ValueError otherwise."""
    seg = np.asarray(segment)
    k = int(seg.max())
    l_test = int((seg == k).sum())
    l_demo = int((seg == 0).sum()) if k > 0 else 0
    if not np.array_equal(seg, make_layout(k, l_demo, l_test)[0]):
        raise ValueError("segment is not an episodes.layout(k, l_demo, l_test) layout")
    return k, l_demo, l_test


def permute_demos(tokens: np.ndarray, layout, perm) -> tuple[np.ndarray, np.ndarray]:
    """Reorder the demo blocks: new block i is original block perm[i] (with its delimiter).

    tokens (N, T); layout = (segment, position) from episodes.layout; perm (k,) for all
    episodes or (N, k) per episode. Returns (tokens', key_map) with key_map (T,) or (N, T):
    the new position of every original position (a bijection; test positions map to
    themselves), so tokens[n, t] == tokens'[n, key_map[n, t]].
    """
    k, l_demo, _ = _dims(layout[0])
    tokens = np.asarray(tokens)
    N, T = tokens.shape
    perm = np.asarray(perm, dtype=np.intp)
    single = perm.ndim == 1
    P = perm[None] if single else perm
    if P.shape[-1] != k or (not single and P.shape[0] != N) or \
            not (np.sort(P, axis=1) == np.arange(k)).all():
        raise ValueError(f"perm must be a permutation of range({k}), shape (k,) or (N={N}, k)")
    blk = l_demo + 1
    src = (P[:, :, None] * blk + np.arange(blk)).reshape(len(P), k * blk)  # new pos -> original pos
    src = np.concatenate([src, np.broadcast_to(np.arange(k * blk, T), (len(P), T - k * blk))], axis=1)
    out = np.take_along_axis(tokens, np.broadcast_to(src, (N, T)), axis=1)
    key_map = np.argsort(src, axis=1)  # inverse permutation: original pos -> new pos
    return out, (key_map[0] if single else key_map)


def _draw_perms(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """(n, k) uniform non-identity permutations."""
    p = rng.permuted(np.tile(np.arange(k), (n, 1)), axis=1)
    while (bad := (p == np.arange(k)).all(1)).any():
        p[bad] = rng.permuted(np.tile(np.arange(k), (int(bad.sum()), 1)), axis=1)
    return p


def _mean_ci(x: np.ndarray):
    """(mean, se, lo, hi, n) over axis 0, NaNs (no valid pair) left out, +- 1.96 se (NaN for n < 2)."""
    n = np.isfinite(x).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        m = np.nanmean(x, 0)
        se = np.where(n > 1, np.nanstd(x, 0, ddof=1) / np.sqrt(n), NAN)
    return m, se, m - 1.96 * se, m + 1.96 * se, n


def _reason(lo: float, hi: float) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "CI not finite"
    return ("95% CI entirely below 0: upper layers change less" if hi < 0 else
            "95% CI entirely above 0: upper layers change more" if lo > 0 else "95% CI contains 0")


def layer_claims(per_episode: np.ndarray) -> list[Claim]:
    """The two 'upper layers change less' claims from r[e, l] (episodes x layers); module docstring."""
    r = np.asarray(per_episode, float)
    r = r[np.isfinite(r).all(1)]  # episodes with a valid value at every layer
    E, L = r.shape
    names = ("upper layers change less (slope)", "upper layers change less (upper - lower half)")
    stats = ("OLS slope of normalized logit change vs layer, episode-clustered SE",
             "mean(upper-half layers) - mean(lower-half layers), paired over episodes")
    why = "one layer: no layer trend to test" if L < 2 else "fewer than 2 valid episodes" if E < 2 else None
    if why is not None:
        return [claim(n, s, NAN, NAN, NAN, _RULE, why) for n, s in zip(names, stats)]
    x = np.tile(np.arange(L, dtype=float), E)
    fit = sm.OLS(r.reshape(-1), sm.add_constant(x)).fit(
        cov_type="cluster", cov_kwds={"groups": np.repeat(np.arange(E), L)}, use_t=True)
    b, (lo, hi) = float(fit.params[1]), (float(v) for v in np.asarray(fit.conf_int(0.05))[1])
    out = [claim(names[0], stats[0], b, lo, hi, _RULE, _reason(lo, hi))]
    h = L // 2
    d = r[:, L - h:].mean(1) - r[:, :h].mean(1)
    dlo, dhi = (float(v) for v in sm.stats.DescrStatsW(d).tconfint_mean(0.05))
    out.append(claim(names[1], stats[1], float(d.mean()), dlo, dhi, _RULE, _reason(dlo, dhi)))
    return out


@dataclass
class ShuffleResult:
    per_episode: np.ndarray  # (E, L) pooled-over-heads normalized change
    per_episode_head: np.ndarray  # (E, L, H)
    by_layer: list[dict]
    by_head: list[dict]
    claims: list[Claim]
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return jsonable({"by_layer": self.by_layer, "by_head": self.by_head,
                          "claims": [asdict(c) for c in self.claims], "meta": self.meta,
                          "per_episode": self.per_episode})

    def to_csv(self, directory) -> list[Path]:
        """by_layer.csv, by_head.csv, claims.csv, per_episode.csv in `directory` (atomic writes)."""
        E, L = self.per_episode.shape
        pe = [{"episode": e, "layer": l, "change": float(self.per_episode[e, l])} for e in range(E) for l in range(L)]
        return write_tables(directory, {"by_layer": self.by_layer, "by_head": self.by_head,
                                        "claims": [asdict(c) for c in self.claims], "per_episode": pe})

    def figure(self, title: str | None = None):
        """Figure 2 as a matplotlib Figure: the per-layer change with its 95% CI (error bars and band) and a
        layer x head heatmap with a labelled colourbar. Layers are numbered as in Figure 3: layer l >= 1 is
        the attention of block l (1-based, the block whose output Figure 3 calls layer l); layer 0, the
        embedding, has no attention and no point here. (Tables and metrics keep `layer` = 0-based block.)
        The band and its legend entry appear only where a CI exists (>= 2 episodes) over >= 2 layers; the claim's box says its
        verdict and value with CI, or, with no value (one layer, too few episodes), its verdict and why."""
        # lazy: matplotlib (~0.5 s) only when a figure is drawn (train.figures / no figures: never)
        from matplotlib.figure import Figure

        lay = np.array([[r["layer"], r["mean"], r["ci_lo"], r["ci_hi"]] for r in self.by_layer], float)
        heat = np.array([[r["mean"] for r in self.by_head if r["layer"] == l] for l in range(len(lay))], float)
        x = lay[:, 0] + 1  # Figure 3's numbering: layer 0 = embedding
        fig = Figure(figsize=(11, 4.2), layout="constrained")
        a, b = fig.subplots(1, 2)
        has_ci = bool((np.isfinite(lay[:, 2]) & np.isfinite(lay[:, 3])).any())
        if has_ci and len(x) >= 2:  # a band needs two layers; none (nor its legend entry) where it is not drawn
            a.fill_between(x, lay[:, 2], lay[:, 3], color="C0", alpha=0.25, label="95% CI over episodes")
        err = np.abs(np.stack([lay[:, 1] - lay[:, 2], lay[:, 3] - lay[:, 1]]))
        a.errorbar(x, lay[:, 1], yerr=np.nan_to_num(err), fmt="o-", color="C0", capsize=5, elinewidth=1.5,
                   label="mean over episodes" + ("" if has_ci and len(x) >= 2 else " (bars: 95% CI)" if has_ci
                                                 else " (no CI: fewer than 2 episodes)"))
        a.set(xlabel="layer (attention of block l; 0 = embedding, as in Fig. 3)",
              ylabel="mean |delta logit| / mean |logit|", title="shuffle test: test -> demo logits")
        a.set_xticks(x)
        a.set_xlim(0.5, len(x) + 0.5)
        lo = np.nanmin(lay[:, 2]) if np.isfinite(lay[:, 2]).any() else 0.0
        a.set_ylim(bottom=min(0.0, lo))
        c = next((c for c in self.claims if "slope" in c.statistic.lower()), self.claims[0] if self.claims else None)
        if c is not None:
            detail = (f"{c.value:.3g} [95% CI {c.ci_lo:.3g}, {c.ci_hi:.3g}]"
                      if math.isfinite(c.value) and math.isfinite(c.ci_lo) and math.isfinite(c.ci_hi)
                      else f"{c.value:.3g} (no CI)" if math.isfinite(c.value) else f"not estimated: {c.reason}")
            a.text(0.02, 0.02, f"{c.name}: {c.verdict}\n{detail}" + (f"\n({c.statistic})" if math.isfinite(c.value)
                                                                    else ""),
                   transform=a.transAxes, fontsize=7, va="bottom", bbox={"facecolor": "white", "alpha": 0.8, "lw": 0})
        a.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)  # below: on no point
        im = b.imshow(heat.T, aspect="auto", origin="lower", cmap="viridis",
                      extent=(0.5, heat.shape[0] + 0.5, -0.5, heat.shape[1] - 0.5))
        b.set(xlabel="layer (attention of block l)", ylabel="head", title="normalized change per head",
              xticks=range(1, heat.shape[0] + 1), yticks=range(heat.shape[1]))
        fig.colorbar(im, ax=b, label="mean |delta logit| / mean |logit|")
        fig.suptitle("Figure 2: shuffle test" + (f", {title}" if title else "")
                     + f" ({self.per_episode.shape[0]} episodes)")
        return fig

    def plot(self, path, title: str | None = None) -> list[Path]:
        """Write `figure()` as <path>.png and <path>.pdf; returns [png, pdf]."""
        # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
        from ..safe_output import save_figure

        return save_figure(self.figure(title), path)


def _scores_forward(model, idx: torch.Tensor, reduce) -> None:
    """One forward of `model` on idx through every layer, each layer's attention on the explicit path, calling
    reduce(layer, scores) with its pre-softmax scores (rows, H, T, T) as they are made (nothing is cached, so one
    layer's scores are alive at a time); the logits are not computed. Flags and hooks are restored on return."""
    blocks = list(model.blocks)
    saved = [b.attn.explicit for b in blocks]
    handles = []

    class _Done(Exception):
        pass

    def hook(l):
        def fn(_mod, _inp, scores):
            reduce(l, scores)
            if l == len(blocks) - 1:
                raise _Done  # the last layer's scores are all it needs: no MLP, final norm or head
        return fn

    try:
        for l, b in enumerate(blocks):
            b.attn.explicit = True
            handles.append(b.attn.hook_attn_scores.register_forward_hook(hook(l)))
        try:
            model(idx)
        except _Done:
            pass
    finally:
        for h in handles:
            h.remove()
        for b, e in zip(blocks, saved):
            b.attn.explicit = e


@torch.no_grad()
def shuffle_test(model, ep: Episodes, *, n_perms: int = 4, seed: int = 0, device="cpu", batch_size: int = 32,
                 max_episodes: int | None = None, max_bytes: int = 1 << 28) -> ShuffleResult:
    """Run the shuffle test of `model` on `ep` (module docstring); the model is returned to its device and mode."""
    t0 = time.perf_counter()
    if max_episodes is not None:
        ep = ep.subset(slice(0, max_episodes))
    k, E, T = ep.n_demos, len(ep), ep.seq_len
    if k < 2 or ep.l_test < 2 or n_perms < 1 or E < 1:
        raise ValueError(f"shuffle test needs n_demos >= 2, l_test >= 2, n_perms >= 1, episodes >= 1 "
                         f"(got {k}, {ep.l_test}, {n_perms}, {E})")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    lay = (ep.segment, ep.position)
    seg = ep.segment[: T - 1]
    device = torch.device(device)
    qi = torch.as_tensor(np.flatnonzero(seg == k), device=device)
    ki_np = np.flatnonzero((seg >= 0) & (seg < k))
    ki = torch.as_tensor(ki_np, device=device)
    rng = seeds.rng(seed, _TAG)
    perms = np.stack([_draw_perms(rng, E, k) for _ in range(n_perms)])  # (P, E, k)
    sums = np.zeros((4, E, L, H))  # |delta| sum, its count, |logit| sum, its count
    p0 = next(model.parameters())
    home, was_training = p0.device, model.training
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        model.to(device).eval()
        torch.backends.cuda.matmul.allow_tf32 = False
        per_ep = (1 + n_perms) * H * (T - 1) ** 2 * 4  # bytes of one layer's scores for one episode
        bs = max(1, min(batch_size, max_bytes // per_ep))  # one layer's scores at a time: reduced as they come
        for lo in range(0, E, bs):
            b = np.arange(lo, min(lo + bs, E))
            B, tok = len(b), ep.tokens[b].astype(np.int64)
            rows, kmaps = [tok], []
            for p in range(n_perms):
                t2, km = permute_demos(tok, lay, perms[p, b])
                rows.append(t2)
                kmaps.append(km[:, ki_np])  # (B, nk): new position of each demo key
            idx = torch.as_tensor(np.concatenate(rows)[:, :-1], device=device)  # ((1+P) B, T-1)
            kmap = torch.as_tensor(np.stack(kmaps), device=device)  # (P, B, nk)
            gi = kmap[:, :, None, None, :].expand(n_perms, B, H, len(qi), len(ki))
            out = torch.empty((L, 4, B, H), dtype=torch.float64, device=device)

            def reduce(l, scores, B=B, gi=gi, out=out):  # one layer's scores as the forward makes them: their sums
                s = scores.float().view(1 + n_perms, B, H, T - 1, T - 1)[:, :, :, qi]
                orig = s[0][..., ki]  # (B, H, nq, nk)
                moved = s[1:].gather(-1, gi)  # (P, B, H, nq, nk): each key's moved copy
                ok0 = (orig[:, :1] > -math.inf).expand_as(orig)  # the mask is the same for all heads
                ok = ok0 & (moved[:, :, :1] > -math.inf)
                dlt = torch.where(ok, (moved - orig).abs(), 0.0)
                out[l] = torch.stack([dlt.sum((0, 3, 4)), ok.sum((0, 3, 4)),
                                      torch.where(ok0, orig.abs(), 0.0).sum((2, 3)), ok0.sum((2, 3))]).double()

            _scores_forward(model, idx, reduce)
            sums[:, b] = out.permute(1, 2, 0, 3).cpu().numpy()  # (4, B, L, H)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        model.to(home).train(was_training)
    with np.errstate(invalid="ignore", divide="ignore"):
        num, den = sums[0] / sums[1], sums[2] / sums[3]  # (E, L, H) mean |delta|, mean |logit|
        r_head = num / den
        r_layer = num.mean(2) / den.mean(2)  # (E, L) pooled over heads
        ok = np.isfinite(num) & np.isfinite(den)  # pooled: over (episode, head) cells with valid pairs
        nz, dz = np.where(ok, num, 0.0), np.where(ok, den, 0.0)
        pooled_l, pooled_h = nz.sum((0, 2)) / dz.sum((0, 2)), nz.sum(0) / dz.sum(0)
    mad, mal = _mean_ci(num.mean(2))[0], _mean_ci(den.mean(2))[0]
    m, se, clo, chi, n = _mean_ci(r_layer)
    by_layer = [{"layer": l, "mean": m[l], "ci_lo": clo[l], "ci_hi": chi[l], "se": se[l], "pooled": pooled_l[l],
                 "mean_abs_delta": mad[l], "mean_abs_logit": mal[l],
                 "n_episodes": n[l]} for l in range(L)]
    m, se, clo, chi, n = _mean_ci(r_head)
    by_head = [{"layer": l, "head": h, "mean": m[l, h], "ci_lo": clo[l, h], "ci_hi": chi[l, h], "se": se[l, h],
                "pooled": pooled_h[l, h], "n_episodes": n[l, h]} for l in range(L) for h in range(H)]
    meta = {"n_episodes": E, "n_perms": n_perms, "seed": seed, "n_layers": L, "n_heads": H,
            "pos_enc": model.cfg.pos_enc, "n_queries": len(qi), "n_keys": len(ki), "seq_len": T - 1,
            "wall_s": time.perf_counter() - t0}
    return ShuffleResult(r_layer, r_head, jsonable(by_layer), jsonable(by_head), layer_claims(r_layer), meta)
