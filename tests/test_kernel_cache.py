"""The mixture kernel's rank-specialized copies (issue 30, item 3; issue 36, item 1): no code runs from the cache
folder unchecked, numba's index and data files included.

Before: `_mixture_kernel.for_rank` executed `$XDG_CACHE_HOME/hmmscope/kernels/hmmscope_mixkernel_d{d}_{hash}.py`
whenever it existed (anyone who could write the folder ran code as the user), a corrupt file was a SyntaxError on
every run at that rank, and the folder was created with the umask's mode (0755). Now the copy's generated source is
the code compiled; the file is compared with it and rewritten when it differs; the folders are 0700, and a cache
folder that is not this user's is not used. Loading a copy compiles nothing (numba compiles on the first call); the
tests of numba's cache entries compile the small `_bounds` kernel (a second or two).

Issue 36: numba unpickled its index (`*.nbi`) from `<kernels>/__pycache__` before anything checked it, and followed a
`__pycache__` that was a link. Now no source file is written at all, and every cache entry is hmmscope's own: written
with an HMAC under the folder's key and loaded only when it verifies.
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


def test_no_source_is_read_from_the_cache_folder(cache, tmp_path):
    """The copy's code is its generated source, compiled from memory: a `.py` planted in the cache folder under the
    name an older version wrote (and ran) is never run, and the copy works."""
    mod = _load()
    assert getattr(mod, "__file__", None) is None and hasattr(mod, "mix_chunk")
    marker = tmp_path / "pwned"
    for name in (mod.__name__, mod.__name__.rsplit("_", 1)[0] + "_000000000000"):
        (cache / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    mod = _load()
    assert not marker.exists() and hasattr(mod, "_chain")


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
    assert type(mod._bounds._cache).__name__ == "NullCache" and hasattr(mod, "mix_chunk")  # compiled in memory
    _call_bounds(mod)
    assert list(cache.iterdir()) == []


# ---------------------------------------------------------------- issue 36, item 1: numba's index and data files

def _call_bounds(mod):
    """Run the small `_bounds` kernel once (a compile, or a load from the cache) and return its R column."""
    import numpy as np

    tok = np.array([[0, 1, 0]], np.int32)
    kind = np.array([1, 0, 0], np.int8)
    lq = np.log(np.full((3, 1, 2), 0.5))
    mx = np.zeros((1, 3))
    cum, R = np.zeros((4, 1)), np.zeros((4, 1))
    mod._bounds(0, 0, 1, tok, kind, lq, 1.0, mx, cum, R)
    return R[:, 0].tolist()


class _Planted:
    """Unpickling this creates `path` (what a planted numba index would run)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant(path: Path, marker: Path) -> None:
    """A numba-format cache file (its version pickle, then the payload) whose payload runs code when unpickled."""
    import pickle

    import numba

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(numba.__version__) + pickle.dumps((_Planted(marker), {})))


def _index_names(mod) -> list[str]:
    return [Path(getattr(mod, f)._cache._cache_file._index_path).name for f in ("_chain", "_bounds", "mix_chunk")]


def test_a_planted_numba_index_is_never_unpickled(cache, tmp_path):
    """Before: numba unpickled `<kernels>/__pycache__/<name>.nbi` before anything checked it (code ran, exit 0)."""
    mod = _load()
    want = _call_bounds(mod)
    marker = tmp_path / "pwned"
    for f in ("_chain", "_bounds", "mix_chunk"):
        _plant(Path(getattr(mod, f)._cache._cache_file._index_path), marker)
    mod = _load()
    assert _call_bounds(mod) == want
    assert not marker.exists()


def test_a_tampered_cache_entry_is_not_loaded(cache, tmp_path):
    mod = _load()
    want = _call_bounds(mod)
    files = [p for p in cache.rglob("*") if p.is_file() and p.suffix in (".nbi", ".nbc")]
    assert files, "the kernel's machine code was not cached"
    for p in files:  # one byte flipped in each: an entry hmmscope did not write is never trusted
        raw = bytearray(p.read_bytes())
        raw[-1] ^= 0xFF
        p.write_bytes(bytes(raw))
    mod = _load()
    assert _call_bounds(mod) == want
    assert mod._bounds.stats.cache_hits.most_common() == [] or sum(mod._bounds.stats.cache_hits.values()) == 0


def test_a_symlinked_pycache_is_never_followed(cache, tmp_path):
    """Before: `<kernels>/__pycache__` as a link to a shared folder was followed (its planted index ran)."""
    mod = _load()
    names = _index_names(mod)
    shared = tmp_path / "shared"
    marker = tmp_path / "pwned"
    for n in names:
        _plant(shared / n, marker)
    before = sorted(p.name for p in shared.iterdir())
    pyc = cache / "__pycache__"
    if pyc.is_dir() and not pyc.is_symlink():
        import shutil

        shutil.rmtree(pyc)
    pyc.symlink_to(shared, target_is_directory=True)
    mod = _load()
    _call_bounds(mod)
    assert not marker.exists()
    assert sorted(p.name for p in shared.iterdir()) == before  # nothing written through the link


def test_signed_entries_are_reused_by_the_next_process(tmp_path):
    """The on-disk cache still works: a second process loads the machine code the first one compiled."""
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_kernel_cache import _call_bounds
        from hmmscope.oracles import mixture_kernel as K
        mod = K.for_rank(4)
        _call_bounds(mod)
        print(sum(mod._bounds.stats.cache_hits.values()))
    """)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "HMMSCOPE_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    hits = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                           timeout=600).stdout.split()[-1] for _ in range(2)]
    assert hits == ["0", "1"], hits
