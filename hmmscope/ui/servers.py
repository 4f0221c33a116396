"""Local servers a command keeps alive while it runs (`hmmscope ui`: the MLflow UI, optuna-dashboard).

Owns: whether a port is free on 127.0.0.1; whether a URL answers; the command line of each server (`mlflow_ui`,
`optuna_dashboard`: optuna-dashboard's app behind `dashboard_guard`'s Host/Origin check) and their environment;
and their supervision (`supervise`): each server started in its own
process group with its output in one log file, made to die with this process even when it is SIGKILLed
(PR_SET_PDEATHSIG, Linux), waited on until it answers, watched until one exits or this process is told to stop
(Ctrl-C, SIGTERM, SIGHUP), then stopped whole (`stop_groups`: SIGTERM to each group, SIGKILL after a grace period).

It reports through its caller: `supervise` takes a context manager to show while the servers start and a
callback for when they answer, and returns a `Failure` (what happened, the log's path and last lines) or None.

Must not import typer, rich or `hmmscope.cli` (the CLI prints; this module does not), nor torch, mlflow, optuna
at module level: `hmmscope.tracking` and `hmmscope.sweep` are imported inside the functions that need them (`# lazy:`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from ..interrupts import die_with_parent

START_DEADLINE_S = 180.0  # a server that neither answers nor exits within this long is a failure (stopped)
STOP_GRACE_S = 15.0  # SIGTERM, then SIGKILL what is left of a group after this long
LOG_TAIL_LINES = 15  # the lines of the servers' log a Failure carries


@dataclass(frozen=True)
class Server:
    """One server to supervise: a name for messages, its argv, its base URL, and the path that says it is up.

    `needs_200`: the path must answer 200 (a health endpoint); otherwise any HTTP answer means up."""

    name: str
    argv: tuple[str, ...]
    url: str
    path: str
    needs_200: bool


@dataclass(frozen=True)
class Failure:
    """A server exited (before it answered, or later): the message, the log file (kept), its last lines."""

    message: str
    log_path: str
    tail: tuple[str, ...]


def port_free(port: int) -> bool:
    """Whether a server can listen on `port` on 127.0.0.1 now: bound as servers bind (SO_REUSEADDR, as uvicorn and
    MLflow's server do), so the TIME_WAIT connections a stopped server leaves for a minute do not count; a port
    another socket listens on does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def answers(url: str, ok_only: bool = True) -> bool:
    """Whether `url` answers within 2 s: with 200 (`ok_only`), or with any HTTP status."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200 or not ok_only
    except urllib.error.HTTPError:
        return not ok_only
    except OSError:
        return False


def stop_groups(procs: Sequence[subprocess.Popen], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM each server's process group (by the group's id, its leader's pid), then SIGKILL what is left
    after `grace` seconds. Returns once every member of every group is gone (the leader reaped)."""

    def alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + grace
    for p in procs:
        while p.poll() is None or alive(p.pid):  # poll() reaps the leader: a zombie still counts as a member
            if time.time() > deadline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
            time.sleep(0.1)


def mlflow_ui(uri: str, port: int) -> Server:
    """The MLflow UI on the tracking store `uri` (which must exist: `tracking.ensure_store`), on 127.0.0.1:port,
    with one uvicorn worker and no per-request lines.

    A sqlite store is given as `tracking.server_uri` (SQLite's mode=rw: the server never creates it); `store_watch`
    says when it is gone. The argv is a list built from typed values, never a string split by a shell's rules: every value is
    joined to its option with `=` (`--backend-store-uri=URI`), so a URI or path with spaces, quotes or a
    leading `--` stays one value of its option and can never become an option of its own."""
    from .. import tracking  # lazy: tracking (mlflow) and sweep (optuna) only in the functions that start them

    exe = shutil.which("mlflow") or str(Path(sys.executable).parent / "mlflow")
    served = tracking.server_uri(uri)  # a sqlite store opened, never created (moved away while served: not re-made)
    argv = [exe, "ui", f"--backend-store-uri={served}", f"--registry-store-uri={served}"]
    root = tracking.artifact_root(uri)
    if root:
        argv.append(f"--default-artifact-root={root}")
    argv += ["--host=127.0.0.1", f"--port={int(port)}", "--workers=1",
             "--uvicorn-opts=--log-level warning --no-access-log"]  # a constant: no per-request lines
    return Server("MLflow UI", tuple(argv), f"http://127.0.0.1:{port}", "/health", needs_200=True)


def optuna_dashboard(storage: str | None, port: int) -> Server:
    """optuna-dashboard on the Optuna storage (default: `sweep.default_storage()`), on 127.0.0.1:port, behind the
    Host/Origin guard the MLflow UI has (`dashboard_guard`: its WSGI app wrapped, in a process of this Python).
    ConfigError if it is not installed."""
    if importlib.util.find_spec("optuna_dashboard") is None:
        raise ConfigError("optuna-dashboard is not installed: pip install optuna-dashboard")
    if not storage:
        # lazy: tracking (mlflow) and sweep (optuna) only in the functions that start them
        from ..sweep.storage import default_storage

        storage = default_storage()
    return Server("optuna-dashboard", (sys.executable, "-m", "hmmscope.ui.dashboard_guard", "--host=127.0.0.1",
                                       f"--port={int(port)}", "--", storage),
                  f"http://127.0.0.1:{port}", "/", needs_200=False)


def server_env() -> dict[str, str]:
    """The servers' environment: this one, with MLflow's job execution off and Starlette's deprecation quiet."""
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "PYTHONWARNINGS": "ignore:starlette.middleware.wsgi is deprecated"}


