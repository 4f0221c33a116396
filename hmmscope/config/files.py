"""Config text from files, read safely: `read_text` (a regular UTF-8 file of at most MAX_TEXT_BYTES; a FIFO, device
or folder refused before it is read), `parse_toml` (at most MAX_TOML_DEPTH levels deep), `load_toml` (a config file
on top of a base config, through `override`). Imports `config.schema` and `config.overrides`.
"""

from __future__ import annotations

import os
import stat as stat_
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .overrides import override
from .schema import Config, ConfigError

MAX_TEXT_BYTES = 1 << 20  # a config file or sweep spec is read up to this size
MAX_TOML_DEPTH = 16  # tables and arrays nested deeper are refused (a config has 2 levels, a spec 4)


def _nested_to_flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_nested_to_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_toml(path: str | Path, base: Config | None = None) -> Config:
    """Apply a TOML file (tables [hmm], [data], ...) on top of `base` (default: Config())."""
    path = Path(path)
    data = parse_toml(read_text(path, "config file"), path)
    try:
        return override(base or Config(), _nested_to_flat(data))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a file; ConfigError (one line) if it is missing, a folder, unreadable or binary, a
    special file (a FIFO, device or socket: refused before it is opened, so a FIFO never blocks), or larger than
    MAX_TEXT_BYTES (`--config /dev/zero` never reads on)."""
    path = Path(path)
    try:
        st = os.stat(path)
        if stat_.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if not stat_.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {path} is a special file (FIFO, device or socket), not a regular file")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO swapped in meanwhile: no block
        with os.fdopen(fd, "rb") as f:
            if not stat_.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{what} {path} is a special file (FIFO, device or socket), not a regular file")
            data = f.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise ConfigError(f"{what} {path} is larger than {MAX_TEXT_BYTES >> 20} MiB: not a config or spec")
        return data.decode("utf-8-sig")  # a leading UTF-8 BOM (some editors write one) is no text
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not a text (UTF-8) file") from None
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot read it ({e.strerror or e})") from None


def _depth(v: Any) -> int:
    """Nesting depth of parsed TOML (tables and arrays), without recursion."""
    best, todo = 0, [(v, 0)]
    while todo:
        x, d = todo.pop()
        best = max(best, d)
        if isinstance(x, dict):
            todo.extend((y, d + 1) for y in x.values())
        elif isinstance(x, list):
            todo.extend((y, d + 1) for y in x)
    return best


def parse_toml(text: str, path: str | Path) -> dict[str, Any]:
    """TOML text parsed; ConfigError (one line) if invalid or nested deeper than MAX_TOML_DEPTH levels."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested deeper than {MAX_TOML_DEPTH} levels") from None
    if _depth(data) > MAX_TOML_DEPTH:
        raise ConfigError(f"{path}: nested deeper than {MAX_TOML_DEPTH} levels")
    return data
