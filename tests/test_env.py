"""hmmscope.env: each environment variable parsed against its range; one-line errors; unset or empty is the default."""

from __future__ import annotations

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


@pytest.mark.parametrize("raw", ["0.49", "10.01", "nan", "inf", "-inf", "1e-300", "1e308", "ten", "1s", "x" * 500])
def test_seconds_out_of_range_is_one_line_naming_the_variable_and_range(monkeypatch, raw):
    monkeypatch.setenv("HMMSCOPE_TEST_S", raw)
    with pytest.raises(ValueError) as e:
        env.seconds("HMMSCOPE_TEST_S", 7.0, 0.5, 10.0, "a test")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("HMMSCOPE_TEST_S=") and "[0.5, 10]" in msg and "(a test)" in msg
    assert len(msg) < 200  # the value is cut, never echoed whole


@pytest.mark.parametrize(("raw", "want"), [(None, None), ("", None), ("1", 1), ("4096", 4096), (" 2 ", 2)])
def test_threads(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv(env.THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(env.THREADS_ENV, raw)
    assert env.threads() == want


@pytest.mark.parametrize("raw", ["0", "-1", "4097", "1.5", "two", "nan"])
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
