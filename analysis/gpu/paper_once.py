"""The paper experiment in ONE device command, driven by a deadline (issue 28; analysis/gpu/README.md).

    OUT=$OUT bash analysis/gpu/session.sh paper-once [FLAGS]      # on the device (session.sh runs `run` below)
    DRY=1 OUT=/tmp/dry bash analysis/gpu/session.sh paper-once    # the rehearsal here: CPU, tiny model, <= 240 s

    python3 analysis/gpu/paper_once.py run --out OUT [FLAGS]      # the orchestrator (standard library + hmmscope.config)
    python analysis/gpu/paper_once.py record --store S --rec R --name N --out D   # phase 6's record (needs MLflow)
    python3 analysis/gpu/paper_once.py collect FILES_AT analysis/results/paper-gpu-figures   # after the session

Phases, each a subprocess under its own time limit, each packed into OUT/<n>-<phase>.tar.gz as soon as it ends (a
phase cut off by its limit, or a command killed by the device tool's limit, leaves every earlier phase's archive):

1. setup     `session.sh setup-once`: the carried wheels into /tmp/venv, hmmscope editable, env.txt. Runs at t = 0
             BESIDE phase 2 (setup is pip on the CPU; the bench needs only the image's torch): --setup-s cap.
2. bench     `hmmscope bench train --variants V --json` at the training shape (batch x episode tokens), under the
             image's python3 with PYTHONPATH = the checkout: every step variant (eager; a pinned SDPA kernel;
             each block compiled) timed from the same weights, with its one-off compile time, MFU against the
             GEMM rate measured in the same run: --bench-s cap, from t = 0.
   plan      `bench_variants.choose_variant`: the variant fitting most steps into the training time left, its compile time
             counted against it; steps = floor((train window - fixed - compile) / (step x ratio) / quantum) x
             quantum, at most --max-steps (the formula, its numbers and the target it meets or misses are printed
             and kept in plan.json). No bench rows: eager and --target-steps (train's --deadline still holds).
3. train     `hmmscope train --no-evaluate --deadline` until its planned end (below): the emergence curves at
             --eval-points evaluations, one checkpoint at the end (the deadline stop writes it too).
4. figure1   `hmmscope evaluate RUN --n-episodes E`: Figure 1 on seen and unseen tasks with the oracles, the counting
             baselines, best_counting (fitted on eval.fit_episodes fit-task episodes) and family_bayes over
             eval.family_tasks = M tasks (--family-tasks; the config's 256 at the paper preset).
5. analyze   `hmmscope analyze RUN`: shuffle test, task / state / k-back and belief probes, claims with CIs and
             verdicts, at most --analyze-s (issue 28: 120 s).
6. pack      paper_record.py's `record` (MLflow): report.md, claims.csv, curves.csv, run.json, trials.csv, phases.csv,
             bench.json, plan.json, figures/ and a trimmed store (mlflow.db + artifacts, no checkpoint or model
             weights), then the archive.

Time plan (seconds after --t0, the command's start): pack starts by DEADLINE - PACK_S; analyze gets ANALYZE_S before
that; Figure 1 FIG1_S before that; training ends by DEADLINE - PACK_S - ANALYZE_S - FIG1_S (its `--deadline`).
A phase that ends early passes its slack on (analyze stays capped at ANALYZE_S; what is left ends the command early);
Figure 1 may run on past its FIG1_S until analyze would keep less than --analyze-min-s (so a late training, or a
slow Figure 1, takes from analyze's margin first); a phase that would get less than --min-phase-s is skipped, and
says so. Every phase's line: its start, end, seconds, exit code and
status (ok, failed, cut off, skipped) goes to the console and to phases.csv in every archive.

Before any phase (and any folder): the flags' ranges and, unless --dry, the CUDA device (paper_plan.flag_problem,
device_problem): one line, exit 2. The last line says how many phases failed (failed or cut off); the exit code is 1
when any did, 143 when the command was stopped by SIGTERM.

Killed from outside (SIGTERM or SIGKILL at the device tool's limit): the phase child gets SIGTERM (a SIGTERM to this
process is passed on, and PR_SET_PDEATHSIG sends it when this process dies), so a training run ends KILLED rather
than RUNNING; a child still there STOP_GRACE_S later is SIGKILLed, and `hmmscope runs gc` ends the runs it held
KILLED and frees their locks (Session.settle); the archives already in OUT stay as they were (each is written as
.part and renamed). A SIGTERM
waits while a phase's child starts or an archive is written; then every phase started and not yet packed is packed
(the one running as cut off), and a second SIGTERM is ignored while that packing runs.

DRY (--dry): the same phases on the CPU with the worktree's .venv, the tiny preset made smaller (DRY_SETS) and a
deadline of 240 s (the phases' budgets scaled down; what is left over ends the command early); it measures nothing
about a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from paper_plan import PHASES, bench_rows, device_problem, flag_problem, make_plan, phase_ends
from paper_record import artifact_dir, collect, copy_small_artifacts, last_error, record, store_db_copy

ROOT = Path(__file__).resolve().parents[2]
CLI = "import sys; from hmmscope.cli import main; sys.argv[0] = 'hmmscope'; main()"
DRY_SETS = ("model.n_layers=2", "model.d_model=32", "model.d_mlp=64", "model.n_heads=2", "model.max_len=64",
            "data.n_train=256", "data.n_eval=32", "train.batch_size=8", "train.warmup=2", "train.emergence_episodes=8")
DRY_FAMILY = ("hmm.n_tasks=8", "hmm.n_states=8", "hmm.n_tokens=4", "hmm.rank=2", "data.n_demos=2", "data.l_demo=8",
              "data.l_test=8")  # DRY without --config: the tiny preset's family made smaller (a --config keeps its own)
TAR_FILE_MAX = 12 << 20  # a file this large stays out of an archive (the device tool returns files up to 16 MiB)


# ---------------------------------------------------------------- running and packing phases


ORCHESTRATOR = os.getpid()  # this process: a phase's child checks it is still its parent


def _child_setup() -> None:  # in the child, before exec: its own process group; SIGTERM when the orchestrator dies
    os.setpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's Stop: a SIGTERM here just ends the child
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked in the parent while it starts the child
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != ORCHESTRATOR:  # the orchestrator died before PR_SET_PDEATHSIG was set
        os.kill(os.getpid(), signal.SIGTERM)


class Stop(Exception):
    """This process got SIGTERM (the device tool's limit, `timeout`): stop the phase, pack, exit."""


def _on_term(signum, frame):
    raise Stop(f"signal {signum}")


@contextlib.contextmanager
def _term_deferred():
    """SIGTERM waits for the block's end, then raises Stop there: a child is never started without its phase knowing
    it (CI once signalled between the two), an archive is never half-written by a SIGTERM (SIGKILL leaves its .part,
    which `collect` never reads). This holds because this process has one thread (a signal sent to a process goes to
    any thread that does not block it)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # may raise a pending Stop: nothing is blocked yet
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@dataclass
class Phase:
    n: int
    name: str
    dir: Path
    start: float = 0.0
    end: float = 0.0
    rc: int | None = None
    status: str = "pending"
    note: str = ""


SETTLE_S = 60.0  # at most this long for `runs gc` after a phase's child had to be SIGKILLed (Session.settle)


@dataclass
class Session:
    out: Path
    rec: Path
    t0: float
    env: dict
    phases: list[Phase] = field(default_factory=list)
    live: list[tuple[Phase, subprocess.Popen, Callable]] = field(default_factory=list)  # started, not yet packed
    store: Path | None = None  # the MLflow store the phases write (settle: `runs gc` there)
    py: str = sys.executable  # the python with hmmscope that runs `runs gc`

    def now(self) -> float:
        return time.time() - self.t0

    def phase(self, n: int, name: str) -> Phase:
        p = Phase(n, name, self.rec / name)
        p.dir.mkdir(parents=True, exist_ok=True)
        self.phases.append(p)
        return p

    def say(self, msg: str) -> None:
        print(f"[{self.now():6.1f} s] {msg}", flush=True)

    def write_phases(self) -> None:
        with open(self.rec / "phases.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["phase", "name", "start_s", "end_s", "seconds", "rc", "status", "note"])
            for p in self.phases:
                w.writerow([p.n, p.name, f"{p.start:.1f}", f"{p.end:.1f}", f"{p.end - p.start:.1f}", p.rc, p.status,
                            p.note])

    def start(self, p: Phase, cmd: list[str], log: str, extra_env: dict | None = None,
              on_end: Callable | None = None) -> subprocess.Popen:
        """The phase's child, started; the phase is live until on_end (default: pack) has packed it. A phase started
        again (bench under another python) keeps its first start time."""
        with _term_deferred():
            p.start, p.status = (self.now() if p.status == "pending" else p.start), "running"
            self.say(f"phase {p.n} {p.name}: start")
            f = open(p.dir / log, "ab")  # noqa: SIM115 - closed by finish()
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                    env={**self.env, **(extra_env or {})}, preexec_fn=_child_setup)
            proc.log = f  # type: ignore[attr-defined]
            self.live.append((p, proc, on_end or self.pack))
        return proc

    def on_end(self, proc: subprocess.Popen) -> Callable:
        return next(f for _, r, f in self.live if r is proc)

    def finish(self, p: Phase, proc: subprocess.Popen, cut: bool, note: str = "") -> None:
        killed = cut and _stop(proc)
        proc.wait()
        proc.log.close()  # type: ignore[attr-defined]
        p.end, p.rc = self.now(), proc.returncode
        p.status = "cut off" if cut else ("ok" if proc.returncode == 0 else "failed")
        p.note = note or p.note or (last_error(p.dir / Path(proc.log.name).name)  # type: ignore[attr-defined]
                                    if p.status != "ok" else "")
        self.say(f"phase {p.n} {p.name}: {p.status} (rc {p.rc}) after {p.end - p.start:.1f} s{': ' + p.note if p.note else ''}")
        if killed:
            self.settle(p)

    def settle(self, p: Phase) -> None:
        """A phase's child SIGKILLed (its SIGTERM grace ran out, e.g. training in a long C call on a loaded CPU) left
        the runs it held RUNNING, with their lease: `hmmscope runs gc` on the store ends them KILLED (reason
        "orphaned: ...", their owner is gone) and frees their locks, as the child's own SIGTERM handler would have."""
        if self.store is None or not (self.store / "mlflow.db").is_file():
            return
        cmd = [self.py, "-c", CLI, "runs", "gc", "--tracking-uri", f"sqlite:///{self.store}/mlflow.db"]
        try:
            r = subprocess.run(cmd, cwd=self.rec, env=self.env, capture_output=True, text=True, timeout=SETTLE_S)
            said = [x for x in (r.stdout + r.stderr).splitlines() if re.match(r"\d+ orphan run|error", x)]
            what = said[0] if said else f"runs gc exited {r.returncode}"
        except (OSError, subprocess.SubprocessError) as e:
            what = f"runs gc failed: {type(e).__name__}"
        p.note = f"{p.note}; killed, {what}" if p.note else f"killed, {what}"
        self.say(f"phase {p.n} {p.name}: its child was killed; {what}")

    def cut_live(self) -> None:
        """At Stop: cut the phases still running and pack every phase started and not yet packed (its on_end), once.
        A second SIGTERM is ignored from here: it would cut this packing short."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for p, proc, on_end in list(self.live):
            if p.status == "running":
                self.finish(p, proc, cut=True, note="the command was stopped (SIGTERM)")
            on_end(p)

    def skip(self, n: int, name: str, why: str) -> Phase:
        p = self.phase(n, name)
        p.start = p.end = self.now()
        p.status, p.note = "skipped", why
        self.say(f"phase {n} {name}: skipped: {why}")
        self.pack(p)
        return p

    def pack(self, p: Phase) -> Path:
        """OUT/<n>-<name>.tar.gz from the phase's folder and phases.csv (written as .part, then renamed)."""
        self.write_phases()
        shutil.copy(self.rec / "phases.csv", p.dir / "phases.csv")
        dst = self.out / f"{p.n}-{p.name}.tar.gz"
        part = dst.with_name(dst.name + ".part")
        left_out = []

        def small(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
            if ti.isfile() and ti.size > TAR_FILE_MAX:
                left_out.append(f"{ti.name} ({ti.size / 2**20:.0f} MiB)")
                return None
            return ti

        with _term_deferred():
            with tarfile.open(part, "w:gz") as tar:
                tar.add(p.dir, arcname=f"{self.rec.name}/{p.name}", filter=small)
            os.replace(part, dst)
            self.live = [x for x in self.live if x[0] is not p]
        if left_out:
            self.say(f"phase {p.n} {p.name}: left out of its archive (over {TAR_FILE_MAX >> 20} MiB): {', '.join(left_out)}")
        self.say(f"phase {p.n} {p.name}: packed {dst.name} ({dst.stat().st_size / 1024:.0f} KiB)")
        return dst


STOP_GRACE_S = 10.0  # a cut phase's child gets SIGTERM, then SIGKILL this long after


def _stop(proc: subprocess.Popen, grace: float | None = None) -> bool:
    """SIGTERM to the child's process group, SIGKILL after `grace` seconds (default STOP_GRACE_S); whether SIGKILL
    was sent."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S if grace is None else grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return sig == signal.SIGKILL
        try:
            proc.wait(wait)
            return sig == signal.SIGKILL
        except subprocess.TimeoutExpired:
            continue
    return True


def wait_all(s: Session, jobs: list[tuple[Phase, subprocess.Popen, float]]) -> None:
    """Wait for the jobs (phase, process, absolute end); cut each at its end; its on_end (start's) as each one ends.
    Stop (SIGTERM) passes through: run() cuts and packs what is still live (Session.cut_live)."""
    left = list(jobs)
    while left:
        for job in list(left):
            p, proc, end = job
            if proc.poll() is not None or s.now() >= end:
                s.finish(p, proc, cut=proc.poll() is None)
                left.remove(job)
                s.on_end(proc)(p)
        time.sleep(0.2)


def run_one(s: Session, p: Phase, cmd: list[str], log: str, timeout: float, on_end=None) -> Phase:
    proc = s.start(p, cmd, log, on_end=on_end)
    wait_all(s, [(p, proc, s.now() + timeout)])
    return p


# ---------------------------------------------------------------- the command


def _checkpoint(store: Path, run_id: str) -> Path | None:
    d = artifact_dir(store, run_id)
    return d / "checkpoints" / "last.pt" if d and (d / "checkpoints" / "last.pt").is_file() else None


def _cfg(args):
    """The training config the phases share (hmmscope.config: the standard library only) and its CLI arguments."""
    sys.path.insert(0, str(ROOT))
    from hmmscope.config import load_toml, override, preset, seq_len

    sets = [*(DRY_SETS if args.dry else ()), *(DRY_FAMILY if args.dry and not args.config else ()), *args.set]
    pairs = {}
    for kv in sets:
        if "=" not in kv:
            raise ValueError(f"--set expects key=value, got {kv!r}")
        k, v = kv.split("=", 1)
        pairs[k.strip()] = v.strip()
    cfg = preset(args.preset)
    if args.config:
        cfg = load_toml(args.config, cfg)
    cfg = override(cfg, pairs)
    if args.family_tasks is not None:  # Figure 1's family_bayes task count M
        sets.append(f"eval.family_tasks={args.family_tasks}")
        cfg = override(cfg, {"eval.family_tasks": args.family_tasks})
    cli = ["--preset", args.preset, *(["--config", str(args.config)] if args.config else [])]
    for kv in sets:
        cli += ["--set", kv]
    return cfg, cli, cfg.train.batch_size, seq_len(cfg.data) - 1


def run(args) -> int:
    t0 = args.t0 if args.t0 is not None else time.time()
    out, rec, store = Path(args.out).resolve(), Path(args.rec).resolve(), Path(args.store).resolve()
    phases = [x.strip() for x in args.phases.split(",")]
    bad = [x for x in phases if x not in PHASES]
    if bad or not phases:
        print(f"error: --phases: unknown {bad} (known: {', '.join(PHASES)})", file=sys.stderr)
        return 2
    # before any phase (and any folder): the flags' ranges, then the device (a CUDA run on a machine without one
    # ran every phase, each failing, and exited 0)
    why = flag_problem(args) or (None if args.dry else device_problem(args.device, args.probe_python or sys.executable))
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    try:
        cfg, cfg_cli, batch, seq = _cfg(args)
        from hmmscope.config import flatten
    except Exception as e:  # noqa: BLE001 - a bad --set / --config: one line, nothing written
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    for d in (out, store):
        d.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(rec, ignore_errors=True)
    rec.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db"}
    if args.dry:
        env.update(HMMSCOPE_THREADS="1", OMP_NUM_THREADS="1")
    py = args.python or (sys.executable if args.dry else "/tmp/venv/bin/python")
    s = Session(out, rec, t0, env, store=store, py=py)
    signal.signal(signal.SIGTERM, _on_term)
    ends = phase_ends(args.deadline, args.pack_s, args.analyze_s, args.fig1_s, phases)
    exp = f"hmmscope-{args.name}"
    ev = flatten(cfg)
    s.say(f"Figure 1's references: family_bayes over eval.family_tasks = {ev.get('eval.family_tasks')} tasks (0: off), "
          f"best_counting fitted on eval.fit_episodes = {ev.get('eval.fit_episodes')} episodes")
    s.say(f"{args.name}: deadline {args.deadline:.0f} s; planned ends {json.dumps({k: round(v) for k, v in ends.items()})}; "
          f"config {' '.join(cfg_cli)} (batch {batch} x {seq} tokens); device {args.device}")
    info: dict = {"t0": t0, "args": vars(args), "ends": ends}
    try:
        # 1 + 2: setup and bench side by side from t = 0
        jobs = []
        if "setup" in phases:
            p1 = s.phase(1, "setup")
            proc = s.start(p1, ["bash", "analysis/gpu/session.sh", "setup-once"], "setup.log",
                           {"OUT": str(p1.dir), "DRY": "1" if args.dry else "0"})
            jobs.append((p1, proc, s.now() + args.setup_s))
        bench_json = rec / "bench" / "bench.json"
        if "bench" in phases:
            p2 = s.phase(2, "bench")
            cmd = [args.probe_python or sys.executable, "-c", CLI, "bench", "train", *cfg_cli, "--device", args.device,
                   "--batch-size", str(batch), "--seq-len", str(seq), "--steps", str(args.bench_steps), "--no-peer",
                   "--variants", args.variants, "--json", str(bench_json)]
            proc = s.start(p2, cmd, "bench.log", {"PYTHONPATH": str(ROOT)})
            jobs.append((p2, proc, s.now() + args.bench_s))
        wait_all(s, jobs)
        if "setup" in phases and s.phases[0].status != "ok":
            s.say("setup failed: nothing after it can run (setup.log in 1-setup.tar.gz)")
            return 1
        if "bench" in phases and p2.status == "failed" and not bench_rows(bench_json) and py != cmd[0]:
            s.say("bench: failed under the image's python (bench.log): once more under the venv's")
            proc = s.start(p2, [py, *cmd[1:]], "bench-venv.log")
            wait_all(s, [(p2, proc, s.now() + args.bench_s)])
        # the plan: the variant and the step count, from the bench rows
        plan = make_plan(s, args, ends, bench_json)
        info["plan"] = plan
        # 3: train
        run_id = None
        if "train" in phases:
            p3 = s.phase(3, "train")
            (p3.dir / "plan.json").write_text(json.dumps(plan, indent=1))
            steps = plan["steps"]
            window = ends["train"] - s.now()
            cmd = [py, "-c", CLI, "train", *cfg_cli, "--set", f"train.steps={steps}",
                   "--set", f"train.eval_every={max(1, steps // args.eval_points)}", "--set", f"train.ckpt_every={steps}",
                   "--set", f"train.compile={plan['compile']}", "--set", f"train.attention={plan['attention']}",
                   "--device", args.device, "--no-evaluate", "--deadline", f"{max(window - args.train_post_s, 1.0):.0f}",
                   "--run-name", args.name, "--experiment", exp, "--out", str(p3.dir / "out")]
            s.say(f"train: {steps} steps ({plan['variant']}), --deadline {window - args.train_post_s:.0f} s (its window "
                  f"{window:.0f} s less --train-post-s {args.train_post_s:g} for what the command does after training)")

            def train_done(p: Phase) -> None:
                nonlocal run_id
                log = (p.dir / "train.log").read_text(errors="replace")
                m = re.search(r"^run ([0-9a-f]{32}) (?:started|resumed)", log, re.M)
                run_id = m.group(1) if m else None
                done = re.findall(r"(\d+) steps in (\d+) s", log)  # the metrics table's title (rich may wrap it)
                stopped = "stopped by the deadline" in log
                p.note = (f"run {run_id}: {done[-1][0] if done else '?'} of {steps} steps"
                          f"{' (stopped by the deadline)' if stopped else ''}" if run_id else "no run was started")
                info["train"] = {"run_id": run_id, "steps_done": int(done[-1][0]) if done else None,
                                 "steps_planned": steps, "stopped_by_deadline": stopped, "rc": p.rc}
                if run_id:
                    store_db_copy(store, p.dir / "mlflow.db")
                    copy_small_artifacts(store, run_id, p.dir / "artifacts")
                s.pack(p)

            run_one(s, p3, cmd, "train.log", window + args.train_grace_s, train_done)
            if p3.rc != 0 or not run_id or _checkpoint(store, run_id) is None:
                run_id = None
                s.say("train: no finished run with a checkpoint: Figure 1 and the analysis cannot run")
        # 4: Figure 1
        if "figure1" in phases:  # until analyze must start to keep --analyze-min-s (FIG1_S is what the plan gave it)
            left = ends["analyze"] - (args.analyze_min_s if "analyze" in phases else 0) - s.now()
            if run_id is None:
                s.skip(4, "figure1", "no trained run")
            elif left < args.min_phase_s:
                s.skip(4, "figure1", f"{left:.0f} s left of its window, --min-phase-s {args.min_phase_s:g}")
            else:
                p4 = s.phase(4, "figure1")
                run_one(s, p4, [py, "-c", CLI, "evaluate", run_id, "--device", args.device, "--n-episodes",
                                str(args.fig1_episodes), "--out", str(p4.dir / "out")], "evaluate.log", left)
        # 5: the layerwise analysis
        if "analyze" in phases:
            left = min(args.analyze_s, ends["analyze"] - s.now())
            if run_id is None:
                s.skip(5, "analyze", "no trained run")
            elif left < args.min_phase_s:
                s.skip(5, "analyze", f"{left:.0f} s left, --min-phase-s {args.min_phase_s:g}")
            else:
                p5 = s.phase(5, "analyze")
                run_one(s, p5, analyze_command(args, py, run_id, exp, p5.dir / "out"), "analyze.log", left)
        # 6: the record
        if "pack" in phases:
            p6 = s.phase(6, "pack")
            (rec / "session.json").write_text(json.dumps(info, indent=1, default=str))
            s.write_phases()
            left = max(5.0, min(args.deadline - s.now(), args.limit - 5 - s.now()))
            cmd = [py, str(Path(__file__).resolve()), "record", "--store", str(store), "--rec", str(rec),
                   "--name", args.name, "--out", str(p6.dir / "record"), *(["--run", run_id] if run_id else []),
                   "--code-version", args.code_version or code_version()]
            run_one(s, p6, cmd, "record.log", max(left, 5.0))
    except Stop as e:
        s.cut_live()
        s.say(f"stopped ({e}): the archives packed so far are in {out}")
        return 143
    bad = [f"{p.name} {p.status}" for p in s.phases if p.status in ("failed", "cut off")]
    s.say(f"{args.name}: done, {len(bad)} of {len(s.phases)} phases failed{' (' + ', '.join(bad) + ')' if bad else ''}; "
          f"files in {out}: {' '.join(sorted(f.name for f in out.iterdir()))}")
    return 1 if bad else 0


def code_version() -> str:
    """The commit this checkout is: `git rev-parse HEAD`, else the first word of .whl/code_version (the device copy
    has no .git: README step 0 writes that file into the carried .whl/), else 'unknown'."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    f = ROOT / ".whl" / "code_version"
    words = f.read_text().split() if f.is_file() else []
    return words[0] if words else "unknown"


def default_probe_jobs() -> int:
    """The probes' fit processes when --probe-jobs is not given: the usable cores (`hmmscope analyze` refuses more;
    issue 37: cores + 1 made the analyze phase fail in 0.4 s on the 16-core device)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def analyze_command(args, py: str, run_id: str, exp: str, out: Path) -> list[str]:
    """Phase 5's command line: `hmmscope analyze RUN` with the plan's probe set (--probe-jobs: default_probe_jobs)."""
    return [py, "-c", CLI, "analyze", run_id, "--device", args.device, "--n-episodes", str(args.analyze_episodes),
            "--ks", args.ks, "--probe-tasks", str(args.probe_tasks), "--min-per-task", str(args.min_per_task),
            "--probe-jobs", str(args.probe_jobs or default_probe_jobs()), "--probe-fits", args.probe_fits,
            "--experiment", exp, "--out", str(out)]


# ---------------------------------------------------------------- command line


def main_parser(argv=None) -> argparse.ArgumentParser:
    """The command line of `run`, `record` and `collect` (argv: to read --dry's defaults from; default sys.argv)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the one command (module docstring)")
    dry = "--dry" in (argv if argv is not None else sys.argv)
    r.add_argument("--out", required=True, help="the folder whose files come back ($OUT)")
    r.add_argument("--dry", action="store_true", help="the rehearsal: CPU, the tiny model made smaller, <= 240 s")
    r.add_argument("--t0", type=float, default=None, help="the command's start (epoch seconds; default now)")
    r.add_argument("--deadline", type=float, default=240 if dry else 570, help="seconds after t0 by which all is packed")
    r.add_argument("--limit", type=float, default=600, help="the device call's timeout_s: nothing runs past limit - 5")
    r.add_argument("--name", default="paper-once", help="run name; the experiment is hmmscope-NAME")
    r.add_argument("--preset", default="tiny" if dry else "paper")
    r.add_argument("--config", default=None, help="a TOML on top of the preset (e.g. analysis/gpu/inference-gpu.toml)")
    r.add_argument("--set", action="append", default=[], help="key=value for bench and train (repeatable)")
    r.add_argument("--device", default="cpu" if dry else "cuda")
    r.add_argument("--phases", default=",".join(PHASES), help="a subset of " + ",".join(PHASES))
    r.add_argument("--store", default=str(ROOT / "mlruns" / "once"), help="the MLflow store (mlflow.db + artifacts/)")
    r.add_argument("--rec", default=None, help="the working record folder (default /tmp/NAME)")
    r.add_argument("--python", default=None, help="python for phases 3-6 (default /tmp/venv/bin/python; DRY: this one)")
    r.add_argument("--probe-python", default=None, help="python for the bench beside setup (default: this one)")
    r.add_argument("--setup-s", type=float, default=60 if dry else 150, help="cap on setup")
    r.add_argument("--variants", default="eager,eager+math" if dry else "eager,blocks,blocks-head",
                   help="bench train --variants (the first is the reference; eager+cudnn gained 1.3%% on the H100 and "
                        "left for blocks-head; model-graphs, model-autotune compile the whole model: over --bench-s)")
    r.add_argument("--bench-steps", type=int, default=3 if dry else 10)
    r.add_argument("--bench-s", type=float, default=45 if dry else 60, help="cap on the bench (from t0)")
    r.add_argument("--train-fixed-s", type=float, default=30 if dry else 90,
                   help="train phase seconds besides steps (README.md: 45.7 s measured + estimates)")
    r.add_argument("--train-ratio", type=float, default=1.06, help="a training step over the bench's (README.md)")
    r.add_argument("--train-grace-s", type=float, default=20, help="train's limit past its window")
    r.add_argument("--train-post-s", type=float, default=5 if dry else 15,
                   help="train's --deadline ends this long before its window: the CLI's work after training (the "
                        "logged model: 0.8 GB of weights at the paper's size, an estimate)")
    r.add_argument("--steps", type=int, default=None, help="train exactly this many steps (no plan)")
    r.add_argument("--target-steps", type=int, default=64 if dry else 4096, help="the paper's literal count")
    r.add_argument("--max-steps", type=int, default=400 if dry else 4096,
                   help="the paper's 4096 steps: the time a faster step saves goes to Figures 2-3 (issue 37)")
    r.add_argument("--quantum", type=int, default=16 if dry else 256)
    r.add_argument("--eval-points", type=int, default=12, help="evaluations (emergence curves) over the run")
    r.add_argument("--fig1-s", type=float, default=45 if dry else 75, help="Figure 1 window (README.md: 69.3 s measured)")
    r.add_argument("--fig1-episodes", type=int, default=16 if dry else 256)
    r.add_argument("--analyze-s", type=float, default=60 if dry else 150)
    r.add_argument("--analyze-min-s", type=float, default=30 if dry else 100,
                   help="Figure 1 may run on until analyze would have less than this")
    r.add_argument("--analyze-episodes", type=int, default=16 if dry else 256)
    r.add_argument("--ks", default="1,2" if dry else "1,2,3")
    r.add_argument("--probe-tasks", type=int, default=4 if dry else 32)
    r.add_argument("--min-per-task", type=int, default=4 if dry else 15)
    r.add_argument("--probe-jobs", default="1" if dry else None,
                   help="the probes' fit processes (default: the usable cores, the most `hmmscope analyze` takes)")
    r.add_argument("--probe-fits", default="torch" if dry else "auto",
                   help="analyze --probe-fits (auto: torch on the GPU; DRY: torch on the CPU, the GPU path's twin)")
    r.add_argument("--family-tasks", type=int, default=None,
                   help="Figure 1's family_bayes task count M (eval.family_tasks; default: the config's, 256 at the paper)")
    r.add_argument("--code-version", default=None,
                   help="the commit, set on the runs as hmmscope.code_version (default: code_version())")
    r.add_argument("--pack-s", type=float, default=15)
    r.add_argument("--min-phase-s", type=float, default=10)
    c = sub.add_parser("record", help="phase 6's record (the venv's python)")
    c.add_argument("--store", required=True)
    c.add_argument("--rec", required=True)
    c.add_argument("--name", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--run", default=None)
    c.add_argument("--code-version", default=None, help="set as hmmscope.code_version where the runs read unknown")
    k = sub.add_parser("collect", help="the archives of one command into the repository's record folder")
    k.add_argument("src", help="the folder holding the archives (the device tool's files_at)")
    k.add_argument("dest", help="e.g. analysis/results/paper-gpu-figures")
    k.add_argument("--code-version", default=None, help="the commit the device ran (its copy has no .git)")
    return ap


def main(argv=None) -> int:
    a = main_parser(argv).parse_args(argv)
    if a.cmd == "record":
        return record(a)
    if a.cmd == "collect":
        collect(Path(a.src), Path(a.dest), a.code_version)
        return 0
    a.rec = a.rec or f"/tmp/{a.name}"
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
