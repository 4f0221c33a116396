"""Fault tests with real processes: interrupted and resumed sweeps, SIGKILLed workers, two `sweep run`s at once,
a moved, copied or read-only project folder. Tiny trials, 1-second heartbeats (trials and MLflow runs)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app
from hmmscope.sweep import ensure_storage, study_status
from hmmscope.tracking.liveness import lease_of

EXE = Path(sys.executable).parent / "hmmscope"
runner = CliRunner()

FIXED = """
[fixed]
"hmm.n_tasks" = 4
"hmm.n_states" = 8
"hmm.n_tokens" = 4
"hmm.rank" = 2
"data.n_demos" = 2
"data.l_demo" = 8
"data.l_test" = 8
"data.n_train" = 48
"data.n_eval" = 16
"model.n_layers" = 1
"model.n_heads" = 2
"model.d_model" = 32
"model.d_mlp" = 64
"model.max_len" = 64
"train.steps" = {steps}
"train.batch_size" = 8
"train.warmup" = 0
"train.eval_every" = {steps}
"train.ckpt_every" = {steps}
"train.device" = "cpu"
"train.figures" = false
"""

TRAIN_SPEC = """
[sweep]
name = "{name}"
kind = "train"
sampler = "grid"
seeds = [0, 1]
experiment = "faults"
heartbeat_interval = 1
grace_period = 3
max_retry = 3
""" + FIXED + """
[space]
"model.pos_enc" = {{grid = ["rope", "absolute"]}}
"""

THEORY_SPEC = """
[sweep]
name = "{name}"
kind = "theory"
sampler = "grid"
experiment = "faults"
heartbeat_interval = 1
grace_period = 3

[fixed]
"theory.rhos" = [0.05]
"theory.n_states" = [8]
"theory.n_tokens" = 4
"theory.lengths" = [1, 2, 4]
"theory.n_histories" = 200
"theory.burn_in" = 10

