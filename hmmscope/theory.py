"""Theorem 1 computations and fits (SCIENCE.md 4), as a library.

Theorem 1 / Lemma 1 claim eps(L) <= C d exp(-c gamma^4 L). We measure eps(L) per
setting (S, d, rho, gamma) and fit, all by OLS with t-based 95% CIs (plain, not
HC-robust: with 3-9 points per fit HC errors are biased low, and the residual
variance of plain OLS already absorbs the curvature of a not-quite-exponential
curve):

- `fit_decay_rate`: log eps(L) = a - r L over the leading L range (sorted by L) where
  eps > floor and, given stderr, eps > 2 stderr (a noise-dominated mean has no usable
  log). The range stops at the first failing L: a later point back above the floor is
  noise. Fewer than 3 points -> rate NaN, reason "too few points above floor".
- `fit_exponent`: log r = b + k log gamma (r > 0 finite) -> empirical exponent k.
- `fit_rank_intercept`: a = b + s log d -> s, the bound's coefficient being 1.

Verdict rules. C and c are unspecified, so a single setting can only test the
literal summary reading C = c = 1, and scaling claims are tested by CIs:
(a) `eps(L) - 2 stderr <= d exp(-g^4 L)` at every measured L: supported if all
    pass, not supported if any fails; inconclusive if d exp(-g^4 L) >= 1 at every L
    (eps <= 1 always, so the check has no power; in particular when g = gamma(O) = 0,
    which holds whenever S > V, SCIENCE.md 2: the bound in gamma(O) is then vacuous).
(b) decay rate vs g^4 (c = 1): supported if CI lower >= g^4, not supported if CI
    upper < g^4, else inconclusive. `value` = r / g^4, the largest c the data allow.
    Both run with g = gamma(O) and with g = gamma_eff = gamma(Q O); an inexact
    gamma is checked at its lower and upper bound, and differing answers -> inconclusive.
(c) the bound allows r >= c gamma^4, i.e. k <= 4 (and intercept slope in log d
    <= 1). CI upper < 4: supported, the bound holds in gamma and is loose by
    gamma^(4-k); CI lower > 4: not supported, rates fall faster than gamma^4, so no
    fixed c works as gamma -> 0; CI contains 4: inconclusive (consistent with a
    tight exponent but k > 4 not excluded). Same with 1 for the rank slope.
    `run_theory` regresses on the gamma knob (= gamma(O) when S <= V; when S > V
    gamma(O) = 0 and the knob is the only usable x) and on gamma_eff's `.value`
    (its certified lower bound when not exact), per (S, d, rho) group and pooled.
    Forgetting by mixing (rho > 0; see the Dobrushin coefficient) keeps r > 0 as
    gamma -> 0 and pulls k down: read k next to the mixing.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import statsmodels.api as sm

from .config import HMMConfig, TheoryConfig
from .hmm import make_hmm
from .stats import jsonable

Z_SIG = 2.0  # eps must exceed Z_SIG * stderr to enter a rate fit / to count as above the bound
NAN = float("nan")


def _ols(x, y, w=None) -> tuple[float, tuple, float, tuple, float]:
    """(slope, slope CI, intercept, intercept CI, r2): OLS (WLS if w) with 95% t intervals."""
    X = sm.add_constant(np.asarray(x, float), has_constant="add")
    res = (sm.WLS(y, X, weights=w) if w is not None else sm.OLS(y, X)).fit()
    ci = np.asarray(res.conf_int(0.05))
    r2 = float(res.rsquared) if np.ptp(y) > 0 else 1.0
    return float(res.params[1]), (float(ci[1, 0]), float(ci[1, 1])), float(res.params[0]), \
        (float(ci[0, 0]), float(ci[0, 1])), r2


def _ci_verdict(lo: float, hi: float, target: float, claim_below: bool) -> str:
    """Claim `est <= target` (claim_below) or `est >= target`, judged by the 95% CI."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if claim_below:
        return "supported" if hi < target else "not supported" if lo > target else "inconclusive"
    return "supported" if lo >= target else "not supported" if hi < target else "inconclusive"


