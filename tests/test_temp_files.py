"""Temp files nobody removes (issue 36, item 7): cleaned on SIGTERM, found and removed after SIGKILL.

Each command runs as a real process whose signal arrives at a chosen point: a small wrapper patches one function of
hmmscope (the commit of a safe write, a checkpoint's read, the store's creation) to send the process the signal there,
then runs the CLI. So the signal lands while a temp file exists, every time, without a timed race.
- SIGTERM to `generate` or `report` while a file is being written (before: no handler, exit 143, a
  `.<name>.<hex>.tmp` left, dataset-sized for generate): the command ends 130 with no temp file left.
- SIGKILL cannot be handled: what it leaves is found by `runs gc` (and by the next write of the same file): a
  checkpoint copy `evaluate` staged under TMPDIR (now named after its run), a temp file under out/ (its name carries
  its writer, so a dead writer's is told from a live one's), the `.mlflow.db.<hex>.creating` of a first store creation
  and its journal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app


def _signalled(cwd: Path, args: list[str], module: str, func: str, sig: int, env: dict | None = None,
               after: bool = False) -> subprocess.CompletedProcess:
    """`hmmscope ARGS` in `cwd`, the process sending itself `sig` when `module.func` is first called (or, `after`,
    when it first returns)."""
    code = textwrap.dedent(f"""
        import importlib, os, sys
        mod = importlib.import_module({module!r})
        orig = getattr(mod, {func!r})
        def hit(*a, **kw):
            if not {after!r}:
                os.kill(os.getpid(), {int(sig)})
            out = orig(*a, **kw)
            if {after!r}:
                os.kill(os.getpid(), {int(sig)})
            return out
        setattr(mod, {func!r}, hit)
        from hmmscope.cli.app import main
        sys.argv = ["hmmscope", *{args!r}]
        main()
    """)
    full = {**os.environ, "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    full.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=full, capture_output=True, text=True, timeout=600)


def _temps(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith((".tmp", ".creating",
                                                                                           ".creating-journal")))


def test_sigterm_during_generate_leaves_no_temp_file(tmp_path, tiny_toml):
    """Before: exit -15 (143 from a shell) and the dataset's `.x.npz.<hex>.tmp` left."""
    (tmp_path / "tiny.toml").write_text(tiny_toml)
    r = _signalled(tmp_path, ["generate", "x.npz", "--config", "tiny.toml"], "hmmscope.safe_output", "_commit",
                   signal.SIGTERM)
    assert r.returncode == 130 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    assert _temps(tmp_path) == [] and not (tmp_path / "x.npz").exists()


def test_sigterm_during_report_leaves_no_temp_file(tmp_path):
    """Before: `report` had no handler: killed, its temp file left."""
    from test_studies import make_study, stores

    make_study(tmp_path, "a", gammas="[0.5]")
    storage, uri = stores(tmp_path)
    r = _signalled(tmp_path, ["report", "a", "--storage", storage, "--tracking-uri", uri], "hmmscope.safe_output",
                   "_commit", signal.SIGTERM)
    assert r.returncode == 130 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    assert _temps(tmp_path) == []


def _trained(tmp_path: Path, tiny_toml: str) -> str:
    (tmp_path / "tiny.toml").write_text(tiny_toml)
    os.chdir(tmp_path)
    r = CliRunner().invoke(app, ["train", "--config", "tiny.toml", "--no-evaluate"], env={"MLFLOW_TRACKING_URI": None})
    assert r.exit_code == 0, r.output
    return tracking.search_runs(tracking.default_tracking_uri(), "hmmscope")[0].info.run_id


def test_what_a_sigkilled_evaluate_leaves_is_removed_by_runs_gc(tmp_path, monkeypatch, tiny_toml):
    """Before: its checkpoint copy (a `tmpXXXX` folder under TMPDIR) and `.figure1_by_k.csv.<hex>.tmp` under out/
    stayed: nothing could tell them from anyone's."""
    cwd = os.getcwd()
    try:
        rid = _trained(tmp_path, tiny_toml)
    finally:
        os.chdir(cwd)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    env = {"TMPDIR": str(tmpdir)}
    r = _signalled(tmp_path, ["evaluate", rid], "hmmscope.training.checkpoints", "read_checkpoint", signal.SIGKILL, env)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    left = [p.name for p in tmpdir.iterdir()]
    assert left and all(n.startswith(f"hmmscope-{rid}-") for n in left), left  # the staged copy, named for its run
    r = _signalled(tmp_path, ["evaluate", rid], "hmmscope.safe_output", "_new_temp", signal.SIGKILL, env, after=True)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    out_temps = _temps(tmp_path / "out")
    assert out_temps, "the kill left no temp file under out/"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    r = CliRunner().invoke(app, ["runs", "gc"])
    assert r.exit_code == 0, r.output
    assert list(tmpdir.iterdir()) == [] and _temps(tmp_path / "out") == [], (list(tmpdir.iterdir()), r.output)


def test_a_sigkilled_first_store_creation_is_cleaned_by_runs_gc(tmp_path, monkeypatch, tiny_toml, project):
    """Before: `.mlflow.db.<hex>.creating` and its journal stayed beside a store that never came to be."""
    (tmp_path / "tiny.toml").write_text(tiny_toml)
    r = _signalled(tmp_path, ["train", "--config", "tiny.toml", "--no-evaluate"], "os", "fsync", signal.SIGKILL)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert [p for p in _temps(tmp_path) if ".creating" in p], _temps(tmp_path)
    r = CliRunner().invoke(app, ["runs", "gc"])
    assert r.exit_code in (0, 2) and "creating" not in "".join(_temps(tmp_path)), r.output
    assert _temps(tmp_path) == [], _temps(tmp_path)
    assert "removed" in r.output, r.output
