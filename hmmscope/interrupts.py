"""SIGTERM as Ctrl-C, an interrupt Python swallowed raised again, children that die with their parent, and threads
that stop with their block.

`kill PID`, `timeout` and a sweep stopping its workers send SIGTERM; inside `sigterm_interrupts` (and in a sweep
worker, `on_sigterm`) it raises KeyboardInterrupt, so a run ends KILLED and a trial is handed back, as with Ctrl-C.
A signal handler's exception is raised in whatever Python code runs when the signal arrives. If that is a weakref
callback or a __del__ (the garbage collector runs them between any two bytecodes), Python prints "Exception ignored
in: ..." and goes on: the interrupt is lost, and a training run would keep going after SIGTERM.
So the handler also records the signal, and long loops call `raise_if_terminated()` at each step: a recorded signal
whose exception has not reached them raises there. Inside `sigterm_interrupts` such a swallowed interrupt prints
nothing (no "Exception ignored" traceback on the way to the one-line "error: interrupted"); it is counted in
`SWALLOWED`. A second SIGTERM while the first one's interrupt is being handled is ignored (until
`sigterm_interrupts` ends): the clean-up it would cut short is what leaves a run KILLED with its last rows.

Children (`die_with_parent`, a preexec_fn): a sweep's worker processes and `hmmscope ui`'s servers get SIGTERM when
the process that started them dies, even by SIGKILL (Linux). Heartbeats (`every`): a daemon thread that calls a
function at an interval until the block ends or the function says stop (a run's lease, a trial's heartbeat).
Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_PENDING: list[int] = []  # signals received whose KeyboardInterrupt may not have propagated
_STOPPING: list[int] = []  # a SIGTERM's interrupt is under way (until `sigterm_interrupts` ends): later ones wait
SWALLOWED: list[str] = []  # where Python swallowed one of our interrupts (inside `sigterm_interrupts`), for tests


def on_sigterm(signum, frame) -> None:
    """The SIGTERM handler: record the signal, then raise KeyboardInterrupt where the program is. Once: a second
    SIGTERM while the first one's interrupt is handled (a run's end being written, `timeout` and a scheduler both
    signalling) is ignored, so it cannot cut that clean-up short (a run left RUNNING, its last rows lost)."""
    if _STOPPING:
        return
    _STOPPING.append(signum)
    _PENDING.append(signum)
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


def raise_if_terminated() -> None:
    """Raise KeyboardInterrupt if a SIGTERM was received (its first exception may have been swallowed); once."""
    if _PENDING:
        signum = _PENDING[-1]
        _PENDING.clear()
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside (main thread only): SIGTERM raises KeyboardInterrupt, as Ctrl-C does; the old handler comes back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, on_sigterm)
    old_hook = sys.unraisablehook

    def unraisable(u) -> None:  # our interrupt, swallowed in a weakref callback or __del__: pending, not printed
        if isinstance(u.exc_value, KeyboardInterrupt) and _PENDING:
            SWALLOWED.append(repr(u.object))
            return
        old_hook(u)

    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        sys.unraisablehook = old_hook
        signal.signal(signal.SIGTERM, old)
        _PENDING.clear()
        _STOPPING.clear()


def die_with_parent():
    """preexec_fn (Linux): the child gets SIGTERM when this process dies, even by SIGKILL (PR_SET_PDEATHSIG);
    a child whose parent is already gone stops at once. None where prctl does not exist."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # lazy: libc's prctl, only where a child is started (Linux)

    libc, parent = ctypes.CDLL(None, use_errno=True), os.getpid()  # loaded here: no imports after fork

    def preexec() -> None:
        libc.prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@contextmanager
def every(interval: float, beat: Callable[[], bool | None], name: str) -> Iterator[None]:
    """Call `beat()` from a daemon thread every `interval` seconds while the block runs (a heartbeat); the thread stops
    when `beat` returns False or the block ends, and is joined before the block is left. An exception in `beat` is
    swallowed (a busy or unreachable store: the next beat comes soon)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            try:
                if beat() is False:
                    return
            except Exception:  # noqa: BLE001  (see the docstring)
                continue

    th = threading.Thread(target=loop, daemon=True, name=name)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()
