"""Workers and scheduling: the loop that runs a study's trials, the local worker processes, their GPUs.

Owns `run_worker` (claim, run, finish, until the study is exhausted), `run_sweep` (create or resume the
study, start local workers, wait, summarize) and the worker command line (`python -m hmmscope.sweep worker`).
Every change of a trial's state goes through protocol.TrialStore; what a trial does is trial.py's. Imports the
other sweep modules and tracking (lazily); never the jobs or train directly.

- Heartbeats: a worker beats for its trial from a thread (`TrialStore.heartbeat`) every heartbeat_interval.
  A worker killed mid-trial leaves its trial RUNNING; once its heartbeat is older than grace_period the
  next worker poll fails it (one winner, user attr fail_reason "stale: ...") and enqueues a retry (at
  most max_retry per trial). Workers keep polling while trials are RUNNING, so a sweep finishes only when
  every slot has a finished trial. A trial whose worker finished its MLflow run but died before recording
  the result is retried the same way; its finished run is never counted, because the report reads one
  run per COMPLETE trial (user attr mlflow_run_id). A retried training trial resumes from its
  predecessor's checkpoint (trial.py).
- A worker cut off from its storage (its host lost the network): every call of the storage in its loop waits
  out the outage (`_Patient`: transient connection errors retried for up to STORE_OUTAGE_S, env
  HMMSCOPE_STORE_OUTAGE_S; PostgreSQL connections bounded by storage.PG_CONNECT_ARGS), while another worker fails
  its trial as stale and retries it (in a new MLflow run: the cut worker is alive, its run not resumable). Its trial's
  heartbeat sees the trial taken (`TrialStore.heartbeat(lost=...)`) and its training stops at the next evaluation
  (trial.TrialLost); when the storage answers again its result is dropped (`finish` loses), and its run, if still
  RUNNING (its end could not be written) or FINISHED (a result no trial owns), is ended FAILED with the reason
  (`tracking.settle_run`). Its runs are those it noted as they opened and those the store holds under its lease
  with the trial's tags (`tracking.own_runs`: one cut off before it was noted; a second one of a create whose reply
  was lost and retried). Tested with three network namespaces: tests/test_netns_sweep.py.
- Interrupts: Ctrl-C or SIGTERM to `run_sweep` sends SIGTERM to its workers (by pid); a worker so stopped marks
  its trial FAIL (user attr fail_reason="interrupted"), enqueues a retry and exits; its MLflow run ends KILLED, as
  does the parent. Running the sweep again resumes it. A worker still there after WORKER_STOP_S is SIGKILLed and
  `run_sweep` hands its trial back for it (`TrialStore.hand_back`). A worker killed from outside cannot clean up:
  its trial is retried after grace_period (above) and its run is marked KILLED as an orphan (status.py) until a
  retry resumes it.
- Results: a pruned trial is PRUNED with its last reported value (as `Study.tell` records it) and user
  attr pruned_reason; a diverged (or otherwise failing) trial is FAIL with user attr fail_reason, and the
  sweep continues; a non-finite objective is a FAIL. `Study.tell` is not used: it writes the state outside
  the protocol (its sampler hook is a no-op for the random and TPE samplers used here).
- The parent run is RUNNING while `run_sweep` waits for its workers and ends FINISHED when it returns
  (KILLED on Ctrl-C); bare `run_worker` calls never touch its status. It is kept up to date as trials end
  (`refresh_parent`, called by the worker that finished one): its counts (sweep/<state>), the best trial so
  far (sweep/best_value, sweep/best_trial, tags hmmscope.best_params / hmmscope.best_run), and the comparison
  figure and pivot table (compare.py: they grow with the sweep, so a worker redraws them at most every
  COMPARISON_EVERY_S and once when it stops, unless `run_sweep` started it: that draws them at its end). Step k
  holds the counts and the best trial once k trials had finished
  (`status.finish_order`: by completion time): each finished trial has its own step, whichever worker logs it
  and however two finishes interleave, so no key is logged twice at one step, and the last step holds the
  final counts (`run_sweep`'s own last update only when a worker has not logged it).
- GPUs: gpus.py hands them out (`worker_gpus`: worker i's through CUDA_VISIBLE_DEVICES) and pins a joining
  worker (`pin_gpu`). The worker's host, pid and GPU are recorded on each trial it runs (user attr "worker").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .. import env
from ..config import ConfigError
from ..interrupts import die_with_parent, on_sigterm
from .gpus import pin_gpu, worker_gpus
from .protocol import TrialStore
from .spec import SweepSpec
from .status import best_trial, collect_orphans, counts
from .storage import default_storage, outage_limit, safe_url, storage_url
from .study import ATTR_PARENT, create_study, load_study, spec_of_study, stored_spec
from .trial import run_trial


class SweepDeleted(RuntimeError):
    """The sweep's study was deleted while this process ran it: one line, no traceback; its runs are ended."""


