"""Saving figures: every figure hmmscope makes is written as a PNG and a PDF side by side.

`save(fig, path)` writes `path` with the suffix .png and .pdf (any suffix given is replaced), each through
a temporary file renamed into place, so an interrupted save leaves no half-written figure; it returns
[png, pdf]. Figures are built on `matplotlib.figure.Figure` (no pyplot state, safe in threads and
workers).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

DPI = 120


def save(fig, path, dpi: int = DPI) -> list[Path]:
    """Write fig as <path>.png and <path>.pdf (atomically); returns [png, pdf]."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for fmt in ("png", "pdf"):
        dst = path.with_suffix(f".{fmt}")
        fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
        os.close(fd)
        try:
            fig.savefig(tmp, dpi=dpi, format=fmt)
            os.replace(tmp, dst)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        out.append(dst)
    return out
