"""The trial protocol: every change of a trial's state, made so that exactly one process wins it.

Owns claiming a WAITING trial (WAITING -> RUNNING), finishing a RUNNING one (COMPLETE / PRUNED / FAIL, with
its value and its reason), heartbeats, failing the trials whose worker stopped beating, enqueueing a
retry, enqueueing the new cells of a growing sweep once (`enqueue_missing`), and recording a study attribute once
(the sweep's parent run). Everything goes through one small
interface, `TrialStore`, whatever the storage. Imports Optuna, SQLAlchemy and filelock and
storage.py; never MLflow (tracking/), torch, or the other sweep modules.

The rule. A transition is read-check-write under the storage's mutex (`TrialStore._mutex`): read the
trial; go on only if its state is the one expected; write the reason (user attrs); then the state and
value (`set_trial_state_values`). Every process that changes a trial's state holds the mutex from its read
to its write, so no other transition comes in between. All writes go through Optuna's public storage API:
`set_trial_state_values`, `set_trial_user_attr`, `set_trial_system_attr`, `create_new_trial` with a
template trial, `RDBStorage.record_heartbeat`, `set_study_user_attr`. No SQL, no private tables.

Why a mutex at all, and the one storage-specific piece (tests in tests/test_sweep_protocol.py):
- Every storage: the public API cannot record a trial's reason together with its state. The reason is a
  user attr, set by a call of its own before the state (a finished trial takes no more attrs). Without a
  mutex, a process failing a stale trial writes fail_reason="stale: ...", the trial's own worker (alive
  after all) records COMPLETE, and the first process's FAIL is refused: a COMPLETE trial that says it went
  stale. `test_public_api_cannot_record_a_reason_with_the_state` plays that order on each storage.
- SQLite: `set_trial_state_values` reads the trial with SELECT ... FOR UPDATE, which SQLite ignores (the
  read runs outside the write transaction), so two processes both claim one WAITING trial, or both fail
  one stale trial and enqueue two retries: `test_public_api_claim_when_reads_interleave[sqlite]`. On
  PostgreSQL the same interleaving has one winner (the row lock), and a journal orders writes by its log.
So the one storage-specific piece is the mutex (`_mutex_for`):
- sqlite: an OS file lock (filelock) on `.<database name>.lock` beside the database (SQLite is one-host).
- postgresql: a transaction-level advisory lock, `pg_advisory_xact_lock(KEY)`, on a connection of its own;
  the server drops it when its holder's connection ends, so a killed process never leaves it held.
- journal: Optuna's JournalFileOpenLock (a lock file created with O_EXCL, one of the two locks Optuna offers
  for journals on NFS) on `<journal>.trials.lock`; a lock left by a holder that died (killed inside a
  transition) is broken once it has not changed for JOURNAL_LOCK_GRACE_S, Optuna's own default for journal
  locks. (Optuna's other lock, JournalFileSymlinkLock, is no use here: it tells a stale lock by the mtime of
  the file its symlink points to, and ours points to no file.) `test_journal_mutex_left_by_a_dead_process`.
`test_trials_have_one_winner_across_processes[sqlite|journal|postgresql]` races real processes through
`TrialStore` on each storage: claims, stale failures and a worker's finish against stale failures.

Heartbeats. RDB storages: `RDBStorage.record_heartbeat` and its stale-trial query (`_get_stale_trial_ids`,
the method of Optuna's BaseHeartbeat that `optuna.storages.fail_stale_trials` uses; the database's clock).
`fail_stale_trials` itself is not used: it writes FAIL outside the mutex and with no reason. Journal: Optuna
5.0's JournalStorage has no heartbeat (optuna#6615; its pull request #6622 was closed unmerged), so a worker
records the trial's system attr "heartbeat" (UTC time, ISO 8601, its own clock) every heartbeat interval,
and a RUNNING trial whose last beat is older than grace_period is stale: the clocks of the machines sharing
a journal must agree to well within grace_period (as NTP keeps them). A trial that never beat is never
stale, and `claim` records the first beat before RUNNING, so every RUNNING trial has one.

Retries. Only the process that won a trial's FAIL enqueues its retry, so a failed trial is retried at most
once: a WAITING copy with the same params and user attrs (less its MLflow links, reasons and worker:
NOT_INHERITED), system attrs "failed_trial" (the first trial of the chain) and "retry_history" (every
trial of it), as Optuna's RetryFailedTrialCallback records them; at most max_retry retries per chain.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import filelock
import optuna
import sqlalchemy as sa
from optuna.storages.journal import JournalFileOpenLock
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from ..interrupts import every
from .storage import journal_path, pg_connect_args, storage_kind

HEARTBEAT = "heartbeat"  # journal storages: the system attr holding a trial's last beat
PG_LOCK_KEY = 0x686D6D73636F7065 >> 1  # "hmmscope" as a positive bigint: the advisory lock of every sweep
JOURNAL_LOCK_GRACE_S = 30  # a journal mutex unchanged this long belongs to a dead process and is broken
NOT_INHERITED = ("mlflow_run_id", "mlflow_experiment_id", "mlflow_run_url", "mlflow_analysis_run_id",
                 "mlflow_analysis_experiment_id", "mlflow_analysis_run_url", "fail_reason", "pruned_reason", "worker")


class TrialStore:
    """The trials of one study in one storage, changed only through the protocol (module docstring)."""

    def __init__(self, storage, study_id: int, url: str, grace_period: float | None = None):
        self.storage, self.study_id, self.url = storage, study_id, url
        self.kind = storage_kind(url)
        self.grace_period = grace_period
        self._mutex = _mutex_for(self.kind, url)

    @classmethod
    def of(cls, study, url: str, grace_period: float | None = None) -> TrialStore:
        """The store of an Optuna study opened on storage `url`."""
        return cls(study._storage, study._study_id, url, grace_period)

    # ------------------------------------------------------------ transitions (each under the mutex)

    def claim(self) -> int | None:
        """WAITING -> RUNNING for one WAITING trial, its first heartbeat included; its id, or None if none is left."""
        for t in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.WAITING,)):
            with self._mutex():
                if self.storage.get_trial(t._trial_id).state != TrialState.WAITING:
                    continue  # another process claimed it since the list was read
                self.beat(t._trial_id)
                if self.storage.set_trial_state_values(t._trial_id, TrialState.RUNNING):
                    return t._trial_id
        return None

    def finish(self, trial_id: int, state, value: float | None = None,
               attrs: Mapping[str, Any] | None = None) -> bool:
        """RUNNING -> `state` with its value and user attrs, if the trial is still RUNNING; False if another
        process finished it first (e.g. failed it as stale)."""
        with self._mutex():
            if self.storage.get_trial(trial_id).state != TrialState.RUNNING:
                return False
            self._write(trial_id, state, value, attrs)
        return True

    def fail_stale(self, max_retry: int | None, log: Callable[[str], None]) -> list[int]:
        """Fail the RUNNING trials whose worker stopped beating (one process wins each) and retry each one;
        returns the ids this process failed."""
        reason = f"stale: no heartbeat for over {self._grace()} s (its worker died, or lost the storage)"
        failed = []
        for tid in self.stale_trial_ids():
            with self._mutex():
                if tid not in self.stale_trial_ids():  # finished, or beat again, since the first look
                    continue
                self._write(tid, TrialState.FAIL, None, {"fail_reason": reason})
            failed.append(tid)
            new = self.retry(tid, max_retry)
            log(f"trial {self.storage.get_trial(tid).number} failed ({reason}); "
                + (f"retried as trial {new}" if new is not None else "no retries left"))
        return failed

    def set_study_attr_once(self, key: str, value: Any) -> Any:
        """Record the study user attr `key` = `value` unless it is recorded already; returns the recorded value."""
        with self._mutex():
            have = self.storage.get_study_user_attrs(self.study_id)
            if key in have:
                return have[key]
            self.storage.set_study_user_attr(self.study_id, key, value)
        return value

    def enqueue_missing(self, points: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
                        cell: Callable[[Mapping[str, Any], Mapping[str, Any]], Any], cell_of: Callable[[Any], Any],
                        first: Callable[[], None] | None = None) -> list[int]:
        """Under the mutex: `first()` (a growing sweep stores its spec there, so a worker that claims a new trial reads
        a spec that has it), then a WAITING trial (as `Study.enqueue_trial` makes it: its params as fixed_params, the
        point's user attrs) for each point (params, user attrs) whose `cell(params, attrs)` is not the `cell_of(trial)`
        of a trial the study has; the numbers of those enqueued. Two processes growing a study at once enqueue each
        cell once."""
        out = []
        with self._mutex():
            if first is not None:
                first()
            have = {cell_of(t) for t in self.storage.get_all_trials(self.study_id, deepcopy=False)}
            for params, attrs in points:
                if cell(params, attrs) in have:
                    continue
                new = optuna.trial.create_trial(state=TrialState.WAITING, system_attrs={"fixed_params": dict(params)},
                                                user_attrs=dict(attrs))
                out.append(self.storage.get_trial(self.storage.create_new_trial(self.study_id, template_trial=new)).number)
                have.add(cell(params, attrs))
        return out

    def _write(self, trial_id: int, state, value: float | None, attrs: Mapping[str, Any] | None) -> None:
        """The reason, then the state: call with the mutex held, after checking the trial is RUNNING."""
        for k, v in (attrs or {}).items():
            self.storage.set_trial_user_attr(trial_id, k, v)
        self.storage.set_trial_state_values(trial_id, state, None if value is None else [value])

    # ------------------------------------------------------------ retries (only the winner of a FAIL calls this)

    def retry(self, trial_id: int, max_retry: int | None, *, interrupted: bool = False,
              reset: bool = False) -> int | None:
        """Enqueue a WAITING copy of the failed trial `trial_id` (module docstring); its number, or None when
        the chain has used its retries.

        Only crashes use the budget: the system attr "crashes" counts the chain's crash failures (a chain
        from before it existed: its length). An `interrupted` trial (a signal, a pre-emption) is retried
        without using it; `reset` (the user's `--retry-failed`) starts the budget again."""
        t = self.storage.get_trial(trial_id)
        history = [*t.system_attrs.get("retry_history", []), t.number]
        crashes = 0 if reset else t.system_attrs.get("crashes", len(history) - 1) + (0 if interrupted else 1)
        if max_retry is not None and crashes > max_retry:
            return None
        system = {**{k: v for k, v in t.system_attrs.items() if k != HEARTBEAT},
                  "failed_trial": t.system_attrs.get("failed_trial", t.number), "retry_history": history,
                  "crashes": crashes}
        copy = optuna.trial.create_trial(
            state=TrialState.WAITING, params=t.params, distributions=t.distributions,
            user_attrs={k: v for k, v in t.user_attrs.items() if k not in NOT_INHERITED}, system_attrs=system)
        return self.storage.get_trial(self.storage.create_new_trial(self.study_id, template_trial=copy)).number

    def requeue_failed(self) -> list[int]:
        """Enqueue a WAITING copy of every FAIL trial not retried yet (the last of its chain); their numbers."""
        trials = self.storage.get_all_trials(self.study_id, deepcopy=False)
        retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
        out = []
        for t in trials:
            if t.state == TrialState.FAIL and t.number not in retried:
                new = self.retry(t._trial_id, None, reset=True)
                if new is not None:
                    out.append(new)
        return out

    def hand_back(self, host: str, pids: Sequence[int], max_retry: int | None) -> list[tuple[int, int]]:
        """The RUNNING trials of the workers `pids` on `host`, which are gone (SIGKILLed), handed back as a worker
        does on SIGTERM: FAIL with fail_reason "interrupted", then a WAITING retry (no retry budget used). Their
        (number, worker pid)."""
        out = []
        for t in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            w = t.user_attrs.get("worker") or {}
            if w.get("host") == host and w.get("pid") in pids and self.finish(
                    t._trial_id, TrialState.FAIL, attrs={"fail_reason": "interrupted"}):
                self.retry(t._trial_id, max_retry, interrupted=True)
                out.append((t.number, w["pid"]))
        return out

    # ------------------------------------------------------------ heartbeats

    def beat(self, trial_id: int) -> None:
        """Record that the trial's worker is alive (RDB: the heartbeat table; journal: a system attr)."""
        if self.kind == "journal":
            self.storage.set_trial_system_attr(trial_id, HEARTBEAT, datetime.now(UTC).isoformat())
        else:
            self.storage.record_heartbeat(trial_id)

    @contextlib.contextmanager
    def heartbeat(self, trial_id: int, interval: float, lost: threading.Event | None = None) -> Iterator[None]:
        """Beat every `interval` seconds from a thread while the block runs. `lost`: set (and the beats stop) once
        the trial is no longer RUNNING: another process failed it as stale (this worker's beats stopped reaching
        the storage, e.g. its host was cut off) and retries it, or it is no longer there (its study deleted); its
        worker must stop and record nothing."""
        def beat() -> bool:
            try:
                state = self.storage.get_trial(trial_id).state
            except KeyError:  # the trial is gone (its study deleted): nothing to beat for
                state = None
            if lost is not None and state != TrialState.RUNNING:
                lost.set()
                return False
            self.beat(trial_id)
            return True

        with every(interval, beat, f"heartbeat-{trial_id}"):
            yield

    def stale_trial_ids(self) -> list[int]:
        """RUNNING trials whose last heartbeat is older than the grace period (never: a trial with no beat)."""
        grace = self._grace()
        if self.kind != "journal":  # the storage's own grace period: open it with the spec's (storage.open_storage)
            return list(self.storage._get_stale_trial_ids(self.study_id))
        now = datetime.now(UTC)
        return [t._trial_id for t in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,))
                if HEARTBEAT in t.system_attrs
                and (now - datetime.fromisoformat(t.system_attrs[HEARTBEAT])).total_seconds() > grace]

    def _grace(self) -> float:
        if self.grace_period is None:
            raise ValueError("TrialStore: give grace_period (the spec's) to tell stale trials")
        return self.grace_period

    def running(self) -> bool:
        """Is any trial of the study RUNNING?"""
        return bool(self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,)))


# ---------------------------------------------------------------- the mutex of each storage kind


def _mutex_for(kind: str, url: str) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of context managers that hold the storage's cross-process mutex (module docstring)."""
    if kind == "sqlite":
        db = Path(make_url(url).database or "")
        lock = filelock.FileLock(str(db.parent / f".{db.name}.lock"))
        return lambda: lock
    if kind == "journal":
        jlock = JournalFileOpenLock(f"{journal_path(url)}.trials", grace_period=JOURNAL_LOCK_GRACE_S)

        @contextlib.contextmanager
        def held() -> Iterator[None]:
            jlock.acquire()
            try:
                yield
            finally:
                jlock.release()

        return held

    engine = sa.create_engine(url, pool_size=1, max_overflow=0, pool_pre_ping=True, connect_args=pg_connect_args(url))

    @contextlib.contextmanager
    def advisory() -> Iterator[None]:
        with engine.begin() as conn:  # the lock is the transaction's: released at its commit or disconnect
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_LOCK_KEY})
            yield

    return advisory
