"""hmmscope.interrupts.every: a heartbeat thread that beats at its interval, stops when told or when its block ends,
survives a failing beat, and is gone (joined) once the block is left; sigterm_interrupts: a second SIGTERM waits for
the first one's clean-up."""

from __future__ import annotations

import threading
import time

from hmmscope.interrupts import every


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_beats_until_the_block_ends_then_the_thread_is_gone():
    beats = []
    with every(0.02, lambda: beats.append(time.monotonic()), "beat-test-a"):
        assert len(_threads("beat-test-a")) == 1
        deadline = time.monotonic() + 10
        while len(beats) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    n = len(beats)
    assert n >= 3 and _threads("beat-test-a") == []
    time.sleep(0.1)
    assert len(beats) == n  # no beat after the block


def test_a_beat_that_returns_false_stops_the_thread_and_one_that_raises_does_not():
    calls = []

    def beat():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("the store is busy")  # swallowed: the next beat comes
        return len(calls) < 3

    with every(0.01, beat, "beat-test-b"):
        deadline = time.monotonic() + 10
        while _threads("beat-test-b") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _threads("beat-test-b") == []  # stopped by its own False, inside the block
    assert len(calls) == 3


def test_no_beat_before_the_first_interval_and_an_exception_in_the_block_still_joins():
    beats = []
    try:
        with every(60.0, lambda: beats.append(1), "beat-test-c"):
            raise KeyboardInterrupt  # a SIGTERM inside the block
    except KeyboardInterrupt:
        pass
    assert beats == [] and _threads("beat-test-c") == []


def test_a_second_sigterm_waits_for_the_first_ones_clean_up():
    """Issue 47, item 1: two SIGTERMs 0.05 s apart; the second raised KeyboardInterrupt again inside the first one's
    clean-up (a run's last rows and its end being written), so the run lost its rows or stayed RUNNING. Now a SIGTERM
    while one is handled is ignored until `sigterm_interrupts` ends; after it, a SIGTERM interrupts again."""
    import signal

    import pytest

    from hmmscope.interrupts import sigterm_interrupts

    me = threading.get_ident()  # to this thread: another one (xdist's) would take a signal sent to the process
    cleaned = []
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), sigterm_interrupts():
        try:
            signal.pthread_kill(me, signal.SIGTERM)
            time.sleep(5)
        finally:
            signal.pthread_kill(me, signal.SIGTERM)  # the second one, while the first is handled
            time.sleep(0.05)
            cleaned.append(True)
    assert cleaned == [True]
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), sigterm_interrupts():
        signal.pthread_kill(me, signal.SIGTERM)
        time.sleep(5)
