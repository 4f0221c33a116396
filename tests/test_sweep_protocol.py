"""hmmscope.sweep.protocol: one winner per trial transition, raced by real processes on every storage kind
(SQLite, a journal file, PostgreSQL), and what Optuna's public storage API does on its own (the reasons for
the storage mutex the module docstring gives)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pg_server import postgres_server

from hmmscope.config import ConfigError
from hmmscope.sweep import TrialStore, journal_path, open_storage, quiet_optuna, storage_kind, storage_url

RACER = Path(__file__).resolve().parent / "sweep_racer.py"
N_TRIALS, N_RACERS = 12, 3


class Spec:  # the heartbeat settings open_storage takes from a sweep spec
    heartbeat_interval, grace_period = 1, 1


@pytest.fixture(scope="module")
def pg_url():
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "journal", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/optuna.db"
    if request.param == "journal":
        return f"journal://{tmp_path}/optuna.log"
    return request.getfixturevalue("pg_url")


def _new_study(url: str, name: str, n: int = N_TRIALS):
    import optuna

    quiet_optuna()
    study = optuna.create_study(study_name=name, storage=open_storage(url, Spec))
    for i in range(n):
        study.enqueue_trial({"x": i}, skip_if_exists=False)
    return study


def _go(folder: Path, n: int, procs: list[subprocess.Popen]) -> list[list[int]]:
    """Start phase n once every racer is ready; the trial ids each racer reports."""
    deadline = time.time() + 240
    while not all((folder / f"ready{n}-{i}").exists() for i in range(len(procs))):
        assert all(p.poll() is None for p in procs), [p.communicate()[1] for p in procs if p.poll() is not None]
        assert time.time() < deadline, f"racers never got ready for phase {n}"
        time.sleep(0.02)
    (folder / f"go{n}").touch()
    while not all((folder / f"out{n}-{i}").exists() for i in range(len(procs))):
        assert all(p.poll() in (None, 0) for p in procs), [p.communicate()[1] for p in procs if p.poll()]
        assert time.time() < deadline, f"racers never finished phase {n}"
        time.sleep(0.02)
    return [json.loads((folder / f"out{n}-{i}").read_text()) for i in range(len(procs))]


def _once(got: list[list[int]]) -> set[int]:
    flat = [t for g in got for t in g]
    assert len(flat) == len(set(flat)), f"won twice: {sorted(t for t in set(flat) if flat.count(t) > 1)}"
    return set(flat)


def test_trials_have_one_winner_across_processes(url, tmp_path):
    """N_RACERS processes, each with its own storage, race through TrialStore: (1) claim the same WAITING
    trials; (2) fail the same stale trials and retry them; (3) one worker finishes RUNNING trials while the
    others fail them as stale. Exactly one process wins each trial, every stale failure has one retry, and
    the winner's value and reason are the ones recorded."""
    from optuna.trial import TrialState

    folder = tmp_path / "race"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(RACER), url, str(i), str(folder)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(N_RACERS)]
    try:
        claim, stale, finish = (_new_study(url, name) for name in ("claim", "stale", "finish"))
        for study in (stale, finish):  # RUNNING, each with one beat: stale once the racers are ready
            store = TrialStore.of(study, url, Spec.grace_period)
            while store.claim() is not None:
                pass
        stale_from = time.time() + Spec.grace_period + 1.2  # heartbeats have whole seconds on SQLite
        _go(folder, 0, procs)  # the racers have loaded the studies
        claimed = _once(_go(folder, 1, procs))  # (1) claims
        trials = claim.get_trials(deepcopy=False)
        assert claimed == {t._trial_id for t in trials} and {t.state for t in trials} == {TrialState.RUNNING}

        time.sleep(max(0.0, stale_from - time.time()))
        before = {t._trial_id: t.number for t in stale.get_trials(deepcopy=False)}
        assert _once(_go(folder, 2, procs)) == set(before)  # (2) stale failures and their retries
        trials = stale.get_trials(deepcopy=False)
        assert all(t.state == TrialState.FAIL and t.user_attrs["fail_reason"].startswith("stale")
                   for t in trials if t._trial_id in before)
        retries = [t for t in trials if t.state == TrialState.WAITING]
        assert sorted(t.system_attrs["retry_history"] for t in retries) == [[n] for n in sorted(before.values())]

        running = {t._trial_id for t in finish.get_trials(deepcopy=False)}
        got = _go(folder, 3, procs)  # (3) the worker's finish against stale failures
        completed, failed = set(got[0]), _once(got[1:])
        assert not completed & failed and completed | failed == running
        trials = {t._trial_id: t for t in finish.get_trials(deepcopy=False)}
        for tid in completed:
            t = trials[tid]
            assert t.state == TrialState.COMPLETE and t.value == float(tid) and "fail_reason" not in t.user_attrs
        for tid in failed:
            t = trials[tid]
            assert t.state == TrialState.FAIL and t.value is None and t.user_attrs["fail_reason"].startswith("stale")
        retried = [t.system_attrs["retry_history"] for t in trials.values() if t.state == TrialState.WAITING]
        assert sorted(retried) == sorted([trials[tid].number] for tid in failed)  # one retry per stale failure
        assert all(p.wait(timeout=60) == 0 for p in procs), [p.communicate()[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_journal_mutex_left_by_a_dead_process(tmp_path, monkeypatch):
    """A process killed inside a transition leaves the journal's mutex (its lock file) behind: the next process
    breaks it once it has not changed for the grace period, and goes on."""
    from hmmscope.sweep import protocol

    monkeypatch.setattr(protocol, "JOURNAL_LOCK_GRACE_S", 3)
    url = f"journal://{tmp_path}/optuna.log"
    study = _new_study(url, "dead", n=1)
    lock = tmp_path / "optuna.log.trials.lock"
    lock.touch()  # what the dead holder left
    t0 = time.time()
    assert TrialStore.of(study, url, Spec.grace_period).claim() == study.get_trials()[0]._trial_id
    assert time.time() - t0 >= 3 and not lock.exists()


# ---------------------------------------------------------------- why the mutex (module docstring)


def test_public_api_cannot_record_a_reason_with_the_state(url):
    """Optuna's public API writes a trial's reason (a user attr) and its state in separate calls. Played in
    this order, a process failing a stale trial leaves its reason on a trial the worker finished first."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    study = _new_study(url, "reason", n=1)
    (t,) = study.get_trials()
    storage = open_storage(url, Spec)
    assert storage.set_trial_state_values(t._trial_id, TrialState.RUNNING)
    storage.set_trial_user_attr(t._trial_id, "fail_reason", "stale")  # the failing process: its reason first
    assert storage.set_trial_state_values(t._trial_id, TrialState.COMPLETE, [0.5])  # the worker wins the state
    with pytest.raises(UpdateFinishedTrialError):
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # too late for the state, not for the reason
    (t,) = study.get_trials()
    assert t.state == TrialState.COMPLETE and t.user_attrs["fail_reason"] == "stale"


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_public_api_claim_when_reads_interleave(kind, tmp_path, request):
    """`set_trial_state_values(RUNNING)` reads the trial, then writes it. Process B claims while A is between
    its read and its write: on SQLite both claim the trial (SELECT ... FOR UPDATE is not a lock there); on
    PostgreSQL B waits on A's row lock and loses."""
    import sqlalchemy as sa
    from optuna.trial import TrialState

    url = f"sqlite:///{tmp_path}/optuna.db" if kind == "sqlite" else request.getfixturevalue("pg_url")
    study = _new_study(url, "interleave", n=1)
    tid = study.get_trials()[0]._trial_id
    a, b = open_storage(url), open_storage(url)
    won: dict[str, bool] = {}
    b_thread = threading.Thread(target=lambda: won.update(b=b.set_trial_state_values(tid, TrialState.RUNNING)))
    waited: list[bool] = []

    @sa.event.listens_for(a.engine, "before_cursor_execute")
    def between_read_and_write(conn, cursor, statement, params, context, executemany):
        if not waited and statement.lstrip().upper().startswith("UPDATE TRIALS"):
            b_thread.start()
            b_thread.join(timeout=3)
            waited.append(b_thread.is_alive())  # True: B is blocked on A's lock

    won["a"] = a.set_trial_state_values(tid, TrialState.RUNNING)
    b_thread.join(timeout=30)
    if kind == "sqlite":
        assert waited == [False] and won == {"a": True, "b": True}  # two claims of one trial
    else:
        assert waited == [True] and won == {"a": True, "b": False}


# ---------------------------------------------------------------- storage URLs


def test_storage_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert journal_path("journal:///abs/dir/s.log") == Path("/abs/dir/s.log")
    assert journal_path("runs/s.journal") == tmp_path / "runs" / "s.journal"
    assert storage_url("runs/s.log") == f"journal://{tmp_path}/runs/s.log"
    assert storage_url("sqlite:///x.db") == "sqlite:///x.db" and journal_path("sqlite:///x.log") is None
    assert [storage_kind(u) for u in ("sqlite:///x.db", "postgresql+psycopg2://u@h/db", "x.log")] == [
        "sqlite", "postgresql", "journal"]
    for bad in ("journal://relative/s.log", "journal:///"):
        with pytest.raises(ConfigError, match="journal:///ABSOLUTE/PATH"):
            journal_path(bad)
    with pytest.raises(ConfigError, match="sweeps run on sqlite"):
        storage_kind("mysql://u@127.0.0.1/db")
    with pytest.raises(ConfigError, match="no journal storage"):
        open_storage(f"journal://{tmp_path}/missing.log", create=False)
    assert not (tmp_path / "missing.log").exists()


def _fail_once(store, interrupted: bool, max_retry: int):
    """Claim the WAITING trial, fail it (a crash or an interrupt), retry it; the retry's number or None."""
    from optuna.trial import TrialState

    tid = store.claim()
    assert tid is not None
    assert store.finish(tid, TrialState.FAIL, attrs={"fail_reason": "interrupted" if interrupted else "boom"})
    return store.retry(tid, max_retry, interrupted=interrupted)


def test_hand_back_puts_back_only_the_killed_workers_trials(tmp_path):
    """Before: a worker SIGKILLed after not stopping in time (a loaded machine) left its trial RUNNING until the grace
    period ran out; the sweep now hands back the trials of the workers it killed, and only theirs."""
    from optuna.trial import TrialState

    url = f"sqlite:///{tmp_path}/optuna.db"
    study = _new_study(url, "back", n=3)
    store = TrialStore.of(study, url, 60)
    ids = [store.claim() for _ in range(3)]
    for tid, (host, pid) in zip(ids, [("h", 11), ("h", 12), ("other", 11)], strict=True):
        store.storage.set_trial_user_attr(tid, "worker", {"host": host, "pid": pid})
    assert store.hand_back("h", [11], max_retry=0) == [(0, 11)]  # an interrupt uses no retry budget
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert by_number[0].state == TrialState.FAIL and by_number[0].user_attrs["fail_reason"] == "interrupted"
    assert by_number[1].state == by_number[2].state == TrialState.RUNNING  # another pid, another host
    (retry,) = [t for t in by_number.values() if t.state == TrialState.WAITING]
    assert retry.system_attrs["fixed_params"] == {"x": 0}  # the same cell again
    assert store.hand_back("h", [11], max_retry=0) == []  # once


def test_interrupts_do_not_use_the_crash_budget_and_failed_trials_can_be_requeued(tmp_path):
    """Before: a one-trial sweep interrupted three times ended FAILED (max_retry used up by signals), and
    nothing could run it again. Now: interrupts are free, crashes count, --retry-failed re-queues."""

    url = f"sqlite:///{tmp_path}/optuna.db"
    study = _new_study(url, "budget", n=1)
    store = TrialStore.of(study, url, 1)
    for _ in range(5):  # five pre-emptions with max_retry = 2: still retried each time
        assert _fail_once(store, True, 2) is not None
    assert _fail_once(store, False, 2) is not None  # crash 1
    assert _fail_once(store, True, 2) is not None  # an interrupt between crashes: free
    assert _fail_once(store, False, 2) is not None  # crash 2
    assert _fail_once(store, False, 2) is None  # crash 3 > max_retry: the cell ends FAILED
    assert store.requeue_failed() != [] and store.requeue_failed() == []  # once per failed cell
    assert _fail_once(store, False, 2) is not None  # its budget starts again
