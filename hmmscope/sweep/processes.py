"""A sweep's local worker processes: started in their own session with one torch thread each (`worker_env`), their
output forwarded line by line through the caller's `log`, stopped on an interrupt (SIGTERM, then SIGKILL after
WORKER_STOP_S, the killed ones' trials handed back), and their exit codes told apart in `SweepSummary` (a crash, or a
stop from outside). Imports `protocol` and `status`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..interrupts import die_with_parent
from .protocol import TrialStore
from .spec import SweepSpec
from .status import collect_orphans

WORKER_STOP_S = 30.0  # how long a stopping sweep waits for its workers to hand their trials back before SIGKILL
STOP_SIGNALS = {int(getattr(signal, n)) for n in ("SIGKILL", "SIGTERM", "SIGINT") if hasattr(signal, n)}


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
        return [rc for rc in self.worker_returncodes if rc > 0 or (rc < 0 and -rc not in STOP_SIGNALS)]

    @property
    def killed_workers(self) -> list[int]:
        """Exit codes (-signal) of workers stopped from outside (SIGKILL, SIGTERM, SIGINT: OOM killer, a user);
        their trials are retried, so the sweep can still finish."""
        return [rc for rc in self.worker_returncodes if rc < 0 and -rc in STOP_SIGNALS]


def worker_env(gpu: str | None = None) -> dict[str, str]:
    """A worker's environment: one torch thread; CUDA_VISIBLE_DEVICES=gpu when given."""
    env = {**os.environ, "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def start_worker(argv: list[str], gpu: str | None, log: Callable[[str], object]) -> tuple[subprocess.Popen, threading.Thread]:
    """A worker process and the thread that forwards its output.

    Its own session: a terminal's Ctrl-C reaches only us, and we stop the workers cleanly; SIGTERM when we die, even
    by SIGKILL (PR_SET_PDEATHSIG): a worker hands its trial back and exits, so a resume never runs beside stale
    workers. Its output comes through `log` line by line (above the caller's progress bar, never onto it)."""
    proc = subprocess.Popen(argv, env=worker_env(gpu), start_new_session=True, preexec_fn=die_with_parent(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    reader = threading.Thread(target=forward, args=(proc.stdout, log), daemon=True)
    reader.start()
    return proc, reader


def forward(stream, log: Callable[[str], object]) -> None:
    """A worker's output, line by line, through `log` (the caller prints it above its bar)."""
    with contextlib.suppress(Exception):
        for line in iter(stream.readline, ""):
            log(line.rstrip("\n"))
    with contextlib.suppress(Exception):
        stream.close()


def stop_workers(procs: list[subprocess.Popen], study, storage: str, spec: SweepSpec, uri: str,
                 log: Callable[[str], object]) -> None:
    """Stop the workers still running: SIGTERM (each hands its trial back), SIGKILL after WORKER_STOP_S; a killed
    worker's trial is handed back here, and the runs left RUNNING are marked KILLED as orphans."""
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
