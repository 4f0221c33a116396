"""Workers and scheduling: the loop that runs a study's trials, the local worker processes, their GPUs.

Owns `run_worker` (claim, run, finish, until the study is exhausted), `run_sweep` (create or resume the
study, start local workers, wait, summarize) and the worker command line (`python -m hmmscope.sweep worker`).
Every change of a trial's state goes through protocol.TrialStore; what a trial does is trial.py's; the local
processes are processes.py's, the parent run's updates parent.py's, a storage outage outage.py's. Imports the
other sweep modules and tracking; never the jobs or train directly.

- Heartbeats: a worker beats for its trial from a thread (`TrialStore.heartbeat`) every heartbeat_interval.
  A worker killed mid-trial leaves its trial RUNNING; once its heartbeat is older than grace_period the
  next worker poll fails it (one winner, user attr fail_reason "stale: ...") and enqueues a retry (at
  most max_retry per trial). Workers keep polling while trials are RUNNING, so a sweep finishes only when
  every slot has a finished trial. A trial whose worker finished its MLflow run but died before recording
  the result is retried the same way; its finished run is never counted, because the report reads one
  run per COMPLETE trial (user attr mlflow_run_id). A retried training trial resumes from its
  predecessor's checkpoint (trial.py).
- A worker cut off from its storage (its host lost the network): every call of the storage in its loop waits
  out the outage (`outage.Patient`: transient connection errors retried for up to STORE_OUTAGE_S, env
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
  (`parent.refresh_parent`, called by the worker that finished one): its counts (sweep/<state>), the best trial so
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
from typing import Any

import optuna
from optuna.trial import TrialState

from .. import env, tracking
from ..config import ConfigError
from ..interrupts import on_sigterm
from ..tracking.faults import store_error, store_reason
from .gpus import pin_gpu, worker_gpus
from .outage import Patient
from .parent import draw_comparison, refresh_parent
from .processes import SweepSummary, start_worker, stop_workers
from .protocol import TrialStore
from .spec import SweepSpec
from .status import collect_orphans, counts
from .storage import default_storage, open_storage, safe_url, storage_url
from .study import ATTR_PARENT, create_study, load_study, spec_of_study, stored_spec
from .trial import run_trial


class SweepDeleted(RuntimeError):
    """The sweep's study was deleted while this process ran it: one line, no traceback; its runs are ended."""


def _gone(e: KeyError, study_name: str, url: str) -> bool:
    """Is `e` the storage's answer for a study that is no longer there (Optuna: KeyError 'Record does not exist.' on
    an RDB storage, a KeyError on a journal)? Asked of the storage, by the study's name."""
    try:
        return study_name not in optuna.get_all_study_names(open_storage(url, create=False))
    except Exception:  # the storage itself out of reach: not a deleted study
        return False


def _deleted(study_name: str, url: str) -> SweepDeleted:
    return SweepDeleted(f"sweep {study_name!r} was deleted while it ran (its study is no longer in {safe_url(url)}); "
                        "its runs were ended")


def _raise_if_gone(e: KeyError, study_name: str, url: str) -> None:
    """SweepDeleted (one line) when `e` says the study is gone; else nothing (the caller raises `e` again)."""
    if _gone(e, study_name, url):
        raise _deleted(study_name, url) from None


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
    """The loop: claim a trial, run it, record it, end its other runs, say how it ended, update the parent run."""
    w = _Worker(study_name, storage_url_, uri, log or (lambda s: print(s, file=sys.stderr, flush=True)))
    done, drawn_at, pending = 0, time.monotonic(), False
    while max_trials is None or done < max_trials:
        tid = w.next_trial()
        if tid is None:
            break
        if (stored_spec(w.patient(w.store.storage.get_study_user_attrs, w.store.study_id)) or {}).get("hash") \
                != w.spec.hash:
            w.spec = spec_of_study(study_name, w.url)  # the sweep grew (study.py): its new cells are in the new spec
        out = w.run_claimed(tid)
        w.record(tid, out)
        w.end_other_runs(out)
        w.say(out)
        due = time.monotonic() - drawn_at >= COMPARISON_EVERY_S
        refresh_parent(w.uri, w.spec, w.study, w.parent, w.log, quiet=True, trial=out.trial.number,
                       compare=due)  # live: counts, best
        drawn_at, pending = (time.monotonic(), False) if due else (drawn_at, True)
        done += 1
    if pending and final_comparison:  # a comparison that fails says so in one line; an unreachable parent run waits
        with contextlib.suppress(Exception):  # for the next draw (run_sweep's, another worker's)
            draw_comparison(tracking.existing_run(w.uri, w.parent), w.spec, w.study, w.log, quiet=True)
    collect_orphans(w.uri, w.spec.experiment, w.log)
    return done


