"""Theorem 1 computations and fits (SCIENCE.md 4), as a library.

Theorem 1 / Lemma 1 claim eps(L) <= C d exp(-c gamma^4 L). We measure eps(L) per setting
(S, d, rho, gamma) and fit:

- `fit_decay_rate`: OLS of log eps(L) = a - r L over the leading L range (sorted by L) where
  eps > floor and, given stderr, eps > Z_FIT = 4 stderr (Monte Carlo relative SE <= 25%). The range
  stops at the first failing L: a later point back above the floor is noise. Fewer than 3 points ->
  rate NaN, reason "too few points above floor". 95% CI of the rate: given the per-history TV values
  (`tv`, inference.memory_error keeps them), a percentile bootstrap over histories with the L range
  held fixed (each resample refits the same OLS on the resampled means). The OLS t interval treats the
  points as independent, but the eps(L) of one set of histories share their errors across L (a few
  slowly forgetting histories dominate every large L): at gamma 0.9 (S=128, V=16, d=8, rho=0.02, 16
  seeds x 2000 histories against 20000) the rate's spread over seeds was 2.25x the SE the t interval
  implied with a 2-stderr cut, 1.87x with the 4-stderr cut; the bootstrap's SE was within 1.32x / 1.14x.
  At large L the per-history TV is so heavy-tailed that a mean of a few significant histories fools any
  resampling scheme, hence the stricter cut. Without tv: the OLS t interval (`ci_method`).
- `fit_exponent`: OLS of log r on log x (x = gamma or gamma_eff) over points with x > 0, r > 0
  finite -> the empirical exponent k with a t-based 95% CI (plain, not HC: 3-9 points).
- `fit_rank_intercept`: a = b + s log d -> s, the bound's coefficient being 1.

The chain's own forgetting. `hmm.mixing_rate` = -log|lambda_2(T)|: with no information in the
emissions the L-memory error decays like |lambda_2|^L, so measured rates sit on a floor of about this
size at small gamma (SCIENCE.md's 0.020 at gamma 0.1 with rho = 0.02). A gamma^4 law plus such a floor,
fitted as a power of gamma, gives k far below 4 (about 1.7 on SCIENCE.md's grid); so the exponent is
also fitted on the *excess* rate r - m over the points whose rate CI lies above the floor m (y_name
"rate - mixing floor"). The one-step Dobrushin coefficient (~0.998 for every sticky setting) is logged
but says nothing about this.

Claims (stats.claim: the verdict is the rule applied to the CI on the row).
Per setting, for g = gamma(O) and g = gamma_eff (an inexact g is used at its lower/upper bound so that
the CI covers every g in the bracket):
(a) "eps(L) <= d exp(-g^4 L), C = c = 1": statistic max over L of eps(L) - d exp(-g^4 L), CI from
    eps +- 2 stderr pointwise; rule "<= 0". No power when d exp(-g^4 L) >= 1 at every measured L
    (eps <= 1 always; in particular when g = gamma(O) = 0, which holds whenever S > V).
(b) "decay rate >= g^4, c = 1": statistic rate - g^4 with the rate's CI; rule ">= 0". No power when
    g^4 <= the mixing floor m: the chain's mixing alone keeps the rate above g^4, so the check cannot
    fail because of observation (e.g. gamma_eff^4 ~ 1e-5 against rates ~ 0.1).
Across a gamma sweep, per (S, d, rho) group and pooled:
(c) "k <= 4" (the bound allows r >= c gamma^4 as gamma -> 0, i.e. k <= 4); rule "<= 4". A CI entirely
    below 4 reads "exponent 4 rejected; the bound holds and is loose by gamma^(4-k)"; entirely above 4:
    rates fall faster than gamma^4 and no fixed c works; a CI containing 4: consistent with the
    bound's exponent. Fitted on the raw rate and on the excess over the mixing floor. When gamma_eff is
    a constant multiple of gamma over the points (for the emission family of SCIENCE.md 1,
    gamma_eff = gamma * gamma(Q E) exactly), the gamma_eff fit is the same regression shifted: it is
    kept (`same_as`) but not reported as a second claim.
(d) rank: "intercept slope in log d <= 1"; rule "<= 1".
`run_theory` regresses on the gamma knob (= gamma(O) when S <= V; when S > V gamma(O) = 0 and the
knob is the only usable x).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import statsmodels.api as sm

from .config import HMMConfig, TheoryConfig
from .hmm import make_hmm
from .stats import NO_POWER, Claim, claim, jsonable, percentile_ci, rule

Z_FIT = 4.0  # eps must exceed Z_FIT * stderr (Monte Carlo relative SE <= 25%) to enter a rate fit
Z_SIG = 2.0  # the bound check's pointwise CI: eps +- Z_SIG * stderr
NAN = float("nan")
_TAG = 0x54484559  # "THEY": the rate bootstrap's stream


def _ols(x, y, w=None) -> tuple[float, tuple, float, tuple, float]:
    """(slope, slope CI, intercept, intercept CI, r2): OLS (WLS if w) with 95% t intervals."""
    X = sm.add_constant(np.asarray(x, float), has_constant="add")
    res = (sm.WLS(y, X, weights=w) if w is not None else sm.OLS(y, X)).fit()
    ci = np.asarray(res.conf_int(0.05))
    r2 = float(res.rsquared) if np.ptp(y) > 0 else 1.0
    return float(res.params[1]), (float(ci[1, 0]), float(ci[1, 1])), float(res.params[0]), \
        (float(ci[0, 0]), float(ci[0, 1])), r2


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
    ci_method: str = "OLS t"  # or "bootstrap over histories"

    @property
    def ok(self) -> bool:
        return self.reason is None


def _boot_rates(tv, x, w, n_boot: int, seed: int) -> np.ndarray:
    """Rates refitted on n_boot resamples of the histories (rows of tv (n, K)), x (K,) fixed; NaN if a mean <= 0."""
    n = tv.shape[0]
    rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG]))
    idx = rng.integers(0, n, (n_boot, n)) + n * np.arange(n_boot)[:, None]
    counts = np.bincount(idx.ravel(), minlength=n_boot * n).reshape(n_boot, n).astype(float)  # (B, n)
    m = counts @ tv / n  # (B, K)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(m > 0, np.log(np.where(m > 0, m, 1.0)), np.nan)
    w = np.ones_like(x) if w is None else w
    xc = x - (w @ x) / w.sum()
    slope = ((y - (y @ w / w.sum())[:, None]) * w) @ xc / (w @ xc ** 2)
    return -slope


def fit_decay_rate(lengths, eps, stderr=None, floor: float = 1e-10, *, weighted: bool = False, tv=None,
                   n_boot: int = 2000, seed: int = 0, z_fit: float = Z_FIT) -> RateFit:
    """Decay rate of eps(L) (module docstring). tv: (n_histories, len(lengths)) per-history TV values
    (columns in the order of `lengths`) -> bootstrap CI; `weighted`: WLS with 1/var(log eps) = (eps/stderr)^2."""
    L, e = np.asarray(lengths, float), np.asarray(eps, float)
    s = np.zeros_like(e) if stderr is None else np.nan_to_num(np.asarray(stderr, float), nan=0.0)
    order = np.argsort(L, kind="stable")
    L, e, s = L[order], e[order], s[order]
    good = np.isfinite(e) & (e > floor) & (e > z_fit * s)
    n = len(good) if good.all() else int(np.argmin(good))  # leading run of passing points
    L, e, s = L[:n], e[:n], s[:n]
    if n < 3:
        return RateFit(NAN, (NAN, NAN), NAN, (NAN, NAN), n, NAN, tuple(int(v) for v in L),
                       "too few points above floor")
    w = (e / np.maximum(s, 1e-3 * e)) ** 2 if weighted and stderr is not None else None
    b, (blo, bhi), a, a_ci, r2 = _ols(L, np.log(e), w)
    if tv is None:
        return RateFit(-b, (-bhi, -blo), a, a_ci, n, r2, tuple(int(v) for v in L))
    rates = _boot_rates(np.asarray(tv, float)[:, order[:n]], L, w, n_boot, seed)
    return RateFit(-b, percentile_ci(rates), a, a_ci, n, r2, tuple(int(v) for v in L),
                   ci_method=f"bootstrap over histories ({n_boot} resamples, L range fixed)")


@dataclass(frozen=True)
class ExponentFit:
    """log y = intercept + k log x across a sweep (y = rate, or rate - mixing floor); claim k <= target."""

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
    y_name: str = "rate"
    same_as: str | None = None  # set when this fit is another one's regression (x a constant multiple)

    def consistent_with(self, k: float = 4.0) -> bool | None:
        """Whether k lies inside the 95% CI (None when there is no CI)."""
        return _inside(self.k_ci, k)

    def claim(self) -> Claim:
        """This fit as a claim row: statistic k, rule '<= target'."""
        return claim(f"{self.y_name} ~ {self.x_name}^k: k <= {self.target:g} [{self.scope}]",
                     f"OLS slope of log({self.y_name}) on log {self.x_name} ({self.n_used} points)",
                     self.k, *self.k_ci, rule("<=", self.target), self.reason)


def _exponent_reason(k, lo, hi, x: str, target: float, verdict: str) -> str:
    return {
        "supported": f"exponent {target:g} rejected; the bound holds and is loose by {x}^({target - k:.2f})",
        "not supported": f"k > {target:g}: rates fall faster than {x}^{target:g}, so no fixed c gives "
                         f"r >= c {x}^{target:g} as {x} -> 0: the bound fails",
        "inconclusive": (f"CI contains {target:g}: consistent with the bound's exponent, k > {target:g} not excluded"
                         if math.isfinite(lo) and math.isfinite(hi) else "no CI"),
    }[verdict]


def fit_exponent(gammas, rates, rate_ci=None, *, x_name: str = "gamma", scope: str = "pooled",
                 target: float = 4.0, y_name: str = "rate") -> ExponentFit:
    """OLS of log r on log gamma over points with gamma > 0 and r > 0 finite.

    `rate_ci` (pairs) switches to WLS with 1/se(log r)^2 from the CI (delta method,
    se floored at 1e-3), the CIs still scaled by the residual variance.
    """
    g, r = np.asarray(gammas, float), np.asarray(rates, float)
    keep = np.isfinite(g) & (g > 0) & np.isfinite(r) & (r > 0)
    n = int(keep.sum())
    if n < 3 or np.ptp(np.log(g[keep])) == 0:
        why = f"too few points with {x_name} > 0 and {y_name} > 0 ({n}; need 3 distinct)"
        return ExponentFit(NAN, (NAN, NAN), NAN, (NAN, NAN), n, NAN, x_name, scope, target, "inconclusive",
                           why, f"[{scope}] {y_name} ~ {x_name}^k: inconclusive: {why}", None, y_name)
    w = None
    if rate_ci is not None:
        ci = np.asarray(rate_ci, float)[keep]
        se = (ci[:, 1] - ci[:, 0]) / (2 * 1.96 * r[keep])
        w = 1.0 / np.maximum(np.nan_to_num(se, nan=1.0), 1e-3) ** 2
    k, (lo, hi), b, b_ci, r2 = _ols(np.log(g[keep]), np.log(r[keep]), w)
    c = claim("k", "", k, lo, hi, rule("<=", target), "")
    reason = _exponent_reason(k, lo, hi, x_name, target, c.verdict)
    if lo <= 0:
        reason += (f"; the {y_name} does not clearly grow with {x_name}: forgetting is driven by the chain's mixing "
                   "(see the mixing rate), not by observation")
    summary = (f"[{scope}] {y_name} ~ {x_name}^k: k = {k:.2f} [95% CI {lo:.2f}, {hi:.2f}], n = {n}, R2 = {r2:.3f}: "
               f"{reason} (claim k <= {target:g}: {c.verdict})")
    return ExponentFit(k, (lo, hi), b, b_ci, n, r2, x_name, scope, target, c.verdict, reason, summary,
                       _inside((lo, hi), 4.0), y_name)


def exponent_fits(points: list[dict], scope: str) -> list[ExponentFit]:
    """The sweep-level fits of one scope. points: dicts with gamma, gamma_eff, rate, rate_lo, rate_hi,
    mixing_rate (NaN if unknown). Returns: rate on gamma, rate on gamma_eff (same_as="gamma" when
    gamma_eff / gamma is constant over the fitted points), and the excess over the floor on gamma."""
    g, ge, r, rlo, m = (np.array([float(p.get(k, NAN)) for p in points]) for k in
                        ("gamma", "gamma_eff", "rate", "rate_lo", "mixing_rate"))
    fg = fit_exponent(g, r, x_name="gamma", scope=scope)
    fe = fit_exponent(ge, r, x_name="gamma_eff", scope=scope)
    ok = np.isfinite(g) & (g > 0) & np.isfinite(ge) & (ge > 0)
    if ok.any() and ok.sum() == np.isfinite(ge).sum() and np.ptp(np.log(ge[ok] / g[ok])) < 1e-6:
        ratio = float(np.exp(np.mean(np.log(ge[ok] / g[ok]))))
        note = (f"gamma_eff = {ratio:.4g} gamma at every point: the same regression as on gamma (same k and CI), "
                "not a second finding")
        fe = dataclasses.replace(fe, same_as="gamma", reason=note, summary=f"[{scope}] rate ~ gamma_eff^k: {note}")
    out = [fg, fe]
    if np.isfinite(m).any():
        above = np.isfinite(rlo) & np.isfinite(m) & (rlo > m)
        fx = fit_exponent(g[above], (r - m)[above], x_name="gamma", scope=scope, y_name="rate - mixing floor")
        note = f"; points with rate CI above the floor: {int(above.sum())} of {len(points)}"
        out.append(dataclasses.replace(fx, reason=fx.reason + note, summary=fx.summary + note))
    return out


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

    def claim(self) -> Claim:
        return claim(f"intercept slope in log d <= 1 [{self.scope}]", "OLS slope of the rate fit's intercept on log d",
                     self.slope, *self.slope_ci, rule("<=", 1), self.reason)


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
    verdict = claim("s", "", s, lo, hi, rule("<=", 1), "").verdict
    reason = {"supported": "slope < 1: eps grows more slowly with d than the bound's factor d",
              "not supported": "slope > 1: eps grows faster with d than the bound's factor d allows",
              "inconclusive": "CI contains 1: consistent with the factor d, slope > 1 not excluded"}[verdict]
    summary = (f"[{scope}] intercept ~ slope * log d: slope = {s:.2f} [95% CI {lo:.2f}, {hi:.2f}], n = {n}; "
               f"bound 1: {verdict} ({reason})")
    return RankFit(s, (lo, hi), b, b_ci, n, r2, scope, verdict, reason, summary, _inside((lo, hi), 1.0))


def bound_claims(lengths, eps, stderr, rate_fit: RateFit, gamma, d: int, mixing_rate: float = NAN, *,
                 gamma_name: str = "gamma(O)", scope: str = "") -> list[Claim]:
    """Checks (a) and (b) of the module docstring for one setting; gamma a number or a (lower, upper) bracket."""
    g_lo, g_hi = (float(gamma), float(gamma)) if np.isscalar(gamma) else (float(gamma[0]), float(gamma[1]))
    g = g_lo if g_lo == g_hi else 0.5 * (g_lo + g_hi)
    L, e = np.asarray(lengths, float), np.asarray(eps, float)
    s = np.zeros_like(e) if stderr is None else np.nan_to_num(np.asarray(stderr, float), nan=0.0)
    ok = np.isfinite(e)
    bound = lambda x: d * np.exp(-x ** 4 * L[ok])  # noqa: E731
    tag = f" [{scope}]" if scope else ""
    gtxt = f"{gamma_name} = {g_lo:.3g}" if g_lo == g_hi else f"{gamma_name} in [{g_lo:.3g}, {g_hi:.3g}]"
    vac = f"{gamma_name} = 0 (S > V): the bound is vacuous; " if g_hi == 0 else ""
    if ok.any():
        val = float(np.max(e[ok] - bound(g)))
        lo, hi = float(np.max(e[ok] - Z_SIG * s[ok] - bound(g_lo))), float(np.max(e[ok] + Z_SIG * s[ok] - bound(g_hi)))
    else:
        val = lo = hi = NAN
    if ok.any() and np.all(bound(g_hi) >= 1):
        ra, why = NO_POWER, vac + f"d exp(-g^4 L) >= 1 at every measured L ({gtxt}) and eps <= 1: cannot fail"
    else:
        n_over = int((e[ok] - Z_SIG * s[ok] > bound(g_lo)).sum())
        ra, why = rule("<=", 0), f"{gtxt}; {n_over} of {int(ok.sum())} points exceed the bound by > 2 stderr"
    out = [claim(f"eps(L) <= d exp(-g^4 L), g = {gamma_name}, C = c = 1{tag}",
                 "max over L of eps(L) - d exp(-g^4 L) (CI: eps +- 2 stderr)", val, lo, hi, ra, why)]
    r = rate_fit.rate
    rlo, rhi = rate_fit.rate_ci
    if g_hi ** 4 <= mixing_rate or g_hi == 0:
        rb = NO_POWER
        why = vac + (f"g^4 = {g_hi ** 4:.3g} <= the chain's mixing rate -log|lambda_2(T)| = {mixing_rate:.3g}: "
                     "mixing alone keeps the rate above g^4" if g_hi > 0 else "any rate >= 0 passes")
    else:
        rb = rule(">=", 0)
        why = f"rate {r:.4g} [{rlo:.4g}, {rhi:.4g}] ({rate_fit.ci_method}) vs g^4 = {g ** 4:.4g} ({gtxt})" \
            if rate_fit.ok else f"no rate: {rate_fit.reason}"
    out.append(claim(f"decay rate >= g^4, g = {gamma_name}, c = 1{tag}", "decay rate - g^4", r - g ** 4,
                     rlo - g_hi ** 4, rhi - g_lo ** 4, rb, why))
    return out


def _obs_dict(o) -> dict | None:
    if o is None:
        return None
    return {k: getattr(o, k, None) for k in ("value", "exact", "lower", "upper", "method")}


def _bracket(obs: dict):
    """An exact gamma as a number, an inexact one as its (lower, upper) bracket."""
    if obs["exact"] or obs["lower"] is None:
        return float(obs["value"])
    return float(obs["lower"]), float(obs["upper"])


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
    verdicts: list = field(default_factory=list)  # stats.Claim: checks (a) and (b) for gamma(O) and gamma_eff
    seconds: float = 0.0
    mixing_rate: float = NAN  # -log|lambda_2(T)|

    def point(self) -> dict:
        f = self.rate_fit
        return {"gamma": self.params["gamma"], "gamma_eff": self.gamma_eff["value"], "rate": f.rate,
                "rate_lo": f.rate_ci[0], "rate_hi": f.rate_ci[1], "mixing_rate": self.mixing_rate}


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
    verdicts: list[Claim]  # the sweep-level claims (exponents, rank slopes)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """JSON-serializable (plain Python types, NaN -> None)."""
        return jsonable(self)

    def claims(self, detail: bool = True) -> list[Claim]:
        """Sweep-level claims, then (detail) every setting's checks."""
        return [*self.verdicts, *(c for s in self.settings for c in s.verdicts)] if detail else list(self.verdicts)

    def table(self) -> list[dict[str, str]]:
        """One row per setting, values preformatted as strings (column names = keys)."""
        rows = []
        for s in self.settings:
            f, p = s.rate_fit, s.params
            rows.append({
                "S": str(p["n_states"]), "d": str(p["rank"]), "rho": f"{p['rho']:g}", "gamma": f"{p['gamma']:g}",
                "gamma(O)": _fmt_obs(s.gamma_O), "gamma_eff": _fmt_obs(s.gamma_eff),
                f"gamma_{p.get('m', '')}": _fmt_obs(s.gamma_m), "dobrushin": f"{s.dobrushin:.3f}",
                "mixing -log|l2|": f"{s.mixing_rate:.4g}",
                "rate": f"{f.rate:.4g}" if f.ok else "nan",
                "rate 95% CI": f"[{f.rate_ci[0]:.4g}, {f.rate_ci[1]:.4g}]" if f.ok else (f.reason or ""),
                "rate - mixing": f"{f.rate - s.mixing_rate:.4g}" if f.ok else "nan",
                "log(Cd)": f"{f.intercept:.2f}" if f.ok else "nan", "n_fit": str(f.n_used),
                "R2": f"{f.r2:.3f}" if f.ok else "nan",
                "rate>=gamma_eff^4": next((c.verdict for c in s.verdicts if c.name.startswith("decay rate")
                                           and "gamma_eff" in c.name), "-"),
            })
        return rows

    def summary_lines(self) -> list[str]:
        out = [f.summary for f in self.exponent_fits] + [f.summary for f in self.rank_fits]
        for s in self.settings:
            out += [f"{c.name}: {c.verdict} ({c.reason}; {c.value:.4g} [{c.ci_lo:.4g}, {c.ci_hi:.4g}], rule {c.rule})"
                    for c in s.verdicts]
        return out


