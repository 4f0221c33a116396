"""`hmmscope ui`: a real MLflow UI on 127.0.0.1 on the project's store, quiet, stopped (with its children) by
Ctrl-C, SIGTERM or its own death; a moved store is served with its artifacts. Every process a test starts is
stopped by its pid, and checked gone."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hmmscope import tracking


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def _start_time(pid):
    """The process's start time (clock ticks since boot), or None if it is gone (a pid can be reused)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(pid):
    """{pid: start time} of every process below `pid` (Linux /proc)."""
    kids = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            kids.setdefault(int(fields[1]), []).append((int(d.name), fields[19]))
    out, todo = {}, [pid]
    while todo:
        for child, start in kids.get(todo.pop(), []):
            out[child] = start
            todo.append(child)
    return out


def _alive(procs):
    return {pid for pid, start in procs.items() if _start_time(pid) == start}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["ctrl-c-moved-store", "kill-new-store", "sigkill-parent"])
def test_ui_serves_the_store_quietly_and_no_process_outlives_it(tmp_path, stop):
    """`hmmscope ui` prints one line, its URL, once the server answers; nothing else (no MLflow table
    creation, no Starlette warnings, no per-request lines); one uvicorn worker; and every process it started
    is gone after Ctrl-C, SIGTERM, or its own death by SIGKILL (the servers die with their parent)."""
    run_id = eid = None
    if stop == signal.SIGINT:  # a store written in another folder, then moved here (mv old/mlruns mlruns)
        with tracking.start_run(f"sqlite:///{tmp_path}/old/mlruns/mlflow.db", "exp", "r") as run:
            run.log_dict({"x": 1}, "d/x.json")
        run_id, eid = run.run_id, run.get().info.experiment_id
        (tmp_path / "old" / "mlruns").rename(tmp_path / "mlruns")
    port = _free_port()
    exe = Path(sys.executable).parent / "hmmscope"
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "TMPDIR": str(tmp_path)}
    out, err = (tmp_path / "out.txt").open("w+"), (tmp_path / "err.txt").open("w+")
    target = ["--run", run_id] if run_id else ["--create"]  # a folder with no store: only with --create
    proc = subprocess.Popen([str(exe), "ui", "--port", str(port), *target], cwd=tmp_path, env=env,
                            stdout=out, stderr=err, start_new_session=True)
    started, printed_before_health = {}, None
    try:
        deadline = time.time() + 240  # 6-15 s on a quiet machine; minutes on a loaded one
        while not _answers(f"http://127.0.0.1:{port}/health"):
            started.update(descendants(proc.pid))  # known as soon as they exist: stopped by pid at the end
            if printed_before_health is None and (tmp_path / "out.txt").read_text():
                # a server not up refuses at once; one that is up may be slow to answer on a busy machine
                printed_before_health = not _answers(f"http://127.0.0.1:{port}/health", timeout=20)
            assert proc.poll() is None, f"hmmscope ui exited with {proc.returncode}: {(tmp_path / 'err.txt').read_text()}"
            assert time.time() < deadline, "the MLflow UI did not answer within 240 s"
            time.sleep(0.2)
        started.update(descendants(proc.pid))
        deadline = time.time() + 30
        while not (tmp_path / "out.txt").read_text():  # the URL, once /health answers
            assert time.time() < deadline and proc.poll() is None, "hmmscope ui printed no URL"
            time.sleep(0.1)
        assert (tmp_path / "mlruns" / "mlflow.db").exists()  # it serves the default store, created once
        base = f"http://127.0.0.1:{port}"
        if run_id is not None:  # the moved store's artifacts, as the server finds them
            files = json.loads(_get(f"{base}/api/2.0/mlflow/artifacts/list?run_id={run_id}&path=d"))["files"]
            assert [f["path"] for f in files] == ["d/x.json"]
            assert json.loads(_get(f"{base}/get-artifact?path=d/x.json&run_uuid={run_id}")) == {"x": 1}
        _get(f"{base}/ajax-api/2.0/mlflow/experiments/search?max_results=5")
        started.update(descendants(proc.pid))
        serving = _alive(started)  # what serves now (a short-lived helper seen at start-up has exited)
        proc.send_signal(stop)
        assert proc.wait(timeout=60) == (-signal.SIGKILL if stop == signal.SIGKILL else 0)
        deadline = time.time() + 30
        while _alive(started):  # its servers went with it
            assert time.time() < deadline, f"processes outlived hmmscope ui: {_alive(started)}"
            time.sleep(0.2)
        assert not _answers(f"http://127.0.0.1:{port}/health")
        assert len(serving) == 2, (serving, started)  # mlflow, and uvicorn with one worker (its default is 4)
        assert not printed_before_health  # the URL came once the server answered
        shown = f"{base}/#/experiments/{eid}/runs/{run_id}?workflowType=machine_learning" if run_id else base
        assert (tmp_path / "out.txt").read_text() == f"MLflow UI: {shown}  (Ctrl-C to stop)\n"
        assert (tmp_path / "err.txt").read_text() == ""
        logs = list(tmp_path.glob("hmmscope-ui-*.log"))  # the servers' log: removed on a clean stop
        assert len(logs) == (1 if stop == signal.SIGKILL else 0)
    finally:
        for pid in [proc.pid, *started]:  # stop what is left, by pid
            if pid == proc.pid and proc.poll() is None or pid != proc.pid and pid in _alive(started):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        out.close()
        err.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's")
