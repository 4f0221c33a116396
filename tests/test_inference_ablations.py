"""analysis/inference_ablations.py (issue 33) from kept tables (--from-record): planted per-run values with known
pooled answers (t over 3 seeds), the axis effects, the no-room rule, Theorem 1's table and the layerwise pooling."""

from __future__ import annotations

import csv
import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
SHIFT = {0: 0.01, 1: -0.02, 2: 0.005}


def _script():
    sys.path.insert(0, str(ROOT / "analysis"))
    try:
        return importlib.import_module("inference_ablations")
    finally:
        sys.path.pop(0)


def _run(cell: dict, seed: int, study: str) -> dict:
    L, pe, g, d, w = cell["n_layers"], cell["pos_enc"], cell["gamma"], cell["rank"], cell["window"]
    structures = cell.get("structures", "all")
    diff = -0.2 + (-0.01 + 0.002 * seed) * L + (0.05 if pe == "absolute" else 0.0) + 0.1 * (g - 0.8) \
        + (0.003 * seed - 0.01) * (d - 4) + SHIFT[seed]
    R = 2 * (w - 1) + 1 if w else 0
    if w:
        diff += 0.004 * (13 - R) * (1 + seed / 10)
    if structures == "half-heldout":
        diff += 0.03 + 0.01 * seed
    no_room = g == 0.95
    best = 1.40
    fam = best + 0.01 if no_room else best - 0.25
    row = {"study": study, "trial": 0, "run_id": f"{study}-{L}-{pe}-{g}-{d}-{w}-{structures}-{seed}", "seed": seed, "n_layers": L,
           "pos_enc": pe, "gamma": g, "rank": d, "window": w, "structures": structures,
           "model_ce": best + diff, "best_counting_ce": best,
           "family_bayes_ce": fam, "family_bayes_ce_half": fam + 0.05, "em_ce": best + 0.07, "task_oracle_ce": 1.0,
           "diff": diff, "diff_lo": diff - 0.02, "diff_hi": diff + 0.02, "icl_gain": 0.3 + SHIFT[seed],
           "icl_gain_lo": 0.28, "icl_gain_hi": 0.32, "excess_task": best + diff - 1.0, "family_degenerate": "",
           "train_s": 100.0 * L, "figure1_s": 20.0, "regime": "inference beyond counting", "start": 1000.0 + seed,
           "end": 2000.0 + seed, "claim_icl_gain_verdict": "supported",
           "claim_inference_beyond_counting_verdict": "supported", "analysis_run_id": "", "analysis_s": ""}
    for k in ("model_tv", "lmem_tv", "eps", "mix_tv", "receptive_field", "n_positions"):
        row[k] = ""
    if w:
        row.update({"model_tv": 0.3 * math.exp(-(0.05 + 0.01 * seed) * R), "lmem_tv": 0.01 * math.exp(-0.3 * R),
                    "eps": 0.012 * math.exp(-0.3 * R), "mix_tv": 0.2, "receptive_field": R, "n_positions": 16 - R})
    return row


def _record(tmp: Path, one_seed: bool = False) -> Path:
    base = {"n_layers": 2, "pos_enc": "rope", "gamma": 0.8, "rank": 4, "window": 0}
    cells = [("depth", {**base, "n_layers": L, "pos_enc": pe}) for L in (2, 4, 6) for pe in ("rope", "absolute")]
    cells += [("gamma", {**base, "gamma": g}) for g in (0.6, 0.95)] + [("rank", {**base, "rank": d}) for d in (2, 3)]
    cells += [("context", {**base, "gamma": g, "window": w}) for g in (0.6, 0.8) for w in (3, 5, 7)]
    cells += [("structure", {**base, "structures": st}) for st in ("half", "half-heldout")]
    runs = [_run(c, s, study) for study, c in cells for s in SEEDS]
    if one_seed:  # and no windowed cell at gamma 0.6 (a context row cut): its full-context cell is no context level
        runs = [r for r in runs if not (r["window"] and r["gamma"] == 0.6)]
    if one_seed:  # a cell with one seed left (a sweep cut short): no t interval over seeds
        runs = [r for r in runs if not (r["n_layers"] == 6 and r["pos_enc"] == "absolute" and r["seed"] != 1)]
        next(r for r in runs if r["n_layers"] == 6 and r["pos_enc"] == "absolute")["regime"] = "worse than counting"
    rec = tmp / "rec"
    rec.mkdir()
    _csv(rec / "runs.csv", runs)
    curves = [{"study": "depth", "run_id": r["run_id"], "seed": r["seed"], "n_layers": r["n_layers"],
               "pos_enc": r["pos_enc"], "gamma": 0.8, "rank": 4, "window": 0, "step": step, "metric": m,
               "value": v} for r in runs if r["study"] == "depth" for step in (0, 400, 800)
              for m, v in (("vs_best_counting", 0.5 - step / 1000), ("icl_gain", step / 4000))]
    _csv(rec / "curves.csv", curves)
    claims = [{"run_id": r["run_id"], "seed": r["seed"], "n_layers": r["n_layers"], "pos_enc": r["pos_enc"],
               "claim": "shuffle_slope", "value": -0.1 + 0.01 * r["seed"] - 0.01 * r["n_layers"],
               "ci_lo": -0.2, "ci_hi": 0.0 - 0.01, "rule": "< 0", "verdict": "supported"}
              for r in runs if r["study"] == "depth"]
    _csv(rec / "layerwise_runs.csv", claims)
    return rec