def _inside(ci, v: float) -> bool | None:
    lo, hi = ci
    return None if not (math.isfinite(lo) and math.isfinite(hi)) else bool(lo <= v <= hi)


@dataclass(frozen=True)
class RateFit:
    """log eps(L) = intercept - rate * L; `reason` is None when the fit succeeded."""

    rate: float
    rate_ci: tuple[float, float]
    intercept: float  # log scale: the fit's log(C d)
    intercept_ci: tuple[float, float]
    n_used: int
    r2: float
    used_lengths: tuple[int, ...]
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


def fit_decay_rate(lengths, eps, stderr=None, floor: float = 1e-10, *, weighted: bool = False) -> RateFit:
    """Decay rate of eps(L) (module docstring); `weighted`: WLS with 1/var(log eps) = (eps/stderr)^2."""
    L, e = np.asarray(lengths, float), np.asarray(eps, float)
    s = np.zeros_like(e) if stderr is None else np.nan_to_num(np.asarray(stderr, float), nan=0.0)
    order = np.argsort(L, kind="stable")
    L, e, s = L[order], e[order], s[order]
    good = np.isfinite(e) & (e > floor) & (e > Z_SIG * s)
    n = len(good) if good.all() else int(np.argmin(good))  # leading run of passing points
    L, e, s = L[:n], e[:n], s[:n]
    if n < 3:
        return RateFit(NAN, (NAN, NAN), NAN, (NAN, NAN), n, NAN, tuple(int(v) for v in L),
                       "too few points above floor")
    w = (e / np.maximum(s, 1e-3 * e)) ** 2 if weighted and stderr is not None else None
    b, (blo, bhi), a, a_ci, r2 = _ols(L, np.log(e), w)
    return RateFit(-b, (-bhi, -blo), a, a_ci, n, r2, tuple(int(v) for v in L))


@dataclass(frozen=True)
class ExponentFit:
    """log rate = intercept + k log x across a sweep; verdict on k <= target (module docstring, c)."""

    k: float
    k_ci: tuple[float, float]
    intercept: float
    intercept_ci: tuple[float, float]
    n_used: int
    r2: float
    x_name: str = "gamma"
    scope: str = "pooled"
    target: float = 4.0
    verdict: str = "inconclusive"
    reason: str = ""
    summary: str = ""
    consistent_with_4: bool | None = None  # 4 inside the 95% CI

    def consistent_with(self, k: float = 4.0) -> bool | None:
        """Whether k lies inside the 95% CI (None when there is no CI)."""
        return _inside(self.k_ci, k)


def fit_exponent(gammas, rates, rate_ci=None, *, x_name: str = "gamma", scope: str = "pooled",
                 target: float = 4.0) -> ExponentFit:
    """OLS of log r on log gamma over points with gamma > 0 and r > 0 finite.

    `rate_ci` (pairs) switches to WLS with 1/se(log r)^2 from the CI (delta method,
    se floored at 1e-3), the CIs still scaled by the residual variance.
    """
    g, r = np.asarray(gammas, float), np.asarray(rates, float)
    keep = np.isfinite(g) & (g > 0) & np.isfinite(r) & (r > 0)
    n = int(keep.sum())
    if n < 3 or np.ptp(np.log(g[keep])) == 0:
        why = f"too few points with {x_name} > 0 and rate > 0 ({n}; need 3 distinct)"
        return ExponentFit(NAN, (NAN, NAN), NAN, (NAN, NAN), n, NAN, x_name, scope, target, "inconclusive",
                           why, f"[{scope}] rate ~ {x_name}^k: inconclusive: {why}")
    w = None
    if rate_ci is not None:
        ci = np.asarray(rate_ci, float)[keep]
        se = (ci[:, 1] - ci[:, 0]) / (2 * 1.96 * r[keep])
        w = 1.0 / np.maximum(np.nan_to_num(se, nan=1.0), 1e-3) ** 2
    k, (lo, hi), b, b_ci, r2 = _ols(np.log(g[keep]), np.log(r[keep]), w)
    verdict = _ci_verdict(lo, hi, target, claim_below=True)
    reason = {
        "supported": f"k < {target:g}: rates fall more slowly than {x_name}^{target:g}, so the bound holds in "
                     f"{x_name} and is loose by a factor ~{x_name}^({target - k:.2f})",
        "not supported": f"k > {target:g}: rates fall faster than {x_name}^{target:g}, so no fixed c gives "
                         f"r >= c {x_name}^{target:g} as {x_name} -> 0",
        "inconclusive": f"CI contains {target:g}: consistent with the bound's exponent, k > {target:g} not excluded",
    }[verdict]
    if lo <= 0:
        reason += (f"; the rate does not clearly grow with {x_name}: forgetting is driven by the chain's mixing "
                   "(see the Dobrushin coefficient), not by observation")
    summary = (f"[{scope}] rate ~ {x_name}^k: k = {k:.2f} [95% CI {lo:.2f}, {hi:.2f}], n = {n}, R2 = {r2:.3f}; "
               f"theory {target:g}: {verdict} ({reason})")
    return ExponentFit(k, (lo, hi), b, b_ci, n, r2, x_name, scope, target, verdict, reason, summary,
                       _inside((lo, hi), 4.0))


