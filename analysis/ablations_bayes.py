"""The inference ablations read against the Bayes-optimal reference (issue 44, SCIENCE.md 10).

Inputs: the record's kept per-run tables, and what analysis/bayes_reference.py computed from the configs alone on
the same episodes (RECORD/bayes/): bayes.csv (per family cell, seed and k: the Bayes reference's CE with its Monte
Carlo se, and best counting and the task oracle re-derived, which checks that these are the runs' episodes) and
windowed.csv (the windowed Bayes reference at the context cells' receptive fields R). Optionally the push (a bigger
budget at the best cell): push_runs.csv, push_curves.csv (ablations_collect.collect_push).

Per run: bayes_ce, bayes_mc_se (k = k_max, the 512 unseen episodes), bayes_gap = model - bayes, true_room = best
counting - bayes, share = (best counting - model) / true_room. Per cell (t over seeds, as every other column):
bayes_gap, true_room, share_of_room with their 95% intervals. Effects on the Bayes gap with the package's
implementation (hmmscope.sweep.effects: TOST at the default margin, seeds needed, slopes with their adjacent steps).
Within a seed every cell of the depth sweep shares its episodes, so the depth and RoPE - absolute effects on the
Bayes gap equal those on model - best counting (the reference is a constant per seed); gamma and rank change the
family, so theirs differ. Context: per receptive field R, window_forced = windowed Bayes - Bayes (what any
predictor that sees R positions loses) and model_own = model - windowed Bayes (the rest), per seed. Curves: the
emergence curves' model - best counting (on the first 128 of the same episodes) plus best counting - Bayes there
gives the Bayes gap every 400 steps; a power law in the steps fitted per run over the constant-learning-rate part
(gap = A step^-b, log-log OLS) extrapolates the steps for a gap of 0.01 (t over seeds on the log).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import record_effects as fx
from pooled import t_interval
from records_io import RecordError, read_csv

from hmmscope.stats import rule, t_mean

CELL = {(0.8, 4): "g0.8-d4", (0.6, 4): "g0.6-d4", (0.95, 4): "g0.95-d4", (0.8, 2): "g0.8-d2", (0.8, 3): "g0.8-d3"}
TARGET = 0.01  # nats/token: the push's aim, a model within 0.01 of Bayes
BAYES = {
    "bayes.csv": dict(required=("cell", "seed", "k", "bayes_ce", "bayes_mc_se", "bayes_converged", "best_counting_ce",
                                "task_oracle_ce", "bayes_ce_first128", "best_counting_ce_first128"),
                      numbers=("seed", "k", "bayes_ce", "bayes_mc_se", "best_counting_ce", "task_oracle_ce",
                               "bayes_ce_first128", "best_counting_ce_first128"), unique=[("cell", "seed", "k")]),
    "windowed.csv": dict(required=("seed", "R", "wbayes_ce", "wbayes_mc_se", "bayes_ce", "window_forced", "wbayes_tv",
                                   "bayes_tv"),
                         numbers=("seed", "R", "wbayes_ce", "wbayes_mc_se", "bayes_ce", "window_forced", "wbayes_tv",
                                  "bayes_tv"), unique=[("seed", "R")], allow_empty=True),
}


def read_bayes(folder: Path) -> tuple[list[dict], list[dict]] | None:
    """bayes.csv and windowed.csv of RECORD/bayes (records_io checks), numbers as floats; None without the folder."""
    if not (folder / "bayes.csv").exists():
        return None
    out = []
    for name, kw in BAYES.items():
        path = folder / name
        if name == "windowed.csv" and not path.exists():
            out.append([])
            continue
        t = read_csv(path, **kw)
        nums = set(kw["numbers"])
        out.append([{k: (float(v) if k in nums and v != "" else math.nan if k in nums else v) for k, v in r.items()}
                    for r in t.rows])
    return out[0], out[1]


JOINED = ("bayes_ce", "bayes_mc_se", "bayes_gap", "true_room", "share")  # the columns `join` adds to runs.csv


def join(runs: list[dict], bayes: list[dict], k_max: int = 2) -> list[dict]:
    """runs with bayes_ce, bayes_mc_se, bayes_gap, true_room, share (module docstring). A run whose best counting CE
    differs from bayes.csv's (the same fit on the same episodes) raises: then they are not the same episodes."""
    at = {(b["cell"], int(b["seed"])): b for b in bayes if int(b["k"]) == k_max and b["bayes_converged"] == "True"}
    out = []
    for r in runs:
        b = at.get((CELL.get((float(r["gamma"]), int(r["rank"])), ""), int(r["seed"])))
        if b is None:
            out.append({**r, "bayes_ce": math.nan, "bayes_mc_se": math.nan, "bayes_gap": math.nan,
                        "true_room": math.nan, "share": math.nan})
            continue
        if abs(b["best_counting_ce"] - float(r["best_counting_ce"])) > 1e-6:
            raise RecordError(f"run {r['run_id']}: best counting {float(r['best_counting_ce']):.6f} in runs.csv but "
                              f"{b['best_counting_ce']:.6f} in bayes.csv: not the same episodes")
        room = float(r["best_counting_ce"]) - b["bayes_ce"]
        out.append({**r, "bayes_ce": b["bayes_ce"], "bayes_mc_se": b["bayes_mc_se"],
                    "bayes_gap": float(r["model_ce"]) - b["bayes_ce"], "true_room": room,
                    "share": (float(r["best_counting_ce"]) - float(r["model_ce"])) / room if room > 0 else math.nan})
    return out


