"""Theorem 1 fits (SCIENCE.md 4): the decay rate of eps(L) per HMM draw, its combination over draws, the
exponent of the rate on gamma, and the rank slope of the intercept. Library only; imports numpy,
statsmodels and hmmscope.stats, never the HMM or inference code (theorem1.py runs the sweep).

Decay rate of one HMM draw. `fit_decay_rate`: OLS of log eps(L) = a - r L over the leading L range (sorted
by L) where eps > floor and, given stderr, eps > Z_FIT = 4 stderr (Monte Carlo relative SE <= 25%). The
range stops at the first failing L: a later point back above the floor is noise. Fewer than 3 points ->
rate NaN, reason "too few points above floor". 95% CI of the rate: given the per-history TV values (`tv`,
memory.memory_error keeps them), a percentile bootstrap over histories with the L range held fixed
(each resample refits the same OLS on the resampled means). The OLS t interval treats the points as
independent, but the eps(L) of one set of histories share their errors across L (a few slowly forgetting
histories dominate every large L): at gamma 0.9 (S=128, V=16, d=8, rho=0.02, 16 seeds x 2000 histories
against 20000) the rate's spread over seeds was 2.25x the SE the t interval implied with a 2-stderr cut,
1.87x with the 4-stderr cut; the bootstrap's SE was within 1.32x / 1.14x. Without tv: the OLS t interval.
This interval is Monte Carlo error only: it says how well the rate of *this* HMM is known.

Family replicates. A setting (S, d, rho, gamma) is a distribution of HMMs; one draw says little about it
(eight draws of the sticky S=128, d=8 family gave rates 0.096-0.141 at gamma 0.5, against a bootstrap CI
of +-0.004 for one draw). `combine_draws` makes the HMM draw the unit: the setting's rate is the mean of
the per-draw rates with a t interval on draws - 1 df (between-draw), and beside it the Monte Carlo part,
mc_se = sqrt(mean of the per-draw bootstrap variances / draws) (the SE the mean would have if every draw
were the same HMM), and the between-draw sd, sqrt(max(var of the per-draw rates - mean bootstrap
variance, 0)). Per-draw SEs come from the bootstrap CIs as (hi - lo) / 3.92.

Exponent (`fit_exponent`, `exponent_fits`): log r = a + k log x with x = gamma or gamma_eff. Draw i of a
sweep uses the same seed stream at every gamma, so within an (S, d, rho) group a draw is the same W, Q
and revealing map at every gamma (only the emission mixing changes): a draw is a curve. Two-stage: per
draw, the OLS slope of log r on log x with one intercept per (S, d, rho) group (x and y centred within
group), then k = the mean of the per-draw slopes with a t interval on (draws - 1) df. Beside it: the
Monte Carlo SE of k (the per-draw slopes' variances from the rates' bootstrap SEs, delta method
se(log r) = se(r) / r) and the between-draw sd of the slopes. One draw (theory.draws = 1):
OLS with group intercepts over that draw's points, t on n - groups - 1 df; its CI is the scatter about
the line, a statement about one HMM per group, and the method says so.
Also fitted on the excess over the chain's mixing floor m = -log|lambda_2(T)|, r - m, over the points
whose rate CI lies above m (a gamma^4 law plus a floor looks like a small k).
gamma_eff = gamma * gamma(Q E) exactly for the emission family of SCIENCE.md 1, so within a group and
draw gamma_eff is a constant multiple of gamma and its slope is the gamma slope: such a fit is kept
(`same_as`, the note names the multiples) but is no second claim. Pooling groups with a common intercept
would turn these multiples, which differ between ranks, into a slope near 0; group intercepts remove that.

Claims. (c) "k <= 4": the bound allows r >= c gamma^4 as gamma -> 0, i.e. k <= 4; rule "<= 4". A CI
entirely below 4 reads "exponent 4 rejected; the bound holds and is loose by gamma^(4-k)"; entirely above
4: rates fall faster than gamma^4 and no fixed c works; containing 4: consistent with the bound's
exponent. Vacuous: when k's CI reaches 0 or below, the rate is not shown to grow with x, and "k <= 4"
would hold for any rate that ignores x: rule "no power" with that reason (stats.decide then says "no
power"). (d) rank: the intercept a = b + s log d, "s <= 1" (the bound's factor d); two-stage over draws
as above (draw i at every rank is one replicate of the rank series), one draw: OLS t on n - 2 df.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import statsmodels.api as sm
from scipy import stats as st

from ..data import seeds
from ..stats import NO_POWER, Claim, claim, percentile_ci, rule, t_mean

Z_FIT = 4.0  # eps must exceed Z_FIT * stderr (Monte Carlo relative SE <= 25%) to enter a rate fit
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


# ---------------------------------------------------------------- one draw's decay rate


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
    ci_method: str = "OLS t"  # or "bootstrap over histories", or "t over N HMM draws"
    df: float = NAN  # degrees of freedom of rate_ci (NaN: a bootstrap interval)

    @property
    def ok(self) -> bool:
        return self.reason is None


def _boot_rates(tv, x, w, n_boot: int, seed: int) -> np.ndarray:
    """Rates refitted on n_boot resamples of the histories (rows of tv (n, K)), x (K,) fixed; NaN if a mean <= 0."""
    n = tv.shape[0]
    rng = seeds.rng(seed, _TAG)
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
        return RateFit(-b, (-bhi, -blo), a, a_ci, n, r2, tuple(int(v) for v in L), df=float(n - 2))
    rates = _boot_rates(np.asarray(tv, float)[:, order[:n]], L, w, n_boot, seed)
    return RateFit(-b, percentile_ci(rates), a, a_ci, n, r2, tuple(int(v) for v in L),
                   ci_method=f"bootstrap over histories ({n_boot} resamples, L range fixed)")


def _se(ci) -> float:
    """A 95% CI's standard error, (hi - lo) / 3.92 (NaN when the CI is not finite)."""
    lo, hi = (float(v) for v in ci)
    return (hi - lo) / 3.92 if math.isfinite(lo) and math.isfinite(hi) else NAN