@dataclass
class _Outcome:
    """A claimed trial's end as this worker saw it: its state, value, error and user attrs, the MLflow runs it opened
    (the last one holds its result) and whether this worker recorded it (else another process finished it first)."""

    trial: Any  # optuna.Trial
    state: Any = None  # TrialState
    value: float | None = None
    err: BaseException | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    opened: list[str] = field(default_factory=list)
    recorded: bool = False


class _Worker:
    """One worker's study, store, parent run and patience (`outage.Patient`), and the steps of its loop."""

    def __init__(self, study_name: str, storage_url_: str, uri: str, log: Callable[[str], None]):
        self.name, self.log = study_name, log
        self.uri = tracking.resolve_uri(uri)
        self.url = storage_url(storage_url_)
        self.spec = spec_of_study(study_name, self.url)
        self.study = load_study(study_name, self.url, self.spec)
        self.store = TrialStore.of(self.study, self.url, self.spec.grace_period)
        self.parent = self.study.user_attrs[ATTR_PARENT]
        self.worker = {"host": socket.gethostname(), "pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}
        self.patient = Patient(log)

    def next_trial(self) -> int | None:
        """The next trial this worker claims, after failing the trials of dead workers (after grace_period, retried);
        while none is WAITING but some RUNNING, wait (their retries may come); None when the study is exhausted."""
        while True:
            self.patient(self.store.fail_stale, self.spec.max_retry, self.log)
            tid = self.patient(self.store.claim)
            if tid is not None:
                return tid
            if not self.patient(self.store.running):
                return None
            time.sleep(min(2.0, self.spec.heartbeat_interval))

    def run_claimed(self, tid: int) -> _Outcome:
        """Run the claimed trial with its heartbeat: COMPLETE, PRUNED, or FAIL (DivergedError and friends: the sweep
        carries on); Ctrl-C / SIGTERM hands it back (`hand_back`) and raises."""
        lost, opened = threading.Event(), []
        with self.store.heartbeat(tid, self.spec.heartbeat_interval, lost):
            with contextlib.suppress(Exception):
                self.store.storage.set_trial_user_attr(tid, "worker", self.worker)
            out = _Outcome(optuna.Trial(self.study, tid), opened=opened)
            try:
                out.value = run_trial(out.trial, self.spec, self.uri, self.parent, lost=lost, opened=opened)
                out.state = TrialState.COMPLETE
            except optuna.TrialPruned as e:
                out.state, out.err, out.attrs = TrialState.PRUNED, e, {"pruned_reason": str(e)}
            except Exception as e:  # DivergedError and friends: FAIL this trial, carry on
                out.state, out.err, out.attrs = TrialState.FAIL, e, {"fail_reason": f"{type(e).__name__}: {e}"[:2000]}
            except KeyboardInterrupt:  # Ctrl-C / SIGTERM: give the slot back (a WAITING copy, same params)
                self.hand_back(tid, out)
                raise
        return out

    def hand_back(self, tid: int, out: _Outcome) -> None:
        """An interrupted trial: FAIL "interrupted" and a WAITING copy (no retry budget used), with a second SIGTERM
        ignored meanwhile; its study gone: its runs end, SweepDeleted."""
        main_thread = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main_thread else None  # no second cut
        try:
            if self.store.finish(tid, TrialState.FAIL, attrs={"fail_reason": "interrupted"}):
                self.store.retry(tid, self.spec.max_retry, interrupted=True)  # not a crash: no budget used
        except KeyError as e:  # the study is gone: no trial to hand back
            if not _gone(e, self.name, self.url):
                raise
            self.settle(out.trial.number, out.opened, f"its sweep {self.name!r} was deleted while it ran")
            raise _deleted(self.name, self.url) from None
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, old)

    def record(self, tid: int, out: _Outcome) -> None:
        """Finish the trial in the storage (one winner: `out.recorded`): a non-finite objective is a FAIL; a pruned
        trial's value is its last reported one (as Study.tell does). Its study deleted: its runs end, SweepDeleted."""
        if out.state == TrialState.COMPLETE and not math.isfinite(out.value):
            out.state, out.err = TrialState.FAIL, ValueError(f"objective {self.spec.objective} is {out.value}")
            out.attrs = {"fail_reason": str(out.err)}
        if out.state == TrialState.PRUNED:  # as Study.tell does: a pruned trial's value is its last reported one
            steps = self.patient(self.store.storage.get_trial, tid).intermediate_values
            out.value = steps[max(steps)] if steps else None
        try:
            out.recorded = self.patient(self.store.finish, tid, out.state,
                                        out.value if out.state in (TrialState.COMPLETE, TrialState.PRUNED) else None,
                                        out.attrs)
        except KeyError as e:  # the study was deleted under this worker: its runs end, then one line
            if not _gone(e, self.name, self.url):
                raise
            self.settle(out.trial.number, out.opened, f"its sweep {self.name!r} was deleted while it ran")
            raise _deleted(self.name, self.url) from None

    def end_other_runs(self, out: _Outcome) -> None:
        """End FAILED, with the reason, every run of the trial but the one holding its recorded result: its own end
        was not written (the store out of reach), or its result is dropped (the trial was retried elsewhere), or a
        second run of a trial left open (a create whose reply was lost, then retried); so no run stays RUNNING and
        none stands as a second result."""
        done_here = out.state == TrialState.COMPLETE and out.recorded
        kept = out.opened[-1] if done_here and out.opened else None  # the run holding the trial's result
        number = out.trial.number
        for rid in _own_runs(self.uri, self.spec, number, out.opened):
            if rid == kept:
                continue
            if done_here:
                why = f"a second run of trial {number}, left open" + (f"; its result is in run {kept}" if kept else "")
            elif out.recorded:
                why = f"{type(out.err).__name__}: {out.err}"[:2000]
            else:
                why = (f"TrialLost: trial {number} was failed as stale by another worker, which retries it; "
                       "this run's result is dropped")
            with contextlib.suppress(Exception):
                if tracking.settle_run(self.uri, rid, why, finished_too=not out.recorded):
                    self.log(f"trial {number}: its run {rid} ended FAILED ({why[:200]})")

    def say(self, out: _Outcome) -> None:
        """One line: the trial's end, or its result dropped (another process finished it first)."""
        if not out.recorded:
            self.log(f"trial {out.trial.number} was finished by another process (failed as stale?) before this worker "
                     f"could record it as {out.state.name}; this result is dropped")
        elif out.state == TrialState.COMPLETE:
            self.log(f"trial {out.trial.number} complete: {self.spec.objective}={out.value:.6g} params={out.trial.params}")
        else:
            self.log(f"trial {out.trial.number} {out.state.name.lower()}: {type(out.err).__name__}: {out.err}")

    def settle(self, number: int, opened: list[str], why: str) -> None:
        """End FAILED every run this worker opened for trial `number` that is still RUNNING (in the trash too)."""
        for rid in _own_runs(self.uri, self.spec, number, opened):
            with contextlib.suppress(Exception):
                if tracking.settle_run(self.uri, rid, why):
                    self.log(f"trial {number}: its run {rid} ended FAILED ({why})")


