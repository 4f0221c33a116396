"""The terminal of `hmmscope sweep run`: worker output above ONE live bar, the bar ending at n/n, a line per
trial with its objective and params. Slow: a real sweep with 2 worker processes in a real pseudo-terminal
(python's pty module); fast: the same progress object on a rich console that believes it is a terminal.
Off a terminal (nohup, Slurm, CI): a real `hmmscope train` with its output sent to files prints its run id
first, then plain progress lines (no bar, no escape codes)."""

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import ptys
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


def in_a_terminal(args: list[str], cwd: Path, columns: int, lines: int, seconds: float) -> str:
    """`hmmscope *args` in a pseudo-terminal of columns x lines, read to its end (everything it wrote, raw, also
    kept as cwd/terminal.txt); asserts it exited 0 within `seconds`."""
    import pty

    exe = Path(sys.executable).parent / "hmmscope"
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "COLUMNS": str(columns),
           "LINES": str(lines), "TERM": "xterm-256color", "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(exe), *args], cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    try:
        out = ptys.read_to_end(master, proc, time.time() + seconds,
                               f"hmmscope {args[0]} did not finish in {seconds:.0f} s", wait_s=1.0)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    raw = out.decode(errors="replace")
    (cwd / "terminal.txt").write_text(raw)
    assert proc.returncode == 0, raw[-3000:]
    return raw


def test_a_pty_reader_keeps_what_a_process_wrote_as_it_ended():
    """ptys.read_to_end: a process that writes its last line and ends while the reader's select has just timed out
    (the reader's poll then says it ended) loses nothing: the reader drains the terminal (it stopped there before)."""
    import pty
    import select

    master, slave = pty.openpty()
    go_r, go_w = os.pipe()
    code = "import os, sys, time; os.read(0, 1); sys.stdout.write('last\\n'); sys.stdout.flush(); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=go_r, stdout=slave, start_new_session=True)
    os.close(slave)
    os.close(go_r)

    class Ended:  # as the reader sees it: ended just after its select timed out, the last line written meanwhile
        def poll(self):
            os.write(go_w, b"x")
            select.select([master], [], [], 60)  # the line is in the terminal now, unread
            return 0

    try:
        out = ptys.read_to_end(master, Ended(), time.time() + 120, "the reader did not return", wait_s=0.1)
    finally:
        child.kill()
        child.wait()
        os.close(master)
        os.close(go_w)
    assert out.replace(b"\r", b"") == b"last\n"


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


def test_the_training_bar_says_loss_dash_before_the_first_logged_step():
    """Before: `loss nan  0 tok/s` until the first logged step."""
    from rich.console import Console
    from rich.progress import Progress

    from hmmscope.training.progress import loss_column

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=100, color_system=None)
    with Progress(loss_column(), console=con, auto_refresh=False) as bar:
        task = bar.add_task("train", total=10, completed=0, loss=float("nan"), tps=0.0)  # as train starts it
        bar.refresh()
        first = ANSI.sub("\n", buf.getvalue())
        bar.update(task, completed=5, loss=2.5, tps=1234.0)
        bar.refresh()
    assert "loss -" in first and "nan" not in first and "tok/s" not in first, first
    assert "loss 2.5000  1,234 tok/s" in ANSI.sub("\n", buf.getvalue())


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="python's pty module on Linux")
def test_sweep_run_in_a_real_terminal_keeps_one_bar(tmp_path):
    """`hmmscope sweep run SPEC --workers 2` in a pseudo-terminal: every trial's line (objective, params) and
    both workers' closing lines are on lines of their own; the bar ends at 2/2 and is drawn as one bar."""
    (tmp_path / "tty.toml").write_text(SPEC)
    raw = in_a_terminal(["sweep", "run", "tty.toml", "--workers", "2"], tmp_path, 160, 40, 400)
    lines = screen(raw)  # what the person sees at the end
    (tmp_path / "screen.txt").write_text("\n".join(lines))
    for n in (0, 1):
        (ln,) = [x for x in lines if x.startswith(f"trial {n} complete:")]
        assert "theory/rate=" in ln and "params={'theory.gammas':" in ln and "sweep tty" not in ln
    assert len([x for x in lines if re.fullmatch(r"worker \d+: ran \d+ trials", x)]) == 2
    (bar,) = [x for x in lines if x.startswith("sweep tty ") and "/2" in x]  # ONE bar: no stale copies
    assert " 2/2 " in bar and "2 done, 0 failed, 0 running" in bar
    assert lines[-4].startswith("sweep tty: 2 complete, 0 failed") and lines[-3].endswith("hmmscope ui --sweep tty")
    assert lines[-2].startswith("sweep tty: theory.gammas: ") and lines[-1] == "report: out/tty/report.html", lines[-4:]
    assert not re.match(r"\d{4}-\d\d-\d\d ", bar)  # on a terminal: no time stamps