@dataclass(frozen=True)
class DrawSummary:
    """How the per-draw rates of one setting combine (module docstring, family replicates)."""

    n_draws: int  # draws with a rate
    n_total: int  # draws run
    rates: tuple[float, ...]  # per draw (NaN where the fit failed), in draw order
    sd: float  # sample sd of the per-draw rates
    mc_se: float  # Monte Carlo SE of the mean rate
    between_sd: float  # between-draw sd of the rate, Monte Carlo variance removed
    degenerate: str = ""


def combine_draws(fits: list[RateFit]) -> tuple[RateFit, DrawSummary]:
    """The setting's rate over its HMM draws: mean of the per-draw rates, t interval on (draws - 1) df.
    One draw with a rate: that draw's fit, its method saying so. No draw with a rate: the first failure."""
    ok = [f for f in fits if f.ok]
    rates = tuple(float(f.rate) for f in fits)
    if not ok:
        return fits[0], DrawSummary(0, len(fits), rates, NAN, NAN, NAN)
    v = np.array([_se(f.rate_ci) ** 2 for f in ok])
    mc_var = float(np.nanmean(v)) if np.isfinite(v).any() else NAN
    if len(ok) == 1:
        f = ok[0]
        note = "one HMM draw: Monte Carlo error only, not the family's spread: " if len(fits) == 1 else \
            f"one of {len(fits)} HMM draws has a rate (the others: {fits[0].reason if not fits[0].ok else 'failed'}): "
        return dataclasses.replace(f, ci_method=note + f.ci_method), \
            DrawSummary(1, len(fits), rates, NAN, math.sqrt(mc_var) if math.isfinite(mc_var) else NAN, NAN)
    r = np.array([f.rate for f in ok])
    est = t_mean(r, unit="HMM draw")
    a = t_mean([f.intercept for f in ok], unit="HMM draw")
    sd = float(r.std(ddof=1))
    between = math.sqrt(max(sd ** 2 - mc_var, 0.0)) if math.isfinite(mc_var) else NAN
    left = f"; {len(fits) - len(ok)} of {len(fits)} draws had no rate (too few points above the floor) and are " \
           "left out" if len(ok) < len(fits) else ""
    used = tuple(sorted(set.intersection(*(set(f.used_lengths) for f in ok))))
    fit = RateFit(est.value, (est.lo, est.hi), a.value, (a.lo, a.hi), min(f.n_used for f in ok),
                  float(np.mean([f.r2 for f in ok])), used, None,
                  f"t over {len(ok)} HMM draws ({len(ok) - 1} df): between-draw{left}", est.df)
    return fit, DrawSummary(len(ok), len(fits), rates, sd, math.sqrt(mc_var / len(ok)) if math.isfinite(mc_var)
                            else NAN, between, est.degenerate)


