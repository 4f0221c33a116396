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
    assert lease_of(done) is not None