def run_theory(cfg: TheoryConfig, *, progress: Callable[[int, int, str], Any] | None = None,
               time_limit: float = 10.0, gamma_m_time_limit: float = 3.0, n_boot: int = 2000) -> TheoryResult:
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
        fit = fit_decay_rate(L, e, se, cfg.floor, tv=me.tv, n_boot=n_boot, seed=cfg.seed)
        m = hmm.mixing_rate()
        claims = (bound_claims(L, e, se, fit, _bracket(gO), d, m, gamma_name="gamma(O)", scope=label)
                  + bound_claims(L, e, se, fit, _bracket(ge), d, m, gamma_name="gamma_eff", scope=label))
        params = {"family": cfg.family, "n_states": S, "rank": d, "rho": rho, "gamma": g, "m": cfg.gamma_m}
        settings.append(Setting(params, gO, ge, gm, float(hmm.dobrushin()), L.tolist(), e.tolist(), se.tolist(),
                                fit, claims, time.perf_counter() - t1, m))
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
        fits = exponent_fits([s.point() for s in ss], scope)
        if any(s.gamma_O["value"] == 0 for s in ss) and fits[0].n_used >= 3:  # knob != gamma(O) when S > V
            note = "; gamma(O) = 0 here (S > V), so this reads gamma as the emission knob"
            fits[0] = dataclasses.replace(fits[0], reason=fits[0].reason + note, summary=fits[0].summary + note)
        exps += fits
    ranks: list[RankFit] = []
    if len(cfg.ranks) > 1:
        by: dict[tuple, list[Setting]] = {}
        for s in settings:
            by.setdefault((s.params["n_states"], s.params["rho"], s.params["gamma"]), []).append(s)
        ranks = [fit_rank_intercept([s.params["rank"] for s in ss], [s.rate_fit.intercept for s in ss],
                                    scope=f"S={k[0]} rho={k[1]:g} gamma={k[2]:g}") for k, ss in by.items()]
    verdicts = [f.claim() for f in exps if f.same_as is None] + [f.claim() for f in ranks]
    return TheoryResult(dataclasses.asdict(cfg), settings, exps, ranks, verdicts, time.perf_counter() - t0)