# ---------------------------------------------------------------- exponent


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
    df: float = NAN  # of the CI
    n_draws: int = 1  # HMM draws with a slope (the units of the CI when >= 2)
    mc_se: float = NAN  # Monte Carlo SE of k (from the rates' bootstrap SEs)
    between_sd: float = NAN  # between-draw sd of the per-draw slopes, Monte Carlo variance removed
    method: str = ""
    slopes: tuple[float, ...] = ()  # per-draw slopes
    vacuous: str = ""  # why "k <= target" cannot fail here ("" when it can)
    degenerate: str = ""

    def consistent_with(self, k: float = 4.0) -> bool | None:
        """Whether k lies inside the 95% CI (None when there is no CI)."""
        return _inside(self.k_ci, k)

    def claim(self) -> Claim:
        """This fit as a claim row: statistic k, rule '<= target' ('no power' when vacuous, module docstring)."""
        return claim(f"{self.y_name} ~ {self.x_name}^k: k <= {self.target:g} [{self.scope}]",
                     f"{self.method or 'OLS slope'} of log({self.y_name}) on log {self.x_name} ({self.n_used} points)",
                     self.k, *self.k_ci, NO_POWER if self.vacuous else rule("<=", self.target), self.reason,
                     df=self.df, degenerate=self.degenerate)


def _exponent_reason(k, lo, hi, x: str, target: float, verdict: str) -> str:
    return {
        "supported": f"exponent {target:g} rejected; the bound holds and is loose by {x}^({target - k:.2f})",
        "not supported": f"k > {target:g}: rates fall faster than {x}^{target:g}, so no fixed c gives "
                         f"r >= c {x}^{target:g} as {x} -> 0: the bound fails",
        "inconclusive": (f"CI contains {target:g}: consistent with the bound's exponent, k > {target:g} not excluded"
                         if math.isfinite(lo) and math.isfinite(hi) else "no CI"),
        "no power": "",
    }[verdict]


def _centred(x, y, groups):
    """x, y centred within each group (one intercept per group)."""
    xc, yc = x.astype(float).copy(), y.astype(float).copy()
    for g in set(groups.tolist()):
        m = groups == g
        xc[m] -= x[m].mean()
        yc[m] -= y[m].mean()
    return xc, yc


def _labels(v, n: int) -> np.ndarray:
    return np.zeros(n, object) if v is None else np.asarray([str(x) for x in v], object)


def _two_stage(x, y, se_y, draws, groups):
    """Per draw: OLS slope of y on x with group intercepts and its Monte Carlo variance from se_y.
    Returns (draw ids, slopes, MC variances, points used)."""
    ids, slopes, var, used = [], [], [], 0
    for dr in sorted(set(draws.tolist()), key=str):
        m = draws == dr
        xc, yc = _centred(x[m], y[m], groups[m])
        sxx = float(xc @ xc)
        if sxx <= 1e-12:
            continue
        ids.append(dr)
        slopes.append(float(xc @ yc) / sxx)
        var.append(float(np.sum((xc / sxx) ** 2 * se_y[m] ** 2)))
        used += int(m.sum())
    return ids, np.array(slopes), np.array(var), used


