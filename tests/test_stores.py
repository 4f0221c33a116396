"""Stores that block, lie or fail (issue 30, items 2, 5 and 8): every wait is bounded, read-only commands stay
read-only, a failed creation leaves no half-made store.

- FIFOs and devices as store paths (MLflow's sqlite store and its journal file, Optuna's sqlite and journal
  storages, journal:///dev/null) are refused at once, naming the file; each case runs in a thread with a deadline,
  so a regression is a failure here, not a frozen suite.
- `runs list / show / compare` open a store read-only: a 0-byte mlflow.db stays 0 bytes; a truncated store, a .pt
  file, an Optuna database, `databricks`, a half-created store and a store another process holds locked each give
  one line (the locked one naming its holder), exit 2.
- Real misbehaving HTTP servers on 127.0.0.1 (tests/bad_http_server.py, stopped by pid): one that never answers,
  one that drips its body, one that answers 500 to every write; and a refused port. Each gives one line.
- A full disk (a small tmpfs, root only) while the store is first created: no store is left, the command says so
  in one line, and the next command with room creates it. A half-created store of an earlier version (migrated in
  place onto the full disk, as before) is recognized with the command that removes it.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope import store_checks, tracking
from hmmscope.cli import app
from hmmscope.config import ConfigError

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent / "hmmscope"


def _within(fn, seconds: float = 30.0):
    """fn() in a daemon thread; its result, or a failure if it is still running after `seconds` (a hang)."""
    out: list = []

    def run():
        try:
            out.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out.append(("err", e))

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(seconds)
    assert out, f"still running after {seconds} s: a hang"
    kind, val = out[0]
    if kind == "err":
        raise val
    return val


def _error_line(stderr: str) -> str:
    """The one error line: the last line of stderr, and the only one that says "error:" (off a terminal a command's
    progress lines, `train: setting up ...`, come before it on stderr)."""
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), stderr[-3000:]
    assert [ln for ln in lines if "error" in ln.lower()] == lines[-1:], stderr[-3000:]
    return lines[-1]


def _one_line(r) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = [_error_line(r.stderr)]
    assert "Traceback" not in r.output
    return lines[0]


def _invoke(args, env=None, seconds=60.0):
    return _within(lambda: CliRunner().invoke(app, args, env={"MLFLOW_TRACKING_URI": None, **(env or {})}), seconds)


def _store(tmp_path: Path) -> str:
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    with tracking.start_run(uri, "exp", "one") as run:
        run.log_metrics({"m": 1.0})
    return uri


# ---------------------------------------------------------------- special files as stores (item 5)


def test_fifos_and_devices_as_stores_are_refused_at_once(tmp_path, monkeypatch):
    """Before: each of these blocked for ever on the FIFO's open (or read /dev/null for 23 s, naming no file)."""
    monkeypatch.chdir(tmp_path)
    for name in ("m.db", "o.db", "j.log"):
        os.mkfifo(tmp_path / name)
    uri = _store(tmp_path / "real")
    os.mkfifo(tmp_path / "real" / "mlruns" / "mlflow.db-journal")  # a planted journal beside a healthy store
    cases = [
        (["train", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"], "m.db"),
        (["runs", "list", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"], "m.db"),
        (["runs", "list", "--tracking-uri", uri], "mlflow.db-journal"),
        (["sweep", "status", "x", "--storage", f"sqlite:///{tmp_path}/o.db"], "o.db"),
        (["sweep", "status", "x", "--storage", "j.log"], "j.log"),
        (["sweep", "status", "x", "--storage", f"journal://{tmp_path}/j.log"], "j.log"),
        (["sweep", "status", "x", "--storage", "journal:///dev/null"], "/dev/null"),
    ]
    for args, name in cases:
        line = _one_line(_invoke(args, seconds=30))
        assert "special file" in line and name in line, (args, line)


# ---------------------------------------------------------------- read-only means read-only (item 8)


def test_runs_commands_never_create_or_migrate_a_store(tmp_path, monkeypatch):
    """Before: `runs list` on a 0-byte mlflow.db wrote MLflow's whole schema (954 KB) into it and exited 0."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlruns" / "mlflow.db"
    db.parent.mkdir()
    db.touch()
    for args in (["runs", "list"], ["runs", "show", "0" * 32], ["runs", "compare", "0" * 32, "1" * 32]):
        line = _one_line(_invoke(args))
        assert "mlflow.db" in line and "empty" in line, line
        assert db.stat().st_size == 0
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db"]  # no lock file, no journal either


def test_a_read_never_creates_a_store_in_an_empty_or_missing_file(tmp_path):
    """Issue 47, item 5: a read (the report's lookup of its sweep, `tracking.search_runs`, `get_run`) on a 0-byte
    mlflow.db grew it to MLflow's whole empty schema (954 KB): MLflow creates the schema on its first call. Now only
    `ensure_store` (a write's first step) creates one; a read raises StoreMissing in one line and writes nothing."""
    from hmmscope.report import build_report

    zero = tmp_path / "zero" / "mlflow.db"
    zero.parent.mkdir()
    zero.touch()
    missing = tmp_path / "none" / "mlflow.db"
    for db in (zero, missing):
        uri = f"sqlite:///{db}"
        for read, args in ((tracking.search_runs, (uri,)), (tracking.get_run, (uri, "0" * 32)),
                           (build_report, (uri, "0" * 32, tmp_path / "out"))):
            with pytest.raises(tracking.StoreMissing, match="a read creates none") as e:
                read(*args)
            assert "\n" not in str(e.value) and str(db) in str(e.value)
        assert (db.stat().st_size == 0) if db is zero else not db.parent.exists()
    assert not (tmp_path / "out").exists()
    tracking.ensure_store(f"sqlite:///{zero}")  # a write creates it
    assert zero.stat().st_size > 0 and tracking.search_runs(f"sqlite:///{zero}") == []


def test_a_read_only_open_reads_runs_and_writes_nothing(tmp_path, monkeypatch):
    uri = _store(tmp_path)
    db = Path(uri[len("sqlite:///"):])
    before = (db.stat().st_size, db.stat().st_mtime_ns, sorted(os.listdir(db.parent)))
    monkeypatch.chdir(tmp_path)
    r = _invoke(["runs", "list", "--tracking-uri", uri])
    assert r.exit_code == 0 and "one" in r.stdout, r.output
    ro = tracking.read_only_uri(uri)
    assert ro.endswith("?mode=ro&uri=true") and tracking.store.sqlite_path(ro) == db
    with pytest.raises(Exception, match="readonly"):
        tracking.client(ro).create_experiment("nope")
    assert (db.stat().st_size, db.stat().st_mtime_ns, sorted(os.listdir(db.parent))) == before


def _locker(db: Path, ready: Path) -> subprocess.Popen:
    code = ("import sqlite3, sys, time, pathlib\n"
            f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "c.execute('begin exclusive'); c.execute('update experiments set name = name')\n"
            f"pathlib.Path({str(ready)!r}).write_text('x'); time.sleep(600)\n")
    return subprocess.Popen([sys.executable, "-c", code])


def test_each_bad_store_is_one_line_and_a_locked_one_names_its_holder(tmp_path, monkeypatch):
    """Before: tracebacks for a truncated store, a .pt file, optuna.db as the tracking store and `databricks`;
    a locked store was called "not an SQLite database"."""
    monkeypatch.chdir(tmp_path)
    uri = _store(tmp_path / "good")
    db = Path(uri[len("sqlite:///"):])
    trunc = tmp_path / "trunc.db"
    trunc.write_bytes(db.read_bytes()[: 200 * 1024])
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04" + b"\0" * 2000)
    with sqlite3.connect(tmp_path / "optuna.db") as c:
        c.execute("create table studies (study_id integer)")
    half = tmp_path / "half.db"
    half.write_bytes(db.read_bytes())
    with sqlite3.connect(half) as c:
        c.execute("create table _alembic_tmp_endpoints (x integer)")
    cases = [(f"sqlite:///{trunc}", "corrupt"), (f"sqlite:///{tmp_path}/model.pt", "not an SQLite database"),
             (f"sqlite:///{tmp_path}/optuna.db", "without a 'experiments' table"), ("databricks", "databricks"),
             (f"sqlite:///{half}", "half-created")]
    for store, needle in cases:
        for args in (["runs", "list"], ["runs", "show", "0" * 32], ["runs", "gc"]):
            line = _one_line(_invoke([*args, "--tracking-uri", store]))
            assert needle in line, (store, args, line)
    ready = tmp_path / "ready"
    p = _locker(db, ready)
    try:
        deadline = time.time() + 30
        while not ready.exists():
            assert time.time() < deadline and p.poll() is None
            time.sleep(0.05)
        line = _one_line(_invoke(["runs", "list", "--tracking-uri", uri]))
        assert "is locked by process " + str(p.pid) in line and "sqlite3" in line, line
        assert "not an SQLite database" not in line
    finally:
        p.kill()
        p.wait()


def test_half_created_store_says_how_to_remove_or_repair_it(tmp_path):
    uri = _store(tmp_path)
    db = Path(uri[len("sqlite:///"):])
    with sqlite3.connect(db) as c:
        c.execute("create table _alembic_tmp_endpoints (x integer)")
    with pytest.raises(ConfigError, match=r"half-created .*_alembic_tmp_endpoints.*1 run\(s\).*DROP TABLE "
                                          r"_alembic_tmp_endpoints.*mlflow db upgrade"):
        store_checks.tracking_store(uri, must_exist=True, write=False)
    empty = tmp_path / "empty" / "mlflow.db"
    empty.parent.mkdir()
    with sqlite3.connect(empty) as c:  # what a creation cut short leaves: some of the tables, an old revision
        c.execute("create table experiments (experiment_id integer)")
        c.execute("create table runs (run_uuid text)")
        c.execute("create table alembic_version (version_num text)")
        c.execute("insert into alembic_version values ('451aebb31d03')")
    with pytest.raises(ConfigError, match=rf"half-created .*revision 451aebb31d03.*holds no runs: remove it \(`rm {empty}`\)"):
        store_checks.tracking_store(f"sqlite:///{empty}", write=True)


# ---------------------------------------------------------------- servers that never answer, drip, or fail writes


@pytest.fixture
def bad_server(tmp_path):
    procs = []

    def start(mode: str) -> str:
        port_file = tmp_path / f"port-{mode}"
        p = subprocess.Popen([sys.executable, str(HERE / "bad_http_server.py"), mode, str(port_file)])
        procs.append(p)
        deadline = time.time() + 30
        while not (port_file.exists() and port_file.read_text().strip().isdigit()):
            assert p.poll() is None and time.time() < deadline, "the test server did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{port_file.read_text().strip()}"

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_a_silent_or_dripping_server_fails_the_health_check_within_its_deadline(bad_server, tmp_path, monkeypatch):
    """Before: `runs list` on a server that never answers was still running at 150 s, and `train` on one that
    answers /health and drips its body hung."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(store_checks, "HEALTH_DEADLINE_S", 2.0)  # the default (10 s) would only make this slower
    (tmp_path / "j.log").touch()  # an (empty) Optuna journal: `sweep status` reaches the tracking store
    for mode, commands in (("silent", (["runs", "list"], ["sweep", "status", "x", "--storage", "j.log"])),
                           ("drip", (["runs", "show", "0" * 32], ["runs", "gc"]))):
        url = bad_server(mode)
        for args in commands:
            line = _one_line(_invoke([*args, "--tracking-uri", url], seconds=30))
            assert "did not answer its health check within 2 s" in line and url in line, (mode, args, line)
    line = _one_line(_invoke(["runs", "list", "--tracking-uri", "http://127.0.0.1:9"]))
    assert "not reachable" in line  # a refused port: at once (before: 249 s of MLflow's retries, then a traceback)


def test_a_server_answering_500_to_writes_gives_one_line(bad_server, tmp_path):
    """Before: `train` sat in MLflow's retries (7, backoff factor 2) for over 200 s, then printed a traceback.
    Now each request is tried 3 times (tracking.store.HTTP_RETRIES): a real `hmmscope train` process says so in one
    line; 120 s is a hang detector here, not a timing (it takes about 15 s, mostly imports and the data)."""
    url = bad_server("500w")
    (tmp_path / "tiny.toml").write_text("[train]\nsteps = 2\ndevice = \"cpu\"\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    r = subprocess.run([str(BIN), "train", "--config", "tiny.toml", "--tracking-uri", url, "--no-evaluate"],
                       cwd=tmp_path, env={**env, "HMMSCOPE_THREADS": "1"}, capture_output=True, text=True, timeout=120)
    lines = [_error_line(r.stderr)]
    assert r.returncode == 2 and lines[0].startswith("error: the store failed"), r.stderr[-3000:]
    assert "500" in lines[0] and "Traceback" not in r.stderr


# ---------------------------------------------------------------- a full disk while the store is created (item 2)


def _tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        path.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()[:200]}")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (a real full disk): needs root")
@pytest.mark.parametrize("made", ["first", "later"])
def test_a_full_disk_while_the_store_is_created_leaves_no_store(tmp_path, monkeypatch, made):
    """Before: a traceback and a half-migrated mlflow.db that broke every later command ("table _alembic_tmp_...
    already exists"), unnoticed by the store checks. The process's first new store (MLflow migrates it) and a later
    one (a copy of the first: tracking.store._create); the later one said '[Errno 28]' with no store named."""
    from hmmscope.tracking import store

    monkeypatch.setattr(store, "_EMPTY", [])  # as in a new process
    if made == "later":
        tracking.ensure_store(f"sqlite:///{tmp_path}/before/mlflow.db")
        assert store._EMPTY
    disk = tmp_path / "disk"
    _tmpfs(disk, "400k")  # the schema alone takes 954 KB
    try:
        monkeypatch.chdir(tmp_path)
        uri = f"sqlite:///{disk}/mlflow.db"
        r = _invoke(["runs", "gc", "--tracking-uri", uri])  # nothing there yet: refused before any creation
        assert r.exit_code == 2 and os.listdir(disk) == []
        r = _invoke(["train", "--set", "train.steps=2", "--set", "train.device=cpu", "--no-evaluate",
                     "--tracking-uri", uri, "--out", str(tmp_path / "out")], seconds=120)
        line = _one_line(r)
        assert "full" in line, line
        assert [p for p in os.listdir(disk) if not p.endswith(".lock")] == []  # no store, no temp file
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        tracking.ensure_store(uri)
        assert store_checks.tracking_store(uri, must_exist=True) == uri
        # what the earlier, in-place creation left on a full disk is recognized, with what to do
        full = tmp_path / "full"
        _tmpfs(full, "400k")
        old = f"sqlite:///{full}/old.db"
        from mlflow.tracking import MlflowClient

        with pytest.raises(Exception, match="full"):
            MlflowClient(tracking_uri=old).search_experiments()
        with pytest.raises(ConfigError, match=rf"half-created.*holds no runs: remove it \(`rm {full}/old.db`\)"):
            store_checks.tracking_store(old, must_exist=True, write=False)
    finally:
        for d in (disk, tmp_path / "full"):
            subprocess.run(["umount", "-l", str(d)], check=False, capture_output=True)