def _own_runs(uri: str, spec, number: int, opened: list[str]) -> list[str]:
    """The runs this worker opened for trial `number`: those noted as they opened, and those the store holds with
    this process's lease and the trial's tags (one cut off before it was noted: its id lost with a create's reply,
    or a write failing between the create and the note; CI saw such a run stay RUNNING)."""
    found: list[str] = []
    with contextlib.suppress(Exception):  # a store still out of reach: the noted ones only
        found = tracking.own_runs(uri, spec.experiment, {"hmmscope.study": spec.name, "hmmscope.trial": number})
    return list(dict.fromkeys([*opened, *found]))


def worker_command(study_name: str, storage_url_: str, uri: str, max_trials: int | None = None,
                   final_comparison: bool = True) -> list[str]:
    """A worker's argv: a list of typed values, each joined to its option with '=' (a value that starts with
    '-' or holds spaces stays that option's value); never a string for a shell."""
    cmd = [sys.executable, "-m", "hmmscope.sweep", "worker", f"--study={study_name}",
           f"--storage={storage_url(storage_url_)}", f"--uri={uri}"]
    return cmd + ([f"--max-trials={int(max_trials)}"] if max_trials else []) + (
        [] if final_comparison else ["--no-final-comparison"])


def run_sweep(spec: SweepSpec, *, workers: int = 1, storage: str | None = None, uri: str | None = None,
              progress: Callable[[dict[str, int], int], None] | None = None,
              log: Callable[[str], None] = print, gpus: Sequence[str] | None = None,
              retry_failed: bool = False) -> SweepSummary:
    """Create/resume the study, run `workers` local worker processes until the sweep is exhausted.

    gpus: GPU ids to hand out round-robin (default: see `worker_gpus`). retry_failed: first re-queue every
    FAILED trial that was not retried (its retry budget starts again), so a sweep with failed cells can finish.
    """
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
        draw_comparison(tracking.existing_run(uri, parent), spec, study, log)  # refreshed (e.g. by newer code)
        return SweepSummary(spec.name, storage, parent, spec.n_trials, c["complete"], c["failed"], c["pruned"],
                            c["retried"], True)
    workers = min(workers, spec.n_trials)  # as the memory check counts: no more processes than trials
    assigned = worker_gpus(spec, workers, gpus)
    log(f"sweep {spec.name!r}: {spec.n_trials} trials, {workers} workers, storage {safe_url(storage)}, "
        f"MLflow parent run {parent}" + (f", GPUs {assigned}" if any(g is not None for g in assigned) else ""))
    return _run_workers(spec, study, storage, uri, parent, assigned, progress, log)