def theory_figure(result: TheoryResult, title: str | None = None):
    """The Theorem 1 figure as a matplotlib Figure.

    One panel per (S, d, rho) group: eps(L) vs L per gamma, with the rate fit as a dashed line in its
    points' colour over the L range it used; points left out of the fit (below the floor or the 4-stderr
    cut) are hollow. Then rate vs gamma and rate vs gamma_eff on separate panels (log-log): a colour per
    (S, d, rho) group, each group's exponent fit in its points' colour, the pooled fit in black; on the
    gamma panel also the excess over the mixing floor (triangles, hollow where the rate CI does not clear
    the floor and the excess fit leaves the point out), with the reference g^4 (c = 1) and the floor.
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    groups: dict[tuple, list[Setting]] = {}
    for s in result.settings:
        groups.setdefault((s.params["n_states"], s.params["rank"], s.params["rho"]), []).append(s)
    n = len(groups) + 2
    fig = Figure(figsize=(4.6 * n, 6.5), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    hollow = Line2D([], [], color="gray", marker="o", mfc="none", ls="none", label="hollow: left out of the fit")
    for ax, ((S, d, rho), ss) in zip(axes, groups.items()):
        for j, s in enumerate(ss):
            L, e, se = (np.asarray(x, float) for x in (s.lengths, s.eps, s.stderr))
            pos = np.isfinite(e) & (e > 0)
            used = np.isin(L, np.asarray(s.rate_fit.used_lengths, float)) if s.rate_fit.ok else np.zeros_like(pos)
            c = f"C{j % 10}"
            yerr = np.minimum(se, 0.999 * e)
            for sel, mfc, lab in ((pos & used, c, f"gamma={s.params['gamma']:g}"), (pos & ~used, "none", None)):
                if sel.any():
                    ax.errorbar(L[sel], e[sel], yerr=yerr[sel], fmt="o", ms=4, capsize=2, color=c, mfc=mfc,
                                label=lab if lab and (pos & used).any() else None)
            if not (pos & used).any():
                ax.plot([], [], "o", color=c, label=f"gamma={s.params['gamma']:g} (no fit)")
            f = s.rate_fit
            if f.ok:
                x = np.array([min(f.used_lengths), max(f.used_lengths)], float)
                ax.plot(x, np.exp(f.intercept - f.rate * x), "--", color=c)
        ax.set(yscale="log", xlabel="L (memory)", ylabel="eps(L)", title=f"S={S} d={d} rho={rho:g}")
        h, _ = ax.get_legend_handles_labels()
        ax.legend(handles=[*h, hollow, Line2D([], [], color="gray", ls="--", label="rate fit")], fontsize=7)
    r = np.array([s.rate_fit.rate for s in result.settings])
    rlo = np.array([s.rate_fit.rate_ci[0] for s in result.settings])
    m = np.array([s.mixing_rate for s in result.settings])
    gk = np.array([s.params["gamma"] for s in result.settings], float)
    ge = np.array([NAN if s.gamma_eff["value"] is None else s.gamma_eff["value"] for s in result.settings], float)
    gi = {id(s): i for i, s in enumerate(result.settings)}
    scope_of = {k: f"S={k[0]} d={k[1]} rho={k[2]:g}" for k in groups}
    pooled = len(groups) > 1
    for ax, xs, x_name in ((axes[-2], gk, "gamma"), (axes[-1], ge, "gamma_eff")):
        xmin = 1.0
        for j, (k, ss) in enumerate(groups.items()):
            c, idx = f"C{j % 10}", np.array([gi[id(s)] for s in ss])
            x, y = xs[idx], r[idx]
            ok = np.isfinite(x) & (x > 0) & np.isfinite(y) & (y > 0)
            if ok.any():
                xmin = min(xmin, float(x[ok].min()))
                ax.plot(x[ok], y[ok], "o", color=c, label=f"rate, {scope_of[k]}")
            if x_name == "gamma":
                ex, above = (r - m)[idx], (np.isfinite(rlo) & np.isfinite(m) & (rlo > m))[idx]
                okx = np.isfinite(ex) & (ex > 0) & (x > 0)
                for sel, mfc in ((okx & above, c), (okx & ~above, "none")):
                    if sel.any():
                        ax.plot(x[sel], ex[sel], "^", color=c, mfc=mfc,
                                label=f"rate - mixing floor, {scope_of[k]}" if mfc == c else None)
            for f in result.exponent_fits:
                if f.x_name != x_name or f.scope != scope_of[k] or not math.isfinite(f.k) or not ok.any():
                    continue
                g = np.geomspace(x[ok].min(), x[ok].max(), 50)
                ls = "-" if f.y_name == "rate" else "--"
                ax.plot(g, np.exp(f.intercept) * g ** f.k, ls, color=c, lw=1.2,
                        label=f"fit {f.y_name}: k={f.k:.2f} [{f.k_ci[0]:.2f}, {f.k_ci[1]:.2f}]")
        for f in result.exponent_fits:
            ok = np.isfinite(xs) & (xs > 0)
            if pooled and f.scope == "pooled" and f.x_name == x_name and math.isfinite(f.k) and ok.any():
                g = np.geomspace(xs[ok].min(), xs[ok].max(), 50)
                ax.plot(g, np.exp(f.intercept) * g ** f.k, "-" if f.y_name == "rate" else "--", color="k", lw=1.2,
                        label=f"pooled fit {f.y_name}: k={f.k:.2f} [{f.k_ci[0]:.2f}, {f.k_ci[1]:.2f}]")
        if np.isfinite(m).any():
            ax.axhline(float(np.nanmin(m)), color="gray", lw=0.8, ls="-.", label="mixing floor -log|lambda_2|")
        g = np.geomspace(min(xmin, 1.0), 1.0, 50)
        ax.plot(g, g ** 4, ":", color="gray", label=f"{x_name}^4 (c = 1)")
        h, _ = ax.get_legend_handles_labels()
        ax.set(xscale="log", yscale="log", xlabel=x_name, ylabel="decay rate r", title=f"rate vs {x_name}")
        ax.legend(handles=h + ([hollow] if x_name == "gamma" else []), fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.suptitle("Theorem 1: eps(L) and its decay rate" + (f", {title}" if title else ""))
    return fig


def plot_theory(result: TheoryResult, path, title: str | None = None) -> list[Path]:
    """Write `theory_figure` as <path>.png and <path>.pdf; returns [png, pdf]."""
    from .figures import save

    return save(theory_figure(result, title), path)