@dataclass(frozen=True)
class RankFit:
    """Rate-fit intercept a = intercept + slope log d; the bound allows slope <= 1."""

    slope: float
    slope_ci: tuple[float, float]
    intercept: float
    intercept_ci: tuple[float, float]
    n_used: int
    r2: float
    scope: str = "pooled"
    verdict: str = "inconclusive"
    reason: str = ""
    summary: str = ""
    consistent_with_1: bool | None = None  # 1 inside the 95% CI


def fit_rank_intercept(ranks, intercepts, *, scope: str = "pooled") -> RankFit:
    """OLS of the log-scale intercept a on log d (log eps <= log C + log d - c gamma^4 L)."""
    d, a = np.asarray(ranks, float), np.asarray(intercepts, float)
    keep = np.isfinite(a) & (d >= 1)
    n = int(keep.sum())
    if n < 3 or np.ptp(d[keep]) == 0:
        why = f"too few ranks with a fitted intercept ({n}; need 3 distinct)"
        return RankFit(NAN, (NAN, NAN), NAN, (NAN, NAN), n, NAN, scope, "inconclusive", why,
                       f"[{scope}] intercept ~ slope * log d: inconclusive: {why}")
    s, (lo, hi), b, b_ci, r2 = _ols(np.log(d[keep]), a[keep])
    verdict = _ci_verdict(lo, hi, 1.0, claim_below=True)
    reason = {"supported": "slope < 1: eps grows more slowly with d than the bound's factor d",
              "not supported": "slope > 1: eps grows faster with d than the bound's factor d allows",
              "inconclusive": "CI contains 1: consistent with the factor d, slope > 1 not excluded"}[verdict]
    summary = (f"[{scope}] intercept ~ slope * log d: slope = {s:.2f} [95% CI {lo:.2f}, {hi:.2f}], n = {n}; "
               f"bound 1: {verdict} ({reason})")
    return RankFit(s, (lo, hi), b, b_ci, n, r2, scope, verdict, reason, summary, _inside((lo, hi), 1.0))


@dataclass(frozen=True)
class Verdict:
    claim: str
    scope: str
    verdict: str  # supported | not supported | inconclusive
    reason: str
    value: float | None = None  # (a): fraction of points under the bound; (b): r / g^4


