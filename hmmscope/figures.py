"""Saving figures: every figure hmmscope makes is written as a PNG and a PDF side by side.

`save(fig, path)` writes `path` with the suffix .png and .pdf (any suffix given is replaced), each through
a temporary file renamed into place, so an interrupted save leaves no half-written figure; it returns
[png, pdf]. Figures are built on `matplotlib.figure.Figure` (no pyplot state, safe in threads and
workers).
"""

from __future__ import annotations

from pathlib import Path

DPI = 120


def save(fig, path, dpi: int = DPI) -> list[Path]:
    """Write fig as <path>.png and <path>.pdf (atomically); returns [png, pdf]."""
    from .safe_output import atomic_path

    path = Path(path)
    out = []
    for fmt in ("png", "pdf"):
        dst = path.with_suffix(f".{fmt}")
        with atomic_path(dst) as tmp:
            fig.savefig(tmp, dpi=dpi, format=fmt)
        out.append(dst)
    return out
