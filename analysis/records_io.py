"""A kept record's tables read, and what a script computes from them written: the analysis scripts' one reader.

A record (analysis/results/NAME) keeps CSV tables and JSON files. The scripts that recompute from a record
(`inference_ablations.py --from-record`, `task_diversity.py --trials`, `regime_layerwise.py --from-runs`,
`verdict_moves.py`) read them through `read_csv` / `read_json`, so each checks the same things before it computes,
and says what is wrong in one line naming the file and the row (`RecordError`; a script prints `error: <line>` and
exits 2):

- the file: there, a regular file, UTF-8 text with no NUL byte (a byte-order mark is dropped; CRLF and LF line ends
  both read), not empty, and its last row ended by a newline (a file cut mid-row is refused, not read as a shorter
  last row: every CSV writer ends each row with one);
- the header: no column twice, every `required` column there (a table with no rows, where allowed, needs none);
- each row: as many fields as the header, strict CSV quoting (an unclosed quote is an error, not a swallowed row);
  a `numbers` column holds a number (Python's float syntax) or nothing;
- `unique` keys (e.g. run_id; the cell and seed): one row each, so a repeated run is never counted as another seed;
- at least one row unless `allow_empty`.

Writing (`Outputs`): a script collects every table and text file it computes and calls `write()` once all are
computed: the folder is checked (`check_out`: --out naming a file is refused; called before computing too), made,
and each file written atomically by `hmmscope.safe_output` (a temp file beside it, fsync, rename): nothing is written
until everything is computed, and no file is ever left half-written. Tables are the CSV `sweepdata.write_table`
writes, printed the same way.

Standard library and hmmscope.safe_output only; the package never imports this folder.
"""

from __future__ import annotations

import csv
import io
import json
import math
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class RecordError(ValueError):
    """A record's file that cannot be read as the script needs it (one line: the file, the row, what is wrong)."""


@dataclass
class Table:
    """A CSV table as read: its columns, its rows (dicts of the cells as text) and each row's line in the file."""

    path: Path
    columns: list[str]
    rows: list[dict[str, str]]
    lines: list[int]

    def where(self, i: int) -> str:
        return f"{self.path} row {self.lines[i]}"


