import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app


def _runs(uri):
    c = tracking.client(uri)
    exps = c.search_experiments()
    return c.search_runs([e.experiment_id for e in exps])


def test_nested_runs_params_metrics_artifacts(tmp_path, store_uri):
    uri = store_uri
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


def test_a_failed_run_never_ends_without_its_reason(tmp_path, monkeypatch):
    """The store drops the reason's write once (a link coming back, CI's netns cut): the end is not written
    without it; the next try writes both (a run FAILED with no hmmscope.failure_reason was seen in CI). The reason
    is written through the client (`liveness.end_run`, which also ends a run in the trash): its write is dropped
    there, and the run must still be RUNNING when it is."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/db.sqlite"
    real, dropped = MlflowClient.set_tag, []

    def flaky(self, run_id, key, value, *args, **kwargs):
        if key == "hmmscope.failure_reason" and not dropped:
            dropped.append(self.get_run(run_id).info.status)  # not ended before its reason is written
            raise ConnectionError("store out of reach")
        return real(self, run_id, key, value, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "set_tag", flaky)
    with pytest.raises(RuntimeError), tracking.start_run(uri, "exp", "boom"):
        raise RuntimeError("diverged at step 3")
    (run,) = _runs(uri)
    assert dropped == ["RUNNING"] and run.info.status == "FAILED"
    assert run.data.tags["hmmscope.failure_reason"] == "RuntimeError: diverged at step 3"


def test_default_uri_is_sqlite_under_mlruns(tmp_path, monkeypatch, project):
    uri = tracking.resolve_uri()
    assert uri == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert tracking.artifact_root(uri) == (tmp_path / "mlruns" / "artifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert tracking.resolve_uri() == "http://127.0.0.1:1" and tracking.resolve_uri("sqlite:///x.db") == "sqlite:///x.db"


def _dump(db: Path) -> tuple[set[str], list[tuple]]:
    """A sqlite database as (its schema statements, every row of every table, sorted). A statement is the set of its
    lines: alembic writes a rebuilt table's constraints in an order that varies between two migrations."""
    import sqlite3

    con = sqlite3.connect(str(db))
    try:
        schema = {frozenset(ln.strip().rstrip(",") for ln in sql.splitlines())
                  for (sql,) in con.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")}
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = sorted((t, *map(repr, r)) for t in tables for r in con.execute(f'SELECT * FROM "{t}"'))
    finally:
        con.close()
    return schema, rows


def test_a_processs_later_new_stores_equal_a_migrated_one_without_migrating_again(tmp_path, monkeypatch):
    """A new store is migrated through every MLflow schema revision (about 3 s of CPU); a process does that once
    (before: for every new store). Its later stores: the same schema and rows as a store MLflow migrates there,
    the Default experiment rooted at their own artifacts, created now; runs work in them as in any store."""
    import mlflow.store.db.utils as db_utils
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from hmmscope.tracking import store

    migrations: list[str] = []
    real = db_utils._upgrade_db
    monkeypatch.setattr(db_utils, "_upgrade_db", lambda engine: migrations.append(str(engine.url)) or real(engine))
    monkeypatch.setattr(store, "_EMPTY", [])  # as in a new process
    first, later = tmp_path / "a" / "mlflow.db", tmp_path / "b c" / "mlflow.db"
    for db in (first, later):
        tracking.ensure_store(f"sqlite:///{db}")
    assert len(migrations) == 1 and store._EMPTY, migrations
    t0 = int(time.time() * 1000)
    ref = tmp_path / "ref" / "mlflow.db"  # what MLflow itself makes of a new database at the later store's root
    ref.parent.mkdir()
    root = (later.parent / "artifacts").resolve().as_uri()
    SqlAlchemyStore(f"sqlite:///{ref}", root)
    SqlAlchemyStore._engine_map.pop(f"sqlite:///{ref}").dispose()
    (schema, rows), (ref_schema, ref_rows) = _dump(later), _dump(ref)
    assert schema == ref_schema, schema ^ ref_schema
    when = lambda rows: [r[5:7] for r in rows if r[0] == "experiments"]  # noqa: E731  (creation, last update)
    strip = lambda rows: [r[:5] + r[7:] if r[0] == "experiments" else r for r in rows]  # noqa: E731
    assert strip(rows) == strip(ref_rows) and f"'{root}/0'" in {r[3] for r in rows if r[0] == "experiments"}
    (made,) = when(rows)
    assert abs(int(made[0]) - t0) < 60_000 and made[0] == made[1]
    assert oct(later.stat().st_mode & 0o777) == oct(first.stat().st_mode & 0o777)
    uri = f"sqlite:///{later}"
    with tracking.start_run(uri, "exp", "r") as r:
        r.log_metrics({"m": 1.0})
        r.log_dict({"x": 1}, "a.json")
    assert (later.parent / "artifacts").is_dir() and not (first.parent / "artifacts").exists()
    assert [x.data.metrics for x in _runs(uri)] == [{"m": 1.0}]


_CONCURRENT = """
import sys
from hmmscope import tracking
with tracking.start_run(sys.argv[1], "exp", sys.argv[2]) as r:
    r.log_metrics({"m": 1.0})
"""


def test_parallel_writers_after_one_time_creation(tmp_path, store_uri):
    uri = store_uri
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


def _forget_then_resume(uri: str) -> tuple[int, dict[str, list[tuple[int, float]]], dict[str, float]]:
    """A run that logged steps 1..6 of a/x and b, a system/* sample at step 9 and c at step 0, resumed from a checkpoint
    at step 3 (forget_metrics(3)), then logging steps 4..6 again with new values: (rows forgotten, history, latest)."""
    with tracking.start_run(uri, "forget", "r") as run:
        run.log_metric_steps([({"a/x": float(s), "b": float(s)}, s) for s in range(1, 7)])
        run.log_metrics({"system/cpu": 1.0}, step=9)
        run.log_metrics({"c": 5.0})
    with tracking.start_run(uri, "forget", "", resume=run.run_id) as again:
        n = again.forget_metrics(3)
        again.log_metric_steps([({"a/x": 10.0 + s, "b": 10.0 + s}, s) for s in range(4, 7)])
    c = tracking.client(uri)
    hist = {k: sorted((m.step, m.value) for m in c.get_metric_history(run.run_id, k)) for k in ("a/x", "b", "system/cpu")}
    return n, hist, c.get_run(run.run_id).data.metrics


def test_forget_metrics_past_a_checkpoint_stores_each_step_once(tmp_path, mlflow_server):
    """Issue 47, item 1: a resume logs the steps past its checkpoint again; the rows a killed writer left there are
    removed first (a database store, one transaction, MLflow's latest value recomputed), or, on a server (MLflow's REST
    API removes no metric), kept and not written again. Either way one row per step; system/* (MLflow's sample
    counter as its step) and keys at earlier steps untouched. A subset of keys: only those (a name or a prefix/)."""
    n, hist, latest = _forget_then_resume(f"sqlite:///{tmp_path}/mlflow.db")
    assert n == 6  # a/x and b at steps 4, 5, 6
    for k in ("a/x", "b"):
        assert hist[k] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0), (5, 15.0), (6, 16.0)]  # the resume's values
        assert latest[k] == 16.0
    assert hist["system/cpu"] == [(9, 1.0)] and latest["c"] == 5.0
    n, hist, latest = _forget_then_resume(mlflow_server)
    assert n == 6
    for k in ("a/x", "b"):
        assert hist[k] == [(s, float(s)) for s in range(1, 7)] and latest[k] == 6.0  # the first writer's, once
    uri = f"sqlite:///{tmp_path}/keys.db"
    with tracking.start_run(uri, "forget", "r") as run:
        run.log_metric_steps([({"val/loss": 1.0, "val/acc": 0.5, "Loss/val": 1.0, "train/loss": 2.0}, 12)])
        assert run.forget_metrics(11, ("val/", "Loss/val")) == 3
    assert set(tracking.client(uri).get_run(run.run_id).data.metrics) == {"train/loss"}