def _gone(e: KeyError, study_name: str, url: str) -> bool:
    """Is `e` the storage's answer for a study that is no longer there (Optuna: KeyError 'Record does not exist.' on
    an RDB storage, a KeyError on a journal)? Asked of the storage, by the study's name."""
    import optuna

    from .storage import open_storage

    try:
        return study_name not in optuna.get_all_study_names(open_storage(url, create=False))
    except Exception:  # the storage itself out of reach: not a deleted study
        return False


def _deleted(study_name: str, url: str) -> SweepDeleted:
    return SweepDeleted(f"sweep {study_name!r} was deleted while it ran (its study is no longer in {safe_url(url)}); "
                        "its runs were ended")


# A worker redraws the parent run's comparison (its figure and pivot table grow with the sweep) at most this often.
COMPARISON_EVERY_S = 30.0


def run_worker(study_name: str, storage_url_: str, uri: str, *, max_trials: int | None = None,
               log: Callable[[str], None] | None = None, final_comparison: bool = True) -> int:
    """Pull WAITING trials of the study and run them until none are left (or max_trials); returns trials run. The
    parent's comparison: redrawn COMPARISON_EVERY_S after this worker's last draw (or start), and when it stops (unless
    not `final_comparison`: run_sweep's workers). The study deleted under it, anywhere: SweepDeleted (one line)."""
    try:
        return _run_worker(study_name, storage_url_, uri, max_trials, log, final_comparison)
    except KeyError as e:
        if not _gone(e, study_name, url := storage_url(storage_url_)):
            raise
        raise _deleted(study_name, url) from None


