"""Checks of the paths a command is given, writing nothing: an output folder or file checked through its nearest
existing ancestor (creatable, no symbolic link where it was not asked for), an input file readable and regular.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..config import ConfigError
from ..store_files import creatable


def _links(p: Path, explicit: bool) -> None:
    """The user named `p` (explicit): writes may go through links on its way (safe_output.trust); otherwise a
    link on the way out of the project, or a link or special file at `p`, is refused now, before any work."""
    from .. import safe_output  # lazy: safe_output (~10 ms: secrets, random) off the CLI's start-up

    if explicit:
        safe_output.trust(p)
    safe_output.check_dest(p)


def output_dir(path: str | Path, what: str, *, explicit: bool = False) -> Path:
    """A folder that will be created or written into: an existing writable folder, or a creatable path.
    Not under a link that leaves the project, unless `explicit` (the user named it: see safe_output)."""
    p = Path(path)
    if os.path.lexists(p):
        if not p.is_dir():
            raise ConfigError(f"{what} {p} exists and is not a folder")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ConfigError(f"{what} {p} is not writable")
    else:
        creatable(p, what)
    from .. import safe_output  # lazy: safe_output (~10 ms: secrets, random) off the CLI's start-up

    if explicit:
        safe_output.trust(p)
    _links(p / safe_output.PROBE, False)  # its folders, itself among them
    return p


def output_file(path: str | Path, what: str, suffix: str | None = None, *, explicit: bool = True) -> Path:
    """A file that will be written (by a rename in its folder): not a folder, in a writable or creatable folder;
    not a special file (/dev/full is never replaced). A path the user named (`explicit`, the default: output
    files are always named) may be a symlink, which the rename replaces (its target is left alone)."""
    p = Path(path)
    if suffix is not None and p.suffix != suffix:
        raise ConfigError(f"{what} must end in {suffix}, got {p}")
    if os.path.lexists(p) and p.is_dir():
        raise ConfigError(f"{what} {p} is a folder, not a file")
    creatable(p, what)  # its folder (existing or not) takes a new file: the write goes to a temp file, renamed
    _links(p, explicit)
    return p


def input_file(path: str | Path, what: str) -> Path:
    """A file that will be read: exists, is a regular file (a FIFO, device or socket is refused before it is
    opened: a FIFO would block, /dev/zero never ends), is readable."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what} not found: {p}")
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a folder, not a file")
    if not stat.S_ISREG(p.stat().st_mode):
        raise ConfigError(f"{what} {p} is a special file (FIFO, device or socket), not a regular file")
    if not os.access(p, os.R_OK):
        raise ConfigError(f"{what} {p} is not readable")
    return p
