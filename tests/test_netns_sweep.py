"""A sweep across hosts that lose the network (issue 30, item 10), on this machine: three hosts made of network
namespaces and veth pairs on one bridge (tests/netns_hosts.py).

Host srv runs PostgreSQL (the Optuna storage and the MLflow store's database) and `mlflow server` (artifacts served
through it); hosts w1 and w2 each run `hmmscope sweep worker` on one two-point grid study. Once w1's trial is under
way (its MLflow run open) and w2 has joined, w1's cable is pulled (`ip link set <its veth> down`). The study must
finish without w1: w2 fails w1's trial as stale by its heartbeat and runs its retry, so every grid point completes
exactly once. Then the cable is plugged back: w1 comes back to its storage, finds its trial failed and retried, records
nothing, ends its own run FAILED (its end could not be written while it was cut off) and exits 0. At the end no
MLflow run is RUNNING, each grid point has one COMPLETE trial and one FINISHED training run, nothing is doubled
(one metric value per step), and the cut run is FAILED with the reason.

Where namespaces, PostgreSQL or psycopg2 cannot be had the test skips, with the reason (CI runs as root with
PostgreSQL installed, so it runs there). In the default suite: a tiny grid (2 points, 200 steps), heartbeats of 1 s
and a grace period of 5 s; measured 72 s on this 2-core machine under `pytest -n 2` at a load average of 5, and
130 s at a load average of 10 (servers 37 s, the study finishing 46 s after the cut, the cut worker out 14 s after
the restore; timings.json in its tmp_path); the workers' MLflow client is bounded to
2 tries of 5 s (MLFLOW_HTTP_REQUEST_*), the storage outage to 600 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from netns_hosts import Hosts

BIN = Path(sys.executable).parent

SPEC = """
[sweep]
name = "{name}"
kind = "train"
objective = "eval/seen/excess_ce"
sampler = "grid"
seeds = [0]
experiment = "netns"
heartbeat_interval = 1
grace_period = 5
max_retry = 2
[fixed]
"hmm.n_tasks" = 4
"hmm.n_states" = 8
"hmm.n_tokens" = 4
"hmm.rank" = 2
"data.n_demos" = 2
"data.l_demo" = 8
"data.l_test" = 8
"data.n_train" = 256
"data.n_eval" = 16
"model.n_layers" = 1
"model.n_heads" = 2
"model.d_model" = 32
"model.d_mlp" = 64
"model.max_len" = 64
"train.steps" = 200
"train.batch_size" = 8
"train.warmup" = 1
"train.eval_every" = 20
"train.ckpt_every" = 100
"train.emergence_episodes" = 0
"train.figures" = false
"train.device" = "cpu"
[space]
"hmm.gamma" = {{grid = [0.5, 0.8]}}
"""


def _need_postgres():
    from pg_server import _pg_bin

    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not found; apt-get install postgresql")
    try:
        import pwd

        pw = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no 'postgres' system user to run the server")
    pytest.importorskip("psycopg2", reason="psycopg2 (the postgres extra) is not installed")
    return bindir, pw


def _wait(cond, timeout: float, what: str, procs=()):
    deadline = time.time() + timeout
    while not cond():
        for p, log in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: a process exited ({p.returncode}): {Path(log).read_text()[-3000:]}")
        if time.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)


def _stop(p: subprocess.Popen | None, group: bool = False) -> None:
    if p is None or p.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, None)):
        try:
            if group:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)
            p.wait(timeout=wait)
            return
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue


def test_a_sweep_across_hosts_survives_a_cut_link(tmp_path):
    why = Hosts.why_not()
    if why is not None:
        pytest.skip(why)
    bindir, pw = _need_postgres()
    import optuna
    from optuna.trial import TrialState

    from hmmscope import tracking
    from hmmscope.sweep import create_study, quiet_optuna
    from hmmscope.sweep.spec import parse_spec

    quiet_optuna()
    pgroot = Path(tempfile.mkdtemp(prefix="hmmscope-netns-pg-"))  # in TMPDIR itself: the postgres user reaches it
    os.chmod(pgroot, 0o755)
    data, sock = pgroot / "data", pgroot / "sock"
    for d in (data, sock):
        d.mkdir()
        os.chown(d, pw.pw_uid, pw.pw_gid)
    procs: dict[str, subprocess.Popen] = {}
    t0, took = time.time(), {}  # seconds of each phase, written to timings.json
    logs = {k: tmp_path / f"{k}.log" for k in ("mlflow", "w1", "w2")}
    with Hosts(["srv", "w1", "w2"]) as net:
        srv = net.ip("srv")
        pg = ["runuser", "-u", "postgres", "--"]
        try:
            subprocess.run([*pg, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
                           check=True, capture_output=True)
            with open(data / "pg_hba.conf", "a") as f:
                f.write(f"host all all {net.subnet}.0/24 trust\n")
            net.run("srv", [*pg, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-t", "60", "-l", str(data / "log.txt"),
                            "-o", f"-p 5432 -k {sock} -c listen_addresses={srv} -c fsync=off", "start"],
                    check=True, capture_output=True)
            for db in ("optuna", "mlflow"):
                net.run("srv", [*pg, str(bindir / "createdb"), "-h", srv, "-p", "5432", "-U", "postgres", db],
                        check=True, capture_output=True)
            storage = f"postgresql+psycopg2://postgres@{srv}:5432/optuna"
            uri = f"http://{srv}:5000"
            env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
            env.update({"OMP_NUM_THREADS": "1", "HMMSCOPE_THREADS": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                        "HMMSCOPE_RUN_HEARTBEAT_S": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
                        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "HMMSCOPE_STORE_OUTAGE_S": "600"})
            procs["mlflow"] = net.popen("srv", [str(BIN / "mlflow"), "server", "--backend-store-uri",
                                                f"postgresql+psycopg2://postgres@{srv}:5432/mlflow",
                                                "--artifacts-destination", str(tmp_path / "artifacts"), "--host", srv,
                                                "--port", "5000", "--workers", "1"],
                                        env=env, stdout=open(logs["mlflow"], "wb"), stderr=subprocess.STDOUT,
                                        start_new_session=True)

            def healthy() -> bool:
                try:
                    with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                        return r.status == 200
                except OSError:
                    return False

            _wait(healthy, 240, "mlflow server", [(procs["mlflow"], logs["mlflow"])])
            spec = parse_spec(SPEC.format(name="cut"), tmp_path / "cut.toml")
            create_study(spec, storage, uri)
            worker = [str(BIN / "hmmscope"), "sweep", "worker", "cut", "--storage", storage, "--tracking-uri", uri]

            def start(name: str) -> None:
                procs[name] = net.popen(name, worker, env=env, cwd=tmp_path, stdout=open(logs[name], "wb"),
                                        stderr=subprocess.STDOUT, start_new_session=True)

            def trials():
                return optuna.load_study(study_name="cut", storage=storage).get_trials(deepcopy=False)

            def runs(status: str | None = None):
                rs = tracking.search_runs(uri, "netns")
                return [r for r in rs if status is None or r.info.status == status]

            def w1_mid_trial() -> bool:  # its trial claimed, and that trial's own training run open (not any trial's:
                # under load w2's run could open first, and the cut then came before w1 had a run; issue 36, item 10)
                mine = [t.number for t in trials() if t.state == TrialState.RUNNING
                        and t.user_attrs.get("worker", {}).get("pid") == procs["w1"].pid]
                return bool(mine) and any(r.data.tags.get("hmmscope.trial") == str(mine[0]) for r in runs("RUNNING"))

            took["servers"] = time.time() - t0
            start("w1")
            start("w2")
            _wait(lambda: w1_mid_trial() and sum(t.state == TrialState.RUNNING for t in trials()) == 2, 240,
                  "both workers' trials under way", [(procs["w1"], logs["w1"]), (procs["w2"], logs["w2"])])
            (cut_trial,) = [t for t in trials() if t.state == TrialState.RUNNING
                            and t.user_attrs["worker"]["pid"] == procs["w1"].pid]
            cut_at = time.time()
            net.cut("w1")

            def done() -> bool:
                return sum(t.state == TrialState.COMPLETE for t in trials()) == 2

            _wait(done, 420, "the study finishing without w1", [(procs["w2"], logs["w2"])])
            finished_at = time.time()
            assert procs["w1"].poll() is None  # cut off, still there
            procs["w2"].wait(timeout=120)
            assert procs["w2"].returncode == 0, logs["w2"].read_text()[-3000:]
            net.restore("w1")
            procs["w1"].wait(timeout=420)
            back_for = time.time() - finished_at
            w1_log, w2_log = logs["w1"].read_text(), logs["w2"].read_text()
            assert procs["w1"].returncode == 0, w1_log[-4000:]
            assert "Traceback" not in w1_log + w2_log, (w1_log + w2_log)[-4000:]

            ts = trials()
            complete = [t for t in ts if t.state == TrialState.COMPLETE]
            failed = [t for t in ts if t.state == TrialState.FAIL]
            assert sorted(t.params["hmm.gamma"] for t in complete) == [0.5, 0.8]  # every grid point once
            assert [t.number for t in failed] == [cut_trial.number], [(t.number, t.state) for t in ts]
            assert failed[0].user_attrs["fail_reason"].startswith("stale: no heartbeat")
            (retry,) = [t for t in complete if t.system_attrs.get("failed_trial") == cut_trial.number]
            assert retry.user_attrs["worker"]["pid"] == procs["w2"].pid and retry.params == cut_trial.params
            assert "this result is dropped" in w1_log and "complete:" not in w1_log  # w1 wrote no second result
            assert runs("RUNNING") == []
            train_runs = [r for r in runs() if r.data.tags.get("hmmscope.kind") == "sweep-train"]
            finished = [r for r in train_runs if r.info.status == "FINISHED"]
            assert sorted(r.info.run_id for r in finished) == sorted(t.user_attrs["mlflow_run_id"] for t in complete)
            (cut_run,) = [r for r in train_runs if r.info.status != "FINISHED"]
            assert cut_run.info.status in ("FAILED", "KILLED") and cut_run.data.tags["hmmscope.failure_reason"]
            c = tracking.client(uri)
            for r in finished:  # nothing doubled: one value per step
                for key in ("train/loss", "val/loss"):
                    steps = [m.step for m in c.get_metric_history(r.info.run_id, key)]
                    assert steps and len(steps) == len(set(steps)), (r.info.run_id, key)
            took.update(cut_to_done=finished_at - cut_at, w1_exit_after_restore=back_for, total=time.time() - t0)
            (tmp_path / "timings.json").write_text(json.dumps({k: round(v, 1) for k, v in took.items()}))
        finally:
            for name in ("w1", "w2"):
                _stop(procs.get(name), group=True)
            _stop(procs.get("mlflow"), group=True)
            net.run("srv", [*pg, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                    capture_output=True)
            shutil.rmtree(pgroot, ignore_errors=True)
