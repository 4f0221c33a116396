"""hmmscope.tracking.liveness: one writer per run. A run's lease is one tag (hidden by MLflow's UI); `runs gc`
from another PID namespace on this host (a container: `unshare --pid --fork --mount-proc`) leaves a live run
alone and ends one whose lease expired; `--resume` of a live run is refused; a run that finishes after being
marked an orphan clears the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app
from hmmscope.tracking.liveness import LEASE_TAG, lease_of, live_owner, stale_reason


def _gc_in_new_pid_namespace(uri: str) -> list[str]:
    """`gc_runs` run by a process in a fresh PID namespace (same host, same boot): the names it marked."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs Linux, root and unshare(1) for a new PID namespace")
    code = ("import json, sys\nfrom hmmscope import tracking\n"
            f"print(json.dumps([r.info.run_name for r, _ in tracking.gc_runs({uri!r})]))\n")
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=180)
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip(f"unshare is not permitted here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_lease_is_one_tag_outside_mlflows_prefix_with_a_namespace_safe_identity(tmp_path):
    """One tag, `hmmscope.lease` (MLflow reserves `mlflow.` for its own tags); a run recorded with the old
    `mlflow.hmmscope.lease` is read the same way."""
    from hmmscope.tracking.liveness import LEGACY_LEASE_TAG

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with tracking.start_run(uri, "exp", "r") as run:
        tags = run.get().data.tags
    lease = json.loads(tags[LEASE_TAG])
    assert LEASE_TAG == "hmmscope.lease" and not any(k.startswith("mlflow.hmmscope") for k in tags)
    assert not any(k in tags for k in ("hmmscope.pid", "hmmscope.heartbeat", "hmmscope.host"))
    assert lease["pid"] == str(os.getpid()) and lease["pidns"].startswith("pid:[") and lease["boot"]
    c = tracking.client(uri)
    old = c.create_run(tracking.experiment_id(uri, "exp"), run_name="old",
                       tags={LEGACY_LEASE_TAG: json.dumps({**lease, "pid": "999999999", "beat": time.time()})})
    got = lease_of(c.get_run(old.info.run_id))
    assert got is not None and got["pid"] == "999999999" and got["interval"] == lease["interval"]


def test_gc_from_another_pid_namespace_judges_by_the_lease_not_the_pid(tmp_path):
    """Before: gc in a container on the same host marked live runs KILLED, their pids missing there.
    One gc, from a fresh PID namespace: our live run (fresh lease) is left alone, as is a run whose owner in
    another namespace beat just now; one whose lease expired 400 s ago (5 x 30 s grace) is ended."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking.ensure_store(uri)
    c = tracking.client(uri)
    with tracking.start_run(uri, "exp", "live") as run:
        lease = {**json.loads(run.get().data.tags[LEASE_TAG]), "interval": 30, "pidns": "pid:[1]", "pid": "1"}
        eid = tracking.experiment_id(uri, "exp")
        old = c.create_run(eid, run_name="expired",
                           tags={LEASE_TAG: json.dumps({**lease, "beat": time.time() - 400})}).info.run_id
        fresh = c.create_run(eid, run_name="fresh", tags={LEASE_TAG: json.dumps({**lease, "beat": time.time()})})
        assert _gc_in_new_pid_namespace(uri) == ["expired"]
        assert c.get_run(run.run_id).info.status == "RUNNING"
    assert c.get_run(old).info.status == "KILLED"
    assert c.get_run(old).data.tags["hmmscope.failure_reason"].startswith("orphaned: no heartbeat for 4")
    assert c.get_run(fresh.info.run_id).info.status == "RUNNING"


def test_resume_of_a_live_run_is_refused_and_a_finished_run_clears_its_orphan_mark(tmp_path, monkeypatch):
    """Before: `train --resume RID` ran beside RID's own process, logging steps twice."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with tracking.start_run(uri, "exp", "busy") as run:
        got = run.get()
        assert stale_reason(got) is None and f"process {os.getpid()}" in live_owner(got)
        r = CliRunner().invoke(app, ["train", "--resume", run.run_id, "--tracking-uri", uri])
        assert r.exit_code == 2 and "still running" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        c = tracking.client(uri)  # a gc that misjudged it (e.g. a long pause): the run then finishes
        c.set_tag(run.run_id, "hmmscope.failure_reason", "orphaned: no heartbeat for 999 s")
    done = tracking.client(uri).get_run(run.run_id)
    assert done.info.status == "FINISHED" and "hmmscope.failure_reason" not in done.data.tags
    assert lease_of(done) is None  # nobody holds a finished run (before: its lease stayed, a tag on its UI page)


def test_a_run_that_finishes_drops_the_failure_reason_and_lease_of_its_earlier_session(tmp_path):
    """An interrupted run resumed to its end (a sweep's parent after Ctrl-C and a resume, a retried trial's run) kept
    `hmmscope.failure_reason: KeyboardInterrupt` and its lease; a finished run has neither. One that fails keeps both
    (its reason, and who held it)."""
    from hmmscope.tracking.hold import settle

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(KeyboardInterrupt), tracking.start_run(uri, "exp", "cut") as run:
        raise KeyboardInterrupt("signal 15")
    c = tracking.client(uri)
    cut = c.get_run(run.run_id)
    assert cut.info.status == "KILLED" and cut.data.tags["hmmscope.failure_reason"] == "KeyboardInterrupt: signal 15"
    assert lease_of(cut) is not None
    with tracking.start_run(uri, "exp", "", resume=run.run_id):
        pass
    done = c.get_run(run.run_id)
    assert done.info.status == "FINISHED" and "hmmscope.failure_reason" not in done.data.tags, done.data.tags
    assert LEASE_TAG not in done.data.tags and lease_of(done) is None
    # its writer may still drop its result (a sweep trial retried elsewhere): a finished run without a lease is its own
    assert settle(uri, run.run_id, "dropped", finished_too=True) and c.get_run(run.run_id).info.status == "FAILED"


# ---------------------------------------------------------------- two resumes started together (issue 30, item 1)

RACER = Path(__file__).resolve().parent / "resume_racer.py"
TINY_EXTRA = """emergence_episodes = 0
figures = false
"""  # appended to the shared tiny config (conftest.tiny_toml)


def _race(tmp_path: Path, rounds: int, tiny_toml: str) -> None:
    """`rounds` rounds of two `train --resume RID` processes released at the same instant (tests/resume_racer.py):
    each round exactly one trains (exit 0) and the other exits 2 with one line naming the winner's process; every
    metric step of the run is logged once."""
    from hmmscope.config import load_toml
    from hmmscope.pipeline.run import train

    (tmp_path / "tiny.toml").write_text(tiny_toml + TINY_EXTRA)
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    rid = train(load_toml(tmp_path / "tiny.toml"), tracking_uri=uri, experiment="race", progress=False).run_id
    out = tmp_path / "race.json"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    r = subprocess.run([sys.executable, str(RACER), uri, rid, str(rounds), str(out), str(tmp_path / "tiny.toml"),
                        str(tmp_path / "racer")],
                       cwd=tmp_path, env={**env, "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=120 + 60 * rounds)
    assert r.returncode == 0, r.stderr[-3000:]
    # the children's output stays in the test's folder (before: a /tmp/resume-racer-* folder, never removed)
    assert sorted(p.name for p in (tmp_path / "racer").iterdir()) == sorted(
        f"r{n}-{i}.{x}" for n in range(rounds) for i in (0, 1) for x in ("out", "err"))
    for n, (a, b) in enumerate(json.loads(out.read_text())):
        win, lose = (a, b) if a["code"] == 0 else (b, a)
        assert (win["code"], lose["code"]) == (0, 2), (n, a, b)
        lines = lose["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (n, lose["stderr"])
        assert f"is still running in process {win['pid']} on " in lines[0], (n, lines[0])
    c = tracking.client(uri)
    run = c.get_run(rid)
    assert run.info.status == "FINISHED"
    for key in ("train/loss", "val/loss", "train/lr"):
        steps = [m.step for m in c.get_metric_history(rid, key)]
        assert len(steps) == len(set(steps)), (key, sorted(steps))  # before: steps 20-50 twice, step 20 three times
    assert max(m.step for m in c.get_metric_history(rid, "train/loss")) == 4 + 4 * rounds
    assert not list((tmp_path / "mlruns" / ".leases").glob("*.lock"))  # every lock file removed by its holder


def test_two_resumes_started_together_one_runs_the_other_exits_2(tmp_path, tiny_toml):
    """Before: both ran, writing checkpoints/last.pt and every metric twice. 5 rounds, real processes."""
    _race(tmp_path, 5, tiny_toml)


@pytest.mark.slow  # 40 rounds of the same race: 642 s here (2 cores, beside another test run; the 5-round one 53 s)
def test_two_resumes_started_together_many_rounds(tmp_path, tiny_toml):
    _race(tmp_path, 40, tiny_toml)


def test_a_held_run_is_refused_to_every_other_writer_and_free_after(tmp_path, store_uri):
    """The lease of a sqlite store is an OS lock beside it: held while a run is open, named when refused, dropped when
    its holder ends (a process that dies drops it too: the OS closes its descriptor)."""
    uri = store_uri
    with tracking.start_run(uri, "exp", "r") as run:
        rid = run.run_id
        lock = tmp_path / "mlruns" / ".leases" / f"{rid}.lock"
        assert json.loads(lock.read_text())["pid"] == str(os.getpid())
        code = ("import sys\nfrom hmmscope import tracking\n"
                "try:\n    tracking.start_run(sys.argv[1], 'exp', '', resume=sys.argv[2]).__enter__()\n"
                "except tracking.RunHeld as e:\n    print(e); sys.exit(2)\n")
        r = subprocess.run([sys.executable, "-c", code, uri, rid], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and f"still running in process {os.getpid()} on " in r.stdout, r.stdout + r.stderr
        assert tracking.client(uri).get_run(rid).info.status == "RUNNING"
        with tracking.start_run(uri, "exp", "", resume=rid):  # this process again: re-entrant, not refused
            pass
    assert not lock.exists()
    with tracking.start_run(uri, "exp", "", resume=rid):
        pass
    assert tracking.client(uri).get_run(rid).info.status == "FINISHED"