def store_watch(db: Path) -> Callable[[], str | None]:
    """A check for `supervise`: why the store file `db` is no longer the one served (gone: deleted, or its folder
    moved or renamed; another file in its place), else None."""

    def ident() -> tuple[int, int] | None:
        try:
            st = os.stat(db)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    first = ident()

    def gone() -> str | None:
        now = ident()
        if now == first:
            return None
        what = "is gone (deleted, or its folder moved)" if now is None else "was replaced by another file"
        return f"the MLflow store {db} {what} while the UI served it; the UI stopped (start it again on the store)"

    return gone


def supervise(servers: Sequence[Server], env: dict[str, str], *,
              starting: AbstractContextManager | None = None, ready: Callable[[], None] | None = None,
              log_prefix: str = "hmmscope-ui-", deadline_s: float = START_DEADLINE_S,
              watch: Callable[[], str | None] | None = None) -> Failure | None:
    """Start the servers, wait until each answers, call `ready()`, then keep them until one exits, `watch()` says why
    they must stop (`store_watch`: their store is gone), or this process is stopped (Ctrl-C, SIGTERM, SIGHUP); stop
    them all (`stop_groups`) and return.

    Their output goes to a new log file in the temp folder (TMPDIR), removed on a clean stop. Returns None on a
    clean stop, else a Failure (the log kept; a stop by `watch`: its line, no log lines). `starting` is entered while
    the servers start (e.g. a spinner).

    Signals: SIGINT, SIGTERM and SIGHUP are turned into KeyboardInterrupt while the servers run, and recorded: one
    whose interrupt Python swallowed (raised inside a __del__ or a weakref callback) still stops the wait; from the
    clean-up on,
    SIGINT, SIGTERM and SIGHUP are ignored (a second signal must not cut the clean-up), and stay ignored when
    this returns: the caller is expected to report and exit.
    """
    fd, log_path = tempfile.mkstemp(prefix=log_prefix, suffix=".log")
    stopping: list[int] = []

    def _stop(signum, frame):
        stopping.append(signum)
        raise KeyboardInterrupt

    def _pause(seconds: float) -> None:  # a signal whose KeyboardInterrupt was swallowed still ends the wait
        if stopping:
            raise KeyboardInterrupt
        time.sleep(seconds)
        if stopping:
            raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # Ctrl-C, `kill PID`, a closed terminal
        signal.signal(sig, _stop)
    procs: list[subprocess.Popen] = []
    failed = why = None
    try:
        with os.fdopen(fd, "wb") as log:
            for s in servers:  # own group: we stop it whole; dies with us even on SIGKILL
                procs.append(subprocess.Popen(list(s.argv), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=log, start_new_session=True, preexec_fn=die_with_parent()))
        with starting if starting is not None else contextlib.nullcontext():
            give_up = time.monotonic() + deadline_s
            for s, p in zip(servers, procs, strict=True):
                while not answers(s.url + s.path, ok_only=s.needs_200):
                    if p.poll() is not None:
                        failed = f"{s.name} exited with code {p.returncode} before it answered"
                        break
                    if time.monotonic() > give_up:  # a store it cannot open may keep it waiting forever
                        failed = f"{s.name} did not answer {s.url}{s.path} within {deadline_s:.0f} s"
                        break
                    _pause(0.25)
                if failed:
                    break
        if failed is None:
            if ready is not None:
                ready()
            while all(p.poll() is None for p in procs) and not (why := watch() if watch is not None else None):
                _pause(0.5)
            failed = why or next(f"{s.name} exited with code {p.returncode}" for s, p in
                                 zip(servers, procs, strict=True) if p.poll() is not None)
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut the cleanup
            signal.signal(sig, signal.SIG_IGN)
        stop_groups(procs)
    if failed is not None:
        if why:  # the servers were well; what they say of a vanished store is noise
            Path(log_path).unlink(missing_ok=True)
            return Failure(failed, "", ())
        tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:]
        return Failure(failed, log_path, tuple(tail))
    Path(log_path).unlink(missing_ok=True)
    return None
