"""The one GPU command of issue 28 (analysis/gpu/paper_once.py, `session.sh paper-once`) rehearsed on the CPU.

DRY runs the same phases with the worktree's .venv on the tiny preset made smaller: setup and bench side by side,
the plan, train, Figure 1, analyze, pack, each packed into OUT/<n>-<phase>.tar.gz as it ends. The default test cuts
the command: its bench by the bench's own limit, then the whole command by SIGTERM while it trains (as the device
tool's limit would), and checks that every earlier phase's archive is there and whole, the phase in flight packed as
cut off, and no child left running. The slow test runs the rehearsal to its end (every phase packs its files; the
record holds the report, claims, curves, trials.csv and a trimmed store, no checkpoint) and then kills a second
command with SIGKILL (its child ends by PR_SET_PDEATHSIG; the archives already there stay)."""

from __future__ import annotations

import csv
import importlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "analysis" / "gpu"))
paper_once = importlib.import_module("paper_once")
paper_plan = importlib.import_module("paper_plan")
paper_record = importlib.import_module("paper_record")


def test_phase_ends_and_plan_steps():
    """The time plan: pack by deadline - pack_s, analyze before it, Figure 1 before that, training first; a phase
    left out takes no time. The step count: floor((window - fixed - compile) / (step x ratio) / quantum) x quantum."""
    e = paper_plan.phase_ends(570, 15, 120, 60)
    assert e == {"train": 375, "figure1": 435, "analyze": 555, "pack": 555, "deadline": 570}
    e = paper_plan.phase_ends(230, 15, 120, 45, phases=("setup", "bench", "train", "figure1", "pack"))
    assert e["train"] == 170 and e["figure1"] == e["analyze"] == 215
    # the paper-gpu record: 51 ms per step in bench train, 1.06 x that in training (README.md)
    assert paper_plan.plan_steps(0.051, 325, fixed_s=90, ratio=1.06) == 4096  # 4347 fit
    assert paper_plan.plan_steps(0.040, 325, fixed_s=90, compile_s=20, ratio=1.06) == 4864  # 5070 fit
    assert paper_plan.plan_steps(0.040, 325, fixed_s=90, ratio=1.06, max_steps=4500) == 4352
    assert paper_plan.plan_steps(0.5, 30, fixed_s=90) == 256  # nothing fits: one quantum (train's --deadline stops it)