def _key(r: dict) -> tuple:
    return (float(r["n_layers"]), r["pos_enc"], float(r["gamma"]), float(r["rank"]), float(r["window"]))


def cells(rows: list[dict], runs: list[dict]) -> list[dict]:
    """ablations.csv's rows with bayes_ce, bayes_gap (+ _lo, _hi), true_room (+), share_of_room (+): t over the
    cell's seeds (the runs of the row's n_layers, pos_enc, gamma, rank and window, all structures)."""
    by = defaultdict(list)
    for r in runs:
        if (r.get("structures") or "all") == "all":
            by[_key(r)].append(r)
    out = []
    for row in rows:
        rs = by.get(_key(row), [])
        add = {"bayes_ce": t_interval([r["bayes_ce"] for r in rs])[0]}
        for name, col in (("bayes_gap", "bayes_gap"), ("true_room", "true_room"), ("share_of_room", "share")):
            m, lo, hi = t_interval([r[col] for r in rs])
            add.update({name: m, f"{name}_lo": lo, f"{name}_hi": hi})
        out.append({**row, **add})
    return out


def effects(runs: list[dict], windowed: list[dict]) -> list:
    """Effects on the Bayes gap (module docstring) as hmmscope.sweep.effects.Effect."""
    ok = [r for r in runs if math.isfinite(r["bayes_gap"]) and (r.get("structures") or "all") == "all"]
    out: list = []
    base = dict(gamma=0.8, rank=4, window=0)
    pe = [r for r in ok if all(float(r[k]) == v for k, v in base.items())]
    for enc in ("rope", "absolute"):
        fx.slope(out, f"Bayes gap: slope on n_layers ({enc})", [r for r in pe if r["pos_enc"] == enc], "n_layers",
                 "bayes_gap", rule("<", 0), "deeper models come closer to Bayes", "layer")
    for L in sorted({float(r["n_layers"]) for r in pe}):
        sub = [r for r in pe if float(r["n_layers"]) == L]
        fx.add(out, f"Bayes gap: RoPE - absolute, {int(L)} layers", fx.paired(sub, "bayes_gap", "pos_enc", "rope"),
               rule("<", 0), "model - Bayes: RoPE minus absolute, paired by seed")
    fx.add(out, "Bayes gap: RoPE - absolute, pooled over depths", fx.paired(pe, "bayes_gap", "pos_enc", "rope",
                                                                             "n_layers"),
           rule("<", 0), "model - Bayes: RoPE minus absolute, the mean over depths within a seed, t over seeds")
    two = dict(n_layers=2, window=0)
    fx.slope(out, "Bayes gap: slope on gamma", [r for r in ok if r["pos_enc"] == "rope" and float(r["rank"]) == 4
                                                and all(float(r[k]) == v for k, v in two.items())], "gamma",
             "bayes_gap", rule("<", 0), "more observable tasks leave less to infer", "unit of gamma")
    fx.slope(out, "Bayes gap: slope on d", [r for r in ok if r["pos_enc"] == "rope" and float(r["gamma"]) == 0.8
                                            and all(float(r[k]) == v for k, v in two.items())], "rank", "bayes_gap",
             rule(">", 0), "richer dynamics leave more to infer", "unit of d")
    wb = {(int(w["seed"]), int(w["R"])): w for w in windowed}
    ctx = [r for r in ok if float(r["window"]) > 0 and r["pos_enc"] == "rope" and float(r["n_layers"]) == 2]
    for R in sorted({2 * (int(r["window"]) - 1) + 1 for r in ctx}):
        rs = [r for r in ctx if 2 * (int(r["window"]) - 1) + 1 == R and (int(r["seed"]), R) in wb]
        if not rs:
            continue
        forced = [wb[(int(r["seed"]), R)]["window_forced"] for r in rs]
        own = [float(r["model_ce"]) - wb[(int(r["seed"]), R)]["wbayes_ce"] for r in rs]
        fx.add(out, f"context R = {R}: forced by the window (windowed Bayes - Bayes)", t_mean(forced), rule(">", 0),
               "what any predictor that sees R positions loses, per seed, t over seeds")
        fx.add(out, f"context R = {R}: the model's own (model - windowed Bayes)", t_mean(own), rule(">", 0),
               "the rest of the model's deficit, per seed, t over seeds")
    return out


