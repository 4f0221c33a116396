"""Where the suite's CPU goes, per test: a pytest plugin, not a test module.

`PYTHONPATH=tests .venv/bin/python -m pytest -q -n 2 -p cpu_account` appends one line per test to the file named by
HMMSCOPE_CPU_ACCOUNT (default out/test-artifacts/cpu.tsv): node id, wall seconds, CPU seconds of the pytest process
itself, CPU seconds of the processes it started and waited for (with theirs: a `sweep run` and its workers), pid.
On a busy machine the suite's time follows its CPU, not its wall time alone (sleeps and polls cost none): sort by
the sum of the two CPU columns to see what to make cheaper.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (me0, kids0), t0 = _cpu(), time.monotonic()
    yield
    (me1, kids1), wall = _cpu(), time.monotonic() - t0
    path = Path(os.environ.get("HMMSCOPE_CPU_ACCOUNT", ROOT / "out" / "test-artifacts" / "cpu.tsv"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:  # one short line per write: the two xdist processes append whole lines
        fh.write(f"{item.nodeid}\t{wall:.2f}\t{me1 - me0:.2f}\t{kids1 - kids0:.2f}\t{os.getpid()}\n")
