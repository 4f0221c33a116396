"""Compiled CPU kernel of the mixture oracle (numba): one (episode, task) chain at a time, in registers.

Imported lazily by ``inference.mixture_oracle`` when numba is installed and the device is the CPU; the
torch path (``filtering.forward_run``) does the same computation everywhere else and is the reference.

Per episode i and task j the filter state is the latent c (d,) of the low-rank representation (the
predicted belief is c @ Q_j); one observation o costs z = c @ (Q O)[:, o] (d MACs) and the next latent
c @ M_o / z (d^2 MACs, ``M_o = Q diag(O[:, o]) W``); the task's full prediction c @ Q O (d V MACs) is
formed only when its mixture weight passes the theta test below. The log joint
``L = log p(o_<t, task j)`` is kept in float64. The mixture prediction at t is accumulated over tasks
with an online max per (i, t): ``acc[i, t] = sum_j exp(L_j(t) - mx[i, t]) P_j(t)``, divided at the end by
``wsum[i, t] = sum_j exp(L_j(t) - mx[i, t])`` (the posterior weights, as in the torch path).

Exact skipping, bounded by theta (``err <= 2 n_tasks exp(-theta)`` in total variation of each predicted
row, and the same bound on each posterior row):
- a term with ``L_j(t) < mx[i, t] - theta`` is not added (its relative weight is below exp(-theta), and
  mx only grows as more tasks are seen, so against the final normalizer it is smaller still);
- a task's chain is stopped at t when no later term can pass that test. Bound: after a transition the
  predicted belief is ``c @ Q_j`` with c a distribution over the d prototypes, so ``p(o_s | o_<s, j) =
  c @ (Q_j O_j)[:, o_s] <= max_e (Q_j O_j)[e, o_s] = exp(lq[j, o_s])``; at a restart the prediction is
  known exactly (``P0`` / ``Ps``). Hence ``L_j(t') <= L_j(t) + cum[t'] - cum[t]`` with cum the prefix
  sums of these per-token bounds over the episode's observations, and the chain stops when
  ``L_j(t) - cum[t] < min_{t' >= t} (mx[t'] - theta - cum[t'])``. Its later posterior entries are
  reported as -inf (their true relative weight is below exp(-theta)).

Speed (with the ordering in ``inference._mixture_oracle_cpu``; `hmmscope bench oracle --n-tasks 8192 --n-episodes
1024` times the paper's shape; recorded numbers, and what each of these steps gains:
analysis/results/bench/RUN.md):
- ``for_rank(d)`` runs a copy of this module generated for the rank d (``_specialize``; 4 <= d <= 16): c and the next
  latent are d scalar locals (registers), the d x d update, z and the prediction are unrolled, and the copy
  is compiled with LLVM's SLP vectorizer on (``slp_vectorize``; numba turns it off by default), which packs
  the unrolled products into AVX2 FMAs. The generic loops keep c in memory: each step waits on stores
  and reloads. The copy is compiled from the source generated in memory (never from a file). Its machine code, and
  this module's, is cached on disk by numba only in the user-private folder ``~/.cache/hmmscope/kernels``
  (``$XDG_CACHE_HOME``; 0700, a real folder of this user, checked before every use) through hmmscope's signed cache
  (``install_cache``): every entry, numba's index included, is written there with an HMAC under this user's key
  (``.key``, 0600) and loaded only when it verifies, before anything in it is unpickled; nothing is read from a
  ``__pycache__``, beside the package, or numba's own user-wide folder;
- the stopping bounds cum, R (O(T) per chain, a large share of the time when computed chain by chain) are
  computed for G tasks at once per episode (``_bounds``: the inner loops run over tasks and vectorize).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import os
import pickle
import sys
import types
from pathlib import Path

import numba
import numpy as np
from numba.core import caching

# absolute: the rank-specialized copies of this source are exec'd as top-level modules (for_rank)
from hmmscope.oracles.private_cache import cache_dir, cache_key, read_private, write_private

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # no 'nnan'/'ninf': log(0) = -inf is meaningful here


@numba.njit(fastmath=_FASTMATH)
def _chain(i, j, tok, kind, snap, MM, MpT, Y0, P0, Ys, Ps, logprior, theta, acc, wsum, mx, post,
           c, u, cum, R):  # pragma: no cover
    """Run task j's filter over episode i, adding its terms to acc / wsum / mx and its posterior entries;
    cum, R (T + 1,) its stopping bounds (``_bounds``).

    State: the latent c (d,) with predicted belief c @ Q_j (src 0), or a restart (src 1: mu, 2: the test
    start). Per observation: z = p(o | past) = c @ (Q O)[:, o] (d MACs), next latent c @ M_o / z (d^2);
    the full prediction c @ Q O (d V) only when its mixture weight passes the theta test.
    """
    T = tok.shape[1]
    V, d = MM.shape[1], MM.shape[2]
    L = logprior[j]
    src = 1
    for t in range(T):
        if kind[t] != 0:
            src = kind[t]
        s = snap[t]
        if s >= 0:
            post[i, s, j] = L
        if L - cum[t] < R[t]:  # no later term of this task can reach exp(-theta)
            return
        o = tok[i, t]
        if o < 0 or o >= V:
            continue
        m = mx[i, t]
        if L > m:
            if m > -np.inf:
                sc = math.exp(m - L)
                for v in range(V):
                    acc[i, t, v] *= sc
                wsum[i, t] *= sc
            mx[i, t] = L
            m = L
        if L >= m - theta and L > -np.inf:  # add w * p(. | past, j)
            w = math.exp(L - m)
            wsum[i, t] += w
            if src == 0:
                for v in range(V):
                    pv = 0.0
                    for e in range(d):
                        pv += c[e] * MpT[j, v, e]
                    acc[i, t, v] += w * pv
            elif src == 1:
                for v in range(V):
                    acc[i, t, v] += w * P0[j, v]
            else:
                for v in range(V):
                    acc[i, t, v] += w * Ps[j, v]
        if src == 0:
            z = 0.0
            for e in range(d):
                z += c[e] * MpT[j, o, e]
            for f in range(d):
                u[f] = 0.0
            for e in range(d):
                ce = c[e]
                for f in range(d):
                    u[f] += ce * MM[j, o, e, f]
        elif src == 1:
            z = P0[j, o]
            for f in range(d):
                u[f] = Y0[j, o, f]
        else:
            z = Ps[j, o]
            for f in range(d):
                u[f] = Ys[j, o, f]
        src = 0
        if z > 0:
            L += math.log(z)
            rz = 1.0 / z
            for e in range(d):
                c[e] = u[e] * rz
        else:
            L = -np.inf
            for e in range(d):
                c[e] = 0.0
    s = snap[T]
    if s >= 0:
        post[i, s, j] = L


@numba.njit(fastmath=_FASTMATH)
def _bounds(i, j0, n, tok, kind, lq, theta, mx, cum, R):  # pragma: no cover
    """Stopping bounds of tasks j0 .. j0 + n - 1 on episode i, one column each of cum, R (T + 1, G):
    cum[t] = sum over observed s < t of the bound on log p(o_s | o_<s, j); R[t] = min over observed t' >= t of
    mx[t'] - theta - cum[t'] (a stale mx only lowers it: the chain stops later, never wrongly). The inner loops
    run over the tasks (contiguous in lq): they vectorize."""
    T = tok.shape[1]
    V = lq.shape[2]
    for k in range(n):
        cum[0, k] = 0.0
    b = 1
    for t in range(T):
        if kind[t] != 0:
            b = kind[t]
        o = tok[i, t]
        if 0 <= o < V:
            for k in range(n):
                cum[t + 1, k] = cum[t, k] + lq[b, j0 + k, o]
            b = 0
        else:
            for k in range(n):
                cum[t + 1, k] = cum[t, k]
    for k in range(n):
        R[T, k] = np.inf
    for t in range(T - 1, -1, -1):
        o = tok[i, t]
        if 0 <= o < V:
            r0 = mx[i, t] - theta
            for k in range(n):
                r = r0 - cum[t, k]
                R[t, k] = r if r < R[t + 1, k] else R[t + 1, k]
        else:
            for k in range(n):
                R[t, k] = R[t + 1, k]


G = 16  # tasks whose bounds are computed together (_bounds), per episode of a block

BLOCK = 8  # episodes per block: a task's tables (V d (d + V) numbers) are reused by them from cache


@numba.njit(parallel=True, fastmath=_FASTMATH)
def mix_chunk(tok, kind, snap, MM, MpT, Y0, P0, Ys, Ps, logprior, first, lq, theta, acc, wsum, mx, post):  # pragma: no cover
    """Accumulate one chunk of C tasks into acc (N, T, V), wsum and mx (N, T) (float64, in place).

    tok (N, T) int (outside [0, V): missing); kind (T,) int8: 1 restart from mu, 2 restart from the
    test start, 0 continue; snap (T + 1,) int: posterior slot of each position or -1; MM (C, V, d, d) the
    latent update M_v; MpT (C, V, d) = (Q O)^T; Y0, Ys (C, V, d) first-step latents (unnormalized) from mu /
    the test start; P0, Ps (C, V) their predictions;
    logprior (C,) float64; first (N,) chunk-local task to run first for each episode or -1; lq (3, C, V)
    float64 bounds on log p(o = v | past, task) after a transition, at a restart from mu, at a restart
    from the test start; post (N, n_snap, C) float64 (filled). Episodes run in blocks of BLOCK; within a
    block, tasks in groups of G (their stopping bounds computed together per episode), then task by task.
    """
    N, T = tok.shape
    C, d = MM.shape[0], MM.shape[2]
    for blk in numba.prange((N + BLOCK - 1) // BLOCK):
        i0 = blk * BLOCK
        i1 = min(i0 + BLOCK, N)
        c = np.zeros(d, MM.dtype)
        u = np.empty(d, MM.dtype)
        cum = np.zeros((BLOCK, T + 1, G))
        R = np.empty((BLOCK, T + 1, G))
        for i in range(i0, i1):  # each episode's likely task first: mx rises early, more is skipped
            if first[i] >= 0:
                _bounds(i, first[i], 1, tok, kind, lq, theta, mx, cum[i - i0], R[i - i0])
                _chain(i, first[i], tok, kind, snap, MM, MpT, Y0, P0, Ys, Ps, logprior, theta, acc, wsum, mx,
                       post, c, u, cum[i - i0, :, 0], R[i - i0, :, 0])
        for j0 in range(0, C, G):
            n = min(G, C - j0)
            for i in range(i0, i1):
                _bounds(i, j0, n, tok, kind, lq, theta, mx, cum[i - i0], R[i - i0])
            for k in range(n):
                j = j0 + k
                for i in range(i0, i1):
                    if j != first[i]:
                        _chain(i, j, tok, kind, snap, MM, MpT, Y0, P0, Ys, Ps, logprior, theta, acc, wsum, mx,
                               post, c, u, cum[i - i0, :, k], R[i - i0, :, k])


# ---------------------------------------------------------------- rank-specialized copy

MIN_UNROLL, MAX_UNROLL = 4, 16  # ranks in this range get a specialized copy (each costs a numba compile,
# cached); smaller ranks (short loops, tests) and larger ones (long unrolled code) run the generic kernel


def _specialize(src: str, d: int) -> str:
    """This module's source with the latent c held in d scalar locals (registers) and the d x d update, z and
    the prediction unrolled over the rank (the same arithmetic, in the same order per product; only the
    summation order of each dot product may differ, as fastmath 'reassoc' already allows)."""
    D = range(d)

    def dot(tab, idx):
        return " + ".join(f"c{e} * {tab}[{idx}, {e}]" for e in D)

    def lines(fmt, indent=12):
        return "".join(" " * indent + fmt.format(e=e) + "\n" for e in D)

    edits = [
        ("                for v in range(V):\n                    pv = 0.0\n                    for e in range(d):\n"
         "                        pv += c[e] * MpT[j, v, e]\n                    acc[i, t, v] += w * pv\n",
         f"                for v in range(V):\n                    acc[i, t, v] += w * ({dot('MpT', 'j, v')})\n"),
        ("            z = 0.0\n            for e in range(d):\n                z += c[e] * MpT[j, o, e]\n"
         "            for f in range(d):\n                u[f] = 0.0\n            for e in range(d):\n"
         "                ce = c[e]\n                for f in range(d):\n                    u[f] += ce * MM[j, o, e, f]\n",
         f"            z = {dot('MpT', 'j, o')}\n"
         + "".join(f"            u{f} = " + " + ".join(f"c{e} * MM[j, o, {e}, {f}]" for e in D) + "\n" for f in D)),
        ("            for f in range(d):\n                u[f] = Y0[j, o, f]\n", lines("u{e} = Y0[j, o, {e}]")),
        ("            for f in range(d):\n                u[f] = Ys[j, o, f]\n", lines("u{e} = Ys[j, o, {e}]")),
        ("            for e in range(d):\n                c[e] = u[e] * rz\n", lines("c{e} = u{e} * rz")),
        ("            for e in range(d):\n                c[e] = 0.0\n", lines("c{e} = 0.0")),
        ("    L = logprior[j]\n    src = 1\n",
         "    L = logprior[j]\n" + lines("c{e} = 0.0", 4) + lines("u{e} = 0.0", 4) + "    src = 1\n"),
    ]
    src = src.split("\n# ---------------------------------------------------------------- rank-specialized copy")[0]
    for old, new in edits:
        if src.count(old) != 1:
            raise RuntimeError("mixture kernel: the specialization template no longer matches the source")
        src = src.replace(old, new)
    return src


_SPECIAL: dict[int, object] = {}
_FORMAT = 4  # part of the cache entries' names: bump when the way they are written or loaded changes (stale caches)
_KERNELS = ("_chain", "_bounds", "mix_chunk")  # the compiled functions of a kernel module, each with its cache
_MAGIC = b"hmmscope-numba-cache-1\n"  # the first bytes of every cache entry hmmscope writes


def _signed_cache_class():
    """numba's per-function cache (`numba.core.caching.FunctionCache`) with every entry hmmscope's own: kept in the
    checked folder `cache_dir()` (never beside a source file, in a `__pycache__` or numba's user-wide folder), each
    file written by this class with an HMAC under the folder's key, and read back only when that HMAC verifies, before
    anything in it is unpickled (numba's own index is a pickle it loads unchecked: a planted one ran code). An entry
    that does not verify is removed and the function compiled again."""

    class Locator(caching._CacheLocator):
        def __init__(self, base: Path, stamp: str, py_func):
            self._base, self._stamp = base, stamp
            self._lineno = py_func.__code__.co_firstlineno
            self._py_file = py_func.__code__.co_filename  # numba's warnings name it

        def ensure_cache_path(self):
            if cache_dir() != self._base:
                raise OSError(f"the kernel cache folder {self._base} is not this user's private folder any more")

        def get_cache_path(self):
            return str(self._base)

        def get_source_stamp(self):
            return self._stamp

        def get_disambiguator(self):
            return str(self._lineno)

    class Impl(caching.CompileResultCacheImpl):
        def __init__(self, py_func, base: Path, stamp: str, modname: str):  # numba's locator search skipped
            self._lineno = py_func.__code__.co_firstlineno
            self._locator = Locator(base, stamp, py_func)
            self._filename_base = self.get_filename_base(f"{modname}.{py_func.__qualname__}",
                                                         getattr(sys, "abiflags", ""))

    class SignedFile(caching.IndexDataCacheFile):
        key = b""

        def _seal(self, name: str, payload: bytes) -> bytes:
            mac = hmac.new(self.key, name.encode() + b"\0" + payload, hashlib.sha256).digest()
            return _MAGIC + mac + payload

        def _open(self, path: str) -> bytes | None:
            """The verified payload of the entry at `path`; None (and the file removed) when it is not ours."""
            raw = read_private(Path(path), 1 << 31)
            name = os.path.basename(path)
            n = len(_MAGIC) + 32
            if raw is not None and raw[:len(_MAGIC)] == _MAGIC and hmac.compare_digest(
                    raw[len(_MAGIC):n], self._seal(name, raw[n:])[len(_MAGIC):n]):
                return raw[n:]
            if os.path.lexists(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return None

        def _load_index(self):
            payload = self._open(self._index_path)
            if payload is None:
                return {}
            version, stamp, overloads = pickle.loads(payload)
            return overloads if (version, stamp) == (self._version, self._source_stamp) else {}

        def _save_index(self, overloads):
            payload = self._dump((self._version, self._source_stamp, overloads))
            write_private(Path(self._index_path), self._seal(self._index_name, payload))

        def _load_data(self, name):
            payload = self._open(self._data_path(name))
            if payload is None:
                raise OSError(f"cache entry {name} is missing or not hmmscope's")  # numba: a miss, compiled again
            return pickle.loads(payload)

        def _save_data(self, name, data):
            write_private(Path(self._data_path(name)), self._seal(name, self._dump(data)))

    class SignedCache(caching.FunctionCache):
        def __init__(self, py_func, base: Path, stamp: str, modname: str, key: bytes):
            self._name, self._py_func = repr(py_func), py_func
            self._impl = Impl(py_func, base, stamp, modname)
            self._cache_path = str(base)
            self._cache_file = SignedFile(cache_path=str(base), filename_base=self._impl.filename_base,
                                          source_stamp=stamp)
            self._cache_file.key = key
            self.enable()

        def load_overload(self, sig, target_context):
            try:
                return super().load_overload(sig, target_context)
            except Exception:  # an entry that verified and still cannot be rebuilt (another numba, LLVM): compiled
                return None

        def save_overload(self, sig, data):
            with contextlib.suppress(OSError):  # a cache that cannot be written: the kernel runs uncached
                super().save_overload(sig, data)

    return SignedCache


def install_cache(mod, src: str, modname: str, kernels: tuple[str, ...] = _KERNELS) -> bool:
    """Give the kernel module's compiled functions (`kernels`, by name) hmmscope's signed on-disk cache
    (`_signed_cache_class`) in the checked folder; False (compiled in memory, uncached) when there is no usable folder
    or key. Other compiled modules (bayes_kernel) use it too."""
    base = cache_dir()
    key = cache_key(base) if base is not None else None
    if key is None:
        return False
    cls = _signed_cache_class()
    stamp = hashlib.sha256(f"{_FORMAT}\n{numba.__version__}\n{src}".encode()).hexdigest()
    for f in kernels:
        disp = getattr(mod, f)
        disp._cache = cls(disp.py_func, base, stamp, modname, key)
    return True


def for_rank(d: int):
    """The kernel module to run at rank d: a copy specialized to d, or this generic module when d is outside
    [MIN_UNROLL, MAX_UNROLL].

    The copy's source is generated here (`_specialize`) and is the only code run: it is compiled from memory, and
    nothing of it is read from a file. Its machine code is cached by numba in the user-private folder (`cache_dir`,
    0700) through hmmscope's signed cache (`install_cache`): an entry is loaded only when its HMAC under this user's
    key verifies, so a planted, corrupt or foreign entry never runs, and is no error. Without a usable cache folder
    the copy is compiled in memory, uncached."""
    if not MIN_UNROLL <= d <= MAX_UNROLL:
        return sys.modules[__name__]
    if d not in _SPECIAL:
        src = _specialize(Path(__file__).read_text(), d)
        tag = hashlib.sha256(f"{_FORMAT}\n{src}".encode()).hexdigest()[:12]
        name = f"hmmscope_mixkernel_d{d}_{tag}"
        mod = types.ModuleType(name)
        sys.modules[name] = mod  # numba finds the module's globals by this name
        exec(compile(src, f"<hmmscope mixture kernel, rank {d}>", "exec"), mod.__dict__)
        install_cache(mod, src, name)
        _SPECIAL[d] = mod
    return _SPECIAL[d]


@contextlib.contextmanager
def slp_vectorize():
    """Compile with LLVM's SLP vectorizer on (numba turns it off by default): it packs the unrolled scalar
    products into AVX2 FMAs (the gain is recorded in analysis/results/bench/RUN.md). Only compilation reads the
    flag."""
    saved = numba.core.config.SLP_VECTORIZE
    numba.core.config.SLP_VECTORIZE = 1
    try:
        yield
    finally:
        numba.core.config.SLP_VECTORIZE = saved


def _install_own_cache() -> None:
    """This generic module's functions get the same signed cache as the copies (numba's own would sit beside the
    package or in its user-wide folder, loaded unchecked)."""
    src = Path(__file__).read_text()
    tag = hashlib.sha256(f"{_FORMAT}\n{src}".encode()).hexdigest()[:12]
    with contextlib.suppress(OSError):
        install_cache(sys.modules[__name__], src, f"hmmscope_mixkernel_generic_{tag}")


_install_own_cache()