def test_probe_jobs_default_never_exceeds_the_usable_cores(tmp_path):
    """Issue 37: the one command's analyze failed in 0.4 s with `--probe-jobs 17: at most the 16 usable core(s)`:
    paper_once.py and session.sh defaulted to cores + 1. Every default is now the usable cores (the CLI's limit)."""
    cores = len(os.sched_getaffinity(0))
    assert paper_once.default_probe_jobs() == cores
    args = paper_once.main_parser().parse_args(["run", "--out", "/tmp/x"])
    cmd = paper_once.analyze_command(args, "python", "0" * 32, "exp", Path("/tmp/o"))
    assert int(cmd[cmd.index("--probe-jobs") + 1]) <= cores
    out = subprocess.run(["bash", "analysis/gpu/session.sh", "probe-jobs"], cwd=ROOT, capture_output=True, text=True,
                         env={**{k: v for k, v in os.environ.items() if k != "PROBE_JOBS"}, "OUT": str(tmp_path)},
                         check=True)
    assert int(out.stdout.strip()) <= cores
    readme = (ROOT / "analysis" / "gpu" / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| 5 analyze"))
    assert "--probe-jobs 17" not in row and "--probe-jobs" in row


def test_sigterm_while_a_phase_starts_or_packs_waits_for_that_step(tmp_path, monkeypatch):
    """SIGTERM while the orchestrator starts a phase's child (CI signalled between its 'start' line and the child):
    Stop comes once the child is the phase's; the child ends by SIGTERM when cut (it does not keep the blocked
    signal). A phase ended and not yet packed is packed at Stop (cut_live), a second SIGTERM then ignored. SIGTERM
    while an archive is written: the archive is whole, no .part left."""
    import threading

    old, s = signal.signal(signal.SIGTERM, paper_once._on_term), None
    me = threading.get_ident()  # to this thread: another one (xdist's) would take a signal sent to the process

    def term_then(real):
        def call(*a, **k):
            signal.pthread_kill(me, signal.SIGTERM)
            return real(*a, **k)
        return call

    try:
        out = tmp_path / "out"
        out.mkdir()
        s = paper_once.Session(out, tmp_path / "rec", time.time(), dict(os.environ))
        p = s.phase(3, "train")
        with monkeypatch.context() as m:
            m.setattr(paper_once.subprocess, "Popen", term_then(subprocess.Popen))
            with pytest.raises(paper_once.Stop):
                s.start(p, ["sleep", "60"], "train.log")
        [(q, proc, _)] = s.live
        assert q is p and proc.poll() is None  # the child runs, and its phase has it
        s.finish(p, proc, cut=True)
        assert proc.returncode == -signal.SIGTERM and len(s.live) == 1  # ended, not yet packed: still live
        with monkeypatch.context() as m:
            m.setattr(paper_once.tarfile, "open", term_then(tarfile.open))
            s.cut_live()  # packs it; the SIGTERM sent meanwhile is ignored
        assert s.live == [] and sorted(f.name for f in out.iterdir()) == ["3-train.tar.gz"]
        files = _members(out / "3-train.tar.gz")
        assert "train/train.log" in files and _phases(files, "train")["train"]["status"] == "cut off"

        signal.signal(signal.SIGTERM, paper_once._on_term)
        p4 = s.phase(4, "figure1")
        with monkeypatch.context() as m:
            m.setattr(paper_once.tarfile, "open", term_then(tarfile.open))
            with pytest.raises(paper_once.Stop):
                s.pack(p4)
        assert sorted(f.name for f in out.iterdir()) == ["3-train.tar.gz", "4-figure1.tar.gz"]
        assert "figure1/phases.csv" in _members(out / "4-figure1.tar.gz")
    finally:
        signal.signal(signal.SIGTERM, old)
        for _, proc, _ in s.live if s else []:
            proc.kill()


def _start(tmp: Path, *flags: str) -> subprocess.Popen:
    env = {**os.environ, "DRY": "1", "OUT": str(tmp / "out"), "OMP_NUM_THREADS": "1", "HMMSCOPE_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen(["bash", "analysis/gpu/session.sh", "paper-once", "--store", str(tmp / "store"),
                             "--rec", str(tmp / "rec"), *flags], cwd=ROOT, env=env, stdout=open(tmp / "console.txt", "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(tmp: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.time()
    while text not in (tmp / "console.txt").read_text():
        assert proc.poll() is None, (tmp / "console.txt").read_text()
        assert time.time() - t0 < timeout, f"no {text!r} within {timeout} s:\n" + (tmp / "console.txt").read_text()
        time.sleep(0.2)


def _members(tar: Path) -> dict[str, bytes]:
    with tarfile.open(tar) as t:
        return {m.name.split("/", 1)[1]: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


def _phases(files: dict[str, bytes], name: str) -> dict[str, dict]:
    return {r["name"]: r for r in csv.DictReader(io.StringIO(files[f"{name}/phases.csv"].decode()))}


def _children_of(pid: int, timeout: float = 30) -> list[int]:
    """The command's children, once it has any: it says "phase N: start" just before it starts the phase's child
    (CI once looked in between and found none)."""
    t0, me = time.time(), psutil.Process(pid)
    while not (kids := [c.pid for c in me.children(recursive=True)]) and time.time() - t0 < timeout:
        time.sleep(0.1)
    return kids


def _children_gone(pids: list[int], timeout: float = 30) -> bool:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.2)
    return False


def test_rehearsal_cut_off_keeps_the_earlier_phases(tmp_path):
    """A bench that outlasts its limit is cut and packed (its log, 'cut off'); the plan falls back to the target
    steps; SIGTERM while training (the device tool's limit) packs the training phase as cut off and stops its child;
    the archives of setup and bench stay whole; nothing else is in OUT."""
    proc = _start(tmp_path, "--bench-steps", "1000000", "--bench-s", "6", "--phases", "setup,bench,train,pack")
    try:
        _wait_for(tmp_path, "phase 3 train: start", proc)
        kids = _children_of(proc.pid)
        assert kids, "the training phase runs as a child"
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    console = (tmp_path / "console.txt").read_text()
    assert _children_gone(kids), console
    out = tmp_path / "out"
    assert sorted(f.name for f in out.iterdir()) == ["1-setup.tar.gz", "2-bench.tar.gz", "3-train.tar.gz"], console
    setup, bench, train = (_members(out / n) for n in sorted(f.name for f in out.iterdir()))
    assert {"setup/env.txt", "setup/setup.log", "setup/phases.csv"} <= set(setup)
    assert b"torch:" in setup["setup/env.txt"] and _phases(setup, "setup")["setup"]["status"] == "ok"
    assert "bench/bench.log" in bench and _phases(bench, "bench")["bench"]["status"] == "cut off"
    assert "phase 2 bench: cut off" in console and "no bench rows: --target-steps = 64" in console
    assert json.loads(train["train/plan.json"])["steps"] == 64 and "train/train.log" in train
    rows = _phases(train, "train")
    assert rows["train"]["status"] == "cut off" and rows["setup"]["status"] == "ok"
    assert "stopped (signal 15): the archives packed so far" in console
    got = {str(f.relative_to(tmp_path / "rec2")) for f in paper_record.collect(out, tmp_path / "rec2")}
    assert {"setup/setup.log", "env.txt", "bench/bench.log", "train/train.log", "plan.json", "phases.csv"} <= got


@pytest.mark.slow
def test_rehearsal_every_phase_packs_its_files(tmp_path):
    """The whole DRY command: six archives, each with its phase's files; the record has the report, Figure 1 and
    analysis claims, the curves (emergence included), trials.csv and a trimmed store with no checkpoint or weights;
    every archive under the device tool's 16 MiB. Then a second command killed with SIGKILL while it trains: its
    child ends (PR_SET_PDEATHSIG) and its earlier archives stay."""
    proc = _start(tmp_path)
    assert proc.wait(400) == 0, (tmp_path / "console.txt").read_text()
    console = (tmp_path / "console.txt").read_text()
    out = tmp_path / "out"
    names = sorted(f.name for f in out.iterdir())
    assert names == [f"{i}-{p}.tar.gz" for i, p in enumerate(paper_plan.PHASES, 1)], console
    assert all((out / n).stat().st_size < 16 << 20 for n in names)
    a = {n.split("-", 1)[1].split(".")[0]: _members(out / n) for n in names}
    assert {"setup/env.txt", "setup/setup.log"} <= set(a["setup"])
    bench = json.loads(a["bench"]["bench/bench.json"])
    assert [r["variant"] for r in bench["rows"]] == ["eager", "eager+math"] and bench["gemm_rate"] > 0
    plan = json.loads(a["train"]["train/plan.json"])
    assert plan["measured"] and plan["steps"] % 16 == 0 and "floor((window" in plan["formula"]
    assert {"train/train.log", "train/mlflow.db", "train/artifacts/figures/emergence.png"} <= set(a["train"])
    assert any(k.endswith("evaluation/figure1.json") for k in a["figure1"])
    assert any(k.endswith("analysis/figure3_probes.png") for k in a["analyze"])
    assert b"torch on cpu)" in a["analyze"]["analyze/analyze.log"]  # the GPU probes' twin (issue 37)
    rec = {k.removeprefix("pack/record/"): v for k, v in a["pack"].items()}
    for f in ("report.md", "claims.csv", "curves.csv", "run.json", "trials.csv", "phases.csv", "bench.json", "plan.json",
              "figures/figure1.png", "figures/figure2_shuffle.png", "figures/figure3_probes.png",
              "figures/emergence.png", "store/mlflow.db"):
        assert f in rec, f
    assert not [k for k in rec if k.endswith(paper_record.WEIGHT_SUFFIXES) or len(rec[k]) >= paper_record.BIG_FILE]
    claims = list(csv.DictReader(io.StringIO(rec["claims.csv"].decode())))
    assert {c["source"] for c in claims} == {"figure1", "analysis"}
    assert all(c["verdict"] for c in claims)
    assert b"emergence/unseen/icl_gain" in rec["curves.csv"]
    (trial,) = csv.DictReader(io.StringIO(rec["trials.csv"].decode()))
    assert int(trial["steps"]) == plan["steps"] and trial["analysis_run_id"]
    phases = _phases(a["pack"], "pack")
    statuses = {p: (r["status"], r["seconds"]) for p, r in phases.items()}
    assert all(phases[p]["status"] == "ok" for p in paper_plan.PHASES[:5]), statuses
    report = rec["report.md"].decode()
    run = json.loads(rec["run.json"])
    assert run["tags"]["hmmscope.code_version"] not in ("", "unknown") and "Code version: `" in report
    assert "## Speed" in report and "## Claims" in report and f"**{plan['steps']} steps**" in report
    got = {str(f.relative_to(tmp_path / "results")) for f in paper_record.collect(out, tmp_path / "results")}
    assert {"report.md", "claims.csv", "curves.csv", "trials.csv", "phases.csv", "bench.json", "figures/figure1.png",
            "figures/figure3_probes.png", "figures/emergence.png", "train/train.log", "analyze/analyze.log",
            "tables/evaluation-figure1_by_k.csv"} <= got
    assert not [g for g in got if g.endswith(".db") or g.startswith("store")]

    tmp2 = tmp_path / "killed"
    tmp2.mkdir()
    proc = _start(tmp2)
    try:
        _wait_for(tmp2, "phase 3 train: start", proc)
        kids = _children_of(proc.pid)
        assert kids, "the training phase runs as a child"
        time.sleep(2.0)
        proc.send_signal(signal.SIGKILL)  # the orchestrator (bash exec'd into it) dies at once
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _children_gone(kids)
    assert sorted(f.name for f in (tmp2 / "out").iterdir()) == ["1-setup.tar.gz", "2-bench.tar.gz"]
    assert "bench/bench.json" in _members(tmp2 / "out" / "2-bench.tar.gz")


def test_record_is_readable_answer_first(tmp_path):
    """Issue 37 item 2, on the kept H100 record's files: report.md opens with the answer, marks family Bayes
    DEGENERATE (its CE 2.877 > ln 16), has one metrics row per key (its _lo / _hi as the CI column, with a unit),
    claims to 4 significant digits, the code version passed in, and the failed phase's error line."""
    import shutil

    src = ROOT / "analysis" / "results" / "paper-once-h100"
    d = tmp_path / "rec"
    shutil.copytree(src, d)
    (d / "report.md").unlink()
    text = paper_record.render_report(d).read_text()
    lines = [x for x in text.splitlines() if x.strip()]
    assert lines[1].startswith("**Figure 1 after 5100 steps**") and "-0.033 [-0.042, -0.025]" in lines[1]
    assert "level with an EM-fitted HMM" in lines[1] and "0.30 nats/token above the mixture oracle" in lines[1]
    assert "**family Bayes is DEGENERATE on unseen tasks** (CE 2.877 above a uniform guess ln 16 = 2.773" in text
    assert "**mixture oracle is DEGENERATE on unseen tasks** (CE 2.825" in text  # the training tasks' mixture
    assert "| eval/unseen/excess_ce | -0.1431 |  | nats/token | DEGENERATE reference |" in text
    assert "| eval/seen/excess_ce | 0.3042 |  | nats/token |  |" in text
    assert "**Figures 2-3: not measured** (phase 5 analyze failed after 0.4 s: error: --probe-jobs 17" in text
    assert "Code version: `a0b8cfa`" in text
    rows = [x for x in lines if x.startswith("| eval/") or x.startswith("| baseline/")]
    assert rows and not [x for x in rows if x.split("|")[1].strip().endswith(("_lo", "_hi"))]
    assert "| eval/unseen/vs_best_counting | -0.03326 | [-0.04165, -0.02488] | nats/token |" in text
    assert "| baseline/unseen/family_bayes/ce | 2.877 |  | nats/token | DEGENERATE reference |" in text
    assert "| figure1 | inference_beyond_counting | -0.03326 | [-0.04165, -0.02488] | supported |" in text
    assert "| 5 analyze | 409.9 | 410.3 | 0.4 | 2 | failed | error: --probe-jobs 17: at most the 16 usable" in text
    assert [r["name"] for r in paper_record.metric_rows({"a": 1.0, "a_lo": 0.5, "a_hi": 2.0, "b_lo": 3.0})] == ["a", "b_lo"]
    sig = paper_record.sig
    assert sig(0.30419800486) == "0.3042" and sig(280853.62) == "280,854" and sig(None) == ""


def test_failed_phase_note_is_its_last_error_line(tmp_path):
    """The phases table of the device's record names why a phase failed (issue 37: the note was empty, the reason
    only in analyze.log)."""
    (tmp_path / "out").mkdir()
    s = paper_once.Session(tmp_path / "out", tmp_path / "rec", time.time(), dict(os.environ))
    p = s.phase(5, "analyze")
    paper_once.run_one(s, p, ["sh", "-c", "echo 'analyze: checkpoint loaded, 16 s'; echo 'error: boom' >&2; exit 2"],
                       "analyze.log", 30)
    assert p.status == "failed" and p.note == "error: boom (last progress: analyze: checkpoint loaded, 16 s)"
    (row,) = csv.DictReader(open(tmp_path / "rec" / "phases.csv"))
    assert row["note"] == p.note


def test_the_window_rebalanced_for_the_analysis():
    """Issue 37: 4096 steps are the paper's budget (at the H100's 39.58 ms blocks step, bench.json of
    paper-once-h100: 172 s of steps); the defaults cap training there and give Figure 1 its measured 69 s and the
    analysis 150 s (it was 120: the 2026-11-27 retry was cut at 123 s). The probes fit with torch on the device
    (--probe-fits auto), and in the CPU rehearsal with torch on the CPU (the GPU path's twin)."""
    args = paper_once.main_parser().parse_args(["run", "--out", "/tmp/x"])
    assert args.max_steps == 4096 and args.analyze_s >= 150 and args.fig1_s >= 70
    e = paper_plan.phase_ends(args.deadline, args.pack_s, args.analyze_s, args.fig1_s)
    window = e["train"] - 48.0  # the H100's bench ended at 48.0 s (console.txt)
    steps = paper_plan.plan_steps(0.03957704940000042, window, fixed_s=args.train_fixed_s, compile_s=11.2238116446,
                                  ratio=args.train_ratio, quantum=args.quantum, max_steps=args.max_steps)
    assert steps == 4096
    cmd = paper_once.analyze_command(args, "python", "0" * 32, "exp", Path("/tmp/o"))
    assert cmd[cmd.index("--probe-fits") + 1] == "auto"
    dry = paper_once.main_parser(["run", "--dry"]).parse_args(["run", "--dry", "--out", "/tmp/x"])
    cmd = paper_once.analyze_command(dry, "python", "0" * 32, "exp", Path("/tmp/o"))
    assert cmd[cmd.index("--probe-fits") + 1] == "torch"


# ---------------------------------------------------------------- checks before any phase; a failed phase (issue 47, item 3)


def _once(tmp: Path, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HMMSCOPE_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "analysis/gpu/paper_once.py", "run", "--out", str(tmp / "out"), "--store",
                           str(tmp / "store"), "--rec", str(tmp / "rec"), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(importlib.import_module("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_run_on_a_machine_without_one_is_refused_at_once(tmp_path):
    """Before: `paper_once.py run` (not --dry) without CUDA ran every phase, each failing with "device 'cuda'
    requested but CUDA is not available", then printed "paper-once: done" and exited 0 after 48 s. Now one line,
    exit 2, nothing created."""
    r = _once(tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr.splitlines() == [
        f"error: --device cuda: CUDA is not available here ({sys.executable}'s torch sees 0 CUDA device(s)); give "
        "--dry for the CPU rehearsal"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(("flags", "needle"), [
    (["--deadline", "-5"], "--deadline -5: give seconds in (0, 595]"),
    (["--deadline", "nan"], "--deadline nan: give a finite number"),
    (["--deadline", "900"], "--deadline 900: give seconds in (0, 595]"),
    (["--limit", "0"], "--limit 0: give the device call's timeout in seconds, over 5"),
    (["--steps", "-3"], "--steps -3: give a count >= 1"),
    (["--quantum", "0"], "--quantum 0: give a count >= 1"),
    (["--bench-s", "inf"], "--bench-s inf: give a finite number"),
    (["--analyze-s", "-1"], "--analyze-s -1: give seconds >= 0"),
    (["--train-ratio", "0"], "--train-ratio 0: give a ratio > 0"),
    (["--probe-jobs", "0"], "--probe-jobs '0': give a count >= 1"),
    (["--t0", "nan"], "--t0 nan: give a finite number"),
])
def test_flag_ranges_are_checked_before_any_phase(tmp_path, flags, needle):
    """Before: --deadline -5 and --steps -3 ran every phase; --limit 0 ran until an outside timeout; --deadline nan
    was a ValueError traceback and --quantum 0 a ZeroDivisionError after 48 s. Now one line naming the flag."""
    args = paper_once.main_parser(["run", "--dry"]).parse_args(["run", "--dry", "--out", "/tmp/x", *flags])
    assert paper_plan.flag_problem(args).startswith(needle)
    if flags == ["--quantum", "0"]:  # the whole command: exit 2 at once, nothing created
        r = _once(tmp_path, "--dry", *flags, timeout=60)
        assert r.returncode == 2 and r.stderr.splitlines() == [f"error: {needle}"], r.stderr
        assert not list(tmp_path.iterdir())
    defaults = paper_once.main_parser(["run", "--dry"]).parse_args(["run", "--dry", "--out", "/tmp/x"])
    assert paper_plan.flag_problem(defaults) is None
    assert paper_plan.flag_problem(paper_once.main_parser([]).parse_args(["run", "--out", "/tmp/x"])) is None


def test_the_done_line_counts_failed_phases_and_the_exit_code_says_so(tmp_path):
    """Before: a session whose phases failed printed "done" and exited 0. Now the last line says how many phases
    failed (failed or cut off), and the exit code is 1 when any did."""
    r = _once(tmp_path, "--dry", "--phases", "pack", "--python", "false")
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert "paper-once: done, 1 of 1 phases failed (pack failed); files in" in last, r.stdout


HOLDER = """
import signal, sys, time
from hmmscope import tracking
held = tracking.start_run(sys.argv[1], "exp", "held")  # kept: a context manager collected would end the run
run = held.__enter__()
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a child in a long C call: its SIGTERM never reaches Python in time
print(f"run {run.run_id} started", flush=True)
time.sleep(600)
"""


def test_a_phase_child_killed_after_its_grace_leaves_its_run_killed(tmp_path, monkeypatch):
    """Before: a --dry session stopped by SIGTERM could leave its training run RUNNING, with its lease's lock: a
    child that did not end within its SIGTERM grace was SIGKILLed, and nobody ended its run. Now the session runs
    `hmmscope runs gc` on its store after such a kill: the run ends KILLED (orphaned) and its lock is freed."""
    store = tmp_path / "store"
    uri = f"sqlite:///{store}/mlflow.db"
    monkeypatch.setattr(paper_once, "STOP_GRACE_S", 1.0)
    (tmp_path / "out").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    s = paper_once.Session(tmp_path / "out", tmp_path / "rec", time.time(), env, store=store, py=sys.executable)
    p = s.phase(3, "train")
    proc = s.start(p, [sys.executable, "-c", HOLDER, uri], "train.log")
    try:
        deadline = time.time() + 120
        while "started" not in (p.dir / "train.log").read_text():
            assert proc.poll() is None and time.time() < deadline, (p.dir / "train.log").read_text()
            time.sleep(0.1)
        import re

        run_id = re.search(r"run ([0-9a-f]{32}) started", (p.dir / "train.log").read_text()).group(1)
        s.finish(p, proc, cut=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    from hmmscope import tracking

    run = tracking.client(uri).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["hmmscope.failure_reason"].startswith("orphaned: ")
    assert not list((store / ".leases").glob("*.lock")) if (store / ".leases").is_dir() else True
    assert p.status == "cut off" and "killed, 1 orphan run(s) marked KILLED" in p.note, p.note
