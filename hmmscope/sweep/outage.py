"""A worker cut off from its storage waits out the outage: `Patient` retries a call of the storage that failed with
a transient error (`transient`: the database unreachable, a connection dropped), 1 s then doubling to 15 s apart, for
up to STORE_OUTAGE_S in total (env HMMSCOPE_STORE_OUTAGE_S); a full disk or a read-only store is said at once.
Imports `storage` and tracking's faults only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..tracking.faults import permanent_fault
from .storage import outage_limit


def transient(e: BaseException) -> bool:
    """A storage error that a new connection may not have: the database unreachable, a connection dropped (SQLAlchemy's
    OperationalError / InterfaceError, or Optuna's StorageInternalError wrapping one). Not a full disk or a read-only
    store (`tracking.faults.permanent_fault`): waiting does not cure those, so they are said at once."""
    if permanent_fault(e) is not None:
        return False
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"OperationalError", "InterfaceError", "StorageInternalError"}) or \
        getattr(e, "connection_invalidated", False)


class Patient:
    """Calls of the storage that outlast an outage: a transient error (`transient`) is retried, 1 s then doubling to
    15 s apart, for up to STORE_OUTAGE_S in total (one line when it starts waiting, one when it answers again);
    then, or on any other error, it is raised. A worker cut off from its storage thus resumes where it was when the
    network returns (its trial meanwhile failed as stale and retried by another worker)."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.limit = outage_limit()  # a stated range (storage.STORE_OUTAGE_RANGE): nan, inf refused

    def __call__(self, fn, *args):
        t0, wait, said = time.monotonic(), 1.0, False
        while True:
            try:
                out = fn(*args)
            except Exception as e:
                if not transient(e) or time.monotonic() - t0 > self.limit:
                    raise
                if not said:
                    first = str(e).strip().splitlines()
                    self.log(f"worker {os.getpid()}: the storage does not answer ({type(e).__name__}: "
                             f"{first[0][:200] if first else ''}); retrying for up to {self.limit:.0f} s")
                    said = True
                time.sleep(wait)
                wait = min(15.0, wait * 2)
                continue
            if said:
                self.log(f"worker {os.getpid()}: the storage answers again after {time.monotonic() - t0:.0f} s")
            return out
