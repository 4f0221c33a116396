"""The terminal of `hmmscope sweep run`: worker output above ONE live bar, the bar ending at n/n, a line per
trial with its objective and params. Slow: a real sweep with 2 worker processes in a real pseudo-terminal
(python's pty module); fast: the same progress object on a rich console that believes it is a terminal."""

import io
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
TOKEN = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z]|\r\n|\r|\n)")


def screen(raw: str) -> list[str]:
    """What a terminal shows after `raw`: the lines left on screen (a minimal emulator of what rich uses:
    newline, carriage return, erase in line, cursor up; colours and cursor visibility ignored)."""
    lines, row, col = [""], 0, 0
    for t in TOKEN.split(raw):
        if not t:
            continue
        if t in ("\n", "\r\n"):
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif t == "\r":
            col = 0
        elif t.startswith("\x1b["):
            arg, cmd = t[2:-1], t[-1]
            if cmd == "K":
                lines[row] = "" if arg == "2" else lines[row][:col]
            elif cmd == "A":
                row = max(0, row - int(arg or 1))
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + t + line[col + len(t):]
            col += len(t)
    return [x.rstrip() for x in lines if x.strip()]

SPEC = """
[sweep]
name = "tty"
kind = "theory"
sampler = "grid"
seeds = [0]
experiment = "tty"

[fixed]
"theory.rhos" = [0.05]
"theory.n_states" = [8]
"theory.n_tokens" = 4
"theory.lengths" = [1, 2, 4]
"theory.n_histories" = 100
"theory.burn_in" = 10

[space]
"theory.gammas" = {grid = [0.5, 0.8]}
"theory.ranks" = {grid = [2]}
"""


def test_progress_prints_lines_above_one_bar_that_ends_at_n_of_n():
    from rich.console import Console

    from hmmscope.cli import sweep as cli_sweep

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=120, color_system=None)
    orig = cli_sweep.console
    cli_sweep.console = lambda stderr=False: con
    try:
        with cli_sweep.SweepProgress("s", 3, tty=True) as bar:
            bar({"complete": 1, "running": 2}, 3)
            bar.log("trial 0 complete: theory/rate=0.1 params={'theory.gammas': 0.5}")
            bar.log("trial 1 complete: theory/rate=0.2 params={'theory.gammas': 0.8}")
            bar({"complete": 3, "running": 0}, 3)
    finally:
        cli_sweep.console = orig
    text = ANSI.sub("\n", buf.getvalue())
    lines = [x for x in text.split("\n") if x.strip()]
    for t in ("trial 0 complete", "trial 1 complete"):  # each on a line of its own, no bar fragment on it
        (ln,) = [x for x in lines if t in x]
        assert ln.startswith(t) and "sweep s" not in ln
    assert "3/3" in lines[-1] and "sweep s" in lines[-1]  # the bar stays, at n/n


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="python's pty module on Linux")
def test_sweep_run_in_a_real_terminal_keeps_one_bar(tmp_path):
    """`hmmscope sweep run SPEC --workers 2` in a pseudo-terminal: every trial's line (objective, params) and
    both workers' closing lines are on lines of their own; the bar ends at 2/2 and is drawn as one bar."""
    import pty

    (tmp_path / "tty.toml").write_text(SPEC)
    exe = Path(sys.executable).parent / "hmmscope"
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "COLUMNS": "160", "LINES": "40",
           "TERM": "xterm-256color", "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(exe), "sweep", "run", "tty.toml", "--workers", "2"], cwd=tmp_path, env=env,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = b""
    try:
        deadline = time.time() + 400
        while True:
            assert time.time() < deadline, "sweep run did not finish in 400 s"
            r, _, _ = select.select([master], [], [], 1.0)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the terminal's other side closed
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    raw = out.decode(errors="replace")
    (tmp_path / "terminal.txt").write_text(raw)
    assert proc.returncode == 0, raw[-3000:]
    lines = screen(raw)  # what the person sees at the end
    (tmp_path / "screen.txt").write_text("\n".join(lines))
    for n in (0, 1):
        (ln,) = [x for x in lines if x.startswith(f"trial {n} complete:")]
        assert "theory/rate=" in ln and "params={'theory.gammas':" in ln and "sweep tty" not in ln
    assert len([x for x in lines if re.fullmatch(r"worker \d+: ran \d+ trials", x)]) == 2
    (bar,) = [x for x in lines if x.startswith("sweep tty ") and "/2" in x]  # ONE bar: no stale copies
    assert " 2/2 " in bar and "2 done, 0 failed, 0 running" in bar
    assert lines[-2].startswith("sweep tty: 2 complete, 0 failed") and lines[-1].endswith("hmmscope ui --sweep tty")
