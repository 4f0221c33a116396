"""A real browser on a real `hmmscope ui`: Debian's headless chromium loads the URL hmmscope printed and hands
back the rendered page's text (and a screenshot for a person). Helpers for the tests, not a test module.

- `chromium()`: the executable, or None (tests skip with the reason `NO_CHROMIUM`).
- `serve_ui(cwd, *args)`: starts `hmmscope ui --port <free port> *args` in `cwd`, yields the URL it printed
  once the server answers (`lines=True`: every line it printed, e.g. a sweep's answer, then its trials); stops
  it (SIGTERM to its pid, waited for) and then every process it started that is still there, each by its pid.
- `render(url, shots, name)`: the page's visible text after the UI's requests settled (--dump-dom with a
  virtual-time budget, in the screenshot's window size: the runs table draws only the columns in view), and
  `<shots>/<name>.png`, with the DOM beside it as `<shots>/<name>.html`. Chromium runs in its own process
  group, killed by the group's id (its leader's pid) if it overruns.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NO_CHROMIUM = "chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)"
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("HMMSCOPE_TEST_ARTIFACTS", ROOT / "out" / "test-artifacts"))  # git-ignored
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> set[int]:
    """Every process below `pid` now (Linux /proc)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                kids.setdefault(int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


@contextlib.contextmanager
def serve_ui(cwd: Path, *args: str, timeout: float = 240, lines: bool = False):
    """`hmmscope ui` on a free port in `cwd`; yields the URL it printed (the first line, without its hint), or
    with `lines` every line it printed."""
    exe = Path(sys.executable).parent / "hmmscope"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    out = cwd / "ui.out"
    with out.open("w") as fh:
        proc = subprocess.Popen([str(exe), "ui", "--port", str(_free_port()), *args], cwd=cwd, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    started: set[int] = set()
    try:
        deadline = time.time() + timeout
        while "MLflow UI: " not in out.read_text():
            started |= _children(proc.pid)
            assert proc.poll() is None, f"hmmscope ui exited with {proc.returncode}: {out.read_text()}"
            assert time.time() < deadline, f"hmmscope ui printed no URL in {timeout} s"
            time.sleep(0.2)
        started |= _children(proc.pid)
        printed = out.read_text().splitlines()
        yield printed if lines else printed[0].split("MLflow UI: ", 1)[1].split("  (Ctrl-C", 1)[0]
    finally:
        started |= _children(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in started:  # anything it left behind, by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _chromium(args: list[str], timeout: float) -> str:
    with tempfile.TemporaryDirectory(prefix="hmmscope-chromium-") as profile:
        proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its group: renderer, zygote, ... (by the leader's pid)
            proc.wait()
    return out


def page_text(dom: str) -> str:
    """The visible text of a dumped DOM: no scripts or styles, tags dropped, entities decoded, spaces folded."""
    t = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", t)))


def render(url: str, shots: Path, name: str, timeout: float = 180) -> str:
    """The text the page shows once its requests settled; its screenshot as `<shots>/<name>.png`."""
    shots.mkdir(parents=True, exist_ok=True)
    # one load for both (the DOM, then the screenshot, once the budget has run out; before: two loads, 2 s each).
    # Every compositor stage before the capture, and no backgrounded renderer: without them headless chromium 150
    # never captures a runs table whose column widths a view sets (it waited past any timeout, idle)
    dom = _chromium(["--dump-dom", f"--screenshot={shots / (name + '.png')}", "--window-size=1400,900",
                     "--virtual-time-budget=15000", "--run-all-compositor-stages-before-draw",
                     "--disable-renderer-backgrounding", url], timeout)
    (shots / f"{name}.html").write_text(dom)
    return page_text(dom)
