"""analysis/'s library (pooled, record_effects, records_io.read_trials / number) on known answers, and the scripts'
size: a record script holds the record's choices, so none is over 250 lines (issue 49.4; before: verdict_moves 410,
task_diversity 407, ablations_tables 277, regime_layerwise 258, ablations_bayes 252)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def lib(monkeypatch):
    """The analysis library's modules by name (analysis/ on sys.path for the test, as a script has it)."""
    monkeypatch.syspath_prepend(str(ROOT / "analysis"))
    return importlib.import_module


def test_no_analysis_script_is_over_250_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "analysis").glob("*.py")}
    assert sizes and not {n: k for n, k in sizes.items() if k > 250}


def test_dependency_order_puts_requirements_first_and_leaves_a_cycle_out(lib):
    po = lib("pooled")
    req = {"inf": ["gain"], "gain": [], "a": ["b"], "b": ["a"], "free": ["not-an-item"]}
    order = po.dependency_order(["inf", "gain", "a", "b", "free"], req.get, lambda n: n)
    assert order == ["gain", "free", "inf"]  # a and b wait on each other; an unknown requirement does not wait
    # names: a requirement naming an item of `names` that is not in the list waits for ever (a claim with no rule)
    assert po.dependency_order(["inf"], req.get, lambda n: n, names={"inf", "gain"}) == []


def test_regime_claims_pool_over_seeds_and_gate_on_the_requirement(lib):
    """Three seeds: icl_gain 0.1 +- small (supported); model - best counting -0.2 +- small (supported, as it
    requires icl_gain); with the gain around 0 the same CI no longer makes inference beyond counting."""
    po = lib("pooled")
    seeds = [0, 1, 2]
    got = po.regime_claims({"inference_beyond_counting": ([-0.21, -0.2, -0.19], seeds),
                            "icl_gain": ([0.11, 0.1, 0.09], seeds)})
    assert [c.name for c, _ in got] == ["icl_gain", "inference_beyond_counting"]  # REGIME_CLAIMS's order
    (gain, g), (inf, p) = got
    assert g["value"] == pytest.approx(0.1) and g["df"] == 2 and g["lo"] < 0.1 < g["hi"]
    assert gain.verdict == "supported" and inf.verdict == "supported" and inf.rule == "< 0; requires icl_gain"
    flat = po.regime_claims({"icl_gain": ([0.1, -0.1, 0.0], seeds), "inference_beyond_counting": ([-0.21, -0.2, -0.19],
                                                                                                 seeds)})
    assert flat[0][0].verdict == "inconclusive" and flat[1][0].verdict != "supported"
    rows = po.regime_rows({4: {"retrieval_gap": {0: 0.5, 1: 0.6, 2: 0.55}}, 0: {"icl_gain": {0: 0.1, 1: 0.1}}}, 0)
    assert [r["cell"] for r in rows] == ["4", "fresh"] and rows[0]["regime"] == "retrieval"
    assert rows[1]["icl_gain_verdict"] == "no power"  # equal seeds: a zero-width interval carries no verdict


def test_effects_table_is_the_reports_effect_rows_with_holm(lib, capsys):
    fx = lib("record_effects")
    from hmmscope.stats import rule
    from hmmscope.sweep.effects import COLUMNS

    rows = [{"seed": s, "x": x, "y": 0.1 * x + 0.001 * (s - 1) * x ** 2} for s in range(3) for x in (1, 2, 3)]
    out: list = []
    fx.slope(out, "slope of y on x", rows, "x", "y", rule(">", 0), "y grows with x", "unit of x")
    fx.add(out, "no estimate", "one seed only", rule(">", 0), "nothing to pool")
    table = fx.table(out, "t.csv")
    assert "t.csv, the family of 2 effects" in capsys.readouterr().out
    assert set(COLUMNS) <= set(table[0]) and table[0]["value"] == pytest.approx(0.1)
    assert table[0]["verdict"] == "supported" and table[0]["holm_verdict"] == "supported"
    assert table[1]["verdict"] == "no power" and math.isnan(table[1]["value"])


def test_read_trials_checks_metric_columns_and_repeated_runs(lib, tmp_path):
    rio = lib("records_io")
    p = tmp_path / "trials.csv"
    p.write_text("trial,run_id,kind,eval/x\n0,a,train,0.5\n1,b,train,\n")
    t = rio.read_trials(p, required=("kind",))
    assert [rio.number(r["eval/x"]) for r in t.rows][0] == 0.5 and math.isnan(rio.number(t.rows[1]["eval/x"]))
    p.write_text("trial,run_id,kind,eval/x\n0,a,train,0.5\n1,b,train,oops\n")
    with pytest.raises(rio.RecordError, match="row 3, column 'eval/x'"):
        rio.read_trials(p, required=("kind",))
    p.write_text("trial,run_id,kind,eval/x\n0,a,train,0.5\n1,a,train,0.4\n")
    with pytest.raises(rio.RecordError, match="repeats run_id=a"):
        rio.read_trials(p, required=("kind",))


def test_claims_figure_draws_each_claim_beside_its_seeds(lib, tmp_path, capsys):
    import pandas as pd

    from hmmscope.stats import claim, rule

    cf = lib("claim_figures")
    sub = pd.DataFrame({"metric:claim/a/value": [0.1, 0.2, 0.15], "metric:claim/b/value": [-0.1, 0.1, math.nan]})
    claims = [claim("pooled: a", "a", 0.15, 0.05, 0.25, rule(">", 0), "", df=2),
              claim("pooled: b", "b", 0.0, math.nan, math.nan, rule(">", 0), "", df=1)]
    cf.claims_figure(claims, sub, tmp_path / "fig")
    text = capsys.readouterr().out
    for ext in ("png", "pdf"):
        assert (tmp_path / f"fig.{ext}").stat().st_size > 5000 and f"figure: {tmp_path / 'fig'}.{ext}" in text
    assert cf.VERDICT_COLOURS[claims[0].verdict] == "C2"  # supported
