"""Inference ablations (issue 33, SCIENCE.md 9): depth, RoPE vs absolute, gamma, rank and context in the family where a
model infers beyond counting; the paper's layerwise claims at every depth; Theorem 1 against a learner that infers.

    python analysis/inference_ablations.py --tracking-uri URI --storage URL [--out DIR] [--headroom DIR]
    python analysis/inference_ablations.py --from-record analysis/results/inference-ablations-cpu

The first form reads the four sweeps of sweeps/inference-ablations-{depth,gamma,rank,context}.toml (their COMPLETE
trials, Figure 1 metrics, emergence curves, memory/* metrics and the depth sweep's analysis runs) and writes the
per-run tables the record keeps (runs.csv, curves.csv, layerwise_runs.csv), then everything below from them. The
second form recomputes everything from those kept tables alone (no store), checked first (RECORD, records_io.py);
every table is computed before any is written, each atomically, so a bad record is never overwritten.

Cells and axes. A cell is (n_layers, pos_enc, gamma, rank, window); seeds are its replicates (train.seed = data.seed:
each seed draws its own unseen, fit and family tasks, so an interval over seeds covers those draws). The base cell is
2 layers, RoPE, gamma 0.8, d = 4, full context; each axis moves one key from it (depth and pos_enc: the depth sweep's
3 x 2 grid; context: the window at gamma 0.6 and 0.8, beside the full-context cell of that gamma).

Statistics (seeds are the unit; t intervals on G - 1 df, stats.t_mean, as `hmmscope report`):
- per cell: the model's CE and best counting's at k_max (unseen tasks), diff = model - best counting (each run's
  paired mean over its 512 episodes, pooled over seeds), the room (best counting - family Bayes at M = 4096: a lower
  bound in expectation, SCIENCE.md 9; and the legitimate room, best counting minus the EM learner or a converged family
  Bayes), the share of the room closed ((best counting - model) / (best counting - family Bayes)), the regime word
  from the pooled claims (regimes.regime). A cell whose room is not above 0 on its CI is "no room" and enters no
  axis effect.
- effects (stats.claim with a rule fixed before the data): RoPE - absolute on diff per depth and pooled over depths
  (stats.paired_effect: seeds the unit, depth the block); the slope of diff on n_layers (RoPE) per seed; the slope of
  diff and of the excess over the task oracle on gamma, on d, and on the receptive field R per seed (OLS within a
  seed, then t over seeds), each slope with its adjacent steps ("not monotone" unless they all follow it). Each
  effect (hmmscope.sweep.effects, the report's implementation) also gets its TOST at the margin (0.01 nats/token,
  stats.DEFAULT_MARGIN; a slope's over the swept range), what the design excludes, the seeds needed to decide +-margin
  with 80% power, and a Holm-adjusted verdict over the family of effects (columns margin, tost_p, equivalence,
  excluded_beyond, seeds_needed, holm_verdict).
- Theorem 1 (context cells): the model's TV to the task oracle at test positions j >= R (memory/model_tv), the
  L-memory predictor's on the same tokens (memory/lmem_tv: eps(R) measured there), eps(R) on stationary histories
  (memory/eps), family Bayes with the full history (memory/mix_tv), per gamma and R pooled over seeds; decay rates in
  R from per-seed log-linear fits.
- layerwise: every claim the depth sweep's analyses logged, pooled per (n_layers, pos_enc) over seeds by the report's
  own pooling (hmmscope.report.layerwise), the claim's logged rule applied to the pooled CI.

Writes, under --out: ablations.csv, effects.csv, theorem1.csv, theorem1_rates.csv, layerwise.csv, cost.csv, curves.csv,
runs.csv, layerwise_runs.csv, and the figures ablations.png, depth_curves.png, theorem1.png, layerwise.png (+ PDF).
The package never imports this folder.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
from records_io import Outputs, RecordError, check_out, check_unique, read_csv
from sweepdata import RESULTS, default_storage, fail, load_sweep, save

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


# ---------------------------------------------------------------- collect (from the store)


def collect(uri: str | None, storage: str | None, out: Path) -> None:
    """runs.csv, curves.csv, layerwise_runs.csv from the four sweeps (module docstring)."""
    import optuna
    from optuna.trial import TrialState

    from hmmscope import tracking

    runs, curves, claims, studies = [], [], [], []
    store = default_storage(storage)
    known = set(optuna.get_all_study_names(store))
    for study in STUDIES:  # a study not run (or with no COMPLETE trial yet) is listed in studies.csv, not fatal
        name = f"inference-ablations-{study}"
        st = optuna.load_study(study_name=name, storage=store) if name in known else None
        n_complete = 0 if st is None else sum(t.state == TrialState.COMPLETE for t in st.get_trials(deepcopy=False))
        studies.append({"study": name, "in_store": st is not None,
                        "n_trials": 0 if st is None else len({t.user_attrs.get("slot", t.number)  # the spec's slots
                                                              for t in st.get_trials(deepcopy=False)}),
                        "complete": n_complete})
        if not n_complete:
            print(f"{name}: not in the store or no COMPLETE trial (listed in studies.csv)", file=sys.stderr)
            continue
        sw = load_sweep(argparse.Namespace(sweep=name, tracking_uri=uri, storage=storage))
        client = tracking.client(sw.uri)
        for t in sw.trials:
            run = client.get_run(t.run_id)
            row = {"study": study, "trial": t.number, "run_id": t.run_id, "seed": int(t.seed),
                   **{k: _param(t.params, KEYS[k], BASE[k]) for k in KEYS},
                   **{c: t.metrics.get(m, math.nan) for c, m in METRICS.items()},
                   "regime": run.data.tags.get("hmmscope.regime", ""),
                   "start": run.info.start_time / 1000, "end": (run.info.end_time or 0) / 1000}
            nums, verdicts, rules = tracking.read_claims(sw.uri, run)
            for name in ("icl_gain", "inference_beyond_counting"):
                row[f"claim_{name}_verdict"] = verdicts.get(name, "")
            row["analysis_run_id"] = t.analysis_run_id or ""
            if t.analysis_run_id:
                arun = client.get_run(t.analysis_run_id)
                row["analysis_s"] = (arun.info.end_time - arun.info.start_time) / 1000 if arun.info.end_time else math.nan
                anums, averdicts, arules = tracking.read_claims(sw.uri, arun)
                for name, verdict in averdicts.items():
                    claims.append({"run_id": t.run_id, "seed": row["seed"], "n_layers": row["n_layers"],
                                   "pos_enc": row["pos_enc"], "claim": name,
                                   **{k: anums.get(f"claim/{name}/{k}", math.nan) for k in ("value", "ci_lo", "ci_hi")},
                                   "rule": arules.get(name, ""), "verdict": verdict})
            runs.append(row)
            for e in _emergence(sw.uri, t.run_id):
                if e.get("tasks") == "unseen" and e.get("predictor") == "model" and e.get("metric") in (
                        "vs_best_counting", "icl_gain"):
                    curves.append({"study": study, "run_id": t.run_id, "seed": row["seed"], "n_layers": row["n_layers"],
                                   "pos_enc": row["pos_enc"], "gamma": row["gamma"], "rank": row["rank"],
                                   "window": row["window"], "step": int(e["step"]), "metric": e["metric"],
                                   "value": float(e["value"])})
    _write(studies, out / "studies.csv")
    _write(runs, out / "runs.csv")
    _write(curves, out / "curves.csv")
    _write(claims, out / "layerwise_runs.csv")


def _param(params: dict, key: str, default):
    v = params.get(key)
    if v is None:
        return default
    return v if isinstance(default, str) else type(default)(float(v))


def _emergence(uri: str, run_id: str) -> list[dict]:
    from hmmscope import tracking

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = tracking.Run(uri, run_id).download("emergence/curves.json", tmp)
        except FileNotFoundError:
            return []
        t = json.loads(Path(path).read_text())
    return [dict(zip(t["columns"], row)) for row in t["data"]]


def _write(rows: list[dict], path: Path) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r)) or ["empty"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, cols)
        w.writeheader()
        w.writerows(rows)
    print(f"table: {path}")


RECORD = {  # the kept tables, checked before anything is computed (records_io.read_csv): columns, numbers, keys
    "runs.csv": dict(required=("study", "run_id", "seed", *KEYS.keys() - {"structures"}, "model_ce", "diff"),
                     numbers=("trial", "seed", *KEYS.keys() - set(TEXT), *METRICS), unique=[("run_id",)]),
    "curves.csv": dict(required=("run_id", "step", "metric", "value"), numbers=("step", "value"),
                       unique=[("run_id", "step", "metric")]),
    "layerwise_runs.csv": dict(required=("run_id", "seed", "n_layers", "pos_enc", "claim", "value", "ci_lo", "ci_hi",
                                         "rule"), numbers=("seed", "n_layers", "value", "ci_lo", "ci_hi"),
                               unique=[("run_id", "claim")], allow_empty=True),  # a depth sweep without analyses
}


def _read(path: Path) -> list[dict]:
    """A kept table (RECORD: checked by records_io.read_csv, RecordError naming the file and row), numbers as floats."""
    t = read_csv(path, **RECORD.get(path.name, {}))
    if path.name == "runs.csv":  # one row per cell and seed: a repeated run is no further seed
        check_unique(t, [k for k in ("study", *KEYS, "seed") if k in t.columns])
    rows = t.rows
    for r in rows:
        for k, v in r.items():
            if k in ("pos_enc", "structures", "regime", "run_id", "study", "metric", "claim", "rule", "verdict",
                     "analysis_run_id") \
                    or k.endswith("_verdict"):
                continue
            try:
                r[k] = float(v) if v not in ("", None) else math.nan
            except ValueError:
                pass
    return rows


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


def _pool(values, labels=None) -> dict:
    from hmmscope.stats import t_mean

    e = t_mean([float(v) for v in values], labels, unit="seed")
    return {"value": e.value, "lo": e.lo, "hi": e.hi, "df": e.df, "n": e.n, "degenerate": e.degenerate}


def cell_rows(runs: list[dict]) -> tuple[list[dict], dict]:
    """ablations.csv rows and {cell: room verdict} (module docstring)."""
    from hmmscope.measure.regimes import regime
    from hmmscope.stats import claim, rule

    by = defaultdict(list)
    for r in runs:
        by[_cell(r)].append(r)
    rows, has_room = [], {}
    for axis, level, cell in axes(runs):
        rs = sorted(by[cell], key=lambda r: r["seed"])
        seeds = [int(r["seed"]) for r in rs]
        diff = _pool([r["diff"] for r in rs], seeds)
        room = _pool([r["best_counting_ce"] - r["family_bayes_ce"] for r in rs], seeds)
        legit = []
        for r in rs:
            conv = (r["family_bayes_ce_half"] - r["family_bayes_ce"]) < TOLERANCE
            cands = [r["em_ce"]] + ([r["family_bayes_ce"]] if conv and not r["family_degenerate"] == 1 else [])
            legit.append(r["best_counting_ce"] - min(cands))
        legit_p = _pool(legit, seeds)
        closed = _pool([(r["best_counting_ce"] - r["model_ce"]) / (r["best_counting_ce"] - r["family_bayes_ce"])
                        for r in rs], seeds)
        gain = _pool([r["icl_gain"] for r in rs], seeds)
        c_gain = claim("icl_gain", "pooled", gain["value"], gain["lo"], gain["hi"], rule(">", 0), "", df=gain["df"],
                       degenerate=gain["degenerate"])
        c_inf = claim("inference_beyond_counting", "pooled", diff["value"], diff["lo"], diff["hi"],
                      rule("<", 0, ["icl_gain"]), "", {"icl_gain": c_gain.verdict}, df=diff["df"],
                      degenerate=diff["degenerate"])
        room_ok = room["lo"] > 0 or legit_p["lo"] > 0
        has_room[cell] = room_ok
        rows.append({"axis": axis, "level": level, "n_layers": cell[0], "pos_enc": cell[1], "gamma": cell[2],
                     "rank": cell[3], "window": cell[4], "n_seeds": diff["n"],
                     "model_ce": _mean(r["model_ce"] for r in rs), "best_counting_ce": _mean(r["best_counting_ce"] for r in rs),
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


def _mean(xs) -> float:
    xs = [float(x) for x in xs]
    return float(np.mean(xs)) if xs else math.nan


def effects(runs: list[dict], has_room: dict) -> list[dict]:
    """effects.csv rows (module docstring): each a stats.Claim with its rule fixed before the data, its TOST at the
    default margin and the seeds needed (hmmscope.sweep.effects: the report's implementation); a slope over three or
    more levels carries its adjacent steps ("not monotone" unless they all follow it); a Holm-adjusted verdict beside
    each (the family: every effect)."""
    from hmmscope.stats import DEFAULT_MARGIN, holm_verdicts, paired_effect, rule
    from hmmscope.sweep.effects import effect, effect_row, ordered_effect

    margin = DEFAULT_MARGIN["nats/token"]
    ok = [r for r in runs if has_room.get(_cell(r), False) and (r.get("structures") or "all") == "all"]
    out = []

    def add(name, est_or_why, rule_, what):
        out.append(effect(name, est_or_why, rule_, what, unit="nats/token", margin=margin))

    def slope(name, rows, key, ykey, rule_, what, per):
        rows = [r for r in rows if math.isfinite(float(r[ykey]))]
        out.append(ordered_effect(name, [float(r[key]) for r in rows], [float(r[ykey]) for r in rows],
                                  [int(r["seed"]) for r in rows], None, rule_, f"OLS slope within a seed, t over "
                                  f"seeds: {what}", unit="nats/token", margin=margin, per=per))

    # RoPE - absolute on diff, per depth and pooled (blocks: depth)
    pe = [r for r in ok if r["gamma"] == 0.8 and r["rank"] == 4 and r["window"] == 0]
    for L in sorted({r["n_layers"] for r in pe}):
        sub = [r for r in pe if r["n_layers"] == L]
        add(f"RoPE - absolute, {int(L)} layers", _paired(sub, "pos_enc", "rope", "absolute"), rule("<", 0),
            "model - best counting (unseen tasks, k_max): RoPE minus absolute, paired by seed")
    add("RoPE - absolute, pooled over depths", paired_effect(
        [r["diff"] for r in pe], [r["pos_enc"] == "rope" for r in pe], [int(r["seed"]) for r in pe],
        [r["n_layers"] for r in pe]), rule("<", 0),
        "model - best counting: RoPE minus absolute, the mean over depths within a seed, t over seeds")
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
        slope(name, [r for r in ok if all(r[k] == v for k, v in sel.items())], key, ykey, rule_, what, f"unit of {key}")
    for g in sorted({r["gamma"] for r in ok if r["window"] > 0}):  # the gammas the context sweep ran
        ctx = [{**r, "R": 2 * (r["window"] - 1) + 1} for r in ok if r["gamma"] == g and r["n_layers"] == 2
               and r["pos_enc"] == "rope" and r["rank"] == 4 and r["window"] > 0]
        slope(f"context, gamma {g:g}: slope of the excess over the task oracle on R", ctx, "R", "excess_task",
              rule("<", 0), "a longer receptive field brings the model closer to the oracle", "token of R")
        slope(f"context, gamma {g:g}: slope of model - best counting on R", ctx, "R", "diff", rule("<", 0),
              "a longer receptive field infers more beyond counting", "token of R")
    st = [r for r in runs if r.get("structures") in ("half", "half-heldout")  # same model per seed, two task sets
          and has_room.get(_cell(r), False)]
    if st:
        add("structure: held-out minus seen structures", _paired(st, "structures", "half-heldout", "half"), rule(">", 0),
            "model - best counting on unseen tasks whose revealing maps training never drew, minus on tasks of the "
            "training half (the same model per seed; each against counting fitted to its own half)")
    holm, line = holm_verdicts([e.claim for e in out])
    print(f"effects.csv, the family of {len(out)} effects: {line}")
    return [{**effect_row(e), "holm_verdict": h} for e, h in zip(out, holm)]


def _paired(rows, key, a, b):
    from hmmscope.stats import paired_effect

    return paired_effect([r["diff"] for r in rows], [r[key] == a for r in rows], [int(r["seed"]) for r in rows])


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
                p = _pool([r[k] for r in rs], seeds)
                row.update({k: p["value"], f"{k}_lo": p["lo"], f"{k}_hi": p["hi"]})
            p = _pool([r["model_tv"] - r["lmem_tv"] for r in rs], seeds)
            row.update({"model_minus_lmem_tv": p["value"], "model_minus_lmem_tv_lo": p["lo"],
                        "model_minus_lmem_tv_hi": p["hi"]})
            rows.append(row)
        for k in ("model_tv", "lmem_tv", "eps"):
            per = defaultdict(list)
            for r in sub:
                if r[k] > 0:
                    per[int(r["seed"])].append((r["receptive_field"], math.log(r[k])))
            vals = [-float(np.polyfit(*np.array(v).T, 1)[0]) for v in per.values() if len({x for x, _ in v}) >= 2]
            p = _pool(vals, list(range(len(vals))))
            rates.append({"gamma": g, "quantity": k, "decay_rate": p["value"], "ci_lo": p["lo"], "ci_hi": p["hi"],
                          "df": p["df"], "n_seeds": p["n"], "gamma4": g ** 4,
                          "fit": "log(TV) = a - rate * R, OLS within a seed over its R, t over seeds"})
    return rows, rates


def layerwise(claim_rows: list[dict]) -> list[dict]:
    """layerwise.csv: every logged claim pooled per (n_layers, pos_enc) by the report's own pooling."""
    import pandas as pd

    from hmmscope.report.layerwise import layerwise_section

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
    from hmmscope.stats import Claim, holm_verdicts

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
                        "n_runs": len(cs), "train_s": _mean(r["train_s"] for r in cs),
                        "figure1_s": _mean(r["figure1_s"] for r in cs),
                        "analysis_s": _mean(r.get("analysis_s", math.nan) for r in cs)})
        out.append({"study": study, "cell": "all (wall time, first start to last end)", "n_runs": len(rs),
                    "train_s": max(r["end"] for r in rs) - min(r["start"] for r in rs), "figure1_s": math.nan,
                    "analysis_s": math.nan})
    return out


