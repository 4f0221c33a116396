"""MLflow's usage telemetry stays off in hmmscope's processes (tracking/telemetry.py): a real `hmmscope ui` (the
command, then its MLflow server child, both import mlflow) under a fresh HOME writes no ~/.config/mlflow/telemetry.json
and hands the setting to its server; a user's own MLFLOW_DISABLE_TELEMETRY or DO_NOT_TRACK is kept."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_ui import descendants

from hmmscope.tracking.telemetry import TELEMETRY_ENV, telemetry_off, telemetry_setting

# MLflow turns its telemetry off by itself under pytest and in CI (mlflow.telemetry.utils._is_ci_env_or_testing):
# the process under test must not look like either, or the test could not fail
NOT_A_TEST = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "GITHUB_ACTIONS", "CI", "CIRCLECI", "GITLAB_CI",
              "JENKINS_URL", "TRAVIS", "TF_BUILD", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "BUILDKITE",
              "TEAMCITY_VERSION", "CLOUD_RUN_EXECUTION", "RUNBOT_HOST_URL", "RUNBOT_BUILD_NAME", "RUNBOT_WORKER_ID",
              "MLFLOW_TRACKING_URI", "XDG_CONFIG_HOME", *("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"))


def test_off_unless_the_user_chose():
    assert telemetry_setting({}) == {TELEMETRY_ENV: "true"}
    for chosen in ({TELEMETRY_ENV: "false"}, {TELEMETRY_ENV: "true"}, {"DO_NOT_TRACK": "0"}, {"DO_NOT_TRACK": "1"}):
        env = dict(chosen)
        telemetry_off(env)
        assert env == chosen  # the user's own setting, untouched, and nothing added beside it
    env = {"PATH": "/bin"}
    telemetry_off(env)
    assert env == {"PATH": "/bin", TELEMETRY_ENV: "true"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None if it is gone (a pid can be reused)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_hmmscope_ui_and_its_mlflow_server_write_no_telemetry_file(tmp_path):
    """Before: the command and its server each created HOME/.config/mlflow/telemetry.json (an installation id) and
    would send usage events."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k not in NOT_A_TEST}, "HOME": str(home), "TMPDIR": str(tmp_path)}
    port = _free_port()
    exe = Path(sys.executable).parent / "hmmscope"
    out = (tmp_path / "out.txt").open("w")
    proc = subprocess.Popen([str(exe), "ui", "--create", "--port", str(port)], cwd=tmp_path, env=env, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)
    seen: dict[int, str] = {}
    try:
        deadline = time.time() + 240  # seconds on a quiet machine, minutes on a loaded one
        while not (tmp_path / "out.txt").read_text():  # its URL, once the server answers
            seen.update(descendants(proc.pid))
            assert proc.poll() is None, (tmp_path / "out.txt").read_text()
            assert time.time() < deadline, "hmmscope ui printed no URL within 240 s"
            time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=20) as r:
            assert r.status == 200
        assert not (home / ".config" / "mlflow" / "telemetry.json").exists()
        assert not list(home.rglob("telemetry.json"))
        servers = [p for p in descendants(proc.pid) if b"mlflow" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert servers, "no MLflow server below hmmscope ui"
        for pid in servers:  # the server's own environment says so (a worker it forks inherits it)
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert f"{TELEMETRY_ENV}=true".encode() in environ
    finally:
        seen.update(descendants(proc.pid))
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pid, start in seen.items():  # the servers die with their parent; anything left is stopped by its pid
            if _start(pid) == start:
                os.kill(pid, signal.SIGKILL)
        out.close()