def bound_verdict(lengths, eps, stderr, rate_fit: RateFit, gamma: float, d: int, *,
                  gamma_name: str = "gamma(O)", scope: str = "") -> list[Verdict]:
    """Checks (a) and (b) of the module docstring for one setting and one gamma value."""
    L, e = np.asarray(lengths, float), np.asarray(eps, float)
    s = np.zeros_like(e) if stderr is None else np.nan_to_num(np.asarray(stderr, float), nan=0.0)
    ok = np.isfinite(e)
    bound = d * np.exp(-gamma ** 4 * L)
    under = (e - Z_SIG * s <= bound)[ok]
    frac = float(under.mean()) if under.size else NAN
    vac = f"{gamma_name} = 0 (S > V): the bound is vacuous; " if gamma == 0 else ""
    claim_a = f"eps(L) <= d exp(-g^4 L), g = {gamma_name}, C = c = 1"
    if not np.any((bound < 1) & ok):
        va = Verdict(claim_a, scope, "inconclusive", vac + "d exp(-g^4 L) >= 1 at every measured L, and eps <= 1: "
                     "no power", frac)
    elif under.all():
        va = Verdict(claim_a, scope, "supported", f"all {under.size} points within 2 stderr of the bound", frac)
    else:
        va = Verdict(claim_a, scope, "not supported", f"{int((~under).sum())} of {under.size} points exceed "
                     "d exp(-g^4 L) by > 2 stderr (constants taken as 1)", frac)
    g4 = gamma ** 4
    claim_b = f"decay rate >= g^4, g = {gamma_name}, c = 1"
    if gamma == 0:
        vb = Verdict(claim_b, scope, "inconclusive", vac + "any rate >= 0 passes")
    elif not rate_fit.ok:
        vb = Verdict(claim_b, scope, "inconclusive", f"no rate: {rate_fit.reason}")
    else:
        lo, hi = rate_fit.rate_ci
        v = _ci_verdict(lo, hi, g4, claim_below=False)
        why = {"supported": "CI lower bound", "not supported": "CI upper bound", "inconclusive": "CI"}[v]
        vb = Verdict(claim_b, scope, v, f"rate {rate_fit.rate:.4g} [{lo:.4g}, {hi:.4g}]: {why} vs g^4 = {g4:.4g}",
                     rate_fit.rate / g4)
    return [va, vb]


def _obs_dict(o) -> dict | None:
    if o is None:
        return None
    return {k: getattr(o, k, None) for k in ("value", "exact", "lower", "upper", "method")}


def _checks(lengths, eps, stderr, fit, obs: dict, d, name, scope) -> list[Verdict]:
    """bound_verdict at obs' value; an inexact gamma at both bounds, differing answers -> inconclusive."""
    if obs["exact"] or obs["lower"] is None:
        return bound_verdict(lengths, eps, stderr, fit, float(obs["value"]), d, gamma_name=name, scope=scope)
    lo, hi = (bound_verdict(lengths, eps, stderr, fit, float(obs[k]), d, gamma_name=name, scope=scope)
              for k in ("lower", "upper"))
    return [a if a.verdict == b.verdict else dataclasses.replace(
        a, verdict="inconclusive", reason=f"{name} in [{obs['lower']:.3g}, {obs['upper']:.3g}]: differs by bound")
        for a, b in zip(lo, hi)]


@dataclass
class Setting:
    """One (S, d, rho, gamma) point of the sweep."""

    params: dict
    gamma_O: dict
    gamma_eff: dict
    gamma_m: dict | None
    dobrushin: float
    lengths: list
    eps: list
    stderr: list
    rate_fit: RateFit
    verdicts: list = field(default_factory=list)
    seconds: float = 0.0


def _fmt_obs(o: dict | None) -> str:
    if o is None:
        return "-"
    if o["exact"]:
        return f"{o['value']:.3g}"
    return f"[{o['lower']:.3g}, {o['upper']:.3g}]"