def fit_exponent(gammas, rates, rate_ci=None, *, x_name: str = "gamma", scope: str = "pooled",
                 target: float = 4.0, y_name: str = "rate", draws=None, groups=None) -> ExponentFit:
    """k in log r = a_group + k log x over points with x > 0 and r > 0 finite (module docstring).

    draws: the HMM draw of each point (two-stage over draws when >= 2 draws have a slope); groups: the
    (S, d, rho) group of each point (one intercept each). rate_ci (pairs): the rates' Monte Carlo CIs,
    for the Monte Carlo SE of k (NaN without).
    """
    g, r = np.asarray(gammas, float), np.asarray(rates, float)
    n0 = len(g)
    dr, gr = _labels(draws, n0), _labels(groups, n0)
    ci = np.asarray(rate_ci, float).reshape(n0, 2) if rate_ci is not None else np.full((n0, 2), NAN)
    keep = np.isfinite(g) & (g > 0) & np.isfinite(r) & (r > 0)
    x, y, dr, gr, ci, r = np.log(g[keep]), np.log(r[keep]), dr[keep], gr[keep], ci[keep], r[keep]
    se_y = (ci[:, 1] - ci[:, 0]) / (3.92 * r)
    ids, slopes, var, used = _two_stage(x, y, se_y, dr, gr)
    n_groups = len(set(gr.tolist()))
    within = " with one intercept per (S, d, rho) group" if n_groups > 1 else ""
    if len(ids) >= 2:
        est = t_mean(slopes, ids, unit="HMM draw")
        k, lo, hi, df, degen = est.value, est.lo, est.hi, est.df, est.degenerate
        mc_var = float(np.nanmean(var)) if np.isfinite(var).any() else NAN
        mc_se = math.sqrt(mc_var / len(ids)) if math.isfinite(mc_var) else NAN
        between = math.sqrt(max(float(slopes.var(ddof=1)) - mc_var, 0.0)) if math.isfinite(mc_var) else NAN
        method = f"two-stage: per-draw OLS slope{within}, t over {len(ids)} HMM draws ({len(ids) - 1} df)"
        sel = np.isin(dr, ids)
    elif len(ids) == 1:
        sel = dr == ids[0]
        xc, yc = _centred(x[sel], y[sel], gr[sel])
        sxx = float(xc @ xc)
        k = float(xc @ yc) / sxx
        df = float(sel.sum() - len(set(gr[sel].tolist())) - 1)
        if df < 1:
            ids = []
        else:
            s2 = float(np.sum((yc - k * xc) ** 2)) / df
            q = float(st.t.ppf(0.975, df))
            half = q * math.sqrt(s2 / sxx)
            lo, hi = k - half, k + half
            degen = "" if half > 1e-12 * max(1.0, abs(k)) else \
                "every point lies on the fitted line: zero residual variance, so nothing measures k's uncertainty"
            mc_se = math.sqrt(var[0]) if math.isfinite(var[0]) else NAN
            between = NAN
            method = (f"one HMM draw: OLS{within}, t on {int(df)} df (scatter about the line; the family's "
                      "draw-to-draw spread is not measured)")
    if not ids:
        why = f"too few points with {x_name} > 0 and {y_name} > 0 ({int(keep.sum())}; need 3 distinct)"
        return ExponentFit(NAN, (NAN, NAN), NAN, (NAN, NAN), int(keep.sum()), NAN, x_name, scope, target,
                           "inconclusive", why, f"[{scope}] {y_name} ~ {x_name}^k: inconclusive: {why}", None, y_name)
    xs, ys, gs = x[sel], y[sel], gr[sel]
    xc, yc = _centred(xs, ys, gs)
    ss = float(yc @ yc)
    r2 = 1 - float(np.sum((yc - k * xc) ** 2)) / ss if ss > 0 else 1.0
    b = float(np.mean(ys - k * xs))
    vacuous = ""
    if math.isfinite(lo) and lo <= 0:
        vacuous = (f"k's 95% CI [{lo:.2f}, {hi:.2f}] reaches 0: the {y_name} is not shown to grow with {x_name}, so "
                   f"'k <= {target:g}' would hold for any {y_name} that ignores {x_name} (it cannot fail here); "
                   "forgetting is driven by the chain's mixing (see the mixing rate), not by observation")
    c = claim("k", "", k, lo, hi, NO_POWER if vacuous else rule("<=", target), "", df=df, degenerate=degen)
    reason = vacuous or _exponent_reason(k, lo, hi, x_name, target, c.verdict) or degen
    parts = f"MC SE {mc_se:.2g}, between-draw sd {between:.2g}, " if len(ids) >= 2 else ""
    summary = (f"[{scope}] {y_name} ~ {x_name}^k: k = {k:.2f} [95% CI {lo:.2f}, {hi:.2f}], df = {df:g}, "
               f"{parts}n = {used} points, {len(ids)} draw{'s' if len(ids) > 1 else ''}, R2 = {r2:.3f}: {reason} "
               f"(claim k <= {target:g}: {c.verdict})")
    return ExponentFit(k, (lo, hi), b, (NAN, NAN), used, r2, x_name, scope, target, c.verdict, reason, summary,
                       _inside((lo, hi), 4.0), y_name, None, df, len(ids), mc_se, between, method,
                       tuple(float(s) for s in slopes), vacuous, degen)