def curves(curve_rows: list[dict], bayes: list[dict], runs: list[dict]) -> list[dict]:
    """The emergence curves' Bayes gap: model - best counting + (best counting - Bayes) on the curves' episodes
    (the first 128 of the same 512), per run and step."""
    at = {(b["cell"], int(b["seed"])): b for b in bayes if int(b["k"]) == 2}
    run = {r["run_id"]: r for r in runs}
    out = []
    for c in curve_rows:
        r = run.get(c["run_id"])
        if r is None or c["metric"] != "vs_best_counting":
            continue
        b = at.get((CELL.get((float(r["gamma"]), int(r["rank"])), ""), int(r["seed"])))
        if b is None:
            continue
        out.append({**{k: c[k] for k in ("study", "run_id", "seed", "n_layers", "pos_enc", "gamma", "rank", "window",
                                         "step") if k in c}, "metric": "bayes_gap",
                    "value": float(c["value"]) + b["best_counting_ce_first128"] - b["bayes_ce_first128"]})
    return out


def budget_fit(gap_curves: list[dict], label_of, lo_step: int, hi_step: int) -> list[dict]:
    """Per label (a cell or the push): per run, OLS of log(gap) on log(step) over lo_step <= step <= hi_step (the
    constant learning rate: before the decay); the exponent b and the steps at which the fit reaches TARGET, t over
    the runs (seeds) on b and on log(steps). Runs whose gap is not above 0 there are left out (log)."""
    by = defaultdict(lambda: defaultdict(list))
    for c in gap_curves:
        if lo_step <= c["step"] <= hi_step and c["value"] > 0:
            by[label_of(c)][c["run_id"]].append((c["step"], c["value"]))
    out = []
    for label, runs_ in sorted(by.items()):
        bs, logs, last = [], [], []
        for pts in runs_.values():
            if len(pts) < 3:
                continue
            x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            b, a = np.polyfit(x, y, 1)
            bs.append(-b)
            logs.append((math.log(TARGET) - a) / b if b < 0 else math.inf)
            last.append(sorted(pts)[-1][1])
        if len(bs) < 2:
            continue
        eb = t_mean(bs)
        fin = [v for v in logs if math.isfinite(v)]
        el = t_mean(fin) if len(fin) >= 2 else None
        out.append({"label": label, "n_runs": len(bs), "from_step": lo_step, "to_step": hi_step,
                    "exponent": float(eb.value), "exponent_lo": float(eb.lo), "exponent_hi": float(eb.hi),
                    "gap_at_to_step": float(np.mean(last)),
                    "steps_for_target": math.exp(el.value) if el else math.inf,
                    "steps_for_target_lo": math.exp(el.lo) if el else math.nan,
                    "steps_for_target_hi": math.exp(el.hi) if el else math.nan, "target": TARGET})
    return out


def push_rows(push_runs: list[dict], bayes: list[dict]) -> list[dict]:
    """ablations.csv's axis "push": the push's cell, t over its seeds (module docstring)."""
    j = join(push_runs, bayes)
    if not j:
        return []
    row = {"axis": "push", "level": f"{int(float(j[0]['n_layers']))} layers RoPE, width {int(float(j[0]['d_model']))}, "
           f"{int(float(j[0]['steps'])):,} steps", "n_seeds": len(j)}
    for name, col in (("model_ce", "model_ce"), ("diff", "diff"), ("bayes_ce", "bayes_ce"), ("bayes_gap", "bayes_gap"),
                      ("true_room", "true_room"), ("share_of_room", "share")):
        m, lo, hi = t_interval([float(r[col]) for r in j])
        row.update({name: m, f"{name}_lo": lo, f"{name}_hi": hi} if name not in ("model_ce", "bayes_ce") else {name: m})
    return [row]


def theorem1_windowed(th: list[dict], windowed: list[dict]) -> list[dict]:
    """theorem1.csv's rows (gamma 0.8, per R) with the windowed Bayes reference beside eps(R) and the L-memory
    predictor: wbayes_tv (its TV to the task oracle at test positions j >= R: what any learner that must also infer
    the task from R positions is off by, at best) and bayes_tv (the full-history Bayes reference's), t over seeds;
    and the CE split of the model's deficit over every scored test token, window_forced (windowed Bayes - Bayes)."""
    by = defaultdict(list)
    for w in windowed:
        by[int(w["R"])].append(w)
    out = []
    for row in th:
        ws = by.get(int(row["R"]), []) if float(row["gamma"]) == 0.8 else []
        add = {}
        for col in ("wbayes_tv", "bayes_tv", "window_forced", "wbayes_ce", "bayes_ce"):
            m, lo, hi = t_interval([w[col] for w in ws])
            add.update({col: m, f"{col}_lo": lo, f"{col}_hi": hi})
        out.append({**row, **add})
    return out