@dataclass
class TheoryResult:
    config: dict
    settings: list[Setting]
    exponent_fits: list[ExponentFit]
    rank_fits: list[RankFit]
    verdicts: list[Verdict]
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """JSON-serializable (plain Python types, NaN -> None)."""
        return jsonable(self)

    def table(self) -> list[dict[str, str]]:
        """One row per setting, values preformatted as strings (column names = keys)."""
        rows = []
        for s in self.settings:
            f, p = s.rate_fit, s.params
            rows.append({
                "S": str(p["n_states"]), "d": str(p["rank"]), "rho": f"{p['rho']:g}", "gamma": f"{p['gamma']:g}",
                "gamma(O)": _fmt_obs(s.gamma_O), "gamma_eff": _fmt_obs(s.gamma_eff),
                f"gamma_{p.get('m', '')}": _fmt_obs(s.gamma_m), "dobrushin": f"{s.dobrushin:.3f}",
                "rate": f"{f.rate:.4g}" if f.ok else "nan",
                "rate 95% CI": f"[{f.rate_ci[0]:.4g}, {f.rate_ci[1]:.4g}]" if f.ok else (f.reason or ""),
                "log(Cd)": f"{f.intercept:.2f}" if f.ok else "nan", "n_fit": str(f.n_used),
                "R2": f"{f.r2:.3f}" if f.ok else "nan",
                "rate>=gamma_eff^4": next((v.verdict for v in s.verdicts if v.claim.startswith("decay rate")
                                           and "gamma_eff" in v.claim), "-"),
            })
        return rows

    def summary_lines(self) -> list[str]:
        out = [f.summary for f in self.exponent_fits] + [f.summary for f in self.rank_fits]
        for s in self.settings:
            p = s.params
            tag = f"S={p['n_states']} d={p['rank']} rho={p['rho']:g} gamma={p['gamma']:g}"
            out += [f"[{tag}] {v.claim}: {v.verdict} ({v.reason})" for v in s.verdicts]
        return out


def run_theory(cfg: TheoryConfig, *, progress: Callable[[int, int, str], Any] | None = None,
               time_limit: float = 10.0, gamma_m_time_limit: float = 3.0) -> TheoryResult:
    """The whole Theorem 1 sweep over n_states x ranks x rhos x gammas (module docstring)."""
    from .inference import memory_error
    from .observability import gamma_eff, gamma_m, observability

    bad = [(S, d) for S in cfg.n_states for d in cfg.ranks if d > S]
    if bad:
        raise ValueError(f"theory.ranks must not exceed theory.n_states; offending (S, d): {bad}")
    t0 = time.perf_counter()
    grid = list(itertools.product(cfg.n_states, cfg.ranks, cfg.rhos, cfg.gammas))
    settings: list[Setting] = []
    for i, (S, d, rho, g) in enumerate(grid):
        t1 = time.perf_counter()
        label = f"S={S} d={d} rho={rho:g} gamma={g:g}"
        hmm = make_hmm(HMMConfig(family=cfg.family, n_tasks=1, n_states=S, n_tokens=cfg.n_tokens, rank=d, gamma=g,
                                 alpha=cfg.alpha, rho=rho, seed=cfg.seed))
        gO = _obs_dict(observability(hmm.emission, time_limit=time_limit))
        ge = _obs_dict(gamma_eff(hmm.Q, hmm.emission))
        gm = _obs_dict(gamma_m(hmm, cfg.gamma_m, time_limit=gamma_m_time_limit)) if cfg.gamma_m > 0 else None
        me = memory_error(hmm, list(cfg.lengths), n_histories=cfg.n_histories, burn_in=cfg.burn_in, seed=cfg.seed)
        L, e, se = (np.asarray(x, float) for x in (me.lengths, me.eps, me.stderr))
        fit = fit_decay_rate(L, e, se, cfg.floor)
        verdicts = (_checks(L, e, se, fit, gO, d, "gamma(O)", label)
                    + _checks(L, e, se, fit, ge, d, "gamma_eff", label))
        params = {"family": cfg.family, "n_states": S, "rank": d, "rho": rho, "gamma": g, "m": cfg.gamma_m}
        settings.append(Setting(params, gO, ge, gm, float(hmm.dobrushin()), L.tolist(), e.tolist(), se.tolist(),
                                fit, verdicts, time.perf_counter() - t1))
        if progress is not None:
            progress(i + 1, len(grid), label)

    groups: dict[tuple, list[Setting]] = {}
    for s in settings:
        groups.setdefault((s.params["n_states"], s.params["rank"], s.params["rho"]), []).append(s)
    scopes = [(f"S={k[0]} d={k[1]} rho={k[2]:g}", v) for k, v in groups.items()]
    if len(groups) > 1:
        scopes.append(("pooled", settings))
    exps: list[ExponentFit] = []
    for scope, ss in scopes:
        r = [s.rate_fit.rate for s in ss]
        fg = fit_exponent([s.params["gamma"] for s in ss], r, x_name="gamma", scope=scope)
        if any(s.gamma_O["value"] == 0 for s in ss) and fg.n_used >= 3:  # knob != gamma(O) when S > V
            note = "; gamma(O) = 0 here (S > V), so this reads gamma as the emission knob"
            fg = dataclasses.replace(fg, reason=fg.reason + note, summary=fg.summary + note)
        exps += [fg, fit_exponent([s.gamma_eff["value"] for s in ss], r, x_name="gamma_eff", scope=scope)]
    ranks: list[RankFit] = []
    if len(cfg.ranks) > 1:
        by: dict[tuple, list[Setting]] = {}
        for s in settings:
            by.setdefault((s.params["n_states"], s.params["rho"], s.params["gamma"]), []).append(s)
        ranks = [fit_rank_intercept([s.params["rank"] for s in ss], [s.rate_fit.intercept for s in ss],
                                    scope=f"S={k[0]} rho={k[1]:g} gamma={k[2]:g}") for k, ss in by.items()]
    verdicts = [Verdict(f"rate ~ {f.x_name}^k with k <= {f.target:g}", f.scope, f.verdict, f.reason,
                        None if math.isnan(f.k) else f.k) for f in exps]
    verdicts += [Verdict("intercept slope in log d <= 1", f.scope, f.verdict, f.reason,
                         None if math.isnan(f.slope) else f.slope) for f in ranks]
    return TheoryResult(dataclasses.asdict(cfg), settings, exps, ranks, verdicts, time.perf_counter() - t0)