def _run_workers(spec: SweepSpec, study, storage: str, uri: str, parent: str, assigned: list[str | None],
                 progress: Callable[[dict[str, int], int], None] | None, log: Callable[[str], None]) -> SweepSummary:
    """Start a worker process per GPU slot, wait for them with the parent run RUNNING, then update it; on any
    exception (Ctrl-C, a scheduler's SIGTERM, the study deleted) stop them first (`processes.stop_workers`)."""
    procs: list[subprocess.Popen] = []

    def on_term(signum, frame):  # a scheduler's SIGTERM ends the sweep like Ctrl-C
        raise KeyboardInterrupt(f"signal {signum}")

    old_term = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    readers: list[threading.Thread] = []
    # the parent run is shared by every `sweep run` of the study (their summaries are the same): not exclusive
    with tracking.start_run(uri, spec.experiment, f"sweep-{spec.name}", resume=parent, exclusive=False) as prun:
        try:
            for gpu in assigned:
                proc, reader = start_worker(worker_command(spec.name, storage, uri, final_comparison=False), gpu, log)
                procs.append(proc)
                readers.append(reader)
            _wait(procs, readers, study, spec, storage, progress)
        except BaseException:
            stop_workers(procs, study, storage, spec, uri, log)
            raise
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
        collect_orphans(uri, spec.experiment, log)  # e.g. the runs of workers that were SIGKILLed
        c = refresh_parent(uri, spec, study, parent, log, run=prun)
    return SweepSummary(spec.name, storage, parent, spec.n_trials, c["complete"], c["failed"], c["pruned"],
                        c["retried"], False, [p.returncode for p in procs])


def _wait(procs: list[subprocess.Popen], readers: list[threading.Thread], study, spec: SweepSpec, storage: str,
          progress: Callable[[dict[str, int], int], None] | None) -> None:
    """Until every worker has exited: the counts to `progress` about once a second; then every line a worker wrote is
    out. The study deleted under the sweep: SweepDeleted (its workers are stopped by the caller)."""
    while any(p.poll() is None for p in procs):
        time.sleep(1.0)
        if progress is not None:
            try:
                progress(counts(study), spec.n_trials)
            except KeyError as e:  # the study deleted under this sweep: its workers are stopped by the caller
                _raise_if_gone(e, spec.name, storage)
                raise
    for r in readers:  # every line a worker wrote is out before the summary
        r.join(timeout=10)
    try:
        counts(study)
    except KeyError as e:  # deleted under it, its workers ended first (no progress callback to see it)
        _raise_if_gone(e, spec.name, storage)
        raise


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
        import torch  # lazy: torch (~1 s) off every sweep command that imports this module and trains nothing

        torch.set_num_threads(threads)
    try:
        n = run_worker(a.study, a.storage, a.uri, max_trials=a.max_trials, final_comparison=not a.no_final_comparison)
    except SweepDeleted as e:
        print(f"worker {os.getpid()}: {e}", file=sys.stderr, flush=True)
        return 1
    except Exception as e:  # the storage or the store failed (a full disk): one line, not a traceback
        if not store_error(e):
            raise
        print(f"worker {os.getpid()}: error: the store failed: {store_reason(e)}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"worker {os.getpid()}: interrupted; its trial was put back", file=sys.stderr, flush=True)
        return 130
    print(f"worker {os.getpid()}: ran {n} trial{'' if n == 1 else 's'}", file=sys.stderr, flush=True)
    return 0