def _text(path: Path, what: str) -> str:
    """The file's text (RecordError: missing, a folder or special file, unreadable, NUL bytes, not UTF-8, empty)."""
    shown = f"{what} {path}" if what else str(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise RecordError(f"{shown} is missing") from None
    except OSError as e:
        raise RecordError(f"{shown}: cannot read it ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise RecordError(f"{shown} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise RecordError(f"{shown} is a special file (FIFO, device or socket), not a file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RecordError(f"{shown}: cannot read it ({e.strerror or e})") from None
    if not data:
        raise RecordError(f"{shown} is empty (0 bytes)")
    nul = data.find(b"\0")
    if nul >= 0:
        raise RecordError(f"{shown} is not a text file (a NUL byte at offset {nul})")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise RecordError(f"{shown} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})") from None


def read_csv(path: str | Path, *, required: Iterable[str] = (), numbers: Iterable[str] = (),
             unique: Sequence[Sequence[str]] = (), allow_empty: bool = False, what: str = "") -> Table:
    """The CSV table at `path`, checked as the module docstring says; RecordError (one line) otherwise. `numbers`:
    columns that must hold a number or nothing (those absent from the file are not checked; list them in `required`
    too where they must be there); `unique`: keys (tuples of columns) no two rows share; `what`: how the user named
    the file (e.g. "--trials"), said before its path."""
    path = Path(path)
    text = _text(path, what)
    shown = f"{what} {path}" if what else str(path)
    if not text.endswith(("\n", "\r")):
        last = text.count("\n") + 1
        raise RecordError(f"{shown} row {last}: the file ends mid-row (no newline after its last line): cut short? "
                          "(restore it, or end the row with a newline if it is whole)")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader)
        body = []
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                break
            body.append((reader.line_num, cells))
    except csv.Error as e:
        raise RecordError(f"{shown} row {reader.line_num}: not CSV ({e})") from None
    header = [h.strip() for h in header]
    if not any(header):
        raise RecordError(f"{shown} row 1: no header")
    seen: set[str] = set()
    for h in header:
        if h in seen:
            raise RecordError(f"{shown} row 1: the column {h!r} appears twice")
        seen.add(h)
    rows, lines = [], []
    for line, cells in body:
        if not cells:  # a blank line: no row
            continue
        if len(cells) != len(header):
            raise RecordError(f"{shown} row {line}: {len(cells)} fields, the header has {len(header)}")
        rows.append(dict(zip(header, cells)))
        lines.append(line)
    t = Table(path, header, rows, lines)
    if not rows and not allow_empty:
        raise RecordError(f"{shown}: a header and no rows")
    missing = [c for c in required if c not in seen]
    if missing and rows:  # a table with no rows needs no columns (a writer's placeholder header)
        raise RecordError(f"{shown}: no column {missing[0]!r} (its columns: {', '.join(header)[:300]})")
    check_numbers(t, numbers)
    for key in unique:
        check_unique(t, key)
    return t


def check_numbers(t: Table, columns: Iterable[str]) -> None:
    """RecordError at the first cell of `columns` (those the table has) that is neither a number nor empty."""
    for c in (c for c in columns if c in t.columns):
        for i, r in enumerate(t.rows):
            v = r[c].strip()
            if v:
                try:
                    float(v)
                except ValueError:
                    raise RecordError(f"{t.where(i)}, column {c!r}: {v[:40]!r} is not a number") from None


def check_unique(t: Table, key: Sequence[str], select: Callable[[dict[str, str]], bool] | None = None,
                 why: str = "") -> None:
    """RecordError when two rows (of those `select` keeps) share `key`'s values (columns the table lacks: skipped)."""
    if any(k not in t.columns for k in key):
        return
    first: dict[tuple, int] = {}
    for i, r in enumerate(t.rows):
        if select is not None and not select(r):
            continue
        k = tuple(r[c].strip() for c in key)
        if k in first:
            named = ", ".join(f"{c}={v}" for c, v in zip(key, k))
            raise RecordError(f"{t.where(i)} repeats {named} of row {t.lines[first[k]]}: one row per "
                              f"{' and '.join(key)}{why}")
        first[k] = i


def number(x) -> float:
    """A cell as a float, NaN where it is empty, missing or not a number (a cell already checked, or optional)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def read_trials(path: str | Path, *, required: Iterable[str], numbers: Iterable[str] = (), what: str = "") -> Table:
    """A record's trials.csv (one row per COMPLETE trial: the params that vary, every metric), checked as `read_csv`
    does with one row per run id and per trial, and a number (or nothing) in every metric column (a '/' in its name)."""
    t = read_csv(path, what=what, required=required, numbers=numbers, unique=[("run_id",), ("trial",)])
    check_numbers(t, [c for c in t.columns if "/" in c])
    return t


def read_json(path: str | Path, what: str = "") -> Any:
    """The JSON document at `path` (RecordError, one line, as for a table's file, or where it is not JSON)."""
    path = Path(path)
    text = _text(path, what)
    try:
        return json.loads(text)
    except ValueError as e:
        raise RecordError(f"{what + ' ' if what else ''}{path}: not JSON ({e})") from None


def check_out(path: str | Path, flag: str = "--out", named: bool = True) -> Path:
    """`path` as an output folder: RecordError (one line) when it, or a folder on its way, is a file or a special
    file; `named` (the user gave it): written through links, as `hmmscope.safe_output.trust` says. Creates nothing."""
    from hmmscope.safe_output import PROBE, OutputError, check_dest, trust

    p = Path(path)
    for a in (p, *p.parents):
        if a.exists() and not a.is_dir():
            raise RecordError(f"{flag} {str(path)!r}: {a} is a file, not a folder" if a == p else
                              f"{flag} {str(path)!r}: {a} on its way is a file, not a folder")
    if named:
        trust(p)
    try:
        check_dest(p / PROBE)
    except OutputError as e:
        raise RecordError(f"{flag} {str(path)!r}: {e}") from None
    return p


@dataclass
class Outputs:
    """The files a script computes, written together once all are computed (module docstring)."""

    out: Path
    flag: str = "--out"
    files: list[tuple[str, str, list[dict] | None]] = field(default_factory=list)  # (name, text, rows if a table)

    def table(self, rows: list[dict], stem: str) -> None:
        from sweepdata import table_csv

        self.files.append((f"{stem}.csv", table_csv(rows), rows))

    def text(self, name: str, text: str) -> None:
        self.files.append((name, text, None))

    def write(self) -> list[Path]:
        """Every file, each atomically, into `out` (made); tables printed as `sweepdata.write_table` prints them."""
        from sweepdata import print_table

        from hmmscope.safe_output import OutputError, make_dir, write_text

        check_out(self.out, self.flag, named=False)
        try:
            make_dir(self.out)
            paths = [write_text(self.out / name, text) for name, text, _ in self.files]
        except OutputError as e:
            raise RecordError(str(e)) from None
        for (_, _, rows), p in zip(self.files, paths):
            if rows is not None:
                print_table(rows, p)
            else:
                print(f"file: {p}")
        return paths