def test_keys_are_sanitized(tmp_path):
    uri = f"sqlite:///{tmp_path}/db.sqlite"
    with tracking.start_run(uri, "exp", "keys") as run:
        run.set_tags({"verdict/eps(L) <= d exp(-g^4 L)": "ok"})
        run.log_metrics({"theory/exponent/gamma/S=128 d=8": 1.5})
    (r,) = _runs(uri)
    assert r.data.tags["verdict/eps_L_ __ d exp_-g_4 L_"] == "ok"
    assert r.data.metrics == {"theory/exponent/gamma/S_128 d_8": 1.5}


# ---------------------------------------------------------------- movable stores


def _store_with_artifact(root):
    uri = f"sqlite:///{root}/mlruns/mlflow.db"
    with tracking.start_run(uri, "exp", "r") as run:
        run.log_dict({"x": 1}, "d/x.json")
    return run.run_id


def _roots(db):
    import sqlite3

    con = sqlite3.connect(str(db))
    try:
        return (sorted(r for (r,) in con.execute("SELECT artifact_location FROM experiments WHERE name = 'exp'")),
                sorted(r for (r,) in con.execute("SELECT artifact_uri FROM runs")))
    finally:
        con.close()


def test_copied_store_reads_and_writes_only_its_own_artifacts(tmp_path):
    import shutil

    rid = _store_with_artifact(tmp_path / "A")
    shutil.copytree(tmp_path / "A", tmp_path / "C")
    a_files = sorted(p.name for p in (tmp_path / "A").rglob("*.json"))
    uri_c = f"sqlite:///{tmp_path}/C/mlruns/mlflow.db"
    run = tracking.existing_run(uri_c, rid)  # opens the copy: its recorded roots are rewritten
    assert json.loads(run.download("d/x.json", tmp_path / "dl").read_text()) == {"x": 1}
    run.log_dict({"y": 2}, "y.json")
    assert (tmp_path / "C/mlruns/artifacts" / rid / "artifacts/y.json").is_file()
    assert sorted(p.name for p in (tmp_path / "A").rglob("*.json")) == a_files == ["x.json"]
    root_c = (tmp_path / "C/mlruns/artifacts").as_uri()
    assert _roots(tmp_path / "C/mlruns/mlflow.db") == ([root_c], [f"{root_c}/{rid}/artifacts"])
    root_a = (tmp_path / "A/mlruns/artifacts").as_uri()
    assert _roots(tmp_path / "A/mlruns/mlflow.db") == ([root_a], [f"{root_a}/{rid}/artifacts"])


