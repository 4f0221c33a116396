"""`hmmscope ui`: a real MLflow UI on 127.0.0.1 on the project's store, stopped (with its children) by Ctrl-C."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


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


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ui_serves_the_store_and_stops_its_servers(tmp_path, stop):
    port = _free_port()
    exe = Path(sys.executable).parent / "hmmscope"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([str(exe), "ui", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 90
        while not _answers(f"http://127.0.0.1:{port}/health"):
            assert proc.poll() is None, f"hmmscope ui exited with {proc.returncode}"
            assert time.time() < deadline, "the MLflow UI did not answer within 90 s"
            time.sleep(0.5)
        assert (tmp_path / "mlruns" / "mlflow.db").exists()  # it serves the default store, created once
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
