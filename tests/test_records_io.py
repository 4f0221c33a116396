"""analysis/records_io.py: a kept record's tables checked before anything is computed, and written only once every
table is (issue 47, item 2). The reader refuses each defect in one line naming the file and row; the scripts that
recompute from a record (inference_ablations --from-record, task_diversity --trials, regime_layerwise --from-runs,
verdict_moves) exit 2 on it and leave the record's files as they were."""

from __future__ import annotations

import csv
import importlib
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "analysis" / "results" / "inference-ablations-cpu"


def script(name: str):
    sys.path.insert(0, str(ROOT / "analysis"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


rio = script("records_io")
GOOD = "run_id,seed,value,name\r\na,0,1.5,x\r\nb,1,,y\r\n"


def _read(tmp: Path, text: str | bytes, **kw):
    p = tmp / "t.csv"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return rio.read_csv(p, required=("run_id", "value"), numbers=("seed", "value"), unique=[("run_id",)], **kw)


@pytest.mark.parametrize(("text", "needle"), [
    (b"", "is empty (0 bytes)"),
    ("run_id,seed,value,name\r\n", "a header and no rows"),
    (GOOD[:-7], "row 3: the file ends mid-row"),  # cut inside its last row
    ("run_id,seed,value,name\na,0,1.5\nb,1,2,y\n", "row 2: 3 fields, the header has 4"),
    ("run_id,seed,value,name\na,0,abc,x\n", "row 2, column 'value': 'abc' is not a number"),
    ("run_id,seed,value,name\na,0,1,x\nb,1,2,y\na,0,1,x\n", "row 4 repeats run_id=a of row 2: one row per run_id"),
    ("run_id,seed,name\na,0,x\n", "no column 'value'"),
    ("run_id,seed,value,seed\na,0,1,2\n", "row 1: the column 'seed' appears twice"),
    ('run_id,seed,value,name\na,0,1,"x\n', "not CSV"),
    (b"run_id,seed,value,name\na,0,1,\x00\n", "not a text file (a NUL byte at offset"),
    (b"run_id,seed,value,name\na,0,1,\xff\n", "is not UTF-8 text"),
])
def test_a_defective_table_is_one_line_naming_the_file_and_row(tmp_path, text, needle):
    with pytest.raises(rio.RecordError) as e:
        _read(tmp_path, text)
    msg = str(e.value)
    assert needle in msg and str(tmp_path / "t.csv") in msg and "\n" not in msg, msg


def test_bom_crlf_and_lf_read_alike_and_missing_files_are_one_line(tmp_path):
    want = [{"run_id": "a", "seed": "0", "value": "1.5", "name": "x"}, {"run_id": "b", "seed": "1", "value": "",
                                                                        "name": "y"}]
    for text in (GOOD, GOOD.replace("\r\n", "\n"), "\ufeff" + GOOD):
        t = _read(tmp_path, text)
        assert t.rows == want and t.lines == [2, 3] and t.where(1).endswith("t.csv row 3")
    for bad, needle in ((tmp_path / "none.csv", "is missing"), (tmp_path, "is a folder")):
        with pytest.raises(rio.RecordError, match=needle):
            rio.read_csv(bad, what="--trials")
    (tmp_path / "h.csv").write_text("empty\r\n")  # a writer's placeholder for a table with no rows
    assert rio.read_csv(tmp_path / "h.csv", required=("run_id",), allow_empty=True).rows == []
    with pytest.raises(rio.RecordError, match="not JSON"):
        (tmp_path / "r.json").write_text('{"claims": [')
        rio.read_json(tmp_path / "r.json")


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def _record(tmp: Path) -> Path:
    rec = tmp / "rec"
    rec.mkdir()
    for f in ("runs.csv", "curves.csv", "layerwise_runs.csv", "ablations.csv", "effects.csv", "push_runs.csv",
              "push_curves.csv"):
        shutil.copy(RECORD / f, rec / f)
    shutil.copytree(RECORD / "bayes", rec / "bayes")  # the Bayes reference the record's tables are read against
    return rec


def _edit(path: Path, fn) -> None:
    path.write_bytes(fn(path.read_bytes()))


def _dup_row(b: bytes) -> bytes:
    lines = b.splitlines(keepends=True)
    return b"".join([*lines, lines[1]])


def _text_cell(b: bytes) -> bytes:
    rows = list(csv.reader(b.decode().splitlines()))
    rows[3][rows[0].index("model_ce")] = "abc"
    return "".join(",".join(r) + "\r\n" for r in rows).encode()


def _drop_column(b: bytes) -> bytes:
    rows = list(csv.reader(b.decode().splitlines()))
    i = rows[0].index("gamma")
    return "".join(",".join(r[:i] + r[i + 1:]) + "\r\n" for r in rows).encode()


CUTS = [  # (file, edit, what the one line says)
    ("runs.csv", lambda b: b[: len(b) - len(b.splitlines(keepends=True)[-1]) // 2],  # its last row cut in two: the
     "runs.csv row 40: the file ends mid-row"),  # row number whatever the rows' width (the record gained columns)
    ("runs.csv", lambda b: b"", "runs.csv is empty"),
    ("runs.csv", lambda b: b.splitlines(keepends=True)[0], "runs.csv: a header and no rows"),
    ("runs.csv", _dup_row, "runs.csv row 41 repeats run_id=8fa93f7710d0404b98eda88043dd3ee5 of row 2"),
    ("runs.csv", _text_cell, "runs.csv row 4, column 'model_ce': 'abc' is not a number"),
    ("runs.csv", _drop_column, "runs.csv: no column 'gamma'"),
    ("layerwise_runs.csv", None, "layerwise_runs.csv is missing"),
    ("curves.csv", lambda b: b[:-12], "curves.csv row 1639: the file ends mid-row"),
]


@pytest.mark.parametrize(("name", "edit", "needle"), CUTS, ids=["cut mid-row", "empty", "header only", "a row twice",
                                                               "text in a number", "no column", "a file missing",
                                                               "curves cut"])
def test_a_bad_record_exits_2_in_one_line_and_the_record_is_not_overwritten(tmp_path, capsys, name, edit, needle):
    """Before: a runs.csv cut mid-row, empty or header-only exited 0 with every effect "+nan ... no power", writing
    over the record's own ablations.csv and effects.csv; a repeated run row was a fourth seed (df 2 -> 3); a missing
    layerwise_runs.csv, text in a number column or a missing column was a traceback. Now one line naming the file and
    row, exit 2, and the record (the default output folder) unchanged."""
    rec = _record(tmp_path)
    if edit is None:
        (rec / name).unlink()
    else:
        _edit(rec / name, edit)
    before = _snapshot(rec)
    with pytest.raises(SystemExit) as e:
        script("inference_ablations").main(["--from-record", str(rec), "--no-figures"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert _snapshot(rec) == before


def test_a_bom_crlf_record_gives_the_same_tables_and_out_must_be_a_folder(tmp_path, capsys):
    """A record saved with a byte-order mark and CRLF line ends (a spreadsheet's export) gives the tables the plain
    record gives; --out naming a file is one line (before: a traceback), nothing written."""
    rec = _record(tmp_path)
    ia = script("inference_ablations")
    assert ia.main(["--from-record", str(rec), "--no-figures", "--out", str(tmp_path / "plain")]) == 0
    for f in ("runs.csv", "curves.csv", "layerwise_runs.csv"):
        _edit(rec / f, lambda b: b"\xef\xbb\xbf" + b.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    assert ia.main(["--from-record", str(rec), "--no-figures", "--out", str(tmp_path / "bom")]) == 0
    for f in ("ablations.csv", "effects.csv", "cost.csv", "theorem1.csv", "layerwise.csv"):
        assert (tmp_path / "bom" / f).read_bytes() == (tmp_path / "plain" / f).read_bytes() == (RECORD / f).read_bytes()
    (tmp_path / "file").write_text("x")
    capsys.readouterr()
    before = _snapshot(tmp_path)
    with pytest.raises(SystemExit) as e:
        ia.main(["--from-record", str(rec), "--no-figures", "--out", str(tmp_path / "file")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "is a file, not a folder" in err[0], err
    assert _snapshot(tmp_path) == before


def test_the_other_record_readers_check_their_inputs_the_same_way(tmp_path, capsys):
    """task_diversity --trials: a repeated trial row counted as another seed; regime_layerwise --from-runs --out naming
    a file, and verdict_moves on a cut trials.csv, were tracebacks. Each is one line now, exit 2, nothing written."""
    kept = ROOT / "analysis" / "results" / "task-diversity-cpu"
    trials = tmp_path / "trials.csv"
    trials.write_bytes(_dup_row(kept.joinpath("trials.csv").read_bytes()))
    with pytest.raises(SystemExit) as e:
        script("task_diversity").main(["--trials", str(trials), "--out", str(tmp_path / "td")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "trials.csv row" in err[0] and "repeats run_id=" in err[0], err
    assert not (tmp_path / "td").exists()
    (tmp_path / "file").write_text("x")
    lw = ROOT / "analysis" / "results" / "regime-layerwise-cpu"
    assert script("regime_layerwise").main(["--from-runs", str(lw / "runs"), "--trials", str(lw / "trials.csv"),
                                            "--spec", str(ROOT / "sweeps" / "task-diversity-cpu.toml"), "--out",
                                            str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and "is a file, not a folder" in err[0], err
    rec = tmp_path / "vm"
    shutil.copytree(ROOT / "analysis" / "results" / "rope-vs-absolute-cpu", rec)
    _edit(rec / "trials.csv", lambda b: b[: len(b) * 2 // 3])
    assert script("verdict_moves").main([str(rec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trials.csv row" in err[0] and "ends mid-row" in err[0], err