def test_moved_store_reads_without_rewriting_and_names_a_missing_artifact(tmp_path):
    rid = _store_with_artifact(tmp_path / "A")
    (tmp_path / "A").rename(tmp_path / "B")
    uri_b = f"sqlite:///{tmp_path}/B/mlruns/mlflow.db"
    run = tracking.Run(uri_b, rid)  # no ensure_store: the database still names A (as a read-only store would)
    assert _roots(tmp_path / "B/mlruns/mlflow.db")[1] == [f"{(tmp_path / 'A/mlruns/artifacts').as_uri()}/{rid}/artifacts"]
    assert json.loads(run.download("d/x.json", tmp_path / "dl").read_text()) == {"x": 1}
    want = tmp_path / "B/mlruns/artifacts" / rid / "artifacts/checkpoints/last.pt"
    with pytest.raises(FileNotFoundError, match=f"looked for {want}"):
        run.require("checkpoints/last.pt")


def test_untagged_experiment_of_an_older_store_is_relocated(tmp_path):
    """Stores written before the root tag existed: relocated when the runs' artifact folders came along."""
    import shutil

    uri = f"sqlite:///{tmp_path}/A/mlruns/mlflow.db"
    tracking.ensure_store(uri)
    c = tracking.client(uri)
    eid = c.create_experiment("exp", artifact_location=tracking.artifact_root(uri))  # as the old code did
    other = c.create_experiment("elsewhere", artifact_location=(tmp_path / "data" / "artifacts").as_uri())
    rid = c.create_run(eid).info.run_id
    tracking.Run(uri, rid).log_dict({"x": 1}, "x.json")
    c.create_run(other)
    shutil.move(tmp_path / "A", tmp_path / "B")
    uri_b = f"sqlite:///{tmp_path}/B/mlruns/mlflow.db"
    tracking.ensure_store(uri_b)
    exps = {e.name: e.artifact_location for e in tracking.client(uri_b).search_experiments()}
    assert exps["exp"] == (tmp_path / "B/mlruns/artifacts").as_uri()
    assert exps["elsewhere"] == (tmp_path / "data" / "artifacts").as_uri()  # not ours: untouched


# ---------------------------------------------------------------- orphan runs


