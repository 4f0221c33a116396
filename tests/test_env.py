"""hmmscope.env: each environment variable parsed against its range; one-line errors; unset or empty is the default."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hmmscope import env


@pytest.mark.parametrize(("raw", "want"), [(None, 7.0), ("", 7.0), ("  ", 7.0), ("0.5", 0.5), ("10", 10.0),
                                           ("1e1", 10.0)])
def test_seconds_in_range_or_the_default(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("HMMSCOPE_TEST_S", raising=False)
    else:
        monkeypatch.setenv("HMMSCOPE_TEST_S", raw)
    assert env.seconds("HMMSCOPE_TEST_S", 7.0, 0.5, 10.0, "a test") == want


@pytest.mark.parametrize("raw", ["0.49", "10.01", "nan", "inf", "-inf", "1e-300", "1e308", "ten", "1s", "x" * 500,
                                 "1_0", "\u0665", "0x5", "5.0.0", "1e9999"])
def test_seconds_out_of_range_is_one_line_naming_the_variable_and_range(monkeypatch, raw):
    monkeypatch.setenv("HMMSCOPE_TEST_S", raw)
    with pytest.raises(ValueError) as e:
        env.seconds("HMMSCOPE_TEST_S", 7.0, 0.5, 10.0, "a test")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("HMMSCOPE_TEST_S=") and "[0.5, 10]" in msg and "(a test)" in msg
    assert len(msg) < 200  # the value is cut, never echoed whole


@pytest.mark.parametrize(("raw", "want"), [(None, None), ("", None), ("1", 1), (" 1 ", 1)])
def test_threads(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv(env.THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(env.THREADS_ENV, raw)
    assert env.threads() == want
    assert env.threads_note() is None


def test_threads_are_capped_at_the_usable_cores_with_one_line(monkeypatch):
    """Issue 47, item 4: HMMSCOPE_THREADS=4096 (the top of the range) on a 2-core machine started about 8,200 threads.
    A value above the cores this process may run on (its affinity set) is capped there, and a note says so."""
    cores = len(os.sched_getaffinity(0))
    for asked in (cores, cores + 1, 4096):
        monkeypatch.setenv(env.THREADS_ENV, str(asked))
        assert env.threads() == min(asked, cores)
        note = env.threads_note()
        if asked <= cores:
            assert note is None and env.check() == []
        else:
            assert note == (f"note: HMMSCOPE_THREADS={asked} is more than the {cores} usable core(s); torch uses "
                            f"{cores} thread(s)") and env.check() == [note]


@pytest.mark.parametrize("raw", ["0", "-1", "4097", "1.5", "two", "nan", "2_0", "1_000", "\u0662", "+2", "0x2", "2e0"])
def test_threads_out_of_range_is_one_line(monkeypatch, raw):
    monkeypatch.setenv(env.THREADS_ENV, raw)
    with pytest.raises(ValueError, match=r"^HMMSCOPE_THREADS=.*\[1, 4096\]") as e:
        env.threads()
    assert "\n" not in str(e.value)


def test_the_readers_use_the_one_parse(monkeypatch):
    """progress, the run heartbeat and the store outage read their variables through env.seconds (one range rule)."""
    from hmmscope.sweep.storage import outage_limit
    from hmmscope.tracking.liveness import heartbeat_interval
    from hmmscope.training.progress import progress_every

    for name, read in (("HMMSCOPE_PROGRESS_S", progress_every), ("HMMSCOPE_RUN_HEARTBEAT_S", heartbeat_interval),
                       ("HMMSCOPE_STORE_OUTAGE_S", outage_limit)):
        monkeypatch.setenv(name, "nan")
        with pytest.raises(ValueError, match=f"^{name}='nan': give seconds in"):
            read()
        monkeypatch.setenv(name, "2")
        assert read() == 2.0


def test_the_sweep_worker_entry_point_checks_the_environment_as_the_cli_does():
    """Issue 47, item 4: `python -m hmmscope.sweep worker` with HMMSCOPE_THREADS=0 gave a 15-line ValueError (this
    entry point skipped the CLI's check). Now: one line naming the variable, exit 2, before any storage is opened."""
    for raw, needle in (("0", "HMMSCOPE_THREADS='0'"), ("2_0", "HMMSCOPE_THREADS='2_0'")):
        r = subprocess.run([sys.executable, "-m", "hmmscope.sweep", "worker", "--study", "s", "--storage",
                            "sqlite:////nonexistent/optuna.db", "--uri", "sqlite:////nonexistent/mlflow.db"],
                           capture_output=True, text=True, env={**os.environ, "HMMSCOPE_THREADS": raw}, timeout=120)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