# ---------------------------------------------------------------- figures


def figures(rows, runs, curves, th, lw, out: Path) -> None:
    import matplotlib.pyplot as plt

    axes_ = [a for a in ("depth", "pos_enc", "gamma", "rank", "context", "structure") if any(r["axis"] == a for r in rows)]
    ncol = min(3, len(axes_))  # a grid, each panel its own y axis: the depth and RoPE differences are ~0.02, the
    fig, axs = plt.subplots(-(-len(axes_) // ncol), ncol, figsize=(4.6 * ncol, 4.2 * -(-len(axes_) // ncol) + 0.6),
                            layout="constrained", squeeze=False)  # context's 0.35: a shared axis hid them
    for ax, a in zip(axs.flat, axes_):
        rs = [r for r in rows if r["axis"] == a]
        x = np.arange(len(rs))
        for i, r in enumerate(rs):
            col = "C7" if r["regime"] == "no room" else "C0"
            ax.errorbar([i], [r["diff"]], yerr=[[r["diff"] - r["ci_lo"]], [r["ci_hi"] - r["diff"]]], fmt="o", color=col,
                        capsize=3, zorder=2)
            seeds = [float(v) for v in r["per_seed_diff"].split(";")]
            ax.plot([i + 0.12] * len(seeds), seeds, ".", color="k", alpha=0.8, zorder=3)  # beside the mean, on top
            ax.plot([i - 0.3, i + 0.3], [-r["room"]] * 2, "-", color="C1", lw=1.5, zorder=1)
        ys = [v for r in rs for v in (r["ci_lo"], r["ci_hi"], -r["room"], *map(float, r["per_seed_diff"].split(";")))
              if math.isfinite(v)]
        pad = 0.08 * (max(ys) - min(ys) or 0.01)
        ax.set_ylim(min(ys) - pad, max(ys) + pad)  # the panel's own data, not 0 far away from them
        if min(ys) < 0 < max(ys):
            ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(x, [_short(r["level"]) for r in rs], fontsize=8)
        ax.set(title=a.replace("_", " "), ylabel="model - best counting (nats/token)\nlower is better")
        ax.grid(alpha=0.3)
    for ax in axs.flat[len(axes_):]:
        ax.set_visible(False)
    from matplotlib.lines import Line2D

    fig.legend(handles=[Line2D([], [], marker="o", color="C0", label="mean over seeds, 95% t CI"),
                        Line2D([], [], marker="o", color="C7", label="a cell with no room (enters no effect)"),
                        Line2D([], [], marker=".", ls="", color="k", label="a seed"),
                        Line2D([], [], color="C1", label="minus the room (best counting - family Bayes): the model "
                                                         "level with family Bayes")],
               loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle("Inference ablations: the model minus the best fitted counting predictor, unseen tasks, k_max (below 0: "
                 "the model beats counting)", fontsize=10)
    save(fig, out, "ablations")

    fig, axs = plt.subplots(1, 2, figsize=(13, 4.4), layout="constrained")
    for ax, metric, ylab in ((axs[0], "vs_best_counting", "model - best counting at k_max"),
                             (axs[1], "icl_gain", "in-context gain (same tokens)")):
        for (L, pe), col in zip(sorted({(c["n_layers"], c["pos_enc"]) for c in curves if c["study"] == "depth"}),
                                ("C0", "C1", "C2", "C3", "C4", "C5")):
            cs = [c for c in curves if c["study"] == "depth" and c["n_layers"] == L and c["pos_enc"] == pe
                  and c["metric"] == metric]
            by = defaultdict(dict)
            for c in cs:
                by[c["seed"]][int(c["step"])] = c["value"]
            steps = sorted(set.intersection(*(set(v) for v in by.values()))) if by else []
            steps = [s for s in steps if s > 0]
            if steps:
                ax.plot(steps, [np.mean([v[s] for v in by.values()]) for s in steps], "-" if pe == "rope" else "--",
                        color=col, label=f"{int(L)} layers, {pe}")
        ax.axhline(0, color="gray", lw=0.8)
        ax.set(xlabel="optimizer step", ylabel=f"{ylab} (nats/token)", title=f"{ylab}: mean over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, out, "depth_curves")

    if th:
        fig, axs = plt.subplots(1, len({r["gamma"] for r in th}), figsize=(6.5 * len({r["gamma"] for r in th}), 4.4),
                                layout="constrained", squeeze=False)
        for ax, g in zip(axs[0], sorted({r["gamma"] for r in th})):
            rs = [r for r in th if r["gamma"] == g]
            R = [r["R"] for r in rs]
            for k, col, lab in (("model_tv", "C0", "model (TV to the task oracle)"),
                                ("mix_tv", "C1", "family Bayes, full history"),
                                ("lmem_tv", "C2", "L-memory predictor, same tokens (eps(R) there)"),
                                ("eps", "C3", "eps(R), stationary histories")):
                ax.errorbar(R, [r[k] for r in rs], yerr=[[r[k] - r[f"{k}_lo"] for r in rs], [r[f"{k}_hi"] - r[k] for r in rs]],
                            fmt="o-", color=col, capsize=3, label=lab)
            ax.set(yscale="log", xlabel="receptive field R (tokens)", ylabel="mean TV at test positions j >= R",
                   title=f"gamma {g:g} (gamma^4 = {g ** 4:.3f})", xticks=R)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("Theorem 1 against a learner that infers: fixed memory R, unseen tasks (mean over seeds, 95% t CI)")
        save(fig, out, "theorem1")

    if lw:
        from hmmscope.units import claim_words

        claims = sorted({r["claim"] for r in lw})
        cells = sorted({(r["n_layers"], r["pos_enc"]) for r in lw})
        colours = {"supported": "C2", "not supported": "C3", "inconclusive": "C7", "no power": "C4"}
        fig, ax = plt.subplots(figsize=(9, 0.28 * len(claims) + 2.2), layout="constrained")
        for y, name in enumerate(claims):  # a row per claim, each scaled by its own largest |value| (units differ)
            rs = [r for r in lw if r["claim"] == name]
            scale = max([abs(v) for r in rs for v in (r["estimate"], r["ci_lo"], r["ci_hi"]) if math.isfinite(v)]
                        or [1.0]) or 1.0
            for i, cell in enumerate(cells):
                r = next((r for r in rs if (r["n_layers"], r["pos_enc"]) == cell), None)
                if r is None or not math.isfinite(r["estimate"]):
                    continue
                col = colours.get(r["verdict"], "k")
                if math.isfinite(r["ci_lo"]) and math.isfinite(r["ci_hi"]):
                    ax.plot([i + 0.4 * r["ci_lo"] / scale, i + 0.4 * r["ci_hi"] / scale], [y, y], "-", color=col, lw=2)
                ax.plot([i + 0.4 * r["estimate"] / scale], [y], "o", color=col, ms=4)
        for i in range(len(cells)):
            ax.axvline(i, color="gray", ls=":", lw=0.8)
        ax.set_xticks(range(len(cells)), [f"{int(L)} layers, {pe}" for L, pe in cells], fontsize=8)
        ax.set_yticks(range(len(claims)), [claim_words(c) for c in claims], fontsize=7)
        ax.set(xlim=(-0.5, len(cells) - 0.5), ylim=(len(claims) - 0.5, -0.5), xlabel="cell (dotted: each cell's 0; "
               "a row's values / its largest |value|: the claims' units differ)", ylabel="claim")
        from matplotlib.lines import Line2D

        ax.legend(handles=[Line2D([], [], marker="o", color=c, label=v) for v, c in colours.items()], title="verdict "
                  "(pooled over seeds, 95% t CI)", fontsize=8, title_fontsize=8, ncol=4, loc="upper center",
                  bbox_to_anchor=(0.5, -0.09), frameon=False)
        fig.suptitle("Layerwise claims per depth and encoding, pooled over seeds", fontsize=10)
        save(fig, out, "layerwise")


def _short(level: str) -> str:
    """A level's tick label: 'gamma 0.6, R = 5 (window 3)' -> 'g0.6\nR=5'."""
    t = level.replace("gamma ", "g").replace(" (window ", " w").replace(")", "").replace("R = ", "R=")
    t = t.replace("full context", "full").replace("structures ", "").replace(" of training", "").replace(" in training", "")
    return t.split(" w")[0].replace(", ", "\n")


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracking-uri", default=None, help="MLflow store of the four sweeps")
    p.add_argument("--storage", default=None, help="their Optuna storage")
    p.add_argument("--from-record", type=Path, default=None, help="recompute from a record's kept tables (no store)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: analysis/results/"
                                                          "inference-ablations-cpu, or --from-record's)")
    p.add_argument("--no-figures", action="store_true")
    args = p.parse_args(argv)
    out = args.out or args.from_record or RESULTS / "inference-ablations-cpu"
    try:  # every input checked, every table computed, then written together (records_io): a bad record writes nothing
        check_out(out, "--out" if args.out else "--from-record", named=args.out is not None)
        if args.from_record is not None and not args.from_record.is_dir():
            raise RecordError(f"--from-record {str(args.from_record)!r}: no folder holding runs.csv there (a record of "
                              "this script's tables)")
        src = args.from_record or out
        if args.from_record is None:
            out.mkdir(parents=True, exist_ok=True)
            collect(args.tracking_uri, args.storage, out)
        runs, curves, claim_rows = (_read(src / name) for name in RECORD)
        outs = Outputs(out)
        rows, has_room = cell_rows(runs)
        outs.table(rows, "ablations")
        eff = effects(runs, has_room)
        outs.table(eff, "effects")
        th, rates = theorem1(runs)
        if th:
            outs.table(th, "theorem1")
            outs.table(rates, "theorem1_rates")
        lw = layerwise(claim_rows) if claim_rows else []
        if lw:
            outs.table(lw, "layerwise")
        outs.table(cost(runs), "cost")
        outs.write()
    except RecordError as e:
        fail(str(e))
    if not args.no_figures:
        figures(rows, runs, curves, th, lw, out)
    for e in eff:
        print(f"{e['effect']}: {e['value']:+.4f} [{e['ci_lo']:+.4f}, {e['ci_hi']:+.4f}] {e['unit']}, df {e['df']:g}, "
              f"rule {e['rule']}: {e['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
