"""`hmmscope ui`: a real MLflow UI on 127.0.0.1 on the project's store, stopped (with its children) by Ctrl-C;
a moved store is served with its artifacts."""

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


def _answers(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c-moved-store", "kill-new-store"])
def test_ui_serves_the_store_and_stops_its_servers(tmp_path, stop):
    run_id = None
    if stop == signal.SIGINT:  # a store written in another folder, then moved here (mv old/mlruns mlruns)
        with tracking.start_run(f"sqlite:///{tmp_path}/old/mlruns/mlflow.db", "exp", "r") as run:
            run.log_dict({"x": 1}, "d/x.json")
        run_id = run.run_id
        (tmp_path / "old" / "mlruns").rename(tmp_path / "mlruns")
    port = _free_port()
    exe = Path(sys.executable).parent / "hmmscope"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([str(exe), "ui", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 240  # 6-15 s on a quiet machine; minutes on a loaded one
        while not _answers(f"http://127.0.0.1:{port}/health"):
            assert proc.poll() is None, f"hmmscope ui exited with {proc.returncode}"
            assert time.time() < deadline, "the MLflow UI did not answer within 240 s"
            time.sleep(0.5)
        assert (tmp_path / "mlruns" / "mlflow.db").exists()  # it serves the default store, created once
        if run_id is not None:  # the moved store's artifacts, as the server finds them
            base = f"http://127.0.0.1:{port}"
            files = json.loads(_get(f"{base}/api/2.0/mlflow/artifacts/list?run_id={run_id}&path=d"))["files"]
            assert [f["path"] for f in files] == ["d/x.json"]
            assert json.loads(_get(f"{base}/get-artifact?path=d/x.json&run_uuid={run_id}")) == {"x": 1}
        proc.send_signal(stop)
        assert proc.wait(timeout=60) == 0
        deadline = time.time() + 30
        while _answers(f"http://127.0.0.1:{port}/health"):  # its server went with it
            assert time.time() < deadline, "the MLflow server outlived hmmscope ui"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