def exponent_fits(points: list[dict], scope: str) -> list[ExponentFit]:
    """The sweep-level fits of one scope. points: dicts with gamma, gamma_eff, rate, rate_lo, rate_hi,
    mixing_rate (NaN if unknown), and optionally draw (the HMM draw) and group (the (S, d, rho) group):
    one point per draw of a setting. Returns: rate on gamma, rate on gamma_eff (same_as="gamma" when
    gamma_eff / gamma is constant within every group and draw), and the excess over the floor on gamma."""
    g, ge, r, rlo, rhi, m = (np.array([float(p.get(k, NAN)) for p in points]) for k in
                             ("gamma", "gamma_eff", "rate", "rate_lo", "rate_hi", "mixing_rate"))
    dr = [str(p.get("draw", 0)) for p in points]
    gr = [str(p.get("group", 0)) for p in points]
    ci = np.stack([rlo, rhi], 1) if points else None
    kw = {"scope": scope, "draws": dr, "groups": gr}
    fg = fit_exponent(g, r, ci, x_name="gamma", **kw)
    fe = fit_exponent(ge, r, ci, x_name="gamma_eff", **kw)
    ok = np.isfinite(g) & (g > 0) & np.isfinite(ge) & (ge > 0)
    cl = np.array([f"{a}|{b}" for a, b in zip(dr, gr)], object)
    if ok.any() and ok.sum() == np.isfinite(ge).sum():
        ratio = np.log(ge[ok] / g[ok])
        spread = max(float(np.ptp(ratio[cl[ok] == k])) for k in set(cl[ok].tolist()))
        if spread < 1e-6:
            c_lo, c_hi = float(np.exp(ratio.min())), float(np.exp(ratio.max()))
            mult = f"{c_lo:.4g}" if c_hi - c_lo < 1e-9 * c_hi else f"{c_lo:.4g} to {c_hi:.4g}"
            where = "at every point" if len(set(cl.tolist())) == 1 else "within every (S, d, rho) group and HMM draw"
            note = (f"gamma_eff = c gamma {where} (c = {mult}): the same regression as on gamma (same k and CI), "
                    "not a second finding")
            fe = dataclasses.replace(fe, same_as="gamma", reason=note, summary=f"[{scope}] rate ~ gamma_eff^k: {note}")
    out = [fg, fe]
    if np.isfinite(m).any():
        above = np.isfinite(rlo) & np.isfinite(m) & (rlo > m)
        fx = fit_exponent(g[above], (r - m)[above], ci[above] - m[above, None], x_name="gamma", scope=scope,
                          y_name="rate - mixing floor", draws=np.asarray(dr)[above], groups=np.asarray(gr)[above])
        note = f"; points with rate CI above the floor: {int(above.sum())} of {len(points)}"
        out.append(dataclasses.replace(fx, reason=fx.reason + note, summary=fx.summary + note))
    return out