def _csv(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _t(vals):
    v = np.asarray(vals, float)
    h = st.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))
    return v.mean(), v.mean() - h, v.mean() + h


def test_from_record_gives_the_planted_answers(tmp_path, capsys, monkeypatch):
    rec = _record(tmp_path)
    mod, drawn = _script(), {}
    figs = sys.modules["ablations_figures"]  # the figures' module, imported by the script
    real = figs.save
    monkeypatch.setattr(figs, "save", lambda fig, out, stem: (drawn.__setitem__(stem, fig), real(fig, out, stem))[1])
    assert mod.main(["--from-record", str(rec), "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    abl = {(r["axis"], r["level"]): r for r in _rows(out / "ablations.csv")}
    # a cell: diff pooled over seeds by t on 2 df
    want = _t([_run({"n_layers": 4, "pos_enc": "absolute", "gamma": 0.8, "rank": 4, "window": 0}, s, "depth")["diff"]
               for s in SEEDS])
    r = abl[("pos_enc", "absolute, 4 layers")]
    assert float(r["diff"]) == pytest.approx(want[0]) and float(r["ci_lo"]) == pytest.approx(want[1])
    assert float(r["room"]) == pytest.approx(0.25) and r["regime"] == "inference beyond counting"
    assert float(r["room_closed"]) == pytest.approx(np.mean([-_run({"n_layers": 4, "pos_enc": "absolute", "gamma": 0.8,
                                                                     "rank": 4, "window": 0}, s, "d")["diff"] / 0.25
                                                              for s in SEEDS]))
    # the legitimate room: the EM learner is worse than counting, family Bayes not converged (drop 0.05)
    assert float(r["room_legit"]) == pytest.approx(-0.07)
    # no room at gamma 0.95: said so, and it enters no effect
    assert abl[("gamma", "gamma 0.95")]["regime"] == "no room"
    assert ("gamma", "gamma 0.8") in abl and ("depth", "2 layers") in abl and ("rank", "d = 3") in abl
    eff = {e["effect"]: e for e in _rows(out / "effects.csv")}
    # RoPE - absolute: -0.05 in every seed and depth: a zero-width interval, so no power (never "supported")
    e = eff["RoPE - absolute, pooled over depths"]
    assert float(e["value"]) == pytest.approx(-0.05) and e["verdict"] == "no power"
    # depth slope: -0.01 + 0.002 s per seed -> t over the seeds' slopes
    v = _t([-0.01 + 0.002 * s for s in SEEDS])
    e = eff["depth: slope of model - best counting on n_layers (RoPE)"]
    assert float(e["value"]) == pytest.approx(v[0]) and float(e["ci_hi"]) == pytest.approx(v[2])
    assert e["verdict"] == ("supported" if v[2] < 0 else "inconclusive") and float(e["df"]) == 2
    # gamma: the 0.95 cell has no room, so the slope uses 0.6 and 0.8 only: 0.1 exactly in every seed
    assert float(eff["gamma: slope of model - best counting on gamma"]["value"]) == pytest.approx(0.1)
    # rank slope on d: 0.003 s - 0.01 per seed
    v = _t([0.003 * s - 0.01 for s in SEEDS])
    assert float(eff["rank: slope of model - best counting on d"]["value"]) == pytest.approx(v[0])
    # held-out structures: +0.03 + 0.01 s per seed, the same model scored on the other half of the revealing maps
    v = _t([0.03 + 0.01 * s for s in SEEDS])
    e = eff["structure: held-out minus seen structures"]
    assert float(e["value"]) == pytest.approx(v[0]) and float(e["ci_lo"]) == pytest.approx(v[1])
    assert abl[("structure", "structures held out of training")]["regime"] == "inference beyond counting"
    # Theorem 1: pooled TVs and decay rates (lmem: 0.3 exactly in every seed; model: 0.05 + 0.01 s)
    th = _rows(out / "theorem1.csv")
    assert {(float(r["gamma"]), int(r["R"])) for r in th} == {(g, R) for g in (0.6, 0.8) for R in (5, 9, 13)}
    r5 = next(r for r in th if float(r["gamma"]) == 0.8 and int(r["R"]) == 5)
    assert float(r5["model_tv"]) == pytest.approx(np.mean([0.3 * math.exp(-(0.05 + 0.01 * s) * 5) for s in SEEDS]))
    rates = {(float(r["gamma"]), r["quantity"]): r for r in _rows(out / "theorem1_rates.csv")}
    assert float(rates[(0.8, "lmem_tv")]["decay_rate"]) == pytest.approx(0.3)
    assert float(rates[(0.8, "model_tv")]["decay_rate"]) == pytest.approx(_t([0.05 + 0.01 * s for s in SEEDS])[0])
    # layerwise: the report's pooling per (depth, encoding), the logged rule on the pooled CI
    lw = {(int(r["n_layers"]), r["pos_enc"], r["claim"]): r for r in _rows(out / "layerwise.csv")}
    v = _t([-0.1 + 0.01 * s - 0.06 for s in SEEDS])
    r = lw[(6, "rope", "shuffle_slope")]
    assert float(r["estimate"]) == pytest.approx(v[0]) and float(r["ci_hi"]) == pytest.approx(v[2])
    assert r["verdict"] == ("supported" if v[2] < 0 else "inconclusive") and r["rule"] == "< 0"
    assert len({k[:2] for k in lw}) == 6
    for stem in ("ablations", "depth_curves", "theorem1", "layerwise"):
        assert (out / f"{stem}.png").stat().st_size > 5000 and (out / f"{stem}.pdf").exists()
    # issue 46.5: readable figures. ablations.png: a panel per axis, each its own y range (before: one shared axis
    # set by the context panel squeezed the ~0.02 depth and RoPE differences), "lower is better" on each; the legend
    # names every colour; layerwise.png: one panel, a legend for the verdicts' colours, claims as a reader says them
    from figure_checks import layout_problems

    abl, lw = drawn["ablations"], drawn["layerwise"]
    assert layout_problems(abl) == [] and layout_problems(lw) == []
    panels = [ax for ax in abl.axes if ax.get_visible()]
    assert len({ax.get_ylim() for ax in panels}) == len(panels) and all("lower is better" in ax.get_ylabel()
                                                                          for ax in panels)
    depth = next(ax for ax in panels if ax.get_title() == "depth")
    assert depth.get_ylim()[1] - depth.get_ylim()[0] < 0.2  # the depth differences fill their panel
    assert "minus the room" in " ".join(t.get_text() for t in abl.legends[0].get_texts())
    (ax,) = lw.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["supported", "not supported", "inconclusive",
                                                                   "no power"]


def test_a_missing_record_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _script().main(["--from-record", str(tmp_path / "nope"), "--no-figures"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "runs.csv" in err[0]
    assert not (tmp_path / "nope").exists()  # nothing written


def test_a_cell_with_one_seed_shows_its_runs_word_not_no_room(tmp_path):
    """A cell a cut-short sweep left with one seed has no interval over seeds: its row says "one seed (<the run's own
    regime word>)", not "no room" (which is a measured verdict), and the pos_enc effect at that depth has no power."""
    rec = _record(tmp_path, one_seed=True)
    assert _script().main(["--from-record", str(rec), "--out", str(tmp_path / "out"), "--no-figures"]) == 0
    abl = {(r["axis"], r["level"]): r for r in _rows(tmp_path / "out" / "ablations.csv")}
    r = abl[("pos_enc", "absolute, 6 layers")]
    assert r["n_seeds"] == "1" and r["regime"] == "one seed (worse than counting)" and r["ci_lo"] in ("", "nan")
    assert abl[("pos_enc", "absolute, 4 layers")]["regime"] == "inference beyond counting"
    assert ("context", "gamma 0.6, full context") not in abl and ("context", "gamma 0.8, full context") in abl
    assert ("gamma", "gamma 0.6") in abl
    eff = {e["effect"]: e for e in _rows(tmp_path / "out" / "effects.csv")}
    assert eff["RoPE - absolute, 6 layers"]["verdict"] == "no power"
    # the layerwise claims of a one-run cell: no verdict over seeds (the run's own, over episodes, is kept as text)
    lw = [r for r in _rows(tmp_path / "out" / "layerwise.csv") if r["n_layers"] == "6" and r["pos_enc"] == "absolute"]
    assert lw and all(r["n_runs"] == "1" and r["verdict"] == "no power" and "one seed" in r["statistic"] for r in lw)
    assert any(r["verdict"] == "supported" for r in _rows(tmp_path / "out" / "layerwise.csv") if r["n_runs"] == "3")


def test_effects_csv_says_equivalence_exclusion_power_and_not_monotone(tmp_path, capsys):
    """Issue 45.5: effects.csv gains margin, tost_p, equivalence, excluded_beyond and seeds_needed (hmmscope.sweep.effects,
    the report's implementation), and a Holm-adjusted verdict beside each; the TOST p of RoPE - absolute at 6 layers
    re-derives from runs.csv (statsmodels' ttost_paired on the seeds' differences); the gamma slope on a relation that
    falls then rises (the record's -0.180, -0.248, -0.144) is "not monotone", not "supported"."""
    from statsmodels.stats.weightstats import ttost_paired

    rec = _record(tmp_path)
    runs = _rows(rec / "runs.csv")
    level = {0.6: -0.180, 0.8: -0.248, 0.95: -0.144}
    for r in runs:
        g, s = float(r["gamma"]), int(r["seed"])
        base = (r["n_layers"], r["pos_enc"], r["rank"], r["window"], r["structures"]) == ("2", "rope", "4", "0", "all")
        if base:
            r["diff"] = level[g] + 0.004 * math.sin(3 * s + g)
            r["family_bayes_ce"] = float(r["best_counting_ce"]) - 0.25  # room at every gamma here
        if r["n_layers"] == "6" and r["pos_enc"] == "absolute":
            r["diff"] = float(r["diff"]) + 0.006 * (s - 1) + 0.002 * s * s
    _csv(rec / "runs.csv", runs)
    assert _script().main(["--from-record", str(rec), "--out", str(tmp_path / "out"), "--no-figures"]) == 0
    eff = {e["effect"]: e for e in _rows(tmp_path / "out" / "effects.csv")}
    printed = capsys.readouterr().out
    assert f"effects.csv, the family of {len(eff)} effects: " in printed
    e = eff["gamma: slope of model - best counting on gamma"]
    assert float(e["ci_lo"]) > 0 and e["rule"] == "> 0" and e["verdict"] == "not monotone", e
    assert e["steps"].startswith("0.8 - 0.6 -0.06") and "; 0.95 - 0.8 +0.1" in e["steps"]
    e = eff["RoPE - absolute, 6 layers"]
    six = {(r["pos_enc"], int(r["seed"])): float(r["diff"]) for r in runs if r["n_layers"] == "6"
           and r["structures"] == "all"}
    rope, absolute = ([six[pe, s] for s in SEEDS] for pe in ("rope", "absolute"))
    p, lower, upper = ttost_paired(np.array(rope), np.array(absolute), -0.01, 0.01)
    assert float(e["margin"]) == 0.01 and float(e["tost_p"]) == pytest.approx(p)
    assert e["equivalence"] == ("equivalent within ±0.01" if p < 0.05 else "not shown equivalent")
    lo, hi = float(e["tost_lo90"]), float(e["tost_hi90"])
    assert float(e["excluded_beyond"]) == pytest.approx(max(abs(lo), abs(hi)))
    d = np.array(rope) - np.array(absolute)
    assert float(e["sd"]) == pytest.approx(d.std(ddof=1)) and int(e["seeds_needed"]) >= 2
    assert all(r["holm_verdict"] in ("supported", "not supported", "inconclusive", "no power", "not monotone")
               for r in eff.values())
    lw = _rows(tmp_path / "out" / "layerwise.csv")  # the layerwise table is a family too (issue 45.4)
    assert lw and all(r["holm_verdict"] in ("supported", "inconclusive", "not supported", "no power") for r in lw)
    assert "layerwise.csv, the family of 6 pooled claims: " in printed
