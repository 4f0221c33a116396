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
paper_record = importlib.import_module("paper_record")


def test_phase_ends_and_plan_steps():
    """The time plan: pack by deadline - pack_s, analyze before it, Figure 1 before that, training first; a phase
    left out takes no time. The step count: floor((window - fixed - compile) / (step x ratio) / quantum) x quantum."""
    e = paper_once.phase_ends(570, 15, 120, 60)
    assert e == {"train": 375, "figure1": 435, "analyze": 555, "pack": 555, "deadline": 570}
    e = paper_once.phase_ends(230, 15, 120, 45, phases=("setup", "bench", "train", "figure1", "pack"))
    assert e["train"] == 170 and e["figure1"] == e["analyze"] == 215
    # the paper-gpu record: 51 ms per step in bench train, 1.06 x that in training (README.md)
    assert paper_once.plan_steps(0.051, 325, fixed_s=90, ratio=1.06) == 4096  # 4347 fit
    assert paper_once.plan_steps(0.040, 325, fixed_s=90, compile_s=20, ratio=1.06) == 4864  # 5070 fit
    assert paper_once.plan_steps(0.040, 325, fixed_s=90, ratio=1.06, max_steps=4500) == 4352
    assert paper_once.plan_steps(0.5, 30, fixed_s=90) == 256  # nothing fits: one quantum (train's --deadline stops it)


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
        me = psutil.Process(proc.pid)
        kids = [c.pid for c in me.children(recursive=True)]
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
    assert names == [f"{i}-{p}.tar.gz" for i, p in enumerate(paper_once.PHASES, 1)], console
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
    assert all(phases[p]["status"] == "ok" for p in paper_once.PHASES[:5]), statuses
    report = rec["report.md"].decode()
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
        kids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        time.sleep(2.0)
        proc.send_signal(signal.SIGKILL)  # the orchestrator (bash exec'd into it) dies at once
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _children_gone(kids)
    assert sorted(f.name for f in (tmp2 / "out").iterdir()) == ["1-setup.tar.gz", "2-bench.tar.gz"]
    assert "bench/bench.json" in _members(tmp2 / "out" / "2-bench.tar.gz")
