"""A full disk is not an outage (issue 36, item 6): it is said in one line, at once.

Before: a sweep worker whose store filled up took "database or disk is full" for a storage outage and waited up to
HMMSCOPE_STORE_OUTAGE_S (900 s) printing MLflow's logged tracebacks (45 of them); the sweep's last line lost the
reason ("MlflowException: (raised as a result of Query-invoked autoflush ...)"); a `train --resume` on a full disk
printed 88 lines of stderr before its error. The project lives on a small tmpfs filled with a file (root only: CI
runs as root); the commands run as real processes, their logs outside the full disk.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hmmscope import tracking

BIN = Path(sys.executable).parent / "hmmscope"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (a real full disk): needs root")



@pytest.fixture
def disk(tmp_path):
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()[:200]}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False, capture_output=True)


def _fill(disk: Path) -> None:
    """Every free byte of the tmpfs taken by one file: unbuffered writes until ENOSPC. (A buffered file raised ENOSPC
    again at its close, flushing what the failed write had left in its buffer: the test failed in full runs, with the
    traceback at the `with` line, whenever the free space was not a whole number of writes.)"""
    fd = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        block = b"\0" * (1 << 16)
        while True:
            try:
                os.write(fd, block)  # a short write when less is free; the next one raises
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                return
    finally:
        os.close(fd)


def _env(**kw) -> dict[str, str]:
    env = {**os.environ, "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1", **kw}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _full(line: str) -> bool:
    """The line says the disk is full (SQLite's words, or the OS's)."""
    return "disk is full" in line or "No space left on device" in line


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if "error" in ln.lower()]


def test_a_resume_on_a_full_disk_is_one_line(disk, tmp_path, tiny_toml):
    (disk / "tiny.toml").write_text(tiny_toml)
    r = subprocess.run([str(BIN), "train", "--config", "tiny.toml", "--no-evaluate"], cwd=disk, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rid = tracking.search_runs(f"sqlite:///{disk}/mlruns/mlflow.db", "hmmscope")[0].info.run_id
    _fill(disk)
    r = subprocess.run([str(BIN), "train", "--config", "tiny.toml", "--resume", rid, "--set", "train.steps=8",
                        "--no-evaluate"], cwd=disk, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = _errors(r.stderr)
    assert len(errors) == 1 and errors[0].startswith("error: ") and _full(errors[0]), r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) <= 3, r.stderr[-3000:]




def test_a_sweep_whose_disk_fills_ends_at_once_in_one_line(disk, tmp_path, long_sweep_toml, wait_trial_training):
    """With HMMSCOPE_STORE_OUTAGE_S=600 the worker would have waited ten minutes; the test's own 300 s bound is a hang
    guard, not a timing."""
    (disk / "spec.toml").write_text(long_sweep_toml("full"))
    log = (tmp_path / "err.txt").open("w")  # off the full disk
    p = subprocess.Popen([str(BIN), "sweep", "run", "spec.toml"], cwd=disk, env=_env(HMMSCOPE_STORE_OUTAGE_S="600"),
                         stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        wait_trial_training(disk, p, lambda: (tmp_path / "err.txt").read_text()[-3000:])
        _fill(disk)
        p.wait(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()
    err = (tmp_path / "err.txt").read_text()
    assert p.returncode != 0, err[-3000:]
    assert "Traceback" not in err and "retrying for up to" not in err, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ") or ": error: " in ln]
    assert errors and all(_full(ln) for ln in errors), err[-3000:]
