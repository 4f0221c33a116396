"""Run ids and one run in the terminal (issue 38.6), and the notebook API's columns against mlflow.search_runs's
(issue 38.10): real `hmmscope runs ...` processes writing to files, on a real sqlite MLflow store."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hmmscope import tracking
from hmmscope.stats import claim, rule


def _hmmscope(cwd: Path, *args: str) -> tuple[int, str, str]:
    """A real process, stdout and stderr to files (no terminal): (exit code, stdout, stderr)."""
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "HMMSCOPE_THREADS": "1"}
    with (cwd / "o.txt").open("w") as fo, (cwd / "e.txt").open("w") as fe:
        rc = subprocess.run([str(Path(sys.executable).parent / "hmmscope"), *args], cwd=cwd, env=env, stdout=fo,
                            stderr=fe, stdin=subprocess.DEVNULL, timeout=600).returncode
    return rc, (cwd / "o.txt").read_text(), (cwd / "e.txt").read_text()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """./mlruns/mlflow.db (the default store) with a trial-like run: params, metrics in groups, claims, its lease."""
    d = tmp_path_factory.mktemp("show")
    uri = f"sqlite:///{d}/mlruns/mlflow.db"
    (d / "mlruns").mkdir()
    params = {"hmm.gamma": 0.5, "hmm.n_tasks": 4, "model.pos_enc": "rope", "model.n_layers": 2, "train.seed": 0}
    with tracking.start_run(uri, "show", "rope-g0.5-s0", params=params, tags={"hmmscope.kind": "sweep-train"},
                            note="a trial") as run:
        run.log_metrics({"eval/seen/excess_ce": 0.25, "eval/seen/test_acc": 0.4, "eval/unseen/test_ce": 1.9,
                         "baseline/unseen/best_counting/ce": 1.8, "train/loss": 1.7, "val/loss": 1.75})
        run.log_claims([claim("retrieval_gap", "s", 0.4, 0.3, 0.5, rule(">", 0), ""),
                        claim("icl_gain", "s", 0.01, -0.01, 0.03, rule(">", 0), "")])
    with tracking.start_run(uri, "show", "other") as other:
        pass
    return d, uri, run.run_id, other.run_id


def test_a_short_or_unknown_run_id_says_what_is_wrong_and_names_the_store_as_given(store):
    """Before: `runs show 8b956` said "no run '8b956' in sqlite:///file:<project>/mlruns/mlflow.db?mode=ro&uri=true":
    the internal read-only URI, and no word that a prefix needs 6 characters."""
    d, uri, rid, _ = store
    rc, out, err = _hmmscope(d, "runs", "show", rid[:5])
    assert rc == 2 and out == "" and err == (f"error: run id prefix {rid[:5]!r} is too short: a prefix of a run id "
                                             "needs at least 6 characters (5 given)\n"), err
    unknown = ("0" if rid[0] != "0" else "1") * 8
    for args in (["runs", "show", unknown], ["runs", "compare", rid, unknown]):
        rc, out, err = _hmmscope(d, *args)
        assert rc == 2 and err == f"error: no run {unknown!r} in sqlite:///{d}/mlruns/mlflow.db\n", err
    rc, out, err = _hmmscope(d, "runs", "list", "--experiment", "nope")
    assert rc == 2 and "mode=ro" not in err and f"in sqlite:///{d}/mlruns/mlflow.db" in err, err
    with pytest.raises(ValueError, match="too short"):
        tracking.get_run(uri, rid[:3])


def test_runs_show_says_what_the_run_holds_first_filters_keys_and_hides_the_lease(store):
    """Before: 383 lines (87 params, 256 metrics), the claims last, the lease tag (pid, boot id) among the tags.
    Now the run, then a summary (counts by group, as git show --stat) and its claims, then the tables; --keys
    keeps the keys that match; the lease is out of sight."""
    d, _, rid, _ = store
    rc, out, _ = _hmmscope(d, "runs", "show", rid[:6])
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[2].split() == ["run_id", rid] and re.search(r"^note +a trial$", out, re.M)
    summary = next(i for i, ln in enumerate(lines) if ln.startswith("summary: "))
    assert lines[summary] == ("summary: 5 params (hmm 2, model 2, train 1), 11 metrics (claims 5, eval 3, baseline 1, "
                              "train 1, val 1), 4 tags, 2 claims: 1 supported, 1 inconclusive")
    assert lines[summary + 1:summary + 4] == ["claims:", "  [supported] retrieval_gap = 0.4 [95% CI 0.3, 0.5]; rule > 0",
                                              "  [inconclusive] icl_gain = 0.01 [95% CI -0.01, 0.03]; rule > 0"]
    assert summary < lines.index("params:") < lines.index("metrics:") < lines.index("tags:")
    assert "hmmscope.lease" not in out and "hmmscope.kind" in out
    rc, out, _ = _hmmscope(d, "runs", "show", rid, "--keys", "eval/seen/*")
    assert rc == 0 and "params:" not in out and "tags:" not in out
    table = out.split("\nmetrics:\n", 1)[1].splitlines()
    assert [ln.split()[0] for ln in table[2:4]] == ["eval/seen/excess_ce", "eval/seen/test_acc"]
    assert table[-1] == "2 key(s) matching 'eval/seen/*'"


def test_the_api_has_mlflow_search_runs_columns_and_says_which_are_its_own(store):
    """Before: no experiment_id, end_time or artifact_uri (mlflow.search_runs has them), and a sweep's params came
    back as floats where MLflow gives strings. Now every column of mlflow.search_runs is there with its values, and
    hmmscope's own (OWN_COLUMNS) beside them."""
    import mlflow

    from hmmscope import api

    d, uri, rid, other = store
    ours = api.runs("show", tracking_uri=uri).set_index("run_id")
    mlflow.set_tracking_uri(uri)  # the process's fluent URI: put back below, or later tests would read this store
    try:
        theirs = mlflow.search_runs(experiment_names=["show"]).set_index("run_id")
    finally:
        mlflow.set_tracking_uri(None)
    missing = set(theirs.columns) - set(ours.columns)
    assert not missing, missing
    for col in ("experiment_id", "status", "artifact_uri", "start_time", "end_time", "params.hmm.gamma",
                "metrics.eval/seen/excess_ce", "tags.hmmscope.kind"):
        assert ours.loc[rid, col] == theirs.loc[rid, col], col
    assert ours.loc[rid, "params.hmm.gamma"] == "0.5"  # a string, as MLflow stores it
    assert list(ours.columns[:len(api.RUN_COLUMNS) - 1]) == [c for c in api.RUN_COLUMNS if c != "run_id"]
    assert set(api.OWN_COLUMNS).isdisjoint(theirs.columns) and set(api.MLFLOW_COLUMNS) <= {*theirs.columns, "run_id"}
    assert "hmmscope.lease" not in api.run(rid, tracking_uri=uri)["tags"]
