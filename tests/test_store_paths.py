"""A path is not a URI; read-only reads write nothing (issue 36, items 2 and 5).

- A project folder whose path an sqlite URL cannot carry as it is (`a%41b`: SQLAlchemy decodes `%41` to `A`, so the
  URL names the store of its neighbour `aAb`; `x%2Fy`; `p?q`: the URL ends at `?`) is refused with one line that
  names the folder, before anything is read or written: never another folder's runs, never a database beside the
  project. A `--tracking-uri` whose path holds percent-escapes (which SQLAlchemy decodes and MLflow does not) is
  refused the same way. Folders with other unusual characters (`#`, spaces, `+`, `%` not followed by two hex digits)
  keep working, reads included.
- `runs list / show / compare` and `api.*` open a store read-only and create nothing in the working folder (before:
  an empty tree `./file:/<abs path>/mlruns`), and work from a folder the user cannot write (before: `Permission
  denied: file:`). A folder the user cannot write is made with a read-only bind mount where this runs as root (as CI
  does), and with its mode where it does not.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app


def _store(folder: Path, name: str = "one") -> str:
    uri = f"sqlite:///{folder}/mlruns/mlflow.db"
    with tracking.start_run(uri, "exp", name) as run:
        run.log_metrics({"m": 1.0})
    return uri


def _invoke(args, cwd: Path, monkeypatch):
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return CliRunner().invoke(app, args)


def _one_line(r) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.stderr
    return lines[0]


def _tree(p: Path) -> list[str]:
    return sorted(str(q.relative_to(p)) for q in p.rglob("*"))


@pytest.mark.parametrize("name, shown", [("a%41b", "%41"), ("x%2Fy", "%2F"), ("p?q", "?")])
def test_a_folder_an_sqlite_url_cannot_name_is_refused_and_never_reaches_another_store(tmp_path, monkeypatch, name,
                                                                                       shown):
    """Before: in `a%41b` beside `aAb`, `runs list` showed aAb's runs and `train` wrote into aAb's store (exit 0); in
    `p?q`, train wrote a database named `p` beside the project."""
    neighbour = tmp_path / "aAb"
    _store(neighbour, "neighbour")
    (tmp_path / "x" / "y").mkdir(parents=True)
    project = tmp_path / name
    project.mkdir()
    (project / "tiny.toml").write_text("[train]\nsteps = 2\ndevice = \"cpu\"\n")
    around = _tree(tmp_path)
    for args in (["runs", "list"], ["train", "--config", "tiny.toml"], ["sweep", "list"],
                 ["ui", "--create", "--port", "1"]):
        line = _one_line(_invoke(args, project, monkeypatch))
        assert str(project) in line and shown in line, line
    assert _tree(tmp_path) == around  # nothing created here, beside it, or in aAb's store
    assert [r.info.run_name for r in tracking.search_runs(f"sqlite:///{neighbour}/mlruns/mlflow.db", "exp")] == \
        ["neighbour"]


def test_a_tracking_uri_with_percent_escapes_is_refused(tmp_path, monkeypatch):
    """SQLAlchemy decodes `%20`, MLflow creates the folder it names literally: one line, nothing created."""
    (tmp_path / "my proj").mkdir()
    uri = f"sqlite:///{tmp_path}/my%20proj/mlflow.db"
    line = _one_line(_invoke(["runs", "list", "--tracking-uri", uri], tmp_path, monkeypatch))
    assert "%20" in line and f"{tmp_path}/my proj/mlflow.db" in line, line
    assert _tree(tmp_path) == ["my proj"]


@pytest.mark.parametrize("name", ["h#x", "sp ace", "a+b", "100%", "é"])
def test_unusual_folder_names_that_a_url_can_carry_still_work(tmp_path, monkeypatch, name):
    project = tmp_path / name
    project.mkdir()
    monkeypatch.chdir(project)
    uri = tracking.default_tracking_uri()
    with tracking.start_run(uri, "exp", "here") as run:
        run.log_dict({"a": 1}, "x.json")
    r = _invoke(["runs", "list"], project, monkeypatch)
    assert r.exit_code == 0 and "here" in r.stdout and "1 of 1 run(s)" in r.stdout, r.output
    assert sorted(os.listdir(tmp_path)) == [name] and sorted(os.listdir(project)) == ["mlruns"]


def _reads(run_ids: list[str], uri: str) -> list[list[str]]:
    return [["runs", "list", "--tracking-uri", uri], ["runs", "show", run_ids[0], "--tracking-uri", uri],
            ["runs", "compare", *run_ids, "--tracking-uri", uri]]


def test_read_only_reads_create_nothing_in_the_working_folder(tmp_path, monkeypatch):
    """Before: every read created `./file:/<abs path>/mlruns` (MLflow took the read-only URI for a path)."""
    from hmmscope import api

    uri = _store(tmp_path / "proj")
    _store(tmp_path / "proj", "two")
    ids = [r.info.run_id for r in tracking.search_runs(uri, "exp")]
    work = tmp_path / "work"
    work.mkdir()
    for args in _reads(ids, uri):
        r = _invoke(args, work, monkeypatch)
        assert r.exit_code == 0, r.output
    assert len(api.runs(tracking_uri=uri)) == 2 and api.run(ids[0], tracking_uri=uri)["info"]["run_id"] == ids[0]
    assert _tree(work) == []


@contextlib.contextmanager
def unwritable(folder: Path):
    """`folder` made unwritable for this process: a read-only bind mount as root (root writes through modes), its
    mode otherwise."""
    if os.geteuid() == 0:
        here = os.getcwd()
        subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(folder)], check=True)
        try:
            yield
        finally:
            os.chdir(folder.parent)  # a mount a process works in cannot be taken down
            subprocess.run(["umount", str(folder)], check=True)
            os.chdir(here)  # back (before: left in tmp_path, which pytest removes after a passing test: every later
            # test of that worker had no working folder)
    else:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)


def _can_bind_mount(tmp_path: Path) -> bool:
    d = tmp_path / "probe"
    d.mkdir()
    try:
        with unwritable(d):
            return True
    except (OSError, subprocess.CalledProcessError):
        return False


def test_read_only_reads_work_in_a_folder_the_user_cannot_write(tmp_path, monkeypatch):
    """Before: `Permission denied: file:`, or a run that exists said not to."""
    if os.geteuid() == 0 and not _can_bind_mount(tmp_path):
        pytest.skip("root without mount(2) (no CAP_SYS_ADMIN): a folder root cannot write cannot be made here")
    uri = _store(tmp_path / "proj")
    _store(tmp_path / "proj", "two")
    ids = [r.info.run_id for r in tracking.search_runs(uri, "exp")]
    work = tmp_path / "work"
    work.mkdir()
    with unwritable(work):
        for args in _reads(ids, uri):
            r = _invoke(args, work, monkeypatch)
            assert r.exit_code == 0 and ids[0][:8] in r.stdout, r.output
    assert _tree(work) == []


def test_report_on_a_0_byte_store_is_one_line_and_writes_no_schema(tmp_path, monkeypatch):
    db = tmp_path / "mlruns" / "mlflow.db"
    db.parent.mkdir()
    db.touch()
    for args in (["report", "sw"], ["report", "sw", "--tracking-uri", f"sqlite:///{db}"]):
        line = _one_line(_invoke(args, tmp_path, monkeypatch))
        assert "mlflow.db" in line and "empty" in line, line
        assert db.stat().st_size == 0 and sorted(os.listdir(db.parent)) == ["mlflow.db"]
    assert _tree(tmp_path) == ["mlruns", "mlruns/mlflow.db"]


def test_a_store_of_a_newer_mlflow_is_called_newer(tmp_path, monkeypatch):
    """Issue 36, item 9: a schema revision this MLflow does not know was called 'older' (with `mlflow db upgrade`)."""
    import sqlite3

    uri = _store(tmp_path / "proj")
    db = tmp_path / "proj" / "mlruns" / "mlflow.db"
    with sqlite3.connect(db) as c:
        c.execute("update alembic_version set version_num = 'ffffffffffff'")
    line = _one_line(_invoke(["runs", "list", "--tracking-uri", uri], tmp_path, monkeypatch))
    assert "newer schema" in line and "ffffffffffff" in line and "older" not in line, line


def test_a_linked_models_folder_is_refused_before_training(tmp_path, monkeypatch):
    """Issue 36, item 9: `mlruns/artifacts/models` linked out of the store was refused only when the logged model was
    written, after training and Figure 1."""
    _store(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "mlruns" / "artifacts").mkdir(exist_ok=True)
    (tmp_path / "mlruns" / "artifacts" / "models").symlink_to(outside, target_is_directory=True)
    (tmp_path / "tiny.toml").write_text("[train]\nsteps = 2\ndevice = \"cpu\"\n")
    runs = len(tracking.search_runs(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "hmmscope"))
    line = _one_line(_invoke(["train", "--config", "tiny.toml"], tmp_path, monkeypatch))
    assert "models" in line and "symlink" in line, line
    assert len(tracking.search_runs(f"sqlite:///{tmp_path}/mlruns/mlflow.db", "hmmscope")) == runs == 0
    assert list(outside.iterdir()) == []