def test_heartbeat_and_liveness_tags(tmp_path, monkeypatch):
    import os
    import socket
    import time

    monkeypatch.setenv("HMMSCOPE_RUN_HEARTBEAT_S", "0.3")
    uri = f"sqlite:///{tmp_path}/db.sqlite"
    from hmmscope.tracking.liveness import lease_of

    with tracking.start_run(uri, "exp", "beating") as run:
        first = lease_of(run.get())["beat"]
        time.sleep(2.5)
        t = lease_of(run.get())
    assert t["beat"] > first  # the lease (one tag, hmmscope.lease) is renewed
    assert t["pid"] == str(os.getpid()) and t["host"] == socket.gethostname()
    assert t["interval"] == 0.3


def test_gc_marks_orphans_killed_and_leaves_live_runs(tmp_path):
    import socket
    import time

    uri = f"sqlite:///{tmp_path}/db.sqlite"
    tracking.ensure_store(uri)
    c = tracking.client(uri)
    eid = tracking.experiment_id(uri, "exp")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a real process that has ended
    now = time.time()
    here = socket.gethostname()

    def run(name, host=None, pid=None, beat=None):
        tags = {} if host is None else {"hmmscope.host": host, "hmmscope.pid": str(pid), "hmmscope.heartbeat": str(beat),
                                        "hmmscope.heartbeat_interval": "30"}
        return c.create_run(eid, run_name=name, tags=tags).info.run_id

    dead = run("dead", here, gone.pid, now)  # a process of this host that has ended
    mine = run("mine", here, os.getpid(), now - 9999)  # alive here: its heartbeat does not matter
    silent = run("silent", "elsewhere", 1, now - 400)  # another host, no beat for 400 s > 5 x 30 s
    beating = run("beating", "elsewhere", 1, now - 60)
    legacy = run("legacy")  # no liveness tags: never judged
    found = tracking.gc_runs(uri, dry_run=True)
    assert sorted(r.info.run_name for r, _ in found) == ["dead", "silent"]
    assert all(c.get_run(r).info.status == "RUNNING" for r in (dead, silent))
    r = CliRunner().invoke(app, ["runs", "gc", "--tracking-uri", uri])
    assert r.exit_code == 0 and "2 orphan run(s) marked KILLED" in r.output, r.output
    d, s = c.get_run(dead), c.get_run(silent)
    assert d.info.status == s.info.status == "KILLED"
    assert d.data.tags["hmmscope.failure_reason"] == f"orphaned: its process {gone.pid} on {here} is gone"
    assert s.data.tags["hmmscope.failure_reason"].startswith("orphaned: no heartbeat for 4")
    assert abs(s.info.end_time - (now - 400) * 1000) < 1000  # ended at its last heartbeat
    assert [c.get_run(x).info.status for x in (mine, beating, legacy)] == ["RUNNING"] * 3
    assert tracking.gc_runs(uri) == []