def _run_worker(study_name: str, storage_url_: str, uri: str, max_trials: int | None,
                log: Callable[[str], None] | None, final_comparison: bool) -> int:
    import optuna
    from optuna.trial import TrialState

    from .. import tracking

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    uri = tracking.resolve_uri(uri)
    url = storage_url(storage_url_)
    spec = spec_of_study(study_name, url)
    study = load_study(study_name, url, spec)
    store = TrialStore.of(study, url, spec.grace_period)
    parent = study.user_attrs[ATTR_PARENT]
    worker = {"host": socket.gethostname(), "pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}
    patient = _Patient(log)
    done, drawn_at, pending = 0, time.monotonic(), False
    while max_trials is None or done < max_trials:
        patient(store.fail_stale, spec.max_retry, log)  # retries trials of dead workers (after grace_period)
        tid = patient(store.claim)
        if tid is None:
            if patient(store.running):
                time.sleep(min(2.0, spec.heartbeat_interval))
                continue
            break
        if (stored_spec(patient(store.storage.get_study_user_attrs, store.study_id)) or {}).get("hash") != spec.hash:
            spec = spec_of_study(study_name, url)  # the sweep grew (study.py): its new cells are in the new spec
        state, value, err, attrs = None, None, None, {}
        lost, opened = threading.Event(), []
        with store.heartbeat(tid, spec.heartbeat_interval, lost):
            with contextlib.suppress(Exception):
                store.storage.set_trial_user_attr(tid, "worker", worker)
            trial = optuna.Trial(study, tid)
            try:
                value = run_trial(trial, spec, uri, parent, lost=lost, opened=opened)
                state = TrialState.COMPLETE
            except optuna.TrialPruned as e:
                state, err, attrs = TrialState.PRUNED, e, {"pruned_reason": str(e)}
            except Exception as e:  # DivergedError and friends: FAIL this trial, carry on
                state, err, attrs = TrialState.FAIL, e, {"fail_reason": f"{type(e).__name__}: {e}"[:2000]}
            except KeyboardInterrupt:  # Ctrl-C / SIGTERM: give the slot back (a WAITING copy, same params)
                main_thread = threading.current_thread() is threading.main_thread()
                old = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main_thread else None  # no second cut
                try:
                    if store.finish(tid, TrialState.FAIL, attrs={"fail_reason": "interrupted"}):
                        store.retry(tid, spec.max_retry, interrupted=True)  # not a crash: no budget used
                except KeyError as e:  # the study is gone: no trial to hand back
                    if not _gone(e, study_name, url):
                        raise
                    _settle(uri, spec, trial.number, opened, f"its sweep {study_name!r} was deleted while it ran", log)
                    raise _deleted(study_name, url) from None
                finally:
                    if main_thread:
                        signal.signal(signal.SIGTERM, old)
                raise
        if state == TrialState.COMPLETE and not math.isfinite(value):
            state, err = TrialState.FAIL, ValueError(f"objective {spec.objective} is {value}")
            attrs = {"fail_reason": str(err)}
        if state == TrialState.PRUNED:  # as Study.tell does: a pruned trial's value is its last reported one
            steps = patient(store.storage.get_trial, tid).intermediate_values
            value = steps[max(steps)] if steps else None
        try:
            recorded = patient(store.finish, tid, state,
                               value if state in (TrialState.COMPLETE, TrialState.PRUNED) else None, attrs)
        except KeyError as e:  # the study was deleted under this worker: its runs end, then one line
            if not _gone(e, study_name, url):
                raise
            _settle(uri, spec, trial.number, opened, f"its sweep {study_name!r} was deleted while it ran", log)
            raise _deleted(study_name, url) from None
        done_here = state == TrialState.COMPLETE and recorded
        kept = opened[-1] if done_here and opened else None  # the run holding the trial's result
        for rid in _own_runs(uri, spec, trial.number, opened):
            # its own end was not written (the store out of reach), or its result is dropped (the trial was retried
            # elsewhere), or a second run of a trial left open (a create whose reply was lost, then retried): FAILED
            # with the reason, so that no run stays RUNNING and none stands as a second result
            if rid == kept:
                continue
            if done_here:
                why = f"a second run of trial {trial.number}, left open" + (f"; its result is in run {kept}" if kept else "")
            elif recorded:
                why = f"{type(err).__name__}: {err}"[:2000]
            else:
                why = (f"TrialLost: trial {trial.number} was failed as stale by another worker, which retries it; "
                       "this run's result is dropped")
            with contextlib.suppress(Exception):
                if tracking.settle_run(uri, rid, why, finished_too=not recorded):
                    log(f"trial {trial.number}: its run {rid} ended FAILED ({why[:200]})")
        if not recorded:
            log(f"trial {trial.number} was finished by another process (failed as stale?) before this worker "
                f"could record it as {state.name}; this result is dropped")
        elif state == TrialState.COMPLETE:
            log(f"trial {trial.number} complete: {spec.objective}={value:.6g} params={trial.params}")
        else:
            log(f"trial {trial.number} {state.name.lower()}: {type(err).__name__}: {err}")
        due = time.monotonic() - drawn_at >= COMPARISON_EVERY_S
        refresh_parent(uri, spec, study, parent, log, quiet=True, trial=trial.number, compare=due)  # live: counts, best
        drawn_at, pending = (time.monotonic(), False) if due else (drawn_at, True)
        done += 1
    if pending and final_comparison:  # a comparison that fails says so in one line; an unreachable parent run waits
        with contextlib.suppress(Exception):  # for the next draw (run_sweep's, another worker's)
            _log_comparison(tracking.existing_run(uri, parent), spec, study, log, quiet=True)
    collect_orphans(uri, spec.experiment, log)
    return done


def _own_runs(uri: str, spec, number: int, opened: list[str]) -> list[str]:
    """The runs this worker opened for trial `number`: those noted as they opened, and those the store holds with
    this process's lease and the trial's tags (one cut off before it was noted: its id lost with a create's reply,
    or a write failing between the create and the note; CI saw such a run stay RUNNING)."""
    from .. import tracking

    found: list[str] = []
    with contextlib.suppress(Exception):  # a store still out of reach: the noted ones only
        found = tracking.own_runs(uri, spec.experiment, {"hmmscope.study": spec.name, "hmmscope.trial": number})
    return list(dict.fromkeys([*opened, *found]))


def _settle(uri: str, spec, number: int, opened: list[str], why: str, log: Callable[[str], None]) -> None:
    """End FAILED every run this worker opened for trial `number` that is still RUNNING (in the trash too)."""
    from .. import tracking

    for rid in _own_runs(uri, spec, number, opened):
        with contextlib.suppress(Exception):
            if tracking.settle_run(uri, rid, why):
                log(f"trial {number}: its run {rid} ended FAILED ({why})")


def _transient(e: BaseException) -> bool:
    """A storage error that a new connection may not have: the database unreachable, a connection dropped (SQLAlchemy's
    OperationalError / InterfaceError, or Optuna's StorageInternalError wrapping one). Not a full disk or a read-only
    store (`tracking.faults.permanent_fault`): waiting does not cure those, so they are said at once."""
    from ..tracking.faults import permanent_fault

    if permanent_fault(e) is not None:
        return False
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"OperationalError", "InterfaceError", "StorageInternalError"}) or \
        getattr(e, "connection_invalidated", False)