def test_ui_stops_in_one_line_when_its_store_moves_away_and_never_creates_it_again(tmp_path):
    """Issue 47, item 5: with `hmmscope ui` running, renaming the project folder made the server create
    `<old path>/mlruns/mlflow.db` again (a full empty schema) at its next request, and the ui served on. Now the server
    opens the store without creating it (SQLite mode=rw) and the ui stops with one line, its servers gone."""
    proj = tmp_path / "proj"
    with tracking.start_run(f"sqlite:///{proj}/mlruns/mlflow.db", "exp", "r"):
        pass
    port = _free_port()
    exe = Path(sys.executable).parent / "hmmscope"
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "TMPDIR": str(tmp_path)}
    out, err = (tmp_path / "out.txt").open("w+"), (tmp_path / "err.txt").open("w+")
    proc = subprocess.Popen([str(exe), "ui", "--port", str(port), "--experiment", "exp"], cwd=proj, env=env,
                            stdout=out, stderr=err, start_new_session=True)
    started = {}
    try:
        deadline = time.time() + 240
        while not (tmp_path / "out.txt").read_text():  # the URL: printed once the server answers
            started.update(descendants(proc.pid))
            assert proc.poll() is None, (tmp_path / "err.txt").read_text()
            assert time.time() < deadline, "the MLflow UI did not answer within 240 s"
            time.sleep(0.2)
        started.update(descendants(proc.pid))
        proj.rename(tmp_path / "moved")
        base = f"http://127.0.0.1:{port}"
        for _ in range(3):  # requests that opened (and so created) the store at its old path
            with contextlib.suppress(OSError):
                _get(f"{base}/ajax-api/2.0/mlflow/experiments/search?max_results=5")
        assert proc.wait(timeout=60) == 1
        deadline = time.time() + 30
        while _alive(started):
            assert time.time() < deadline, f"processes outlived hmmscope ui: {_alive(started)}"
            time.sleep(0.2)
        assert not proj.exists()  # nothing created at the old path, not even its folder
        lines = (tmp_path / "err.txt").read_text().splitlines()
        assert lines == [f"error: the MLflow store {proj}/mlruns/mlflow.db is gone (deleted, or its folder moved) while "
                         "the UI served it; the UI stopped (start it again on the store)"], lines
        assert not list(tmp_path.glob("hmmscope-ui-*.log"))
    finally:
        for pid in [proc.pid, *started]:
            if pid == proc.pid and proc.poll() is None or pid != proc.pid and pid in _alive(started):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        out.close()
        err.close()


def test_ui_refuses_a_port_in_use(tmp_path, monkeypatch, project):
    from typer.testing import CliRunner

    from hmmscope.cli import app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = CliRunner().invoke(app, ["ui", "--create", "--port", str(s.getsockname()[1])])
    assert r.exit_code == 2 and "the port is in use" in r.output and not (tmp_path / "mlruns").exists()


def test_ui_refuses_a_folder_with_no_store_unless_create(tmp_path, monkeypatch, project):
    """No store here: exit 2 with one line that says how to get one, and nothing created; an unknown run,
    sweep or experiment is refused before any server starts."""
    from typer.testing import CliRunner

    from hmmscope.cli import app

    r = CliRunner().invoke(app, ["ui"])
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and r.output.startswith("error: no MLflow store at ") and "--create" in r.output
    assert not (tmp_path / "mlruns").exists()
    with tracking.start_run(tracking.default_tracking_uri(), "exp", "r"):
        pass
    for args, what in [(["--run", "nope"], "no run 'nope'"), (["--sweep", "nope"], "no sweep 'nope'"),
                       (["--experiment", "nope"], "no experiment 'nope'"),
                       (["--run", "a", "--sweep", "b"], "at most one of")]:
        r = CliRunner().invoke(app, ["ui", "--port", str(_free_port()), *args])
        assert r.exit_code == 2 and r.output.count("\n") == 1 and what in r.output, r.output


def test_the_optuna_dashboard_url_opens_the_sweeps_study(tmp_path):
    """Before: `ui --sweep NAME --optuna-dashboard` printed the dashboard's front page. Now its URL is the study's
    page (/dashboard/studies/<id>), which a real optuna-dashboard serves, its API naming that study."""
    import optuna

    from hmmscope.cli.ui import study_url

    storage = f"sqlite:///{tmp_path}/optuna.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="other", storage=storage)
    sid = optuna.create_study(study_name="mine", storage=storage)._study_id
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    url = study_url(base, storage, "mine")
    assert url == f"{base}/dashboard/studies/{sid}" and sid == 2
    assert study_url(base, storage, "nope") == base and study_url(base, storage, None) == base
    exe = Path(sys.executable).parent / "optuna-dashboard"
    proc = subprocess.Popen([str(exe), "--host=127.0.0.1", f"--port={port}", "--", storage],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not _answers(f"{base}/api/meta"):
            assert proc.poll() is None and time.time() < deadline, "optuna-dashboard did not answer"
            time.sleep(0.2)
        assert b"<html" in _get(url).lower()  # the page (its single-page app routes /dashboard/studies/<id>)
        assert json.loads(_get(f"{base}/api/studies/{sid}"))["name"] == "mine"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