# ---------------------------------------------------------------- rank


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
    df: float = NAN
    n_draws: int = 1
    method: str = "OLS slope"
    degenerate: str = ""

    def claim(self) -> Claim:
        return claim(f"intercept slope in log d <= 1 [{self.scope}]", f"{self.method} of the rate fit's intercept "
                     "on log d", self.slope, *self.slope_ci, rule("<=", 1), self.reason, df=self.df,
                     degenerate=self.degenerate)


def fit_rank_intercept(ranks, intercepts, *, scope: str = "pooled", draws=None) -> RankFit:
    """Slope of the log-scale intercept a on log d (log eps <= log C + log d - c gamma^4 L): two-stage over
    draws when >= 2 draws have >= 2 ranks, else OLS with a t interval on n - 2 df (module docstring)."""
    d, a = np.asarray(ranks, float), np.asarray(intercepts, float)
    dr = _labels(draws, len(d))
    keep = np.isfinite(a) & (d >= 1)
    x, y, dr = np.log(d[keep]), a[keep], dr[keep]
    n = int(keep.sum())
    ids, slopes, _, used = _two_stage(x, y, np.full(n, NAN), dr, np.zeros(n, object))
    degen = ""
    if len(ids) >= 2:
        est = t_mean(slopes, ids, unit="HMM draw")
        s, lo, hi, df, degen = est.value, est.lo, est.hi, est.df, est.degenerate
        method = f"two-stage: per-draw OLS slope, t over {len(ids)} HMM draws ({len(ids) - 1} df)"
        b = float(np.mean(y - s * x))
        b_ci, r2 = (NAN, NAN), NAN
    elif n >= 3 and np.ptp(x) > 0:
        s, (lo, hi), b, b_ci, r2 = _ols(x, y)
        df, used, method = float(n - 2), n, f"one HMM draw: OLS slope, t on {n - 2} df"
        if hi - lo <= 1e-12 * max(1.0, abs(s)):
            degen = "every point lies on the fitted line: zero residual variance"
    else:
        why = f"too few ranks with a fitted intercept ({n}; need 3 distinct)"
        return RankFit(NAN, (NAN, NAN), NAN, (NAN, NAN), n, NAN, scope, "inconclusive", why,
                       f"[{scope}] intercept ~ slope * log d: inconclusive: {why}")
    verdict = claim("s", "", s, lo, hi, rule("<=", 1), "", df=df, degenerate=degen).verdict
    reason = {"supported": "slope < 1: eps grows more slowly with d than the bound's factor d",
              "not supported": "slope > 1: eps grows faster with d than the bound's factor d allows",
              "inconclusive": "CI contains 1: consistent with the factor d, slope > 1 not excluded",
              "no power": degen}[verdict]
    summary = (f"[{scope}] intercept ~ slope * log d: slope = {s:.2f} [95% CI {lo:.2f}, {hi:.2f}], df = {df:g}, "
               f"n = {used}; bound 1: {verdict} ({reason})")
    return RankFit(s, (lo, hi), b, b_ci, used, r2, scope, verdict, reason, summary, _inside((lo, hi), 1.0), df,
                   max(len(ids), 1), method, degen)
