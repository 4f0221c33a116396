"""Shared fixtures: a fresh project as the working folder (`project`) and a fresh store's URI (`store_uri`); the tiny
training config (`tiny_toml`: a TOML file's text, 4-step CPU training on a 4-task mixture,
for tests that drive the CLI as real processes; append a table or a key of the last table, [train], to vary it), a
real `mlflow server` process on 127.0.0.1, stopped by its process group; a folder built once per test run and
shared by the pytest-xdist processes (`built_once`); the `gpu` marker's skip (or failure, with
HMMSCOPE_REQUIRE_GPU=1) where CUDA is not available."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

TINY_TOML = """
[hmm]
n_tasks = 4
n_states = 8
n_tokens = 4
rank = 2
[data]
n_demos = 2
l_demo = 8
l_test = 8
n_train = 64
n_eval = 16
[model]
n_layers = 1
n_heads = 2
d_model = 32
d_mlp = 64
max_len = 64
[train]
steps = 4
batch_size = 8
warmup = 1
eval_every = 2
ckpt_every = 2
device = "cpu"
"""

pytest_plugins = ["pytester"]  # tests/test_gpu.py checks the gpu group's skip rule in an inline run


@pytest.fixture(scope="session")
def tiny_toml() -> str:
    """The tiny training config as TOML text (module docstring)."""
    return TINY_TOML


LONG_SWEEP = """
[sweep]
name = "{name}"
objective = "eval/seen/excess_ce"
sampler = "grid"
experiment = "sw"
[fixed]
"hmm.n_tasks" = 4
"hmm.n_states" = 8
"hmm.n_tokens" = 4
"hmm.rank" = 2
"data.n_train" = 32
"data.n_eval" = 16
"model.n_layers" = 1
"model.d_model" = 32
"model.d_mlp" = 64
"train.steps" = 100000
"train.eval_every" = 20
"train.device" = "cpu"
"train.figures" = false
[space]
"hmm.gamma" = {grid = [0.5]}
"""


@pytest.fixture(scope="session")
def long_sweep_toml():
    """A sweep spec's TOML text, by name: one trial of the tiny mixture training 100,000 steps (it runs until the
    test stops it or the store fails under it)."""
    return lambda name: LONG_SWEEP.replace("{name}", name)


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A fresh project folder (tmp_path) as the working folder, MLFLOW_TRACKING_URI unset: commands use the default
    store, <project>/mlruns/mlflow.db."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture
def store_uri(tmp_path) -> str:
    """The sqlite URI of a store that does not exist yet, <tmp_path>/mlruns/mlflow.db (hmmscope creates it)."""
    return f"sqlite:///{tmp_path}/mlruns/mlflow.db"


def _wait_trial_training(folder: Path, proc, why, timeout: float = 300.0) -> str:
    """Wait until trial 0 of the sweep process `proc` started in `folder` (its store: folder/mlruns) logs train/loss;
    returns its run id. Fails with `why()` (the process's output) if the process ends first or the wait times out."""
    from hmmscope import tracking

    uri = f"sqlite:///{folder}/mlruns/mlflow.db"
    deadline = time.time() + timeout
    while True:
        assert proc.poll() is None, why()
        assert time.time() < deadline, "the trial never started"
        if (folder / "mlruns" / "mlflow.db").exists():
            runs = [r for r in tracking.search_runs(uri, "sw") if r.data.tags.get("hmmscope.trial") == "0"]
            if runs and "train/loss" in tracking.client(uri).get_run(runs[0].info.run_id).data.metrics:
                return runs[0].info.run_id
        time.sleep(1)


@pytest.fixture(scope="session")
def wait_trial_training():
    """`wait(folder, proc, why, timeout=300)`: the run id of trial 0 of a sweep (long_sweep_toml's experiment `sw`)
    once it logs train/loss."""
    return _wait_trial_training


@pytest.fixture(scope="session")
def built_once(tmp_path_factory):
    """`built_once(name, build)`: the folder <run's temp>/shared-<name>, built by `build(folder)` once per test run
    and shared by every pytest-xdist process of the run (the others wait on a file lock meanwhile). For module
    fixtures whose tests only read what was built (a module's tests may run in both processes). A build that raises
    leaves no marker: the next user builds again, in an emptied folder."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's, not an earlier run's

    def get(name: str, build) -> Path:
        folder = root / f"shared-{name}"
        with FileLock(str(root / f"shared-{name}.lock")):
            if not (folder / ".built").exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                build(folder)
                (folder / ".built").touch()
        return folder

    return get


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{tmp_path}/srv.db",
         "--artifacts-destination", str(tmp_path / "srv-artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240  # a new store's migrations and uvicorn: seconds idle, minutes on a busy machine
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"mlflow server did not come up (exit code {proc.poll()})")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------- the gpu group (tests/test_gpu.py)


def pytest_runtest_setup(item):
    """A `gpu` test without CUDA is skipped with the reason, or fails where HMMSCOPE_REQUIRE_GPU is set."""
    if item.get_closest_marker("gpu") is None:
        return
    import torch

    if not torch.cuda.is_available():
        if os.environ.get("HMMSCOPE_REQUIRE_GPU"):
            pytest.fail(f"CUDA not available (torch {torch.__version__}) but HMMSCOPE_REQUIRE_GPU is set", pytrace=False)
        pytest.skip("CUDA not available")


def pytest_terminal_summary(terminalreporter):
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "gpu" in getattr(r, "keywords", {})]
    if skipped:
        reasons = sorted({r.longrepr[2].removeprefix("Skipped: ") if isinstance(r.longrepr, tuple) else str(r.longrepr)
                          for r in skipped})
        terminalreporter.write_line(f"{len(skipped)} gpu test(s) skipped: {'; '.join(reasons)}")
