"""Bad input, one case per class: exit code 2, one line on stderr, no traceback, nothing written.

Every case runs the real CLI in-process (CliRunner) inside a prepared project: a store with a run whose
checkpoint does not fit its model, a bare run, a sweep study, a config file, a folder, a regular file and a
binary file. Around each case the project is snapshotted: every file and folder (size and mtime; databases
by their rows, lock files by their existence), the MLflow runs with their status, the Optuna studies and
trials. A case passes when the command exits 2 with exactly one `error: ...` line on stderr, raised no
exception but SystemExit, and the snapshot is unchanged (paths outside the project named by the case are
checked too).

tests/audit_bad_inputs.py tries many more inputs of these classes with real processes (a script, not a test).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import tempfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app
from hmmscope.config import flatten, load_toml
from hmmscope.model.transformer import Transformer

runner = CliRunner()

TINY_EXTRA = """[theory]
gammas = [0.5]
n_states = [6]
ranks = [2]
n_tokens = 6
n_histories = 50
lengths = [1, 2, 4]
burn_in = 10
gamma_m = 0
"""  # appended to the shared tiny config (conftest.tiny_toml)


def spec_text(name: str = "s", objective: str = "eval/seen/excess_ce") -> str:
    return (f'[sweep]\nname = "{name}"\nobjective = "{objective}"\nsampler = "grid"\nexperiment = "sw"\n'
            '[fixed]\n"hmm.n_tasks" = 4\n"hmm.n_states" = 8\n"hmm.n_tokens" = 4\n"hmm.rank" = 2\n'
            '"data.n_train" = 32\n"data.n_eval" = 16\n"model.n_layers" = 1\n"model.d_model" = 32\n"model.d_mlp" = 64\n'
            '"train.steps" = 2\n"train.device" = "cpu"\n[space]\n"hmm.gamma" = {grid = [0.5]}\n')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _foreign_server(folder: Path) -> str:
    """A web server that answers /health with 200 and is not MLflow (a static file server; a daemon thread)."""
    import functools
    import http.server
    import threading

    (folder / "health").write_text("OK")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_toml):
    """The prepared project (built once): see the module docstring. Returns {name: value} for the cases."""
    from hmmscope.sweep import create_study
    from hmmscope.sweep.spec import parse_spec

    root = tmp_path_factory.mktemp("project")
    (root / "tiny.toml").write_text(tiny_toml + TINY_EXTRA)
    (root / "cfgdir").mkdir()
    (root / "afile").write_text("a regular file\n")
    (root / "garbage.bin").write_bytes(bytes(range(256)) * 4)
    (root / "spec.toml").write_text(spec_text("fine"))
    (root / "escape.toml").write_text(spec_text("../escape"))
    (root / "objective.toml").write_text(spec_text("objective", objective="eval/not_a_metric"))
    cfg = load_toml(root / "tiny.toml")
    model = Transformer(cfg.model, cfg.hmm.n_tokens + 1)
    ck = {"model": model.state_dict(), "optimizer": {}, "step": 0, "vocab_size": cfg.hmm.n_tokens + 1,
          "config": {**flatten(cfg), "model.d_model": 64}, "metrics": {}, "rng": {}}
    torch.save(ck, root / "misfit.pt")  # weights of a d_model=32 model, config says 64
    torch.save({**ck, "config": flatten(cfg)}, root / "good.pt")  # a checkpoint that fits its model
    torch.save({**ck, "config": flatten(cfg), "step": -5}, root / "negstep.pt")
    nan = {k: v.clone() for k, v in model.state_dict().items()}
    next(v for v in nan.values() if v.is_floating_point()).fill_(float("nan"))
    torch.save({**ck, "config": flatten(cfg), "model": nan}, root / "nan.pt")
    (root / "cut.toml").write_text(spec_text("cut").split("[space]")[0])  # a spec whose file was cut short
    (root / "fixedswept.toml").write_text(spec_text("fs").replace('[space]', '"hmm.gamma" = 0.3\n[space]'))
    (root / "seedswept.toml").write_text(spec_text("ss").replace('[space]\n', '[space]\n"train.seed" = {grid = [3, 4]}\n'))
    uri = f"sqlite:///{root}/mlruns/mlflow.db"
    with tracking.start_run(uri, "hmmscope", "misfit") as run:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "last.pt").write_bytes((root / "misfit.pt").read_bytes())
            run.log_artifact(Path(tmp) / "last.pt", "checkpoints")
    with tracking.start_run(uri, "hmmscope", "deleted") as gone:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "last.pt").write_bytes((root / "misfit.pt").read_bytes())
            gone.log_artifact(Path(tmp) / "last.pt", "checkpoints")
    from mlflow import MlflowClient

    MlflowClient(uri).delete_run(gone.run_id)
    with tracking.start_run(uri, "hmmscope", "nan-weights") as nanrun:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "last.pt").write_bytes((root / "nan.pt").read_bytes())
            nanrun.log_artifact(Path(tmp) / "last.pt", "checkpoints")
    with tracking.start_run(uri, "hmmscope", "zero-checkpoint") as zero:  # a checkpoint whose write was cut off
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "last.pt").touch()
            zero.log_artifact(Path(tmp) / "last.pt", "checkpoints")
    (root / "zero.pt").touch()
    storage = f"sqlite:///{root}/mlruns/optuna.db"
    create_study(parse_spec(spec_text("known"), root / "known.toml"), storage, uri)
    bad = root / "corrupt" / "studies.db"  # a malformed page under an intact header and schema
    bad.parent.mkdir()
    with sqlite3.connect(bad) as c:
        c.execute("create table studies (x text)")
        c.executemany("insert into studies values (?)", [("x" * 500,)] * 200)
    raw = bytearray(bad.read_bytes())
    raw[4096 * 3: 4096 * 3 + 200] = b"\xff" * 200
    bad.write_bytes(bytes(raw))
    os.mkfifo(root / "pipe.csv")
    os.mkfifo(root / "fifo.toml")
    os.mkfifo(root / "fifo.pt")
    (root / "big.toml").write_text("# padding\n" * 200_000)  # 2 MB of comments: valid TOML, too large
    (root / "deep.toml").write_text("x = " + "[" * 3000 + "]" * 3000 + "\n")
    outside = tmp_path_factory.mktemp("outside")
    (root / "out").mkdir()
    (root / "out" / "known").symlink_to(outside, target_is_directory=True)  # planted: report would write there
    if os.geteuid() == 0:  # root writes through permission bits: a procfs folder refuses new entries to everyone
        ro = Path("/proc/1")
    else:
        ro = root / "readonly"
        ro.mkdir()
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    foreign = _foreign_server(tmp_path_factory.mktemp("foreign"))
    return {"deleted_run": gone.run_id, "nan_run": nanrun.run_id, "zero_run": zero.run_id, "foreign": foreign, "outside": outside,
            "root": root, "uri": uri, "storage": storage, "misfit_run": run.run_id, "readonly": ro,
            "port": _free_port()}


def _snapshot(root: Path) -> dict:
    files, runs, studies = {}, {}, set()
    trials = 0
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_dir():
            files[rel] = "dir"
        elif p.suffix in (".db", ".lock"):
            files[rel] = "db"  # a database is compared by its rows below; an existing lock file may be reopened
        else:
            st = p.stat()
            files[rel] = (st.st_size, st.st_mtime_ns)
    for db in root.rglob("mlflow.db"):
        with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as c:
            runs.update({r: s for r, s in c.execute("select run_uuid, status from runs")})
    for db in root.rglob("optuna.db"):
        with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as c:
            studies |= {n for (n,) in c.execute("select study_name from studies")}
            trials += c.execute("select count(*) from trials").fetchone()[0]
    return {"files": files, "runs": runs, "studies": studies, "trials": trials}


P = pytest.param
# One case per class of bad input: (args, a word the one-line error must contain, paths outside the project).
CASES = [
    P(["train", "--config", "tiny.toml", "--set", "train.lr=inf"], "finite", id="config: non-finite float"),
    P(["train", "--config", "tiny.toml", "--set", "train.weight_decay=-1"], "weight_decay", id="config: out of range"),
    P(["generate", "x.npz", "--config", "tiny.toml", "--set", "data.seed=4294967296"], "seed",
      id="seed outside numpy's range"),
    P(["generate", "x.npz", "--config", "tiny.toml", "--set", "hmm.n_tasks=1000000000"], "this machine has",
      id="size that cannot fit in memory"),
    P(["train", "--config", "cfgdir"], "folder", id="directory as config file"),
    P(["sweep", "run", "cfgdir"], "folder", id="directory as sweep spec"),
    P(["train", "--config", "garbage.bin"], "garbage.bin", id="binary config file"),
    P(["generate", "afile/x.npz", "--config", "tiny.toml"], "afile", id="output under a regular file"),
    P(["theory", "--config", "tiny.toml", "--json", "{readonly}/x.json"], "x.json", id="unwritable --json"),
    P(["run", "--config", "tiny.toml", "--out", "{readonly}/out"], "out", id="run: unwritable output folder"),
    P(["train", "--config", "tiny.toml", "--tracking-uri", "bogus://x"], "bogus", id="tracking uri: bogus scheme"),
    P(["evaluate", "{misfit_run}", "--tracking-uri", "http://127.0.0.1:{port}"], "http://127.0.0.1:",
      id="tracking uri: unreachable server"),
    P(["sweep", "run", "spec.toml", "--storage", "postgresql://u:p@127.0.0.1:{port}/db"], "storage",
      id="storage: database down"),
    P(["sweep", "run", "spec.toml", "--storage", "mysql://u:p@127.0.0.1:{port}/db"], "storage",
      id="storage: driver missing or database down"),
    P(["sweep", "worker", "nosuch", "--storage", "{storage}"], "nosuch", id="sweep worker: unknown study"),
    P(["sweep", "status", "nosuch", "--storage", "sqlite:///{root}/fresh/optuna.db"], "optuna",
      id="sweep status: no storage yet"),
    P(["report", "nosuch"], "nosuch", id="report: unknown sweep"),
    P(["report", "../../hmmscope-escape"], "safe name", id="report: name escapes the project"),
    P(["sweep", "run", "escape.toml"], "safe name", id="spec: name escapes the project"),
    P(["sweep", "run", "objective.toml"], "not_a_metric", id="spec: objective the trial does not log"),
    P(["analyze", "misfit.pt"], "do not fit", id="checkpoint file does not fit its model"),
    P(["evaluate", "{misfit_run}"], "do not fit", id="run's checkpoint does not fit its model"),
    P(["train", "--config", "tiny.toml", "--resume", "0123456789abcdef0123456789abcdef"], "unknown",
      id="unknown run"),
    P(["train", "--config", "tiny.toml", "--run-name", "../x"], "safe name", id="unsafe run name"),
    P(["train", "--config", "tiny.toml", "--device", "cuda:99"], "cuda:99", id="unavailable device"),
    P(["sweep", "run", "spec.toml", "--workers", "0"], "--workers", id="option value (Click)"),
    P(["train", "--no-such-option"], "no-such-option", id="unknown option (Click)"),
    P(["train", "--config", "fifo.toml"], "special file", id="config: a FIFO (would block)"),
    P(["train", "--config", "/dev/zero"], "special file", id="config: a device (would never end)"),
    P(["sweep", "run", "fifo.toml"], "special file", id="spec: a FIFO"),
    P(["analyze", "fifo.pt"], "special file", id="checkpoint: a FIFO"),
    P(["train", "--config", "big.toml"], "larger than", id="config: too large to be one"),
    P(["train", "--config", "deep.toml"], "nested deeper", id="config: nested 3000 deep"),
    P(["train", "--config", "tiny.toml", "--set", "model.window=100000000000000000000"], "at most",
      id="int: larger than any int setting"),
    P(["train", "--config", "tiny.toml", "--set", "model.window=65"], "max_len", id="int: window beyond max_len"),
    P(["sweep", "run", "spec.toml", "--workers", "100000"], "--force", id="workers: far more than cores"),
    P(["analyze", "misfit.pt", "--probe-jobs", "4096"], "core", id="probe jobs: more than cores"),
    P(["train", "--config", "tiny.toml", "--tracking-uri", "{foreign}"], "not an MLflow",
      id="tracking uri: a server that answers /health but is not MLflow"),
    P(["sweep", "status", "known", "--storage", "sqlite:///{root}/corrupt/studies.db"], "corrupt",
      id="storage: malformed page"),
    P(["report", "other", "--storage", "sqlite:///{root}/corrupt/studies.db"], "corrupt",
      id="report: malformed storage, no out folder"),
    P(["evaluate", "{deleted_run}"], "deleted", id="deleted run: evaluate"),
    P(["analyze", "{deleted_run}"], "deleted", id="deleted run: analyze"),
    P(["train", "--config", "tiny.toml", "--resume", "{deleted_run}"], "deleted", id="deleted run: resume"),
    P(["train", "--config", "tiny.toml", "--set", "train.steps=1000000000000000"], "years on this machine",
      id="budget: train.steps far beyond this machine"),
    P(["run", "--config", "tiny.toml", "--set", "train.steps=1000000000000000"], "years on this machine",
      id="budget: the main job's train.steps"),
    P(["analyze", "good.pt", "--min-per-task", "100000000"], "probe episodes", id="budget: probe episodes"),
    P(["analyze", "good.pt", "--n-perms", "1000000000"], "shuffle permutations", id="budget: shuffle permutations"),
    P(["bench", "oracle", "--n-tasks", "512,100000000"], "n_tasks 100000000", id="budget: oracle tasks"),
    P(["bench", "counting", "--n-episodes", "1000000000"], "1000000000 x 358 tokens", id="budget: counting episodes"),
    P(["bench", "train", "--config", "tiny.toml", "--steps", "1000000000000000"], "years on this machine",
      id="budget: bench train steps"),
    P(["report", "known", "--storage", "{storage}"], "symlink", id="output folder: a link out of the project"),
    P(["sweep", "export", "known", "pipe.csv", "--storage", "{storage}"], "special file",
      id="output: a special file (a FIFO)"),
    # issue 30, item 9: each was wrongly accepted, or a traceback, or a message that said too little
    P(["sweep", "run", "fixedswept.toml"], "also swept", id="spec: a key both fixed and swept"),
    P(["sweep", "run", "seedswept.toml"], "sweep.seeds", id="spec: train.seed swept beside sweep.seeds"),
    P(["analyze", "good.pt", "--probe-tasks", "100000"], "4 tasks", id="analyze: more probe tasks than the mixture has"),
    P(["analyze", "negstep.pt"], "step -5", id="checkpoint: a negative step"),
    P(["train", "--config", "tiny.toml", "--out", ""], "must not be empty", id="--out ''"),
    P(["runs", "gc", "--experiment", "nosuch"], "nosuch", id="runs gc: unknown experiment"),
    P(["train", "--config", "tiny.toml", "--set", "hmm.gamma=1e-320"], "smallest normal float",
      id="config: a subnormal float"),
    P(["sweep", "worker", "known", "--storage", "{storage}", "--gpu", "0"], "no CUDA GPU",
      marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),
      id="sweep worker --gpu without a GPU"),
    P(["analyze", "good.pt", "--ks", "1,1"], "each k once", id="analyze: --ks 1,1"),
    P(["sweep", "run", "spec.toml", "--storage", "postgresql://u:p@ss@127.0.0.1:{port}/db"], "u:***@127.0.0.1",
      id="storage: a password holding @ masked whole"),
    P(["sweep", "status", "known", "--storage", "journal:///dev/null"], "/dev/null is a special file",
      id="storage: journal:///dev/null"),
    P(["analyze", "nan.pt"], "not finite", id="checkpoint file: NaN weights"),
    P(["analyze", "{nan_run}"], "not finite", id="run: NaN weights, before any analysis run"),
    # issue 36, item 6: a 0-byte checkpoint crashed evaluate and train --resume (IndexError)
    P(["evaluate", "{zero_run}"], "is empty (0 bytes", id="run: a 0-byte checkpoint, evaluate"),
    P(["train", "--config", "tiny.toml", "--resume", "{zero_run}"], "is empty (0 bytes",
      id="run: a 0-byte checkpoint, train --resume"),
    P(["analyze", "zero.pt"], "is empty (0 bytes", id="checkpoint file: 0 bytes"),
    # issue 36, item 9: error lines of 12-240 KB echoing the input; a path with a newline printed raw (two lines)
    P(["train", "--config", "tiny.toml", "--set", "hmm.gamma=" + "x" * 200_000], "characters ...]",
      id="a 200 KB value: the error line is bounded"),
    P(["train", "--config", "no\nsuch.toml"], "no\\nsuch.toml", id="a path holding a newline, escaped"),
    P(["train", "--config", "no\x1b[31msuch.toml"], "no\\x1b[31msuch.toml", id="a path holding an escape sequence"),
    # issue 36, item 8: ui served `tsw` for --sweep "t'sw", the front page for --sweep ''
    P(["ui", "--sweep", "t'sw"], "safe name", id="ui --sweep with a quote"),
    P(["ui", "--sweep", ""], "safe name", id="ui --sweep ''"),
    P(["sweep", "run", "cut.toml"], "[space]", id="spec: cut off before its [space]"),
]

ENV_CASES = [  # (environment, args, needle): read at the command's start
    P({"HMMSCOPE_THREADS": "0"}, ["train", "--config", "tiny.toml"], "HMMSCOPE_THREADS", id="HMMSCOPE_THREADS=0"),
    P({"HMMSCOPE_THREADS": "-1"}, ["runs", "list"], "HMMSCOPE_THREADS", id="HMMSCOPE_THREADS=-1"),
    P({"PYTHONWARNINGS": "error"}, ["train", "--config", "tiny.toml"], "PYTHONWARNINGS=error",
      id="PYTHONWARNINGS=error"),
    # issue 36, item 8: every numeric setting has a stated range (before: 1e-300 s heartbeats, a 1e308 s lease)
    P({"HMMSCOPE_RUN_HEARTBEAT_S": "1e-300"}, ["train", "--config", "tiny.toml"], "[0.1, 3600]",
      id="HMMSCOPE_RUN_HEARTBEAT_S=1e-300"),
    P({"HMMSCOPE_RUN_HEARTBEAT_S": "1e308"}, ["runs", "gc"], "HMMSCOPE_RUN_HEARTBEAT_S", id="HMMSCOPE_RUN_HEARTBEAT_S=1e308"),
    P({"HMMSCOPE_STORE_OUTAGE_S": "1e308"}, ["sweep", "run", "spec.toml"], "[0, 86400]", id="HMMSCOPE_STORE_OUTAGE_S=1e308"),
    P({"HMMSCOPE_PROGRESS_S": "0"}, ["train", "--config", "tiny.toml"], "HMMSCOPE_PROGRESS_S", id="HMMSCOPE_PROGRESS_S=0"),
    P({"HMMSCOPE_THREADS": "100000"}, ["train", "--config", "tiny.toml"], "[1, 4096]", id="HMMSCOPE_THREADS=100000"),
    # issue 47, item 4: an integer is ASCII digits (int() read `2_0` as 20)
    P({"HMMSCOPE_THREADS": "2_0"}, ["train", "--config", "tiny.toml"], "HMMSCOPE_THREADS='2_0'",
      id="HMMSCOPE_THREADS=2_0"),
]


@pytest.mark.parametrize("args, needle", CASES)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(project, monkeypatch, args, needle):
    _case(project, monkeypatch, args, needle)


@pytest.mark.parametrize("env, args, needle", ENV_CASES)
def test_bad_environment_exits_2_with_one_line_and_writes_nothing(project, monkeypatch, env, args, needle):
    """Before: tracebacks (torch.set_num_threads(0); SQLAlchemy's deprecation warning turned into an error)."""
    import warnings

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with warnings.catch_warnings():
        if env.get("PYTHONWARNINGS") == "error":  # what the interpreter makes of it at its start
            warnings.simplefilter("error")
        _case(project, monkeypatch, args, needle)


def _case(project, monkeypatch, args, needle):
    root = project["root"]
    monkeypatch.chdir(root)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", project["uri"])
    args = [a.format(**project) for a in args]
    escape = (root / "../../hmmscope-escape").resolve()
    before = _snapshot(root)
    r = runner.invoke(app, args)
    after = _snapshot(root)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert needle in lines[0], lines[0]
    assert len(lines[0]) < 1000 and lines[0].isprintable(), lines[0][:2000]
    assert "Traceback" not in r.output
    new = sorted(after["files"].keys() - before["files"].keys())
    changed = sorted(k for k in before["files"] if after["files"].get(k) != before["files"][k])
    assert not new and not changed, (new, changed)
    assert after == before
    assert not escape.exists()
    assert list(project["outside"].iterdir()) == []


def test_theory_objectives_are_what_a_theory_trial_returns():
    from hmmscope.config import TheoryConfig
    from hmmscope.sweep.spec import GAMMA_M_OBJECTIVES, THEORY_OBJECTIVES
    from hmmscope.sweep.trial import theory_metrics
    from hmmscope.theory.theorem1 import run_theory

    for m in (0, 2):
        th = TheoryConfig(gammas=(0.7,), ranks=(2,), rhos=(0.05,), n_states=(4,), n_tokens=4, n_histories=64,
                          lengths=(1, 2, 3, 4), burn_in=10, gamma_m=m)
        got = set(theory_metrics(run_theory(th)))
        assert got == THEORY_OBJECTIVES | (GAMMA_M_OBJECTIVES if m else set())