def test_imports_without_fcntl():
    """Windows has no fcntl: the package must import (locks come from the filelock package)."""
    code = ("import sys; sys.modules['fcntl'] = None\n"
            "import hmmscope.tracking, hmmscope.sweep, hmmscope.jobs, hmmscope.report, hmmscope.cli\n"
            "import filelock; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ---------------------------------------------------------------- runs that compare side by side (issue 10)


def test_new_runs_carry_mlflows_standard_tags_and_a_one_line_note(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with tracking.start_run(uri, "exp", "described", note="Training: a\nsmall   run") as run:
        pass
    with tracking.start_run(uri, "exp", "plain"):
        pass
    with tracking.start_run(uri, "exp", "described", resume=run.run_id, note="reopened"):
        pass
    runs = {r.info.run_name: r for r in _runs(uri)}
    for r in runs.values():
        t = r.data.tags
        assert t["mlflow.user"] and t["mlflow.source.type"] == "LOCAL"
        assert t["mlflow.source.name"] == tracking.source_name()
        commit = tracking.git_commit()  # this test runs from the checkout: the package sits at its top
        assert commit is not None and t["mlflow.source.git.commit"] == commit == t["hmmscope.code_version"]
    assert runs["described"].data.tags["mlflow.note.content"] == "reopened"
    assert "mlflow.note.content" not in runs["plain"].data.tags
    assert tracking.note_line("Training: a\nsmall   run") == "Training: a small run"


def test_source_name_is_the_entry_point():
    import hmmscope

    pkg = os.path.dirname(hmmscope.__file__)
    assert tracking.source_name(["/venv/bin/hmmscope", "sweep", "run", "sweeps/smoke.toml"]) == "hmmscope sweep run"
    assert tracking.source_name(["/venv/bin/hmmscope", "train", "--preset", "tiny"]) == "hmmscope train"
    assert tracking.source_name([os.path.join(pkg, "sweep.py"), "worker", "--study", "s"]) == "hmmscope.sweep worker"
    # a module of a subpackage, and `python -m` of a package (its __main__.py)
    assert tracking.source_name([os.path.join(pkg, "sweep", "__main__.py"), "worker"]) == "hmmscope.sweep worker"
    assert tracking.source_name([os.path.join(pkg, "sweep", "worker.py"), "run"]) == "hmmscope.sweep.worker run"
    assert tracking.source_name(["/usr/bin/pytest", "-q"]) == "pytest"
    assert tracking.source_name(["-c"]) == "python"


def test_each_run_kind_logs_its_own_config_sections():
    from hmmscope.config import Config

    train = tracking.config_params(Config(), tracking.TRAIN_SECTIONS)
    theory = tracking.config_params(Config(), tracking.THEORY_SECTIONS)
    assert {k.split(".")[0] for k in train} == {"hmm", "data", "model", "train", "eval"}
    assert len(theory) == 14 and "theory.draws" in theory and all(k.startswith("theory.") for k in theory)


def test_claims_are_a_logged_table_mlflow_can_load(tmp_path, request):
    import mlflow

    from hmmscope.stats import Claim

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # MlflowClient.load_table searches through the fluent API: its URI is the process's (set_tracking_uri) before the
    # environment's; set it for this test only (before: it read another test's store after test_runs_show's)
    mlflow.set_tracking_uri(uri)
    request.addfinalizer(lambda: mlflow.set_tracking_uri(None))
    claims = [Claim("eps(L) <= d exp(-g^4 L)", "slope", 0.5, 0.25, 0.75, "supported", "CI below 1", "< 1"),
              Claim("k back", "acc", float("nan"), float("nan"), float("nan"), "no power", "too few tasks")]
    with tracking.start_run(uri, "exp", "claims") as run:
        run.log_claims(claims)
        run.log_claims(claims[:1])  # written again: replaced, not appended
        run.log_claims([])  # nothing to log
    c = tracking.client(uri)
    r = c.get_run(run.run_id)
    assert json.loads(r.data.tags["mlflow.loggedArtifacts"]) == [{"path": "claims.json", "type": "table"}]
    df = c.load_table(r.info.experiment_id, "claims.json", run_ids=[run.run_id])
    assert list(df.columns) == list(tracking.CLAIM_COLUMNS)
    assert df.to_dict("records") == [{"claim": "eps(L) <= d exp(-g^4 L)", "value": 0.5, "ci_lo": 0.25, "ci_hi": 0.75,
                                      "rule": "< 1", "verdict": "supported", "reason": "CI below 1",
                                      "statistic": "slope"}]
    assert tracking.claims_table(claims[1:])["value"] == [None]  # NaN is no number in JSON
    with pytest.raises(ValueError, match="different lengths"):
        tracking.Run(uri, run.run_id).log_table({"a": [1], "b": []}, "t.json")
    # headline numbers instead of a metric triple and two tags per claim; read back with the old flat keys
    assert r.data.metrics["claims/n"] == 1 and r.data.metrics["claims/supported"] == 1
    assert r.data.metrics["claims/no_power"] == 0 and r.data.tags["hmmscope.claims"] == "1 claims: 1 supported"
    assert not any(k.startswith(("claim/", "verdict/", "rule/")) for k in (*r.data.metrics, *r.data.tags))
    key = tracking.safe_key("eps(L) <= d exp(-g^4 L)")
    assert tracking.read_claims(uri, r) == ({f"claim/{key}/value": 0.5, f"claim/{key}/ci_lo": 0.25,
                                             f"claim/{key}/ci_hi": 0.75}, {key: "supported"}, {key: "< 1"})
    keys = tracking.claim_keys(claims)  # in memory, for sweep objectives: the same keys
    assert {k: v for k, v in keys.items() if "k back" not in k} == {
        f"claim/{key}/value": 0.5, f"claim/{key}/ci_lo": 0.25, f"claim/{key}/ci_hi": 0.75}
    assert math.isnan(keys["claim/k back/value"])
    with tracking.start_run(uri, "exp", "old") as old:  # a run recorded before the table: its metrics and tags
        old.log_metrics({"claim/a/value": 1.0, "claim/a/ci_lo": 0.5, "claim/a/ci_hi": 2.0})
        old.set_tags({"verdict/a": "supported: CI above 0", "rule/a": "> 0"})
    assert tracking.read_claims(uri, old.get()) == ({"claim/a/value": 1.0, "claim/a/ci_lo": 0.5, "claim/a/ci_hi": 2.0},
                                                    {"a": "supported"}, {"a": "> 0"})


def test_run_url_never_carries_a_password_and_opens_the_training_view():
    ml = "?workflowType=machine_learning"  # MLflow 3 opens an experiment in its GenAI view without it
    assert tracking.run_url("https://u:secret@mlflow.example/x/", "3", "abc") == \
        f"https://mlflow.example/x/#/experiments/3/runs/abc{ml}"
    assert tracking.run_url("sqlite:////a/mlflow.db", "1", "r") is None  # no UI port is known: no made-up URL
    assert tracking.run_url("sqlite:////a/mlflow.db", "1", "r", port=5123) == \
        f"http://127.0.0.1:5123/#/experiments/1/runs/r{ml}"
    assert tracking.experiment_url("http://h:1", "4", "tags.`hmmscope.study` = 'a b'") == \
        f"http://h:1/#/experiments/4/runs{ml}&searchFilter=tags.%60hmmscope.study%60%20%3D%20%27a%20b%27"


def test_browse_line_is_one_hmmscope_ui_command_or_the_servers_url(tmp_path, monkeypatch, project):
    """Commands end with ONE line: `hmmscope ui --run ID` (plus --tracking-uri for a store other than the
    default) on a local store, never a raw `mlflow ui --backend-store-uri ...` nor a guessed port."""
    assert tracking.browse_line(tracking.default_tracking_uri(), run_id="abc") == "browse: hmmscope ui --run abc"
    other = f"sqlite:///{tmp_path}/x y/mlflow.db"
    assert tracking.browse_line(other, sweep="smoke") == \
        f"browse: hmmscope ui --sweep smoke --tracking-uri 'sqlite:///{tmp_path}/x y/mlflow.db'"
    with tracking.start_run(other, "exp", "r") as run:
        pass
    eid = run.get().info.experiment_id
    assert tracking.target_url(other, "http://127.0.0.1:9", run_id=run.run_id) == \
        f"http://127.0.0.1:9/#/experiments/{eid}/runs/{run.run_id}?workflowType=machine_learning"
    assert tracking.target_url(other, "http://127.0.0.1:9", experiment="exp") == \
        f"http://127.0.0.1:9/#/experiments/{eid}/runs?workflowType=machine_learning"
    for bad in ({"run_id": "nope"}, {"sweep": "nope"}, {"experiment": "nope"}):
        with pytest.raises(ValueError, match="no (run|sweep|experiment) 'nope'"):
            tracking.target_url(other, "http://127.0.0.1:9", **bad)
    # experiments hmmscope creates are of the training kind: the UI opens them on their runs, not GenAI
    assert tracking.client(other).get_experiment(eid).tags["mlflow.experimentKind"] == "custom_model_development"


def test_run_ids_take_a_unique_prefix_of_six_or_more_characters(tmp_path):
    """Short ids are printed everywhere (reports, folders, `runs compare` headers); a unique prefix of >= 6
    characters is taken wherever a run id is, as git takes a commit's; an ambiguous one is one line naming them."""
    import sqlite3

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with tracking.start_run(uri, "exp", "r0") as run:
        pass
    rid = run.run_id
    assert tracking.resolve_run_id(uri, rid[:6]) == rid and tracking.resolve_run_id(uri, rid[:6].upper()) == rid
    assert tracking.get_run(uri, rid[:8]).info.run_id == rid
    with pytest.raises(ValueError, match=rf"run id prefix '{rid[:5]}' is too short: a prefix of a run id needs at "
                                         "least 6 characters \\(5 given\\)"):  # as git says it
        tracking.resolve_run_id(uri, rid[:5])
    with pytest.raises(ValueError, match="too short"):
        tracking.get_run(uri, rid[:1])
    assert tracking.resolve_run_id(uri, "not-hex") == "not-hex" and tracking.get_run(uri, "not-hex") is None
    other = ("0" if rid[0] != "0" else "1") * 6
    assert tracking.resolve_run_id(uri, other) == other and tracking.get_run(uri, other) is None
    # a second run whose id shares the first 7 characters (copied row by row in the store itself)
    twin = rid[:7] + ("0" if rid[7] != "0" else "1") + rid[8:]
    con = sqlite3.connect(tmp_path / "mlflow.db")
    with con:
        cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
        sel = ", ".join("?" if c == "run_uuid" else c for c in cols)
        con.execute(f"INSERT INTO runs ({', '.join(cols)}) SELECT {sel} FROM runs WHERE run_uuid = ?", (twin, rid))
    con.close()
    with pytest.raises(ValueError, match=rf"run id prefix '{rid[:6]}' is ambiguous: 2 runs start with it \("):
        tracking.resolve_run_id(uri, rid[:6])
    with pytest.raises(ValueError, match="ambiguous"):
        tracking.get_run(uri, rid[:7])
    assert tracking.resolve_run_id(uri, rid[:8]) == rid and tracking.resolve_run_id(uri, twin[:8]) == twin


def test_a_sweeps_trials_view_is_mlflows_shared_view_with_the_objective_as_a_column(tmp_path):
    """MLflow 3.17's runs table takes only its search facets from a URL; its columns come from a shared view
    (experiment tag mlflow.sharedViewState.<key>, URL viewStateShareKey=<key>). The sweep's trials URL names
    that view: the parent's children, sorted by the objective, with the objective and swept params as columns."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    params = {"sweep.objective": "eval/seen/excess_ce", "sweep.direction": "minimize", "sweep.kind": "train",
              "sweep.space.model.pos_enc": ["rope", "absolute"], "sweep.space.hmm.gamma": [0.5, 0.9]}
    with tracking.start_run(uri, "sw", "sweep-s1", params=params,
                            tags={"hmmscope.kind": "sweep", "hmmscope.study": "s1"}) as parent:
        pass
    p = parent.get()
    base = "http://127.0.0.1:9"
    answer, trials = tracking.sweep_urls(uri, base, "s1")
    eid, pid = p.info.experiment_id, p.info.run_id
    assert answer == f"{base}/#/experiments/{eid}/runs/{pid}?workflowType=machine_learning"  # nothing compared yet
    assert "searchFilter=" in trials and "viewStateShareKey" not in trials  # no view saved: the facets alone
    assert tracking.save_sweep_view(uri, p) == "hmmscope-sweep-s1"
    tag = json.loads(tracking.client(uri).get_experiment(eid).tags["mlflow.sharedViewState.hmmscope-sweep-s1"])
    assert tag["name"] == "sweep s1: trials" and isinstance(tag["createdAt"], int)
    state = json.loads(tag["state"])
    cols = ["metrics.`eval/seen/excess_ce`", "params.`hmm.gamma`", "params.`model.pos_enc`", "params.`train.seed`"]
    assert state == {"searchFilter": f"tags.mlflow.parentRunId = '{pid}'",
                     "orderByKey": "metrics.`eval/seen/excess_ce`", "orderByAsc": True,  # the objective, logged once
                     "selectedColumns": cols,
                     "columnOrder": ["attributes.`Run Name`", "runDateAndNestInfo", "duration", *cols],
                     "columnWidths": {c: tracking.search.column_width(c) for c in cols}}
    assert state["columnWidths"][cols[0]] >= 7.5 * len("eval/seen/excess_ce") + 40  # the whole header shows
    assert tracking.sweep_urls(uri, base, "s1")[1] == \
        f"{base}/#/experiments/{eid}/runs?workflowType=machine_learning&viewStateShareKey=hmmscope-sweep-s1"
    before = tracking.client(uri).get_experiment(eid).tags["mlflow.sharedViewState.hmmscope-sweep-s1"]
    tracking.save_sweep_view(uri, p)  # unchanged: not rewritten
    assert tracking.client(uri).get_experiment(eid).tags["mlflow.sharedViewState.hmmscope-sweep-s1"] == before
    tracking.Run(uri, pid).log_table({"a": [1]}, "comparison/pivot.json")  # the comparison exists: the answer
    assert tracking.sweep_urls(uri, base, "s1")[0] == \
        f"{base}/#/experiments/{eid}/runs/{pid}/artifacts/comparison/objective.png?workflowType=machine_learning"
    assert tracking.target_url(uri, base, sweep="s1") == tracking.sweep_urls(uri, base, "s1")[0]
    with pytest.raises(ValueError, match="no sweep 'nope'"):
        tracking.sweep_urls(uri, base, "nope")


def test_a_reopened_runs_duration_is_its_age_while_it_runs(tmp_path, monkeypatch):
    """Before: a sweep parent, reopened while its trials ran, showed the 0.25 s of its first session (the UI's
    duration is end - start). Now reopening moves its end time to now, and each heartbeat moves it again."""
    monkeypatch.setenv("HMMSCOPE_RUN_HEARTBEAT_S", "0.3")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with tracking.start_run(uri, "exp", "parent") as run:
        pass
    first = run.get().info
    time.sleep(1.0)
    with tracking.start_run(uri, "exp", "", resume=run.run_id):
        info = run.get().info
        assert info.status == "RUNNING" and info.end_time >= first.end_time + 900
        time.sleep(1.5)
        later = run.get().info
        assert later.status == "RUNNING" and later.end_time > info.end_time  # moved by the heartbeat
    done = run.get().info
    assert done.status == "FINISHED" and done.end_time >= later.end_time


def test_config_toml_datasets_and_system_metrics(tmp_path, monkeypatch):
    """MLflow's own features on a run: the resolved config as config.toml (read back by load_toml to the same
    Config), dataset inputs with their content hash as digest, system metrics sampled while the run is open."""
    from hmmscope.config import Config, load_toml, override

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.5")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = override(Config(), {"hmm.gamma": 0.3, "model.pos_enc": "absolute"})
    with tracking.start_run(uri, "exp", "r", config=cfg, system_metrics=True) as run:
        run.log_dataset("episodes-train", "a" * 64, "train", "generator x", {"episodes": 3})
        deadline = time.time() + 30
        while not any(k.startswith("system/") for k in run.get().data.metrics):
            assert time.time() < deadline, "no system metric within 30 s"
            time.sleep(0.2)
    r = run.get()
    assert "system/cpu_utilization_percentage" in r.data.metrics and "system/system_memory_usage_megabytes" in r.data.metrics
    path = tmp_path / "config.toml"
    path.write_text(Path(run.require("config.toml")).read_text())
    assert load_toml(path) == cfg
    (inp,) = r.inputs.dataset_inputs
    assert (inp.dataset.name, inp.dataset.digest) == ("episodes-train", "a" * 36)
    assert {t.key: t.value for t in inp.tags} == {"mlflow.data.context": "train"}
    assert json.loads(inp.dataset.profile) == {"episodes": 3}


def test_model_is_a_logged_model_of_the_runs_experiment(tmp_path):
    """Run.log_model: an MLflow LoggedModel in the run's own experiment (not the default one), linked to the run as
    its output at the given step, READY, with the params given, and loadable back to the same function."""
    import mlflow.pytorch
    import torch
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    from hmmscope.config import preset
    from hmmscope.model.transformer import Transformer

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = preset("tiny")
    torch.manual_seed(0)
    model = Transformer(cfg.model, 8).eval()
    with tracking.start_run(uri, "models", "r") as run:
        mid = run.log_model(model, params={"model.pos_enc": "rope", "model.d_model": 128}, step=7)
    c = tracking.client(uri)
    lm = c.get_logged_model(mid)
    assert lm.experiment_id == c.get_experiment_by_name("models").experiment_id != "0"
    assert str(lm.status) in ("READY", "LoggedModelStatus.READY") and lm.source_run_id == run.run_id
    assert lm.params == {"model.pos_enc": "rope", "model.d_model": "128"}
    assert lm.artifact_location.startswith((tmp_path / "artifacts").as_uri())  # the store's own artifact folder
    (out,) = c.get_run(run.run_id).outputs.model_outputs
    assert (out.model_id, out.step) == (mid, 7)
    with _use_tracking_uri(uri):
        back = mlflow.pytorch.load_model(f"models:/{mid}")
    x = torch.randint(0, 8, (2, 16))
    assert torch.equal(model(x)[0], back(x)[0])
