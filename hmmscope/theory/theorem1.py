"""Theorem 1 sweep (SCIENCE.md 4), as a library: eps(L) per HMM draw, per-setting checks, sweep-level fits.

Theorem 1 / Lemma 1 claim eps(L) <= C d exp(-c gamma^4 L). A setting (S, d, rho, gamma) is a family of
HMMs, so each setting is measured on `theory.draws` independent HMM draws. Draw j uses the seed
`draw_seed(theory.seed, j)`: theory.seed itself for j = 0 (so draw 0, and a one-draw sweep, is the HMM
theory.seed alone gives), else a seed from its own stream, SeedSequence([theory.seed, DRAW_TAG, j]). The
seed drives the HMM (make_hmm), its histories (memory_error) and its rate bootstrap. The HMM family's
random parts (W, Q, the revealing map) do not depend on gamma, so draw j is the same chain at every
gamma of a group: the sweep-level fits pair draws across gammas. gamma_m (a costly MILP, a diagnostic no
claim uses) is computed on draw 0 only.

Fits (fit.py): per draw, the decay rate of eps(L) with a bootstrap CI over
histories (Monte Carlo error); per setting, `combine_draws`: the mean rate over draws with a t interval on
draws - 1 df, the Monte Carlo SE and the between-draw sd beside it; across a gamma sweep, the exponent k
of rate ~ gamma^k two-stage over draws (per-draw slopes with one intercept per (S, d, rho) group, t over
draws), also on the excess over the mixing floor; across ranks, the slope of the intercept on log d.

The chain's own forgetting. `hmm.mixing_rate` = -log|lambda_2(T)|: with no information in the
emissions the L-memory error decays like |lambda_2|^L, so measured rates sit on a floor of about this
size at small gamma (SCIENCE.md's 0.020 at gamma 0.1 with rho = 0.02). A gamma^4 law plus such a floor,
fitted as a power of gamma, gives k far below 4 (about 1.7 on SCIENCE.md's grid); so the exponent is
also fitted on the *excess* rate r - m. The one-step Dobrushin coefficient (~0.998 for every sticky
setting) is logged but says nothing about this.

Claims (stats.claim: the verdict is the rule applied to the CI on the row). Per draw (`bound_claims`),
for g = gamma(O) and g = gamma_eff (an inexact g is used at its lower/upper bound so that the CI covers
every g in the bracket):
(a) "eps(L) <= d exp(-g^4 L), C = c = 1": statistic max over L of eps(L) - d exp(-g^4 L), CI from
    eps +- 2 stderr pointwise; rule "<= 0". No power when d exp(-g^4 L) >= 1 at every measured L
    (eps <= 1 always; in particular when g = gamma(O) = 0, which holds whenever S > V).
(b) "decay rate >= g^4, c = 1": statistic rate - g^4 with the rate's CI; rule ">= 0". No power when
    g^4 <= the mixing floor m: the chain's mixing alone keeps the rate above g^4, so the check cannot
    fail because of observation (e.g. gamma_eff^4 ~ 1e-5 against rates ~ 0.1).
Per setting (`setting_claims`), over its draws (draws without power left out; none with power: no power):
(a) must hold for every HMM: the worst draw, value and CI ends each the maximum over draws (a
    simultaneous statement); (b) the family's mean of rate - g^4 with a t interval on draws - 1 df.
Across a gamma sweep, per (S, d, rho) group and pooled: (c) "k <= 4", and (d) per (S, rho, gamma): the
rank slope "<= 1" (fit.py's docstring; a vacuous exponent claim is "no power").
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
from typing import Any

import numpy as np

from ..config import HMMConfig, TheoryConfig
from ..data import seeds
from ..data.hmm import make_hmm
from ..oracles.memory import memory_error
from ..oracles.observability import gamma_eff, gamma_m, observability
from ..stats import NO_POWER, Claim, claim, jsonable, rule, t_mean
from ..units import value_ci
from .figure import theory_figure as _fig
from .fit import (
    DrawSummary,
    ExponentFit,
    RankFit,
    RateFit,
    combine_draws,
    exponent_fits,
    fit_decay_rate,
    fit_rank_intercept,
)

__all__ = ["Z_SIG", "DRAW_TAG", "Draw", "Setting", "TheoryResult", "bound_claims", "draw_seed", "plot_theory",
           "run_theory", "setting_claims", "sweep_fits", "theory_figure"]

Z_SIG = 2.0  # the bound check's pointwise CI: eps +- Z_SIG * stderr
NAN = float("nan")
DRAW_TAG = 0x44524157  # "DRAW": the stream of HMM draws j >= 1


def draw_seed(seed: int, j: int) -> int:
    """The seed of HMM draw j of a setting: `seed` for j = 0, else from SeedSequence([seed, DRAW_TAG, j])."""
    if j == 0:
        return int(seed)
    return int(seeds.sequence(int(seed), DRAW_TAG, int(j)).generate_state(1)[0])


def bound_claims(lengths, eps, stderr, rate_fit: RateFit, gamma, d: int, mixing_rate: float = NAN, *,
                 gamma_name: str = "gamma(O)", scope: str = "") -> list[Claim]:
    """Checks (a) and (b) of the module docstring for one HMM; gamma a number or a (lower, upper) bracket."""
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
                     rlo - g_hi ** 4, rhi - g_lo ** 4, rb, why, df=rate_fit.df))
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


def _lohi(obs: dict) -> tuple[float, float]:
    b = _bracket(obs)
    return (b, b) if np.isscalar(b) else b


def _obs_summary(obs: list[dict]) -> dict:
    """One draw: its dict. Several: the mean value, the min lower and max upper over draws."""
    if len(obs) == 1:
        return obs[0]
    vals = [float(o["value"]) for o in obs]
    lo, hi = min(_lohi(o)[0] for o in obs), max(_lohi(o)[1] for o in obs)
    return {"value": float(np.mean(vals)), "exact": all(o["exact"] for o in obs) and hi - lo <= 1e-12,
            "lower": lo, "upper": hi, "method": f"mean over {len(obs)} HMM draws (lower/upper: min/max over draws)"}


@dataclass
class Draw:
    """One HMM of a setting: its observability, mixing, eps(L) curve, rate fit and checks (a), (b)."""

    index: int
    seed: int
    gamma_O: dict
    gamma_eff: dict
    dobrushin: float
    mixing_rate: float
    lengths: list
    eps: list
    stderr: list
    rate_fit: RateFit
    verdicts: list = field(default_factory=list)


def setting_claims(draws: list[Draw], d: int, scope: str) -> list[Claim]:
    """Checks (a) and (b) of a setting over its draws (module docstring), for gamma(O) and gamma_eff."""
    out = []
    for gname in ("gamma(O)", "gamma_eff"):
        per = [bound_claims(dr.lengths, dr.eps, dr.stderr, dr.rate_fit, _bracket(getattr(dr, gname.replace(
            "(O)", "_O"))), d, dr.mixing_rate, gamma_name=gname, scope=scope) for dr in draws]
        if len(draws) == 1:
            out += per[0]
            continue
        a = [p[0] for p in per]
        live = [c for c in a if c.rule != NO_POWER]
        if not live:
            out.append(a[0])
        else:
            n_bad = sum(c.ci_lo > 0 for c in live)
            out.append(claim(a[0].name, f"worst of {len(live)} HMM draws: max over draws of max over L of eps(L) - "
                             "d exp(-g^4 L) (CI ends: max over draws of eps +- 2 stderr)",
                             max(c.value for c in live), max(c.ci_lo for c in live), max(c.ci_hi for c in live),
                             rule("<=", 0), f"the bound must hold for every HMM: {n_bad} of {len(live)} draws exceed "
                             f"it by > 2 stderr" + (f"; {len(a) - len(live)} draws without power left out"
                                                    if len(live) < len(a) else "")))
        b = [(p[1], dr) for p, dr in zip(per, draws)]
        live_b = [(c, dr) for c, dr in b if c.rule != NO_POWER and dr.rate_fit.ok]
        if not live_b or len(live_b) < 2:
            out.append(live_b[0][0] if live_b else b[0][0])
            continue
        g = [_lohi(getattr(dr, gname.replace("(O)", "_O"))) for _, dr in live_b]
        r = np.array([dr.rate_fit.rate for _, dr in live_b])
        lo_e = t_mean(r - np.array([x[1] for x in g]) ** 4, unit="HMM draw")
        hi_e = t_mean(r - np.array([x[0] for x in g]) ** 4, unit="HMM draw")
        mid = float(np.mean(r - np.array([0.5 * (x[0] + x[1]) for x in g]) ** 4))
        out.append(claim(b[0][0].name, f"mean over {len(live_b)} HMM draws of decay rate - g^4 (t, {lo_e.df:g} df)",
                         mid, lo_e.lo, hi_e.hi, rule(">=", 0),
                         f"rate {r.mean():.4g} (mean of {len(live_b)} draws) vs mean g^4 = {np.mean(r) - mid:.4g}"
                         + (f"; {len(b) - len(live_b)} draws without power or rate left out" if len(live_b) < len(b)
                            else ""), df=lo_e.df, degenerate=lo_e.degenerate or hi_e.degenerate))
    return out


@dataclass
class Setting:
    """One (S, d, rho, gamma) point of the sweep: its draws and their combination.

    gamma_O / gamma_eff: one draw's dict, or over draws the mean value with the min lower / max upper;
    dobrushin, mixing_rate: means over draws; eps: the mean curve over draws, stderr: its between-draw SE
    (one draw: the Monte Carlo stderr); rate_fit: `combine_draws` (mean rate, t over draws); spread: the
    Monte Carlo part beside the between-draw part."""

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
    draws: list = field(default_factory=list)  # Draw
    spread: DrawSummary | None = None

    @property
    def group(self) -> str:
        p = self.params
        return f"S={p['n_states']} d={p['rank']} rho={p['rho']:g}"

    def point(self) -> dict:
        """The setting as one point (combined rate)."""
        f = self.rate_fit
        return {"gamma": self.params["gamma"], "gamma_eff": self.gamma_eff["value"], "rate": f.rate,
                "rate_lo": f.rate_ci[0], "rate_hi": f.rate_ci[1], "mixing_rate": self.mixing_rate,
                "log_intercept": f.intercept, "rank": self.params["rank"], "group": self.group, "draw": 0}

    def points(self) -> list[dict]:
        """One point per HMM draw (the unit of the sweep-level fits); the setting itself when it has no draws."""
        if not self.draws:
            return [self.point()]
        return [{"gamma": self.params["gamma"], "gamma_eff": dr.gamma_eff["value"], "rate": dr.rate_fit.rate,
                 "rate_lo": dr.rate_fit.rate_ci[0], "rate_hi": dr.rate_fit.rate_ci[1], "mixing_rate": dr.mixing_rate,
                 "log_intercept": dr.rate_fit.intercept, "rank": self.params["rank"], "group": self.group,
                 "draw": dr.seed} for dr in self.draws]

    def draw_metrics(self) -> list[tuple[int, dict[str, float]]]:
        """(step, metrics) to log on the setting's run: at step 0 the split of the rate's uncertainty
        (theory/draws, theory/rate_mc_se, theory/rate_between_sd, theory/rate_sd, theory/rate_df), and per
        draw j at step j the draw's own numbers under theory/draw/* (rate, rate_lo, rate_hi, log_intercept,
        gamma_eff, mixing_rate, seed, fit_points)."""
        sp, f = self.spread, self.rate_fit
        out = [(0, {"theory/draws": float(len(self.draws) or 1), "theory/rate_df": f.df,
                    **({"theory/draws_fitted": float(sp.n_draws), "theory/rate_mc_se": sp.mc_se,
                        "theory/rate_between_sd": sp.between_sd, "theory/rate_sd": sp.sd} if sp else {})})]
        for dr in self.draws:
            g = dr.rate_fit
            out.append((dr.index, {"theory/draw/rate": g.rate, "theory/draw/rate_lo": g.rate_ci[0],
                                   "theory/draw/rate_hi": g.rate_ci[1], "theory/draw/log_intercept": g.intercept,
                                   "theory/draw/gamma_eff": dr.gamma_eff["value"],
                                   "theory/draw/mixing_rate": dr.mixing_rate, "theory/draw/seed": float(dr.seed),
                                   "theory/draw/fit_points": float(g.n_used)}))
        return out


def _fmt_obs(o: dict | None) -> str:
    if o is None:
        return "-"
    if o["exact"]:
        return f"{o['value']:.3g}"
    return f"{o['value']:.3g} [{o['lower']:.3g}, {o['upper']:.3g}]"


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
            f, p, sp = s.rate_fit, s.params, s.spread
            rows.append({
                "S": str(p["n_states"]), "d": str(p["rank"]), "rho": f"{p['rho']:g}", "gamma": f"{p['gamma']:g}",
                "draws": str(len(s.draws) or 1),
                "gamma(O)": _fmt_obs(s.gamma_O), "gamma_eff": _fmt_obs(s.gamma_eff),
                f"gamma_{p.get('m', '')}": _fmt_obs(s.gamma_m), "dobrushin": f"{s.dobrushin:.3f}",
                "mixing -log|l2|": f"{s.mixing_rate:.4g}",
                "rate": f"{f.rate:.4g}" if f.ok else "nan",
                "rate 95% CI": f"[{f.rate_ci[0]:.4g}, {f.rate_ci[1]:.4g}]" if f.ok else (f.reason or ""),
                "df": f"{f.df:g}" if math.isfinite(f.df) else "-",
                "MC SE": f"{sp.mc_se:.2g}" if sp and math.isfinite(sp.mc_se) else "-",
                "between-draw sd": f"{sp.between_sd:.2g}" if sp and math.isfinite(sp.between_sd) else "-",
                "rate - mixing": f"{f.rate - s.mixing_rate:.4g}" if f.ok else "nan",
                "log(Cd)": f"{f.intercept:.2f}" if f.ok else "nan", "n_fit": str(f.n_used),
                "rate>=gamma_eff^4": next((c.verdict for c in s.verdicts if c.name.startswith("decay rate")
                                           and "gamma_eff" in c.name), "-"),
            })
        return rows

    def answer(self) -> str:
        """The run's answer in one sentence (its description's first): the first sweep-level claim with a value (an
        exponent or rank fit), else the first decay-rate claim of a setting, with its 95% CI and verdict."""
        found = [c for c in self.claims() if math.isfinite(c.value)]
        c = next((c for c in found if any(c is v for v in self.verdicts)), None) or next(
            (c for c in found if c.name.startswith("decay rate")), None) or (found or self.claims() or [None])[0]
        if c is None:
            return "no claims"
        if not math.isfinite(c.value):
            return f"{c.name}: {c.verdict} ({c.reason})"
        return f"{c.name}: {value_ci(c.value, c.ci_lo, c.ci_hi)}: {c.verdict}"

    def summary_lines(self) -> list[str]:
        out = [f.summary for f in self.exponent_fits] + [f.summary for f in self.rank_fits]
        for s in self.settings:
            out += [f"{c.name}: {c.verdict} ({c.reason}; {c.value:.4g} [{c.ci_lo:.4g}, {c.ci_hi:.4g}], rule {c.rule})"
                    for c in s.verdicts]
        return out


def sweep_fits(points: list[dict], n_ranks: int | None = None) -> tuple[list[ExponentFit], list[RankFit]]:
    """The sweep-level fits from per-draw points (dicts as `Setting.points` makes them, with n_states, rho
    for grouping): exponent fits per (S, d, rho) group and pooled over groups, and the rank fit per
    (S, rho, gamma) with >= 3 ranks (>= 2 when n_ranks says the sweep asked for fewer)."""
    groups: dict[str, list[dict]] = {}
    for p in points:
        groups.setdefault(p["group"], []).append(p)
    scopes = list(groups.items()) + ([("pooled", points)] if len(groups) > 1 else [])
    exps = [f for scope, pts in scopes for f in exponent_fits(pts, scope)]
    by: dict[tuple, list[dict]] = {}
    for p in points:
        by.setdefault((p["n_states"], p["rho"], p["gamma"]), []).append(p)
    need = 3 if n_ranks is None else min(3, n_ranks)
    ranks = [fit_rank_intercept([p["rank"] for p in pts], [p["log_intercept"] for p in pts],
                                scope=f"S={k[0]} rho={k[1]:g} gamma={k[2]:g}", draws=[p["draw"] for p in pts])
             for k, pts in by.items() if len({p["rank"] for p in pts}) >= max(need, 2)]
    return exps, ranks


def _gamma_eff(cache: dict, key: tuple, hmm, g: float, compute) -> dict:
    """gamma_eff of draw `key` at gamma g. The family's emissions are O = g E + (1 - g) U with U uniform, and
    x Q U = 0 for every sum-zero x (rows of Q sum to 1), so gamma(Q O) = g * gamma(Q E) exactly: computed once per
    draw (the first gamma), then scaled (value and bracket), after checking that Q and E are the same."""
    E = (hmm.emission - (1 - g) / hmm.emission.shape[1]) / g
    hit = cache.get(key)
    if hit is not None and np.array_equal(hit[0], hmm.Q) and np.allclose(hit[1], E, atol=1e-9):
        o, g0 = hit[2], hit[3]
        f = g / g0
        return {"value": o["value"] * f, "exact": o["exact"], "lower": None if o["lower"] is None else o["lower"] * f,
                "upper": None if o["upper"] is None else o["upper"] * f,
                "method": f"{o['method']}; scaled from gamma = {g0:g} (gamma_eff = gamma * gamma(Q E))"}
    o = _obs_dict(compute(hmm.Q, hmm.emission))
    cache[key] = (hmm.Q.copy(), E, o, g)
    return o


def run_theory(cfg: TheoryConfig, *, progress: Callable[[int, int, str], Any] | None = None,
               time_limit: float = 10.0, gamma_m_time_limit: float = 3.0, n_boot: int = 2000,
               detail: Callable[[str], Any] | None = None) -> TheoryResult:
    """The whole Theorem 1 sweep over n_states x ranks x rhos x gammas, `cfg.draws` HMMs per setting
    (module docstring); `progress(i, n_settings, label)` after each setting, `detail(text)` as each HMM draw begins
    ("setting i/n (label): HMM draw j/m": a setting takes minutes at the default sizes on a busy machine)."""
    bad = [(S, d) for S in cfg.n_states for d in cfg.ranks if d > S]
    if bad:
        raise ValueError(f"theory.ranks must not exceed theory.n_states; offending (S, d): {bad}")
    t0 = time.perf_counter()
    grid = list(itertools.product(cfg.n_states, cfg.ranks, cfg.rhos, cfg.gammas))
    settings: list[Setting] = []
    cache: dict = {}
    for i, (S, d, rho, g) in enumerate(grid):
        t1 = time.perf_counter()
        label = f"S={S} d={d} rho={rho:g} gamma={g:g}"
        draws, gm = [], None
        for j in range(cfg.draws):
            if detail is not None:
                detail(f"setting {i + 1}/{len(grid)} ({label}): HMM draw {j + 1}/{cfg.draws}")
            seed = draw_seed(cfg.seed, j)
            hmm = make_hmm(HMMConfig(family=cfg.family, n_tasks=1, n_states=S, n_tokens=cfg.n_tokens, rank=d,
                                     gamma=g, alpha=cfg.alpha, rho=rho, seed=seed))
            gO = _obs_dict(observability(hmm.emission, time_limit=time_limit))
            ge = _gamma_eff(cache, (S, d, rho, j), hmm, g, gamma_eff)
            if j == 0 and cfg.gamma_m > 0:
                gm = _obs_dict(gamma_m(hmm, cfg.gamma_m, time_limit=gamma_m_time_limit))
            me = memory_error(hmm, list(cfg.lengths), n_histories=cfg.n_histories, burn_in=cfg.burn_in, seed=seed)
            L, e, se = (np.asarray(x, float) for x in (me.lengths, me.eps, me.stderr))
            fit = fit_decay_rate(L, e, se, cfg.floor, tv=me.tv, n_boot=n_boot, seed=seed)
            draws.append(Draw(j, seed, gO, ge, float(hmm.dobrushin()), hmm.mixing_rate(), L.tolist(), e.tolist(),
                              se.tolist(), fit))
        for dr in draws:  # each draw's own checks, kept with it
            dr.verdicts = setting_claims([dr], d, f"{label} draw {dr.index}")
        fit, spread = combine_draws([dr.rate_fit for dr in draws])
        E = np.array([dr.eps for dr in draws])
        eps_se = E.std(0, ddof=1) / math.sqrt(len(draws)) if len(draws) > 1 else np.asarray(draws[0].stderr)
        params = {"family": cfg.family, "n_states": S, "rank": d, "rho": rho, "gamma": g, "m": cfg.gamma_m}
        settings.append(Setting(params, _obs_summary([dr.gamma_O for dr in draws]),
                                _obs_summary([dr.gamma_eff for dr in draws]), gm,
                                float(np.mean([dr.dobrushin for dr in draws])), draws[0].lengths,
                                E.mean(0).tolist(), list(map(float, eps_se)), fit, setting_claims(draws, d, label),
                                time.perf_counter() - t1, float(np.mean([dr.mixing_rate for dr in draws])), draws,
                                spread))
        if progress is not None:
            progress(i + 1, len(grid), label)
    pts = [{**p, "n_states": s.params["n_states"], "rho": s.params["rho"]} for s in settings for p in s.points()]
    exps, ranks = sweep_fits(pts)
    for f_i, f in enumerate(exps):  # the knob is not gamma(O) when S > V
        ss = [s for s in settings if f.scope in ("pooled", s.group)]
        if f.x_name == "gamma" and f.y_name == "rate" and any(s.gamma_O["value"] == 0 for s in ss) and \
                math.isfinite(f.k):
            note = "; gamma(O) = 0 here (S > V), so this reads gamma as the emission knob"
            exps[f_i] = dataclasses.replace(f, reason=f.reason + note, summary=f.summary + note)
    verdicts = [f.claim() for f in exps if f.same_as is None] + [f.claim() for f in ranks]
    return TheoryResult(dataclasses.asdict(cfg), settings, exps, ranks, verdicts, time.perf_counter() - t0)


def theory_figure(result: TheoryResult, title: str | None = None):
    """The Theorem 1 figure (figure.py)."""
    return _fig(result, title)


def plot_theory(result: TheoryResult, path, title: str | None = None):
    """Write `theory_figure` as <path>.png and <path>.pdf; returns [png, pdf]."""
    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
    return save_figure(theory_figure(result, title), path)