class _Patient:
    """Calls of the storage that outlast an outage: a transient error (`_transient`) is retried, 1 s then doubling to
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
                if not _transient(e) or time.monotonic() - t0 > self.limit:
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


@dataclass
class SweepSummary:
    study_name: str
    storage: str
    parent_run_id: str
    n_trials: int  # slots (grid points x seeds, or n_trials)
    complete: int
    failed: int
    pruned: int
    retried: int  # trials lost with their worker and run again
    already_complete: bool
    worker_returncodes: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.complete + self.failed + self.pruned >= self.n_trials

    @property
    def crashed_workers(self) -> list[int]:
        """Exit codes of workers that crashed: an error exit (a traceback) or a crash signal (e.g. SIGSEGV)."""
        return [rc for rc in self.worker_returncodes if rc > 0 or (rc < 0 and -rc not in _STOP_SIGNALS)]

    @property
    def killed_workers(self) -> list[int]:
        """Exit codes (-signal) of workers stopped from outside (SIGKILL, SIGTERM, SIGINT: OOM killer, a user);
        their trials are retried, so the sweep can still finish."""
        return [rc for rc in self.worker_returncodes if rc < 0 and -rc in _STOP_SIGNALS]


_STOP_SIGNALS = {int(getattr(signal, n)) for n in ("SIGKILL", "SIGTERM", "SIGINT") if hasattr(signal, n)}


def worker_command(study_name: str, storage_url_: str, uri: str, max_trials: int | None = None,
                   final_comparison: bool = True) -> list[str]:
    """A worker's argv: a list of typed values, each joined to its option with '=' (a value that starts with
    '-' or holds spaces stays that option's value); never a string for a shell."""
    cmd = [sys.executable, "-m", "hmmscope.sweep", "worker", f"--study={study_name}",
           f"--storage={storage_url(storage_url_)}", f"--uri={uri}"]
    return cmd + ([f"--max-trials={int(max_trials)}"] if max_trials else []) + (
        [] if final_comparison else ["--no-final-comparison"])


