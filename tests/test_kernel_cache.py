"""The mixture kernel's rank-specialized copies (issue 30, item 3): no code runs from the cache folder unchecked.

Before: `_mixture_kernel.for_rank` executed `$XDG_CACHE_HOME/hmmscope/kernels/hmmscope_mixkernel_d{d}_{hash}.py`
whenever it existed (anyone who could write the folder ran code as the user), a corrupt file was a SyntaxError on
every run at that rank, and the folder was created with the umask's mode (0755). Now the copy's generated source is
the code compiled; the file is compared with it and rewritten when it differs; the folders are 0700, and a cache
folder that is not this user's is not used. Loading a copy compiles nothing (numba compiles on the first call), so
these run in milliseconds.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

K = pytest.importorskip("hmmscope.oracles.mixture_kernel")  # numba


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(K, "_SPECIAL", {})
    return tmp_path / "xdg" / "hmmscope" / "kernels"


def _load(d: int = 4):
    K._SPECIAL.clear()
    mod = K.for_rank(d)
    sys.modules.pop(mod.__name__, None)
    return mod


def test_a_planted_or_corrupt_cache_file_is_never_run_and_is_replaced(cache, tmp_path):
    mod = _load()
    path = Path(mod.__file__)
    good = path.read_bytes()
    assert path.parent == cache and hasattr(mod, "mix_chunk")
    marker = tmp_path / "pwned"
    path.write_text(f"open({str(marker)!r}, 'w').write('ran')\nfrom hmmscope.oracles.mixture_kernel import *\n")
    mod = _load()
    assert not marker.exists() and path.read_bytes() == good and hasattr(mod, "mix_chunk")
    path.write_bytes(b"def broken(:\n\x00\xff garbage")  # a corrupt file: before, a SyntaxError on every run
    mod = _load()
    assert path.read_bytes() == good and hasattr(mod, "_chain")
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.py")  # a link in its place is replaced, its target never written
    mod = _load()
    assert not path.is_symlink() and path.read_bytes() == good and not (tmp_path / "elsewhere.py").exists()


def test_cache_folders_are_user_private(cache):
    cache.parent.mkdir(parents=True, mode=0o777)
    cache.parent.chmod(0o777)  # a folder of ours left open (an older version, a umask of 0)
    _load()
    for d in (cache.parent, cache):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


@pytest.mark.skipif(os.geteuid() != 0, reason="hands the cache folder to another user (chown): needs root")
def test_a_cache_folder_of_another_user_is_not_used(cache, tmp_path):
    import pwd

    cache.mkdir(parents=True, mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(cache, nobody.pw_uid, nobody.pw_gid)
    mod = _load()
    assert getattr(mod, "__file__", None) is None and hasattr(mod, "mix_chunk")  # compiled in memory
    assert list(cache.iterdir()) == []