[space]
"theory.gammas" = {{grid = [0.5, 0.8]}}
"theory.ranks" = {{grid = {ranks}}}
"""


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """An empty project store (MLflow and Optuna schemas), created once and copied by each test."""
    d = tmp_path_factory.mktemp("template") / "mlruns"
    tracking.ensure_store(f"sqlite:///{d}/mlflow.db")
    ensure_storage(f"sqlite:///{d}/optuna.db")
    return d


def _project(tmp_path: Path, template: Path, name: str, spec: str = "") -> Path:
    proj = tmp_path / name
    shutil.copytree(template, proj / "mlruns")
    if spec:
        (proj / "s.toml").write_text(spec)
    return proj


def _stores(proj: Path) -> tuple[str, str]:
    return f"sqlite:///{proj}/mlruns/optuna.db", f"sqlite:///{proj}/mlruns/mlflow.db"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(HMMSCOPE_RUN_HEARTBEAT_S="1", HMMSCOPE_THREADS="1", OMP_NUM_THREADS="1")
    return env


def _start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    """`hmmscope ARGS` in its own session (so SIGINT reaches it as Ctrl-C would), output to `log`."""
    with open(log, "w") as f:
        return subprocess.Popen([str(EXE), *args], cwd=cwd, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _procs_mentioning(needle: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(d.name))
    return pids


@contextlib.contextmanager
def _cleanup(proj: Path, procs: list[subprocess.Popen]):
    """Whatever happens, stop the sweep processes we started and their workers (found by the project path)."""
    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for pid in _procs_mentioning(str(proj / "mlruns")):  # workers: `python -m hmmscope.sweep worker ...`
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _wait(cond, timeout: float, what: str, procs: list[subprocess.Popen] = ()):
    deadline = time.time() + timeout
    while True:
        with contextlib.suppress(Exception):  # the stores may be busy or not created yet
            got = cond()
            if got:
                return got
        assert all(p.poll() is None for p in procs), f"a process ended while waiting for {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _trial_runs(uri: str) -> list:
    return [r for r in tracking.search_runs(uri, "faults") if "hmmscope.trial" in r.data.tags]


def _report(proj: Path, name: str, monkeypatch) -> str:
    monkeypatch.chdir(proj)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    r = runner.invoke(app, ["report", name])
    assert r.exit_code == 0, r.output
    return (proj / "out" / name / "report.md").read_text()


# ---------------------------------------------------------------- interrupted sweeps, killed workers


@pytest.mark.slow  # ~80 s on 2 quiet cores; test_sweep.py's kill / SIGTERM tests cover the default suite
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads worker processes through /proc")
def test_interrupts_and_killed_workers_count_the_grid_once(tmp_path, template, monkeypatch):
    """A 4-trial grid with 2 workers, run twice:

    1. SIGKILL worker A while its training run is open; then Ctrl-C (SIGINT) the sweep while worker B
       evaluates a trial whose training has finished (B hands the trial back as "interrupted").
    2. Run the same command again (resume); SIGKILL the worker C that evaluates a trial whose training has
       finished, before it tells the study; the other worker retries that trial and finishes the grid.

    Then: no RUNNING run is left (A's is KILLED as an orphan); B's and C's runs, cut during their evaluation
    (a trial's run stays open until its evaluation and objective are written), were resumed in place by their
    retries (their final checkpoint: nothing trained twice) and are FINISHED; the report counts and uses
    exactly 4 trials, one run each."""
    proj = _project(tmp_path, template, "p", TRAIN_SPEC.format(name="faults", steps=80))
    storage, uri = _stores(proj)

    def trained(rid) -> bool:  # the trial's run has finished training (train/wall_time_s is logged at its end)
        run = tracking.get_run(uri, rid) if rid else None
        return run is not None and "train/wall_time_s" in run.data.metrics

    def training():  # a worker whose trial's MLflow run is open (RUNNING, tagged with the worker's pid), training
        open_pids = {(lease_of(x) or {}).get("pid") for x in _trial_runs(uri) if x.info.status == "RUNNING"}
        return next((r for r in study_status("faults", storage) if r["state"] == "RUNNING"
                     and not trained(r["mlflow_run_id"]) and str(r["worker"]["pid"]) in open_pids), None)

    def evaluating(but: set[int]):  # a RUNNING trial whose training has finished (its evaluation is under way)
        return next((r for r in study_status("faults", storage) if r["state"] == "RUNNING"
                     and trained(r["mlflow_run_id"]) and r["worker"]["pid"] not in but), None)

    p = _start(["sweep", "run", "s.toml", "--workers", "2"], proj, tmp_path / "run1.log")
    with _cleanup(proj, [p]):
        a = _wait(training, 240, "a worker with an open training run", [p])
        os.kill(a["worker"]["pid"], signal.SIGKILL)
        b = _wait(lambda: evaluating({a["worker"]["pid"]}), 240, "a trial between its training run and its result", [p])
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=120) == 130, (tmp_path / "run1.log").read_text()
    assert _procs_mentioning(str(proj / "mlruns")) == []
    rows = {r["number"]: r for r in study_status("faults", storage)}
    assert rows[b["number"]]["reason"] == "interrupted" and rows[b["number"]]["mlflow_run_id"] == b["mlflow_run_id"]

    p = _start(["sweep", "run", "s.toml", "--workers", "2"], proj, tmp_path / "run2.log")
    with _cleanup(proj, [p]):
        c = _wait(lambda: evaluating({a["worker"]["pid"], b["worker"]["pid"]}), 240,
                  "a trial between its training run and its result", [p])
        os.kill(c["worker"]["pid"], signal.SIGKILL)
        code = p.wait(timeout=600)
    out = (tmp_path / "run2.log").read_text()
    assert code == 0 and "4 complete, 0 failed, 0 pruned of 4 (3 retried)" in out, out
    assert "1 worker(s) were killed" in out

    runs = tracking.search_runs(uri, "faults")
    assert [x.info.run_name for x in runs if x.info.status == "RUNNING"] == []
    (orphan,) = [x for x in _trial_runs(uri) if (lease_of(x) or {}).get("pid") == str(a["worker"]["pid"])
                 and x.info.status != "FINISHED"]
    assert orphan.info.status == "KILLED"
    assert orphan.data.tags["hmmscope.failure_reason"].startswith(f"orphaned: its process {a['worker']['pid']} ")
    rows = {r["number"]: r for r in study_status("faults", storage)}
    assert rows[c["number"]]["state"] == "FAIL" and rows[c["number"]]["reason"].startswith("stale")
    for t in (b, c):  # cut while evaluating, resumed in place by the retry: the same run, FINISHED once
        run = tracking.get_run(uri, t["mlflow_run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["hmmscope.resumed_from_step"] == "80"
    assert len([x for x in _trial_runs(uri) if x.info.status == "FINISHED"]) == 4
    md = _report(proj, "faults", monkeypatch)  # ... and the report counts and uses one run per grid point
    assert "| trials complete / failed / pruned / running | 4 / 0 / 0 / 0 |" in md and "| 0 / 3 |" in md
    assert "Effect = RoPE - absolute; 4 trials, 2 seeds" in md  # (was "4 trials;": stale since the seeds were named)


# ---------------------------------------------------------------- two `sweep run`s at once


@pytest.mark.parametrize("rounds", [pytest.param(1, id="1-round"),
                                    pytest.param(12, id="12-rounds", marks=pytest.mark.slow)])
def test_two_sweep_runs_at_once_finish_the_grid_once(tmp_path, template, rounds):
    """Two `hmmscope sweep run` processes started together on one spec (the old code made two parent runs
    every time and ran one trial twice in 2 of 10 tries)."""
    for i in range(rounds):
        proj = _project(tmp_path, template, f"p{i}", THEORY_SPEC.format(name="twice", ranks="[2, 4]"))
        storage, uri = _stores(proj)
        procs = [_start(["sweep", "run", "s.toml"], proj, tmp_path / f"r{i}-{k}.log") for k in range(2)]
        with _cleanup(proj, procs):
            codes = [p.wait(timeout=300) for p in procs]
        logs = "\n".join((tmp_path / f"r{i}-{k}.log").read_text() for k in range(2))
        assert codes == [0, 0], logs
        rows = study_status("twice", storage)
        assert len(rows) == 4 and all(r["state"] == "COMPLETE" for r in rows), (i, rows)
        assert sorted((r["params"]["theory.gammas"], r["params"]["theory.ranks"]) for r in rows) == [
            (0.5, 2), (0.5, 4), (0.8, 2), (0.8, 4)]
        runs = tracking.search_runs(uri, "faults")
        (parent,) = [r for r in runs if r.data.tags.get("hmmscope.kind", "").startswith("sweep")
                     and r.data.tags.get("hmmscope.kind") != "sweep-theory"]
        assert parent.data.tags["hmmscope.kind"] == "sweep" and parent.info.status == "FINISHED"
        kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert sorted(r.info.run_id for r in kids) == sorted(r["mlflow_run_id"] for r in rows)
        assert all(r.info.status == "FINISHED" for r in kids)


# ---------------------------------------------------------------- moved, copied, read-only projects


def _train_run(proj: Path, monkeypatch) -> str:
    import tomllib

    from hmmscope.config import override, preset
    from hmmscope.pipeline.run import train

    monkeypatch.chdir(proj)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = override(preset("tiny"), tomllib.loads(FIXED.format(steps=10))["fixed"])
    return train(cfg, tracking_uri=tracking.resolve_uri(), experiment="faults", progress=False).run_id


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_moved_project_evaluates_and_analyzes_its_old_runs(tmp_path, template, monkeypatch):
    a = _project(tmp_path, template, "A")
    rid = _train_run(a, monkeypatch)
    monkeypatch.chdir(tmp_path)
    b = tmp_path / "B"
    a.rename(b)  # mv A B
    monkeypatch.chdir(b)
    r = runner.invoke(app, ["evaluate", rid])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["analyze", rid, "--ks", "1", "--n-perms", "1", "--n-episodes", "16"])
    assert r.exit_code == 0, r.output
    assert (b / "mlruns" / "artifacts" / rid / "artifacts" / "evaluation" / "figure1.json").is_file()
    assert not a.exists()
    # a copy works on its own and never writes into the original
    c = tmp_path / "C"
    shutil.copytree(b, c)
    before = _files(b)
    monkeypatch.chdir(c)
    r = runner.invoke(app, ["evaluate", rid])
    assert r.exit_code == 0, r.output
    assert _files(b) == before
    after = _files(c / "mlruns" / "artifacts")
    assert after[f"{rid}/artifacts/evaluation/figure1.json"] > before[f"mlruns/artifacts/{rid}/artifacts/evaluation/figure1.json"]
    # a missing artifact: the error names the path looked for
    ck = c / "mlruns" / "artifacts" / rid / "artifacts" / "checkpoints" / "last.pt"
    ck.unlink()
    r = runner.invoke(app, ["evaluate", rid])
    assert r.exit_code == 2 and "has no checkpoint" in r.output and str(ck) in r.output, r.output


def _read_only(cmd: str, ro: Path) -> list[str]:
    """Run `cmd` (bash) with the folder `ro` read-only: chmod for a normal user; a read-only bind mount in a
    private mount namespace for root (chmod does not stop root)."""
    if os.geteuid() != 0:
        return ["bash", "-c", f"chmod -R a-w {ro} && {cmd}"]
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: cannot make a folder read-only")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"running as root and unshare -m is not permitted: {probe.stderr.decode().strip()}")
    return ["unshare", "-m", "bash", "-c", f"mount --bind {ro} {ro} && mount -o remount,ro,bind {ro} {ro} && {cmd}"]


def test_read_only_store_serves_read_only_commands(tmp_path, template, monkeypatch):
    from hmmscope.sweep import create_study, run_worker
    from hmmscope.sweep.spec import load_spec

    proj = _project(tmp_path, template, "p", THEORY_SPEC.format(name="ro", ranks="[2]"))
    storage, uri = _stores(proj)
    create_study(load_spec(proj / "s.toml"), storage, uri)
    assert run_worker("ro", storage, uri, log=lambda m: None) == 2
    mlruns = proj / "mlruns"
    before = _files(mlruns)
    cmd = f"{EXE} sweep status ro; echo rc=$?; {EXE} runs gc --dry-run; echo rc=$?"
    try:
        r = subprocess.run(_read_only(cmd, mlruns), cwd=proj, env=_env(), capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(mlruns)], check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and out.count("rc=0") == 2 and "Traceback" not in out, out
    assert out.count("COMPLETE") == 2 and "0 orphan run(s) found" in out
    assert _files(mlruns) == before  # nothing written, no lock file


def _cmdline(pid: int) -> bytes:
    """A process's command line; b"" once it is gone (a short-lived child, git's, can end between list and read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _children_of(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
    return out


def _gone(pids, timeout=30.0) -> list[int]:
    """The pids still running (not zombies) after waiting up to `timeout` s for them to go."""
    deadline = time.time() + timeout
    while True:
        left = []
        for p in pids:
            with contextlib.suppress(OSError, IndexError):
                if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    left.append(p)
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkilled_sweep_takes_its_workers_with_it(tmp_path):
    """Fast version: run_sweep's worker processes (here `sleep`, standing in for the worker command) die when
    `sweep run` is SIGKILLed (before: they ran on, detached in their own sessions, beside any resume)."""
    (tmp_path / "s.toml").write_text(TRAIN_SPEC.format(name="pdeath", steps=2) + '"hmm.gamma" = {grid = [0.5]}\n')
    storage, uri = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    code = ("import hmmscope.sweep.worker as w\nfrom hmmscope.sweep.spec import load_spec\n"
            "w.worker_command = lambda *a, **k: ['sleep', '300']\n"
            f"w.run_sweep(load_spec({str(tmp_path / 's.toml')!r}), workers=2, storage={storage!r}, uri={uri!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kids: list[int] = []
    try:
        deadline = time.time() + 120
        while len(kids) < 2:
            kids = [k for k in _children_of(proc.pid) if b"sleep" in _cmdline(k)]
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "run_sweep started no workers"
            time.sleep(0.1)
        proc.kill()
        proc.wait()
        assert _gone(kids) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for k in _gone(kids, timeout=0):
            os.kill(k, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkilled_sweep_run_workers_hand_their_trials_back(tmp_path):
    """Slow version, the real CLI: `hmmscope sweep run` SIGKILLed mid-trial; its worker gets SIGTERM, puts its
    trial back (FAIL 'interrupted' + a WAITING retry) and exits; no worker is left running."""
    (tmp_path / "s.toml").write_text(TRAIN_SPEC.format(name="pdk", steps=5000) + '"hmm.gamma" = {grid = [0.5]}\n')
    storage, uri = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.Popen([str(EXE), "sweep", "run", str(tmp_path / "s.toml"), "--storage", storage,
                             "--tracking-uri", uri], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids: list[int] = []
    try:
        deadline = time.time() + 300
        while True:
            with contextlib.suppress(Exception):
                if sum(r["state"] == "RUNNING" for r in study_status("pdk", storage)) == 1:  # one worker
                    break
            assert proc.poll() is None and time.time() < deadline, "the sweep never started its trials"
            time.sleep(0.2)
        kids = _children_of(proc.pid)
        proc.kill()
        proc.wait()
        assert _gone(kids, timeout=120) == []  # it hands its trial back first (seconds; more on a loaded machine)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for k in _gone(kids, timeout=0):
            os.kill(k, signal.SIGKILL)
    rows = study_status("pdk", storage)
    assert sum(r["state"] == "FAIL" and r["reason"] == "interrupted" for r in rows) == 1
    assert sum(r["state"] == "WAITING" for r in rows) == len(rows) - 1  # its retry, and the trials not reached


def test_a_sweep_with_failed_cells_says_so_and_exits_non_zero(tmp_path, template, monkeypatch):
    """Before: 'already complete: nothing to do ... 0 complete, 1 failed' with exit 0. The FAILED trials are
    made through the trial protocol (no training), then `sweep run` is asked to finish the sweep."""
    from optuna.trial import TrialState

    from hmmscope.sweep import TrialStore, create_study
    from hmmscope.sweep.spec import load_spec

    proj = _project(tmp_path, template, "failed", TRAIN_SPEC.format(name="failed", steps=2).replace(
        'seeds = [0, 1]', 'seeds = [0]').replace('["rope", "absolute"]', '["rope"]'))
    storage, uri = _stores(proj)
    study, _, _ = create_study(load_spec(proj / "s.toml"), storage, uri)
    store = TrialStore.of(study, storage, 3)
    tid = store.claim()
    assert store.finish(tid, TrialState.FAIL, attrs={"fail_reason": "RuntimeError: boom"})
    monkeypatch.chdir(proj)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    r = runner.invoke(app, ["sweep", "run", "s.toml"])
    assert r.exit_code == 1, r.output
    assert "1 trial(s) of sweep failed ended FAILED" in r.stderr and "--retry-failed" in r.stderr


# ---------------------------------------------------------------- a full disk mid-run

DISK = {"hmm.n_tasks": 4, "hmm.n_states": 8, "hmm.n_tokens": 4, "hmm.rank": 2, "data.n_demos": 2, "data.l_demo": 8,
        "data.l_test": 8, "data.n_train": 48, "data.n_eval": 16, "model.n_layers": 1, "model.n_heads": 2,
        "model.d_model": 16, "model.d_mlp": 32, "model.max_len": 64, "train.steps": 24, "train.batch_size": 8,
        "train.warmup": 2, "train.eval_every": 2, "train.ckpt_every": 8, "train.emergence_episodes": 8,
        "train.device": "cpu"}
PAGE = 4096  # tmpfs counts whole pages


def _pages(root: Path) -> int:
    return sum(-(-p.stat().st_size // PAGE) for p in root.rglob("*") if p.is_file())


def _complete(p: Path) -> bool:
    """Is `p` a whole file of its kind (a checkpoint loads, TOML/JSON parse, PNG/PDF end with their trailers)?"""
    import json
    import tomllib

    from hmmscope.training.checkpoints import read_checkpoint

    data = p.read_bytes()
    try:
        if p.suffix == ".pt":
            read_checkpoint(p)
        elif p.suffix == ".toml":
            tomllib.loads(data.decode())
        elif p.suffix == ".json":
            json.loads(data)
        elif p.suffix == ".png":
            return data.endswith(b"IEND\xaeB`\x82")
        elif p.suffix == ".pdf":
            return data.rstrip().endswith(b"%%EOF")
        elif p.suffix == ".csv":
            return data.endswith(b"\n")
    except Exception:
        return False
    return True


@contextlib.contextmanager
def _tmpfs(path: Path, pages: int):
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={pages * PAGE}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


# ~25 s of CPU in three trainings (two real processes); fast twins: test_train.py::test_resume_matches_uninterrupted_run
# (resume, bitwise) and test_full_disk.py (a full disk, in one line)
@pytest.mark.slow
def test_a_full_disk_mid_training_fails_the_run_keeps_the_last_checkpoint_and_resumes_bitwise(tmp_path, template):
    """The artifact store is a tmpfs with room for the run's config.toml and its step-8 checkpoint, no more (the
    checkpoints grow: they carry the emergence curves). The step-16 checkpoint hits ENOSPC: the run ends FAILED
    with the path and the reason in its tag, the command prints one error line and exits non-zero, no file is
    half-written (the step-8 checkpoint is whole), and once the disk has room `train --resume` continues from step
    8 to the weights of an uninterrupted run, bitwise. Before the fix, MLflow's in-place copy truncated the
    step-8 checkpoint and left half of the step-16 one under its name: nothing to resume from."""
    import io

    from hmmscope.config import Config, override
    from hmmscope.pipeline.run import train
    from hmmscope.training.checkpoints import load_model, read_checkpoint

    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    cfg = override(Config(), DISK)
    ref_uri = f"sqlite:///{_project(tmp_path, template, 'ref')}/mlruns/mlflow.db"
    full = train(cfg, tracking_uri=ref_uri, experiment="ref", progress=False)  # the uninterrupted run
    arts = tmp_path / "ref" / "mlruns" / "artifacts" / full.run_id / "artifacts"

    def pages_at(step: int) -> int:  # the checkpoint at `step` holds the emergence curves up to it (fixed-size rest)
        ck = read_checkpoint(arts / "checkpoints" / "last.pt")
        ck["metrics"]["emergence"] = [c for c in ck["metrics"]["emergence"] if c["step"] <= step]
        buf = io.BytesIO()
        torch.save(ck, buf)
        return -(-buf.getbuffer().nbytes // PAGE)

    assert pages_at(16) > pages_at(8)  # the checkpoints grow: a write in place does not fit either
    room = -(-(arts / "config.toml").stat().st_size // PAGE) + pages_at(8)

    proj = _project(tmp_path, template, "proj")
    conf = proj / "c.toml"
    sections: dict[str, list[str]] = {}
    for k, v in DISK.items():
        sec, key = k.split(".")
        sections.setdefault(sec, []).append(f"{key} = {v!r}".replace("'", '"'))
    conf.write_text("".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items()))
    store = proj / "mlruns" / "artifacts"
    with _tmpfs(store, room):
        r = subprocess.run([str(EXE), "train", "--config", str(conf), "--no-evaluate", "--experiment", "disk"],
                           cwd=proj, env=_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode != 0, r.stdout + r.stderr
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "No space left on device" in errors[0] and "checkpoints/last.pt" in errors[0], errors
        uri = f"sqlite:///{proj}/mlruns/mlflow.db"
        (run,) = tracking.search_runs(uri, "disk")
        reason = run.data.tags.get("hmmscope.failure_reason", "")
        assert run.info.status == "FAILED" and "No space left on device" in reason, (run.info.status, reason)
        assert f"{run.info.run_id}/artifacts/checkpoints/last.pt" in reason
        left = [p for p in store.rglob("*") if p.is_file()]
        assert sorted(p.name for p in left) == ["config.toml", "last.pt"], left  # no temp file, no other file
        assert all(_complete(p) for p in left), [p for p in left if not _complete(p)]
        assert read_checkpoint(store / run.info.run_id / "artifacts" / "checkpoints" / "last.pt")["step"] == 8

        subprocess.run(["mount", "-o", "remount,size=64m", str(store)], check=True)  # the disk has room again
        r = subprocess.run([str(EXE), "train", "--config", str(conf), "--resume", run.info.run_id, "--no-evaluate"],
                           cwd=proj, env=_env(),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert tracking.get_run(uri, run.info.run_id).info.status == "FINISHED"
        assert all(_complete(p) for p in store.rglob("*") if p.is_file())
        a, _ = load_model(ref_uri, full.run_id)
        b, _ = load_model(uri, run.info.run_id)
        assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