def plot_theory(result: TheoryResult, path) -> None:
    """log eps vs L per gamma, one panel per (S, d, rho) group, plus rate vs gamma / gamma_eff (log-log)."""
    from matplotlib.figure import Figure

    groups: dict[tuple, list[Setting]] = {}
    for s in result.settings:
        groups.setdefault((s.params["n_states"], s.params["rank"], s.params["rho"]), []).append(s)
    n = len(groups) + 1
    fig = Figure(figsize=(4.5 * n, 4), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    for ax, ((S, d, rho), ss) in zip(axes, groups.items()):
        for j, s in enumerate(ss):
            L, e, se = (np.asarray(x, float) for x in (s.lengths, s.eps, s.stderr))
            pos = np.isfinite(e) & (e > 0)
            line = ax.errorbar(L[pos], e[pos], yerr=np.minimum(se[pos], 0.999 * e[pos]), fmt="o", ms=3,
                               capsize=2, label=f"gamma={s.params['gamma']:g}", color=f"C{j % 10}")
            f = s.rate_fit
            if f.ok:
                x = np.array([min(f.used_lengths), max(f.used_lengths)], float)
                ax.plot(x, np.exp(f.intercept - f.rate * x), "--", color=line[0].get_color())
        ax.set(yscale="log", xlabel="L (memory)", ylabel="eps(L)", title=f"S={S} d={d} rho={rho:g}")
        ax.legend(fontsize=7)
    ax, xmin = axes[-1], 0.1
    for x_name, key, mk in (("gamma", None, "o"), ("gamma_eff", "gamma_eff", "s")):
        xs = np.array([s.params["gamma"] if key is None else (s.gamma_eff["value"] or NAN) for s in result.settings])
        r = np.array([s.rate_fit.rate for s in result.settings])
        ok = np.isfinite(xs) & (xs > 0) & np.isfinite(r) & (r > 0)
        xmin = min([xmin, *xs[ok]])
        ax.plot(xs[ok], r[ok], mk, mfc="none" if key else None, label=f"rate vs {x_name}")
        for f in result.exponent_fits:
            if f.x_name == x_name and f.n_used >= 3 and (f.scope == "pooled" or len(groups) == 1) and ok.any():
                g = np.geomspace(xs[ok].min(), xs[ok].max(), 50)
                ax.plot(g, np.exp(f.intercept) * g ** f.k, "-", lw=1, label=f"fit {x_name}: k={f.k:.2f}")
    g = np.geomspace(xmin, 1.0, 50)
    ax.plot(g, g ** 4, ":", color="gray", label="gamma^4 (c = 1)")
    ax.set(xscale="log", yscale="log", xlabel="gamma / gamma_eff", ylabel="decay rate r", title="rate vs observability")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