def test_train_off_a_terminal_prints_its_run_then_plain_progress_lines(tmp_path):
    """Before: with its output in a file, a job said nothing until the end (no bar off a terminal, no lines).
    Now: the run id and browse line first (stdout), then on stderr one line per phase and, every
    HMMSCOPE_PROGRESS_S seconds, the step, loss, tokens/s and ETA; the last at N/N; no escape codes."""
    exe = Path(sys.executable).parent / "hmmscope"
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "HMMSCOPE_PROGRESS_S": "0.3",
           "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    args = ["train", "--set", "hmm.n_tasks=4", "--set", "model.n_layers=1", "--set", "model.d_model=32",
            "--set", "model.n_heads=2", "--set", "model.d_mlp=64", "--set", "train.steps=400", "--set",
            "train.eval_every=400", "--set", "train.ckpt_every=400", "--set", "train.warmup=2", "--set",
            "data.n_train=64", "--set", "data.n_eval=16", "--set", "data.n_demos=2", "--set", "data.l_demo=8",
            "--set", "data.l_test=8", "--device", "cpu", "--no-evaluate"]
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        rc = subprocess.run([str(exe), *args], cwd=tmp_path, env=env, stdout=out, stderr=err, timeout=600).returncode
    stdout, stderr = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert rc == 0, stderr[-3000:]
    first = stdout.splitlines()[0]
    assert re.fullmatch(r"run ([0-9a-f]{32}) started; browse: hmmscope ui --run \1", first), first
    assert "\x1b" not in stdout + stderr and "\r" not in stdout + stderr  # plain text: no bar, no spinner
    lines = stderr.splitlines()
    # each progress line with the local date and time first (before: none; Slurm and nohup logs add none)
    stamp = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) "
    assert re.fullmatch(stamp + r"train: setting up: data, oracles, model \.\.\.", lines[0]), lines[0]
    steps = [re.fullmatch(stamp + r"train: step (\d+)/400, loss \d+\.\d{4}, [\d,]+ tokens/s, ETA (\d+:\d\d:\d\d|\?)", ln)
             for ln in lines if "train: step " in ln]
    assert len(steps) >= 2 and all(steps), lines
    done = [int(m.group(2)) for m in steps]
    assert done == sorted(done) and done[-1] == 400 and steps[-1].group(3) == "0:00:00"
    import datetime as dt

    times = [dt.datetime.fromisoformat(m.group(1)) for m in steps]
    assert times == sorted(times) and abs((dt.datetime.now() - times[-1]).total_seconds()) < 600  # local, now-ish


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="python's pty module on Linux")
def test_train_in_a_terminal_clears_its_spinner_before_the_run_line(tmp_path):
    """Before: the setup spinner was still on screen when the run line was printed: '... modelrun 3efd...
    started'. Now the spinner is cleared first: the run line starts a line of its own, and the screen ends with
    the summary and the headline, each on its own line."""
    # the evaluation's references it never reads are off (the family's Bayes predictor, the fitted counting
    # baselines, the emergence curves, the images): the headline is the model's and the oracles' CE
    raw = in_a_terminal(["train", "--set", "train.steps=4", "--set", "train.eval_every=4", "--set", "data.n_train=64",
                         "--set", "data.n_eval=16", "--set", "eval.family_tasks=0", "--set", "eval.fit_episodes=0",
                         "--set", "train.emergence_episodes=0", "--set", "train.figures=false", "--device", "cpu"],
                        tmp_path, 200, 50, 600)
    lines = screen(raw)
    (run,) = [x for x in lines if "started; browse: hmmscope ui --run" in x]
    assert re.fullmatch(r"run [0-9a-f]{32} started; browse: hmmscope ui --run [0-9a-f]{32}", run), lines
    assert not any("setting up" in x for x in lines)  # the spinner left nothing behind
    assert any(x.startswith("result (unseen tasks, test CE, nats/token): model ") for x in lines), lines


@pytest.mark.slow  # a whole (quick, shrunk) main job in a real terminal: minutes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="python's pty module on Linux")
def test_run_quick_in_a_real_terminal_leaves_each_phases_result_and_short_claims(tmp_path):
    """On a terminal each phase's spinner or bar is gone when it ends and its one-line result stays; the claims are
    one short line each (before: one line for the whole theory phase, results only at the end, 300-character claims
    and a box table folded mid-number)."""
    raw = in_a_terminal(["run", "--quick", "--set", "train.steps=20", "--set", "train.eval_every=10", "--set",
                         "theory.gammas=[0.5, 0.9]"], tmp_path, 160, 50, 1200)
    lines = screen(raw)
    done = [x for x in lines if re.match(r"\[\d/5\] ", x)]
    assert [x[:5] for x in done] == [f"[{i}/5]" for i in range(1, 6)], lines
    assert not any(": train: setting up" in x or "theory: setting" in x for x in lines), lines  # spinners cleared
    claims = [x for x in lines if x.startswith("  [")]
    assert claims and max(map(len, claims)) < 160 and not any("statistic:" in x for x in claims)
    assert not set("│┃┏╇┡└") & set("".join(lines))  # no box table
    assert lines[-1].startswith("report: out/main-")
