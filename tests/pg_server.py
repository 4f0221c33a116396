"""A throwaway PostgreSQL server for the sweep tests (tests/test_sweep.py, tests/test_sweep_protocol.py): started
with the server binaries found on this machine, stopped and removed on exit; the test is skipped, with the reason,
where they cannot be had (.ci/run installs them)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def _pg_bin() -> Path | None:
    for cand in [shutil.which("initdb"), *sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)]:
        if cand and Path(cand).exists():
            return Path(cand).resolve().parent
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres_server():
    """A throwaway PostgreSQL server on 127.0.0.1 (trust auth), run as the postgres user when we are root."""
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not found; apt-get install postgresql")
    as_root = os.geteuid() == 0
    if as_root:
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' system user to run the server")
    tmp = Path(tempfile.mkdtemp(prefix="hmmscope-pg-"))
    data, sock = tmp / "data", tmp / "sock"
    data.mkdir()
    sock.mkdir()
    if as_root:
        os.chmod(tmp, 0o755)
        for d in (data, sock):
            os.chown(d, pw.pw_uid, pw.pw_gid)
    pre = ["runuser", "-u", "postgres", "--"] if as_root else []
    port = _free_port()

    def sh(*args, **kw):
        return subprocess.run([*pre, *map(str, args)], check=True, capture_output=True, text=True, **kw)

    try:
        sh(bindir / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        sh(bindir / "pg_ctl", "-D", data, "-w", "-t", "60", "-l", data / "log.txt", "-o",
           f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        sh(bindir / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "sweeps")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/sweeps"
    finally:
        with contextlib.suppress(Exception):
            sh(bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(tmp, ignore_errors=True)


