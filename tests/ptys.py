"""Reading what a process writes to a pseudo-terminal, to its end (tests/test_terminal.py, tests/test_cli.py)."""

from __future__ import annotations

import os
import select
import subprocess
import time


def _read(master: int) -> bytes:
    try:
        return os.read(master, 65536)
    except OSError:  # EIO: the terminal's other side closed (the process is gone)
        return b""


def read_to_end(master: int, proc: subprocess.Popen, deadline: float, what: str, wait_s: float = 0.5) -> bytes:
    """Everything `proc` writes to the pty `master` until its side closes, or until it has exited and nothing is left
    to read; asserts it ends before `deadline` (time.time())."""
    out = b""
    while True:
        assert time.time() < deadline, what
        if select.select([master], [], [], wait_s)[0]:
            if not (chunk := _read(master)):
                return out
            out += chunk
        elif proc.poll() is not None:  # it ended while select waited: what it wrote last may still be unread
            while time.time() < deadline and select.select([master], [], [], 0.2)[0] and (chunk := _read(master)):
                out += chunk
            return out