def worker_env(gpu: str | None = None) -> dict[str, str]:
    """A worker's environment: one torch thread; CUDA_VISIBLE_DEVICES=gpu when given."""
    env = {**os.environ, "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


WORKER_STOP_S = 30.0  # how long a stopping sweep waits for its workers to hand their trials back before SIGKILL


def run_sweep(spec: SweepSpec, *, workers: int = 1, storage: str | None = None, uri: str | None = None,
              progress: Callable[[dict[str, int], int], None] | None = None,
              log: Callable[[str], None] = print, gpus: Sequence[str] | None = None,
              retry_failed: bool = False) -> SweepSummary:
    """Create/resume the study, run `workers` local worker processes until the sweep is exhausted.

    gpus: GPU ids to hand out round-robin (default: see `worker_gpus`). retry_failed: first re-queue every
    FAILED trial that was not retried (its retry budget starts again), so a sweep with failed cells can finish.
    """
    from .. import tracking

    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    uri = tracking.resolve_uri(uri)
    storage = storage_url(storage or spec.storage or default_storage())
    study, parent, created = create_study(spec, storage, uri, log=log)
    collect_orphans(uri, spec.experiment, log)
    if retry_failed:
        requeued = TrialStore.of(study, storage, spec.grace_period).requeue_failed()
        log(f"sweep {spec.name!r}: re-queued {len(requeued)} failed trial(s)" +
            (f" as {', '.join(map(str, requeued))}" if requeued else ""))
    c = counts(study)
    if not created and c["waiting"] == 0 and c["running"] == 0:
        log(f"sweep {spec.name!r} is complete ({c['complete']} complete, {c['failed']} failed, "
            f"{c['pruned']} pruned); nothing to do")
        _log_comparison(tracking.existing_run(uri, parent), spec, study, log)  # refreshed (e.g. by newer code)
        return SweepSummary(spec.name, storage, parent, spec.n_trials, c["complete"], c["failed"], c["pruned"],
                            c["retried"], True)
    workers = min(workers, spec.n_trials)  # as the memory check counts: no more processes than trials
    assigned = worker_gpus(spec, workers, gpus)
    log(f"sweep {spec.name!r}: {spec.n_trials} trials, {workers} workers, storage {safe_url(storage)}, "
        f"MLflow parent run {parent}" + (f", GPUs {assigned}" if any(g is not None for g in assigned) else ""))
    procs: list[subprocess.Popen] = []

    def on_term(signum, frame):  # a scheduler's SIGTERM ends the sweep like Ctrl-C
        raise KeyboardInterrupt(f"signal {signum}")

    old_term = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    readers: list[threading.Thread] = []
    # the parent run is shared by every `sweep run` of the study (their summaries are the same): not exclusive
    with tracking.start_run(uri, spec.experiment, f"sweep-{spec.name}", resume=parent, exclusive=False) as prun:
        try:
            for gpu in assigned:
                # own session: a terminal's Ctrl-C reaches only us, and we stop the workers cleanly; SIGTERM
                # when we die, even by SIGKILL (PR_SET_PDEATHSIG): a worker hands its trial back and exits, so
                # a resume never runs beside stale workers. Its output comes through `log` line by line (above
                # the caller's progress bar, never onto it)
                procs.append(subprocess.Popen(worker_command(spec.name, storage, uri, final_comparison=False),
                                              env=worker_env(gpu),
                                              start_new_session=True, preexec_fn=die_with_parent(),
                                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1))
                readers.append(threading.Thread(target=_forward, args=(procs[-1].stdout, log), daemon=True))
                readers[-1].start()
            while any(p.poll() is None for p in procs):
                time.sleep(1.0)
                if progress is not None:
                    try:
                        progress(counts(study), spec.n_trials)
                    except KeyError as e:  # the study deleted under this sweep: its workers are stopped below
                        if _gone(e, spec.name, storage):
                            raise _deleted(spec.name, storage) from None
                        raise
            for r in readers:  # every line a worker wrote is out before the summary
                r.join(timeout=10)
            try:
                counts(study)
            except KeyError as e:  # deleted under it, its workers ended first (no progress callback to see it)
                if _gone(e, spec.name, storage):
                    raise _deleted(spec.name, storage) from None
                raise
        except BaseException:
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGTERM)
            killed = []
            stop_by = time.monotonic() + WORKER_STOP_S
            for p in procs:
                try:
                    p.wait(timeout=max(stop_by - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGKILL)
                    p.wait()
                    killed.append(p.pid)
            # a worker SIGKILLed above left its trial RUNNING: handed back here (as it would have done itself), not
            # after the grace period; it, or one whose own end-of-run write failed (sqlite locked under load), left
            # its run RUNNING: its process is gone now, so it is an orphan, marked KILLED here
            with contextlib.suppress(Exception):
                for n, pid in TrialStore.of(study, storage).hand_back(socket.gethostname(), killed, spec.max_retry):
                    log(f"trial {n}: its worker (pid {pid}) did not stop in {WORKER_STOP_S:g} s and was killed; "
                        "the trial was put back")
            with contextlib.suppress(Exception):
                collect_orphans(uri, spec.experiment, log)
            raise
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
        collect_orphans(uri, spec.experiment, log)  # e.g. the runs of workers that were SIGKILLed
        c = refresh_parent(uri, spec, study, parent, log, run=prun)
    return SweepSummary(spec.name, storage, parent, spec.n_trials, c["complete"], c["failed"], c["pruned"],
                        c["retried"], False, [p.returncode for p in procs])


def refresh_parent(uri: str, spec: SweepSpec, study, parent: str, log: Callable[[str], object], *,
                   run=None, quiet: bool = False, trial: int | None = None, compare: bool = True) -> dict[str, int]:
    """Bring the parent run up to date (module docstring): the counts and the best trial at the step of `trial`
    (the trial that just ended: its place in the finish order), or, with no `trial`, at the last step unless it
    is there already; the comparison. Returns the counts now. A failure is one line (`log`), never the sweep's;
    `quiet`: no line for a comparison written (a worker calls this after every trial); `compare`: draw it."""
    from .. import tracking
    from .status import finish_order

    c = counts(study)
    try:
        run = run or tracking.existing_run(uri, parent)
        order = finish_order(study)
        if trial is not None:
            step = order.index(trial) + 1 if trial in order else None
        else:  # run_sweep's own last word, unless a worker said it
            logged = {m.step for m in tracking.client(uri).get_metric_history(run.run_id, "sweep/complete")}
            step = len(order) if order and len(order) not in logged else None
        if step is not None:
            upto = set(order[:step])
            run.log_metrics({f"sweep/{k}": v for k, v in counts(study, finished=upto).items()}, step=step)
            then = best_trial(study, among=upto)
            if then is not None:
                run.log_metrics({"sweep/best_value": then.value, "sweep/best_trial": then.number}, step=step)
        best = best_trial(study)
        if best is not None:
            run.set_tags({"hmmscope.best_params": json.dumps(best.params),
                          "hmmscope.best_run": best.user_attrs.get("mlflow_run_id", "")})
    except Exception as e:  # e.g. a read-only store: the trials' results stand without the parent's summary
        log(f"sweep {spec.name!r}: parent run not updated: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return c
    if compare:
        _log_comparison(run, spec, study, log, quiet=quiet)
    return c


def _log_comparison(run, spec: SweepSpec, study, log: Callable[[str], object], quiet: bool = False) -> None:
    """The parent run's comparison figure and pivot table (compare.py); a failure is one line, never the sweep's
    (`quiet`: no line when it worked)."""
    from .. import tracking
    from .compare import FOLDER, log_comparison

    def metrics_of(run_id: str) -> dict[str, float]:  # a trial's run's metrics: the oracle's reference line
        r = tracking.get_run(run.uri, run_id)
        return dict(r.data.metrics) if r is not None else {}

    try:
        if log_comparison(run, spec, study, metrics_of=metrics_of) is not None and not quiet:
            log(f"sweep {spec.name!r}: comparison figure and pivot table logged to the parent run ({FOLDER}/)")
    except Exception as e:  # e.g. a read-only store: the sweep's results stand without the figure
        log(f"sweep {spec.name!r}: comparison not logged: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def _forward(stream, log: Callable[[str], object]) -> None:
    """A worker's output, line by line, through `log` (the caller prints it above its bar)."""
    with contextlib.suppress(Exception):
        for line in iter(stream.readline, ""):
            log(line.rstrip("\n"))
    with contextlib.suppress(Exception):
        stream.close()


# ---------------------------------------------------------------- worker entry point (python -m hmmscope.sweep)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hmmscope.sweep")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run trials of an existing study until it is exhausted")
    w.add_argument("--study", required=True)
    w.add_argument("--storage", required=True)
    w.add_argument("--uri", required=True)
    w.add_argument("--max-trials", type=int, default=None)
    w.add_argument("--gpu", type=int, default=None, help="join with this one visible GPU")
    w.add_argument("--no-final-comparison", action="store_true", help="run_sweep draws the comparison at its end")
    a = ap.parse_args(argv)
    if a.gpu is not None:
        pin_gpu(a.gpu)
    signal.signal(signal.SIGTERM, on_sigterm)  # run_sweep stops its workers with SIGTERM: hand the trial back, exit
    if threads := env.threads():
        import torch

        torch.set_num_threads(threads)
    try:
        n = run_worker(a.study, a.storage, a.uri, max_trials=a.max_trials, final_comparison=not a.no_final_comparison)
    except SweepDeleted as e:
        print(f"worker {os.getpid()}: {e}", file=sys.stderr, flush=True)
        return 1
    except Exception as e:  # the storage or the store failed (a full disk): one line, not a traceback
        from ..tracking.faults import store_error, store_reason

        if not store_error(e):
            raise
        print(f"worker {os.getpid()}: error: the store failed: {store_reason(e)}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"worker {os.getpid()}: interrupted; its trial was put back", file=sys.stderr, flush=True)
        return 130
    print(f"worker {os.getpid()}: ran {n} trial{'' if n == 1 else 's'}", file=sys.stderr, flush=True)
    return 0
