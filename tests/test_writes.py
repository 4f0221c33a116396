"""Where writes go and what a killed writer leaves (issue 30, items 6 and 7).

- Links: `mlruns/artifacts` linked out of the store's folder is refused before `train` creates a run, and by every
  artifact write after that (a link planted mid-run); `report` checks every output path before its first file.
- Leftovers: a writer SIGKILLed while it writes an artifact (a real process, killed while its temp file is there)
  leaves `.<name>.<hex>.tmp`; `runs gc` and `train --resume` remove it and say how many and how large.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app
from hmmscope.config import ConfigError

TINY = ["--set", "hmm.n_tasks=4", "--set", "hmm.n_states=8", "--set", "hmm.n_tokens=4", "--set", "hmm.rank=2",
        "--set", "data.n_demos=2", "--set", "data.l_demo=8", "--set", "data.l_test=8", "--set", "data.n_train=64",
        "--set", "data.n_eval=16", "--set", "model.n_layers=1", "--set", "model.d_model=32", "--set",
        "model.d_mlp=64", "--set", "model.max_len=64", "--set", "train.steps=2", "--set", "train.batch_size=8",
        "--set", "train.warmup=1", "--set", "train.eval_every=2", "--set", "train.ckpt_every=2", "--set",
        "train.emergence_episodes=0", "--device", "cpu"]


def _invoke(args):
    return CliRunner().invoke(app, args, env={"MLFLOW_TRACKING_URI": None})


def _one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (r.exit_code, r.output, r.exception)
    return lines[0]


# ---------------------------------------------------------------- links out of the store (item 6)


def test_artifacts_linked_out_of_the_store_are_refused(tmp_path, monkeypatch, store_uri):
    """Before: `train` followed mlruns/artifacts -> a folder outside and wrote checkpoints, figures and the model there."""
    monkeypatch.chdir(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    uri = store_uri
    tracking.ensure_store(uri)
    (tmp_path / "mlruns" / "artifacts").symlink_to(outside, target_is_directory=True)
    line = _one_line(_invoke(["train", *TINY, "--no-evaluate", "--tracking-uri", uri]))
    assert "mlruns/artifacts is a symlink" in line, line
    assert tracking.search_runs(uri) == [] and list(outside.iterdir()) == []
    # a link planted after the checks (mid-run): every artifact write and the model refuse it, nothing lands outside
    (tmp_path / "mlruns" / "artifacts").unlink()
    (tmp_path / "f.txt").write_text("x")
    with tracking.start_run(uri, "exp", "r") as run:
        run.log_artifact(tmp_path / "f.txt")
        os.rename(tmp_path / "mlruns" / "artifacts", tmp_path / "mlruns" / "artifacts-real")
        (tmp_path / "mlruns" / "artifacts").symlink_to(outside, target_is_directory=True)
        (outside / run.run_id / "artifacts").mkdir(parents=True)
        with pytest.raises(ConfigError, match="is a symlink to"):
            run.log_artifact(tmp_path / "f.txt", "again")
        with pytest.raises(ConfigError, match="is a symlink to"), run.artifact_file("checkpoints/last.pt") as p:
            p.write_bytes(b"x")
        import torch

        with pytest.raises(ConfigError, match="is a symlink to"):
            run.log_model(torch.nn.Linear(2, 2))
    assert [p for p in outside.rglob("*") if p.is_file()] == []


def test_report_checks_every_output_before_its_first_file(tmp_path, monkeypatch, store_uri):
    """Before: `report` wrote out/NAME/trials.csv, then refused a planted out/NAME/report.md link."""
    from hmmscope.sweep import create_study
    from hmmscope.sweep.spec import parse_spec

    monkeypatch.chdir(tmp_path)
    uri = store_uri
    spec = ('[sweep]\nname = "known"\nobjective = "eval/seen/excess_ce"\nsampler = "grid"\nexperiment = "sw"\n'
            '[fixed]\n"train.steps" = 2\n"train.device" = "cpu"\n[space]\n"hmm.gamma" = {grid = [0.5]}\n')
    create_study(parse_spec(spec, tmp_path / "known.toml"), f"sqlite:///{tmp_path}/mlruns/optuna.db", uri)
    out = tmp_path / "out" / "known"
    out.mkdir(parents=True)
    (out / "report.md").symlink_to(tmp_path / "elsewhere.md")
    line = _one_line(_invoke(["report", "known", "--tracking-uri", uri]))
    assert "report.md" in line and "symlink" in line, line
    assert sorted(p.name for p in out.iterdir()) == ["report.md"] and not (tmp_path / "elsewhere.md").exists()


# ---------------------------------------------------------------- what a killed writer leaves (item 7)

WRITER = """
import sys, time
import torch
from hmmscope import tracking
uri, rid = sys.argv[1], sys.argv[2]
with tracking.start_run(uri, "exp", "w", resume=rid if rid != "-" else None) as run:
    print(run.run_id, flush=True)
    big = torch.zeros(8 << 20)  # 32 MB
    while True:  # an endless stream of artifact writes, as a checkpoint save is one
        with run.artifact_file("checkpoints/big.pt") as p, open(p, "wb") as f:
            torch.save(big, f)
