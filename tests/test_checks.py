"""Checks before work: paths, stores and memory are judged without writing anything."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import stat
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from hmmscope import checks, store_checks
from hmmscope.checks import GIB, memory_estimate, resources
from hmmscope.config import ConfigError, preset

ROOT_BYPASSES_MODES = os.geteuid() == 0
# a PostgreSQL URL to a closed port: "cannot connect" with psycopg2 (the test extra), the driver's name without it
PG_CLOSED_PORT = "cannot connect" if find_spec("psycopg2") else "the driver for 'postgresql+psycopg2' is not installed"


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _unwritable(tmp_path: Path) -> Path:
    """A folder this process cannot create entries in (procfs when root, whom mode bits do not stop)."""
    if ROOT_BYPASSES_MODES:
        return Path("/proc/1")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return d


def test_output_paths(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d.npz").mkdir()
    before = _listing(tmp_path)
    assert checks.output_file(tmp_path / "new" / "deeper" / "x.npz", "out", ".npz")  # creatable
    assert checks.output_dir(tmp_path / "a" / "b", "--out")
    with pytest.raises(ConfigError, match="must end in .npz"):
        checks.output_file(tmp_path / "x.txt", "out", ".npz")
    with pytest.raises(ConfigError, match=r"f is a file, not a folder"):
        checks.output_file(tmp_path / "f" / "x.npz", "out")
    with pytest.raises(ConfigError, match=r"f is a file, not a folder"):
        checks.output_dir(tmp_path / "f" / "sub" / "deeper", "--out")
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        checks.output_dir(tmp_path / "f", "--out")
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        checks.output_file(tmp_path / "d.npz", "out", ".npz")
    ro = _unwritable(tmp_path)
    with pytest.raises(ConfigError, match="not writable"):
        checks.output_dir(ro / "sub", "--out")
    with pytest.raises(ConfigError, match="not writable"):
        checks.output_file(ro / "x.json", "--json")
    assert _listing(tmp_path) == before + (["ro"] if not ROOT_BYPASSES_MODES else [])


def test_input_file(tmp_path):
    (tmp_path / "c.toml").write_text("")
    assert checks.input_file(tmp_path / "c.toml", "config")
    with pytest.raises(ConfigError, match="config not found"):
        checks.input_file(tmp_path / "missing.toml", "config")
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        checks.input_file(tmp_path, "config")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tracking_store_checks_write_nothing(tmp_path, monkeypatch, project):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "other.db").write_bytes(b"not sqlite at all, just bytes")
    with sqlite3.connect(tmp_path / "optuna-like.db") as c:
        c.execute("create table studies (x)")
    before = _listing(tmp_path)
    assert store_checks.tracking_store(None).endswith("/mlruns/mlflow.db")  # creatable: fine to write
    with pytest.raises(ConfigError, match=r"no MLflow store at .*mlruns/mlflow.db"):
        store_checks.tracking_store(None, must_exist=True)
    port = _free_port()
    cases = [("bogus://x", "unknown scheme 'bogus'"), ("not a url", "a plain folder is not an MLflow store"),
             ("file:///tmp/x", "a plain folder is not an MLflow store"),
             (f"sqlite:///{tmp_path}/afile/m.db", "afile is a file, not a folder"),
             (f"sqlite:///{tmp_path}", "is a folder, not a database file"),
             (f"sqlite:///{tmp_path}/other.db", "is not an SQLite database"),
             (f"sqlite:///{tmp_path}/optuna-like.db", "without a 'experiments' table"),
             ("sqlite://", "give a database file"),
             (f"http://127.0.0.1:{port}", f"MLflow server http://127.0.0.1:{port} is not reachable"),
             (f"postgresql+psycopg2://u:secret@127.0.0.1:{port}/db", PG_CLOSED_PORT),
             (f"mysql://u:secret@127.0.0.1:{port}/db", "mysql")]
    for uri, needle in cases:
        with pytest.raises(ConfigError) as e:
            store_checks.tracking_store(uri)
        msg = str(e.value)
        assert needle in msg and "\n" not in msg and "secret" not in msg, (uri, msg)
    assert _listing(tmp_path) == before


def test_postgres_url_without_its_driver_names_the_driver(monkeypatch):
    """psycopg2 is an optional extra: without it a PostgreSQL URL fails on the driver, before any connection."""
    import builtins

    real_import = builtins.__import__

    def no_psycopg2(name, *a, **kw):
        if name.split(".")[0] == "psycopg2":
            raise ModuleNotFoundError("No module named 'psycopg2'", name="psycopg2")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_psycopg2)
    monkeypatch.delitem(sys.modules, "psycopg2", raising=False)
    port = _free_port()
    for check in (store_checks.tracking_store, store_checks.optuna_storage):
        with pytest.raises(ConfigError, match=r"the driver for 'postgresql\+psycopg2' is not installed") as e:
            check(f"postgresql+psycopg2://u:secret@127.0.0.1:{port}/db")
        assert "secret" not in str(e.value) and "\n" not in str(e.value)


def test_unreachable_server_fails_fast(tmp_path):
    import time

    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="not reachable"):
        store_checks.tracking_store(f"http://127.0.0.1:{_free_port()}")
    assert time.perf_counter() - t0 < 5 * store_checks.HEALTH_TIMEOUT_S  # one short check, no retries


def test_tracking_store_accepts_a_real_server(mlflow_server):
    assert store_checks.tracking_store(mlflow_server, must_exist=True) == mlflow_server


def test_optuna_storage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = _listing(tmp_path)
    assert store_checks.optuna_storage(None) == store_checks.default_storage_url()
    with pytest.raises(ConfigError, match="no Optuna storage at"):
        store_checks.optuna_storage(None, must_exist=True, write=False)
    with pytest.raises(ConfigError, match="unknown scheme 'bogus'"):
        store_checks.optuna_storage("bogus://x")
    with pytest.raises(ConfigError, match="is not a URL"):
        store_checks.optuna_storage("not a url")
    with pytest.raises(ConfigError, match=re.escape(PG_CLOSED_PORT)):
        store_checks.optuna_storage(f"postgresql+psycopg2://u@127.0.0.1:{_free_port()}/db")
    assert _listing(tmp_path) == before
    from hmmscope.sweep import ensure_storage

    ensure_storage(store_checks.default_storage_url())
    assert store_checks.optuna_storage(None, must_exist=True, write=False) == store_checks.default_storage_url()


def test_fits_names_the_dominant_term_and_the_pools():
    need = {"runtime": (GIB, "host"), "activations": (30 * GIB, "device"), "mixture": (2 * GIB, "host")}
    checks.fits(need, host=4 * GIB, device=40 * GIB)  # GPU: the device terms go to the GPU
    with pytest.raises(ConfigError, match=r"needs about 33.0 GiB of memory \(mostly activations: 30.0 GiB\), "
                                          r"this machine has 16.0 GiB available.*--force"):
        checks.fits(need, host=16 * GIB)  # CPU: everything is host memory
    with pytest.raises(ConfigError, match=r"30.0 GiB of GPU memory .*the GPU has 20.0 GiB"):
        checks.fits(need, host=64 * GIB, device=20 * GIB)
    with pytest.raises(ConfigError, match=r"needs about 6.0 GiB .*mostly mixture"):
        checks.fits({k: v for k, v in need.items() if v[1] == "host"}, host=5 * GIB, times=2)
    checks.memory({"x": (1 << 62, "host")}, force=True)  # --force skips the check


def test_paper_preset_fits_a_gpu_machine_and_not_a_small_cpu_one():
    need = memory_estimate(preset("paper"), "train")
    host = sum(b for b, w in need.values() if w == "host")
    dev = sum(b for b, w in need.values() if w == "device")
    assert host < 8 * GIB and 10 * GIB < dev < 60 * GIB
    checks.fits(need, host=128 * GIB, device=78 * GIB)  # an H100 box
    with pytest.raises(ConfigError, match="mostly activations"):
        checks.fits(need, host=24 * GIB)  # this 2-core CPU machine


def test_host_memory_is_plausible():
    have = checks.host_memory()
    assert 64 << 20 < have < 1 << 50


def test_sweep_memory_counts_workers_and_the_largest_point(monkeypatch):
    from hmmscope.sweep.spec import parse_spec

    text = ('[sweep]\nname = "m"\nsampler = "grid"\n[fixed]\n"train.device" = "cpu"\n'
            '[space]\n"data.n_train" = {grid = [64, 100000000000]}\n')
    with pytest.raises(ConfigError, match=r"sweep 'm' \(1 worker\(s\) at once\) needs about .*mostly"):
        checks.sweep_memory(parse_spec(text), workers=1)
    small = parse_spec(text.replace("100000000000", "128"))
    checks.sweep_memory(small, workers=2)
    one = sum(b for b, _ in memory_estimate(small.trial_config({"data.n_train": 128, "seed": 0}), "train").values())
    monkeypatch.setattr(resources, "host_memory", lambda: int(1.5 * one))  # a machine that holds one trial, not two
    checks.sweep_memory(small, workers=1)
    with pytest.raises(ConfigError, match=r"\(2 worker\(s\) at once\)"):
        checks.sweep_memory(small, workers=2)
    checks.sweep_memory(small, workers=2, force=True)


def test_a_corrupt_sqlite_store_is_named_in_one_line(tmp_path):
    """A malformed page (intact header and schema) is found before work starts."""
    import sqlite3

    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as c:
        c.execute("create table experiments (x text)")
        c.executemany("insert into experiments values (?)", [("x" * 500,)] * 200)
    raw = bytearray(db.read_bytes())
    raw[4096 * 3: 4096 * 3 + 200] = b"\xff" * 200  # a page in the middle of the table
    db.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match="is corrupt") as e:
        store_checks.tracking_store(f"sqlite:///{db}")
    assert str(db) in str(e.value) and "\n" not in str(e.value)
