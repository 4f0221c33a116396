import json
import subprocess
import sys
import urllib.request

import pytest

from hmmscope import tracking


def _runs(uri):
    c = tracking.client(uri)
    exps = c.search_experiments()
    return c.search_runs([e.experiment_id for e in exps])


def test_nested_runs_params_metrics_artifacts(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    with tracking.start_run(uri, "exp", "parent", params={"a.b": 1, "l": [1, 2]}) as parent:
        with tracking.start_run(uri, "exp", "child", parent=parent) as child:
            child.log_metrics({"eval/acc": 0.5, "bad": float("nan")}, step=3)
            child.log_dict({"x": 1}, "tables/x.json")
    runs = {r.info.run_name: r for r in _runs(uri)}
    assert runs["parent"].data.params == {"a.b": "1", "l": "[1, 2]"}
    assert runs["child"].data.tags["mlflow.parentRunId"] == parent.run_id
    assert runs["child"].data.metrics == {"eval/acc": 0.5}  # NaN dropped
    assert all(r.info.status == "FINISHED" for r in runs.values())
    art = tmp_path / "mlruns" / "artifacts"
    assert json.loads(next(art.rglob("x.json")).read_text()) == {"x": 1}


def test_failed_run_is_marked_failed_with_reason(tmp_path):
    uri = f"sqlite:///{tmp_path}/db.sqlite"
    with pytest.raises(RuntimeError), tracking.start_run(uri, "exp", "boom"):
        raise RuntimeError("diverged at step 3")
    (run,) = _runs(uri)
    assert run.info.status == "FAILED"
    assert "diverged at step 3" in run.data.tags["hmmscope.failure_reason"]


def test_default_uri_is_sqlite_under_mlruns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking.resolve_uri()
    assert uri == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert tracking.artifact_root(uri) == (tmp_path / "mlruns" / "artifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert tracking.resolve_uri() == "http://127.0.0.1:1" and tracking.resolve_uri("sqlite:///x.db") == "sqlite:///x.db"


_CONCURRENT = """
import sys
from hmmscope import tracking
with tracking.start_run(sys.argv[1], "exp", sys.argv[2]) as r:
    r.log_metrics({"m": 1.0})
"""


def test_parallel_writers_after_one_time_creation(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    tracking.ensure_store(uri)
    tracking.experiment_id(uri, "exp")
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, uri, f"w{i}"]) for i in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert sorted(r.info.run_name for r in _runs(uri)) == ["w0", "w1", "w2"]


def test_http_server_roundtrip_via_rest(mlflow_server):
    with tracking.start_run(mlflow_server, "http-exp", "over-http", params={"hmm.gamma": 0.5}) as run:
        run.log_metrics({"eval/acc": 0.75}, step=2)
        run.log_dict({"ok": True}, "summary.json")
    with urllib.request.urlopen(f"{mlflow_server}/api/2.0/mlflow/runs/get?run_id={run.run_id}", timeout=10) as r:
        data = json.load(r)["run"]
    assert data["info"]["status"] == "FINISHED"
    assert {"key": "hmm.gamma", "value": "0.5"} in data["data"]["params"]
    assert any(m["key"] == "eval/acc" and m["value"] == 0.75 and m["step"] == 2 for m in data["data"]["metrics"])
    with urllib.request.urlopen(
            f"{mlflow_server}/api/2.0/mlflow/artifacts/list?run_id={run.run_id}", timeout=10) as r:
        files = [f["path"] for f in json.load(r).get("files", [])]
    assert "summary.json" in files


def test_keys_are_sanitized(tmp_path):
    uri = f"sqlite:///{tmp_path}/db.sqlite"
    with tracking.start_run(uri, "exp", "keys") as run:
        run.set_tags({"verdict/eps(L) <= d exp(-g^4 L)": "ok"})
        run.log_metrics({"theory/exponent/gamma/S=128 d=8": 1.5})
    (r,) = _runs(uri)
    assert r.data.tags["verdict/eps_L_ __ d exp_-g_4 L_"] == "ok"
    assert r.data.metrics == {"theory/exponent/gamma/S_128 d_8": 1.5}