"""


def _kill_mid_write(uri: str, rid: str = "-") -> tuple[str, Path]:
    """Start WRITER on run `rid` (a new run for "-"), SIGKILL it while a temp file of its write exists: (run id,
    the temp file left)."""
    for _ in range(10):
        p = subprocess.Popen([sys.executable, "-c", WRITER, uri, rid], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            run_id = p.stdout.readline().strip()
            folder = Path(tracking.Run(uri, run_id).artifact_uri().removeprefix("file://")) / "checkpoints"
            deadline = time.time() + 120
            while time.time() < deadline:
                tmp = [f for f in folder.glob(".big.pt.*.tmp")] if folder.is_dir() else []
                if tmp and tmp[0].stat().st_size > 1 << 20:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
                    left = [f for f in folder.glob(".big.pt.*.tmp")]
                    if left:
                        return run_id, left[0]
                    break  # renamed just before the kill: again
                time.sleep(0.01)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
    pytest.fail("could not kill the writer mid-write in 10 tries")


def test_runs_gc_and_resume_remove_what_a_killed_writer_left(tmp_path, monkeypatch, store_uri):
    """Before: a SIGKILL during a checkpoint write left `.last.pt.<hex>.tmp` files (7-38 MB) that neither `train
    --resume` nor `runs gc` removed."""
    monkeypatch.chdir(tmp_path)
    uri = store_uri
    rid, left = _kill_mid_write(uri)
    size = left.stat().st_size
    r = _invoke(["runs", "gc", "--dry-run", "--tracking-uri", uri])
    assert r.exit_code == 0 and "would remove 1 stale temp file(s)" in r.stdout and left.exists(), r.output
    r = _invoke(["runs", "gc", "--tracking-uri", uri])
    assert r.exit_code == 0, r.output
    assert f"removed 1 stale temp file(s), {size / 1e6:.1f} MB" in r.stdout and not left.exists(), r.stdout
    assert tracking.client(uri).get_run(rid).info.status == "KILLED"
    # a trained run, then a writer of it killed mid-write: `train --resume` removes what it left, and says so
    r = _invoke(["train", *TINY, "--no-evaluate", "--tracking-uri", uri, "--experiment", "exp"])
    assert r.exit_code == 0, r.output
    (trained,) = [x.info.run_id for x in tracking.search_runs(uri) if x.info.status == "FINISHED"]
    _, left = _kill_mid_write(uri, trained)
    size = left.stat().st_size
    r = _invoke(["train", *TINY, "--set", "train.steps=4", "--resume", trained, "--no-evaluate", "--tracking-uri", uri])
    assert r.exit_code == 0, r.output
    assert f"removed 1 stale temp file(s), {size / 1e6:.1f} MB left by a killed writer" in r.stderr, r.stderr
    assert not left.exists()
