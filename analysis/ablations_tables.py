"""The inference-ablations record's tables (analysis/inference_ablations.py): its cells and axes, the per-cell pooled
rows, the effects with their rules, Theorem 1 against practice, the layerwise claims pooled per cell, the cost, all
from the record's kept per-run tables (seeds the unit: t over seeds). The statistics are the package's
(hmmscope.stats, hmmscope.sweep.effects): one implementation with `hmmscope report`.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pandas as pd
import record_effects as fx
from pooled import mean, pool, regime_claims

from hmmscope.measure.regimes import regime
from hmmscope.report.layerwise import layerwise_section
from hmmscope.stats import Claim, holm_verdicts, rule

STUDIES = ("depth", "gamma", "rank", "context", "structure")
BASE = {"n_layers": 2, "pos_enc": "rope", "gamma": 0.8, "rank": 4, "window": 0, "structures": "all"}
KEYS = {"n_layers": "model.n_layers", "pos_enc": "model.pos_enc", "gamma": "hmm.gamma", "rank": "hmm.rank",
        "window": "model.window", "structures": "hmm.structures"}
TEXT = ("pos_enc", "structures")  # the keys whose values are names
METRICS = {  # runs.csv column -> MLflow key (the trial's run)
    "model_ce": "eval/unseen/test_ce", "best_counting_ce": "baseline/unseen/best_counting/ce",
    "family_bayes_ce": "baseline/unseen/family_bayes/ce", "family_bayes_ce_half": "baseline/unseen/family_bayes/ce_M2048",
    "em_ce": "baseline/unseen/incontext_hmm/ce", "task_oracle_ce": "eval/unseen/oracle_task_test_ce",
    "diff": "eval/unseen/vs_best_counting", "diff_lo": "eval/unseen/vs_best_counting_lo",
    "diff_hi": "eval/unseen/vs_best_counting_hi", "icl_gain": "eval/unseen/icl_gain",
    "icl_gain_lo": "eval/unseen/icl_gain_lo", "icl_gain_hi": "eval/unseen/icl_gain_hi",
    "excess_task": "eval/unseen/excess_ce_task", "family_degenerate": "baseline/unseen/family_bayes/degenerate",
    "train_s": "train/wall_time_s", "figure1_s": "eval/figure1_s", "model_tv": "memory/model_tv",
    "lmem_tv": "memory/lmem_tv", "eps": "memory/eps", "mix_tv": "memory/mix_tv", "receptive_field": "memory/receptive_field",
    "n_positions": "memory/n_positions"}
TOLERANCE = 0.005  # headroom.TOLERANCE: family Bayes converged when it drops less than this from M/2 to M


# ---------------------------------------------------------------- compute (from the kept tables)


def _cell(r: dict) -> tuple:
    return tuple((r.get(k) or BASE[k]) if k in TEXT else float(r[k]) for k in KEYS)


def _base_with(**kw) -> tuple:
    d = {**BASE, **kw}
    return tuple(d[k] if k in TEXT else float(d[k]) for k in KEYS)


def axes(runs: list[dict]) -> list[tuple[str, str, tuple]]:
    """(axis, level label, cell) for every cell of every axis (module docstring: each axis moves one key)."""
    have = {_cell(r) for r in runs}
    out = []
    for L in (2, 4, 6):
        out.append(("depth", f"{L} layers", _base_with(n_layers=L)))
    for L in (2, 4, 6):
        for pe in ("rope", "absolute"):
            out.append(("pos_enc", f"{pe}, {L} layers", _base_with(n_layers=L, pos_enc=pe)))
    for g in (0.6, 0.8, 0.95):
        out.append(("gamma", f"gamma {g:g}", _base_with(gamma=g)))
    for d in (2, 3, 4):
        out.append(("rank", f"d = {d}", _base_with(rank=d)))
    for g in sorted({c[2] for c in have if c[4] > 0}):  # the gammas with windowed cells, beside their full context
        for w in (3, 5, 7, 0):
            R = 2 * (w - 1) + 1 if w else 0
            out.append(("context", f"gamma {g:g}, " + (f"R = {R} (window {w})" if w else "full context"),
                        _base_with(gamma=g, window=w)))
    for st, lab in (("half", "structures seen in training"), ("half-heldout", "structures held out of training")):
        out.append(("structure", lab, _base_with(structures=st)))
    return [a for a in out if a[2] in have]


def cell_rows(runs: list[dict]) -> tuple[list[dict], dict]:
    """ablations.csv rows and {cell: room verdict} (module docstring)."""
    by = defaultdict(list)
    for r in runs:
        by[_cell(r)].append(r)
    rows, has_room = [], {}
    for axis, level, cell in axes(runs):
        rs = sorted(by[cell], key=lambda r: r["seed"])
        seeds = [int(r["seed"]) for r in rs]
        diff = pool([r["diff"] for r in rs], seeds)
        room = pool([r["best_counting_ce"] - r["family_bayes_ce"] for r in rs], seeds)
        legit = []
        for r in rs:
            conv = (r["family_bayes_ce_half"] - r["family_bayes_ce"]) < TOLERANCE
            cands = [r["em_ce"]] + ([r["family_bayes_ce"]] if conv and not r["family_degenerate"] == 1 else [])
            legit.append(r["best_counting_ce"] - min(cands))
        legit_p = pool(legit, seeds)
        closed = pool([(r["best_counting_ce"] - r["model_ce"]) / (r["best_counting_ce"] - r["family_bayes_ce"])
                        for r in rs], seeds)
        (c_gain, gain), (c_inf, _) = regime_claims({"icl_gain": ([r["icl_gain"] for r in rs], seeds),
                                                    "inference_beyond_counting": ([r["diff"] for r in rs], seeds)},
                                                   lambda _: "pooled")
        room_ok = room["lo"] > 0 or legit_p["lo"] > 0
        has_room[cell] = room_ok
        rows.append({"axis": axis, "level": level, "n_layers": cell[0], "pos_enc": cell[1], "gamma": cell[2],
                     "rank": cell[3], "window": cell[4], "n_seeds": diff["n"],
                     "model_ce": mean(r["model_ce"] for r in rs), "best_counting_ce": mean(r["best_counting_ce"] for r in rs),
                     "diff": diff["value"], "ci_lo": diff["lo"], "ci_hi": diff["hi"], "df": diff["df"],
                     "room": room["value"], "room_lo": room["lo"], "room_hi": room["hi"],
                     "room_legit": legit_p["value"], "room_legit_lo": legit_p["lo"], "room_legit_hi": legit_p["hi"],
                     "room_closed": closed["value"], "room_closed_lo": closed["lo"], "room_closed_hi": closed["hi"],
                     "icl_gain": gain["value"], "icl_gain_lo": gain["lo"], "icl_gain_hi": gain["hi"],
                     # one seed: no interval over seeds; the run's own word (its paired CI over episodes) is shown
                     "regime": (regime([c_gain, c_inf]) if room_ok else "no room") if len(rs) > 1 else
                     f"one seed ({rs[0]['regime']})",
                     "regime_per_run": ";".join(r["regime"] for r in rs),
                     "per_seed_diff": ";".join(f"{r['diff']:.4f}" for r in rs)})
    return rows, has_room


def effects(runs: list[dict], has_room: dict) -> list[dict]:
    """effects.csv rows (module docstring): each a stats.Claim with its rule fixed before the data, its TOST at the
    default margin and the seeds needed (hmmscope.sweep.effects: the report's implementation); a slope over three or
    more levels carries its adjacent steps ("not monotone" unless they all follow it); a Holm-adjusted verdict beside
    each (the family: every effect)."""
    ok = [r for r in runs if has_room.get(_cell(r), False) and (r.get("structures") or "all") == "all"]
    out: list = []
    # RoPE - absolute on diff, per depth and pooled (blocks: depth)
    pe = [r for r in ok if r["gamma"] == 0.8 and r["rank"] == 4 and r["window"] == 0]
    for L in sorted({r["n_layers"] for r in pe}):
        sub = [r for r in pe if r["n_layers"] == L]
        fx.add(out, f"RoPE - absolute, {int(L)} layers", fx.paired(sub, "diff", "pos_enc", "rope"), rule("<", 0),
               "model - best counting (unseen tasks, k_max): RoPE minus absolute, paired by seed")
    fx.add(out, "RoPE - absolute, pooled over depths", fx.paired(pe, "diff", "pos_enc", "rope", "n_layers"),
           rule("<", 0), "model - best counting: RoPE minus absolute, the mean over depths within a seed, t over seeds")
    # slopes within a seed, then t over seeds; their adjacent steps paired by seed
    for name, key, sel, ykey, rule_, what in (
            ("depth: slope of model - best counting on n_layers (RoPE)", "n_layers",
             dict(pos_enc="rope", gamma=0.8, rank=4, window=0), "diff", rule("<", 0), "deeper models infer more"),
            ("gamma: slope of model - best counting on gamma", "gamma", dict(n_layers=2, pos_enc="rope", rank=4, window=0),
             "diff", rule(">", 0), "the advantage over counting shrinks as the tokens reveal the states"),
            ("gamma: slope of the excess over the task oracle on gamma", "gamma",
             dict(n_layers=2, pos_enc="rope", rank=4, window=0), "excess_task", rule("<", 0),
             "more observable tasks are inferred closer to the oracle"),
            ("rank: slope of model - best counting on d", "rank", dict(n_layers=2, pos_enc="rope", gamma=0.8, window=0),
             "diff", rule("<", 0), "richer dynamics leave counting further behind"),
            ("rank: slope of the excess over the task oracle on d", "rank",
             dict(n_layers=2, pos_enc="rope", gamma=0.8, window=0), "excess_task", rule(">", 0),
             "Theorem 1's d: more to infer, further from the oracle")):
        fx.slope(out, name, [r for r in ok if all(r[k] == v for k, v in sel.items())], key, ykey, rule_, what,
                 f"unit of {key}")
    for g in sorted({r["gamma"] for r in ok if r["window"] > 0}):  # the gammas the context sweep ran
        ctx = [{**r, "R": 2 * (r["window"] - 1) + 1} for r in ok if r["gamma"] == g and r["n_layers"] == 2
               and r["pos_enc"] == "rope" and r["rank"] == 4 and r["window"] > 0]
        fx.slope(out, f"context, gamma {g:g}: slope of the excess over the task oracle on R", ctx, "R", "excess_task",
                 rule("<", 0), "a longer receptive field brings the model closer to the oracle", "token of R")
        fx.slope(out, f"context, gamma {g:g}: slope of model - best counting on R", ctx, "R", "diff", rule("<", 0),
                 "a longer receptive field infers more beyond counting", "token of R")
    st = [r for r in runs if r.get("structures") in ("half", "half-heldout")  # same model per seed, two task sets
          and has_room.get(_cell(r), False)]
    if st:
        fx.add(out, "structure: held-out minus seen structures", fx.paired(st, "diff", "structures", "half-heldout"),
               rule(">", 0), "model - best counting on unseen tasks whose revealing maps training never drew, minus on "
               "tasks of the training half (the same model per seed; each against counting fitted to its own half)")
    return fx.table(out, "effects.csv")


def theorem1(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """theorem1.csv (per gamma and R, pooled over seeds) and theorem1_rates.csv (decay rates in R)."""
    ctx = [r for r in runs if r["window"] > 0 and math.isfinite(r["model_tv"])]
    rows, rates = [], []
    for g in sorted({r["gamma"] for r in ctx}):
        sub = [r for r in ctx if r["gamma"] == g]
        for R in sorted({r["receptive_field"] for r in sub}):
            rs = [r for r in sub if r["receptive_field"] == R]
            seeds = [int(r["seed"]) for r in rs]
            row = {"gamma": g, "R": int(R), "n_seeds": len(rs), "n_positions": int(rs[0]["n_positions"])}
            for k in ("model_tv", "lmem_tv", "eps", "mix_tv"):
                p = pool([r[k] for r in rs], seeds)
                row.update({k: p["value"], f"{k}_lo": p["lo"], f"{k}_hi": p["hi"]})
            p = pool([r["model_tv"] - r["lmem_tv"] for r in rs], seeds)
            row.update({"model_minus_lmem_tv": p["value"], "model_minus_lmem_tv_lo": p["lo"],
                        "model_minus_lmem_tv_hi": p["hi"]})
            rows.append(row)
        for k in ("model_tv", "lmem_tv", "eps"):
            per = defaultdict(list)
            for r in sub:
                if r[k] > 0:
                    per[int(r["seed"])].append((r["receptive_field"], math.log(r[k])))
            vals = [-float(np.polyfit(*np.array(v).T, 1)[0]) for v in per.values() if len({x for x, _ in v}) >= 2]
            p = pool(vals, list(range(len(vals))))
            rates.append({"gamma": g, "quantity": k, "decay_rate": p["value"], "ci_lo": p["lo"], "ci_hi": p["hi"],
                          "df": p["df"], "n_seeds": p["n"], "gamma4": g ** 4,
                          "fit": "log(TV) = a - rate * R, OLS within a seed over its R, t over seeds"})
    return rows, rates


def layerwise(claim_rows: list[dict]) -> list[dict]:
    """layerwise.csv: every logged claim pooled per (n_layers, pos_enc) by the report's own pooling."""
    out = []
    for L, pe in sorted({(r["n_layers"], r["pos_enc"]) for r in claim_rows}):
        sub = [r for r in claim_rows if r["n_layers"] == L and r["pos_enc"] == pe]
        wide = defaultdict(dict)
        for r in sub:
            w = wide[r["run_id"]]
            w.update({"trial": r["run_id"][:8], "param:train.seed": str(int(r["seed"])),
                      f"metric:claim/{r['claim']}/value": r["value"], f"metric:claim/{r['claim']}/ci_lo": r["ci_lo"],
                      f"metric:claim/{r['claim']}/ci_hi": r["ci_hi"], f"verdict:{r['claim']}": r["verdict"],
                      f"rule:{r['claim']}": r["rule"]})
        _, claims = layerwise_section(pd.DataFrame(list(wide.values())))
        for c in claims:  # one run: its CI covers its episodes, not seeds (SCIENCE.md 9): no verdict from it here
            one = len(wide) < 2
            out.append({"n_layers": int(L), "pos_enc": pe, "claim": c.name[len("pooled: "):], "estimate": c.value,
                        "ci_lo": c.ci_lo, "ci_hi": c.ci_hi, "df": c.df, "rule": c.rule,
                        "verdict": "no power" if one else c.verdict, "n_runs": len(wide),
                        "statistic": c.statistic + ("; one seed: the run's verdict was " + c.verdict if one else "")})
    family = [Claim(r["claim"], r["statistic"], r["estimate"], r["ci_lo"], r["ci_hi"], r["verdict"], "", r["rule"],
                    r["df"]) if r["verdict"] != "no power" else None for r in out]  # the family: every decided cell
    holm, line = holm_verdicts([c for c in family if c is not None])
    it = iter(holm)
    for r, c in zip(out, family):
        r["holm_verdict"] = next(it) if c is not None else "no power"
    print(f"layerwise.csv, the family of {len(holm)} pooled claims: {line}")
    return out


def cost(runs: list[dict]) -> list[dict]:
    """cost.csv: per study and cell, training / Figure 1 / analysis seconds (mean over seeds) and the study's wall
    time (first run start to last run end)."""
    out = []
    for study in STUDIES:
        rs = [r for r in runs if r["study"] == study]
        if not rs:
            continue
        for cell in sorted({_cell(r) for r in rs}, key=str):
            cs = [r for r in rs if _cell(r) == cell]
            out.append({"study": study, "cell": f"L{int(cell[0])} {cell[1]} g{cell[2]:g} d{int(cell[3])} w{int(cell[4])}",
                        "n_runs": len(cs), "train_s": mean(r["train_s"] for r in cs),
                        "figure1_s": mean(r["figure1_s"] for r in cs),
                        "analysis_s": mean(r.get("analysis_s", math.nan) for r in cs)})
        out.append({"study": study, "cell": "all (wall time, first start to last end)", "n_runs": len(rs),
                    "train_s": max(r["end"] for r in rs) - min(r["start"] for r in rs), "figure1_s": math.nan,
                    "analysis_s": math.nan})
    return out
