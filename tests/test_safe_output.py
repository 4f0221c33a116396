"""hmmscope.safe_output: files land whole under their final name or not at all, never through a planted link, never
onto a special file; a full disk (a tiny tmpfs) or /dev/full is an OutputError naming the path, with no temp file
left behind."""

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from hmmscope import safe_output as so


@pytest.fixture(autouse=True)
def _forget_trusted(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    so.untrust_all()
    yield
    so.untrust_all()


def _files(d: Path):
    return sorted(p.name for p in d.iterdir())


def test_writes_whole_files_and_leaves_no_temp(tmp_path):
    so.write_text(tmp_path / "out" / "a.txt", "hello")
    with so.atomic_open(tmp_path / "out" / "b.csv", "w", newline="") as f:
        f.write("x,y\n")
    so.write_with(tmp_path / "out" / "c.bin", lambda p: Path(p).write_bytes(b"\0" * 10))
    assert (tmp_path / "out" / "a.txt").read_text() == "hello"
    assert (tmp_path / "out" / "b.csv").read_text() == "x,y\n"
    assert _files(tmp_path / "out") == ["a.txt", "b.csv", "c.bin"]
    assert oct((tmp_path / "out" / "a.txt").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_a_failed_writer_leaves_the_old_file_and_no_temp(tmp_path):
    so.write_text(tmp_path / "a.txt", "old")
    with pytest.raises(RuntimeError), so.atomic_open(tmp_path / "a.txt") as f:
        f.write("new, half")
        raise RuntimeError("boom")
    assert (tmp_path / "a.txt").read_text() == "old" and _files(tmp_path) == ["a.txt"]


def test_a_symlink_destination_is_refused_unless_named(tmp_path):
    """Before: evaluate overwrote the target of a planted figure1_by_k.csv link."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "figure1_by_k.csv").symlink_to(victim)
    with pytest.raises(so.OutputError, match="symlink") as e:
        so.write_text(tmp_path / "run" / "figure1_by_k.csv", "x")
    assert "\n" not in str(e.value) and victim.read_text() == "precious"
    so.trust(tmp_path / "run" / "figure1_by_k.csv")  # the user named it: the link is replaced, the target kept
    so.write_text(tmp_path / "run" / "figure1_by_k.csv", "x")
    assert victim.read_text() == "precious" and not (tmp_path / "run" / "figure1_by_k.csv").is_symlink()


def test_a_folder_linked_outside_the_root_is_refused_inside_is_fine(tmp_path, monkeypatch):
    """Before: `out/<sweep>` planted as a link to another folder made `report` write there."""
    elsewhere = tmp_path.parent / (tmp_path.name + "-elsewhere")
    elsewhere.mkdir()
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    (project / "out" / "sw").symlink_to(elsewhere)
    (project / "real").mkdir()
    (project / "out" / "inside").symlink_to(project / "real")
    monkeypatch.chdir(project)  # undone after the test (pytest removes a passing test's tmp_path: its worker's cwd)
    with pytest.raises(so.OutputError, match="outside"):
        so.write_text("out/sw/report.md", "x")
    with pytest.raises(so.OutputError, match="outside"):
        so.make_dir("out/sw/figures")
    assert list(elsewhere.iterdir()) == []
    so.write_text("out/inside/report.md", "x")  # a link that stays inside the project
    assert (project / "real" / "report.md").read_text() == "x"
    so.trust(project / "out" / "sw")  # named by the user (--out out/sw)
    so.write_text("out/sw/report.md", "x")
    assert (elsewhere / "report.md").read_text() == "x"


def test_special_files_are_never_replaced(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for dst in (tmp_path / "fifo", Path("/dev/null")):
        with pytest.raises(so.OutputError, match="special file"):
            so.write_text(dst, "x")
    assert Path("/dev/null").is_char_device() and (tmp_path / "fifo").is_fifo()


def test_dev_full_write_error_is_checked(tmp_path):
    """A write error surfacing on flush/fsync/close fails the write (here: writing through to /dev/full's
    behaviour on a file object whose descriptor is /dev/full)."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    fd = os.open("/dev/full", os.O_WRONLY)
    f = os.fdopen(fd, "wb")
    f.write(b"x" * 10)  # buffered: no error yet
    with pytest.raises(OSError) as e:
        f.close()
    assert e.value.errno == 28  # what atomic_open relies on: close raises, it is never swallowed


@contextlib.contextmanager
def _tiny_tmpfs(path: Path, size: str = "64k"):
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_full_disk_is_one_error_and_leaves_nothing(tmp_path):
    with _tiny_tmpfs(tmp_path / "tiny") as d:
        so.write_text(d / "keep.txt", "old")
        for write in (lambda: so.write_bytes(d / "keep.txt", b"x" * 200_000),
                      lambda: so.write_with(d / "keep.txt", lambda p: Path(p).write_bytes(b"y" * 200_000))):
            with pytest.raises(so.OutputError, match="No space left") as e:
                write()
            assert str(d / "keep.txt") in str(e.value) and "\n" not in str(e.value)
            assert _files(d) == ["keep.txt"] and (d / "keep.txt").read_text() == "old"
        with pytest.raises(so.OutputError, match="No space left"), so.atomic_open(d / "new.csv") as f:
            f.write("z" * 200_000)
        assert _files(d) == ["keep.txt"]


def test_csv_text_columns_in_first_seen_order_missing_and_nan_empty():
    rows = [{"a": 1, "b": float("nan")}, {"b": 2.5, "c": "x,y"}, {"a": None}]
    assert so.csv_text(rows) == 'a,b,c\n1,,\n,2.5,"x,y"\n,,\n'
    assert so.csv_text([rows[1], {}], ["c", "b"]) == 'c,b\n"x,y",2.5\n,\n'  # given columns, in their order
    with pytest.raises(ValueError):
        so.csv_text(rows, ["a"])  # a row with a key outside the columns: an error, never a dropped value
    assert so.csv_text([]) == "" and so.csv_text([], ["a"]) == "a\n"


def test_write_tables_writes_the_tables_with_rows_and_reads_back(tmp_path):
    import csv

    paths = so.write_tables(tmp_path / "t", {"one": [{"k": 1, "v": 0.5}, {"k": 2, "v": float("nan")}], "none": []})
    assert paths == [tmp_path / "t" / "one.csv"] and not (tmp_path / "t" / "none.csv").exists()
    with open(paths[0], newline="") as f:
        assert list(csv.DictReader(f)) == [{"k": "1", "v": "0.5"}, {"k": "2", "v": ""}]
    assert not [p for p in (tmp_path / "t").iterdir() if p.name.startswith(".")]  # no temp file left


def test_save_figure_writes_png_and_pdf_laid_out_once_and_keeps_the_engine(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3), layout="constrained")
    ax = fig.subplots()
    ax.plot([0, 1], [1, 0])
    ax.set_title("a title")
    engine = fig.get_layout_engine()
    png, pdf = so.save_figure(fig, tmp_path / "f.svg")
    assert (png.name, pdf.name) == ("f.png", "f.pdf")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"
    assert fig.get_layout_engine() is engine  # the caller's figure as it was
