"""Checks before work: every name, path, store and size the CLI is given, validated before anything is written.

The CLI (the only module that parses user input) calls these before it creates a run, a study, a folder
or a file; each raises ConfigError with a one-line message naming the value and what is wrong with it.
None of them writes anything: a folder to be created is checked through its nearest existing ancestor,
a database through a read-only open, a server through one short health check.

- Names (sweeps, studies, runs): 1-100 characters from [A-Za-z0-9._-], starting with a letter or a
  digit, so a name never becomes a path outside the output root (`report ../x` is refused).
- Seeds: integers in [0, 2**32 - 1], numpy's legacy range (np.random.seed and torch.manual_seed).
- Stores (`store_checks.tracking_store` / `optuna_storage`, which the CLI calls): the MLflow tracking URI (sqlite:///FILE, http(s)://HOST:PORT,
  or a SQLAlchemy database URL)
  and the Optuna storage (a SQLAlchemy database URL, or a journal file: sweep/storage.py). Commands that
  only read (evaluate, report, sweep status/worker) need the store to exist; commands that write need it
  creatable.
- Memory: `memory_estimate` (below) gives the peak bytes by term; a job whose total exceeds what this
  process can get (MemAvailable, the cgroup limit, RLIMIT_AS; the GPU's memory for device terms) is
  refused unless --force, with the dominant term named.
- Time: a job whose floor on the work (`train_flops`, below) at the best rate this machine could reach (every
  core at PEAK_FLOPS_PER_CORE, or a GPU at PEAK_FLOPS_GPU) takes longer than MAX_JOB_S is refused unless
  --force, with the floor in the message (so `train.steps = 10**15` is refused instead of training forever).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
from collections.abc import Mapping
from pathlib import Path

from .config import (
    SEED_MAX,
    Config,
    ConfigError,
    DataConfig,
    HMMConfig,
    ModelConfig,
    TheoryConfig,
    check_name,
    flatten,
    from_flat,
    seq_len,
    training_tasks,
)
from .store_checks import creatable

PEAK_FLOPS_PER_CORE = 2e11  # float32 FLOP/s no CPU core exceeds (AVX-512: 2 FMA units x 16 lanes x 2 x 3+ GHz ~ 1.9e11)
PEAK_FLOPS_GPU = 4e15  # FLOP/s no single GPU reaches on this model's matmuls (H100/H200 dense bf16: ~1e15)
MAX_JOB_S = 365 * 86400.0  # a job whose floor is over a year is refused unless --force
GIB = 1 << 30


# ---------------------------------------------------------------- names and numbers


def safe_name(value: str, what: str) -> str:
    """`value` if it is a safe name (config.check_name), else ConfigError."""
    return check_name(value, what)


WORKERS_PER_CORE = 4  # `sweep run --workers` beyond this many per usable core needs --force


def cores() -> int:
    """CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def workers(n: int, what: str = "--workers", *, force: bool = False) -> int:
    """Worker processes: at most WORKERS_PER_CORE x the usable cores unless `force` (each is a process with
    its own interpreter and torch; thousands exhaust the pid limit before any work)."""
    cap = WORKERS_PER_CORE * cores()
    if n > cap and not force:
        raise ConfigError(f"{what} {n}: this machine has {cores()} usable core(s), at most {cap} worker "
                          "processes make sense; pass --force to start more")
    return n


def probe_jobs(n: int, what: str = "--probe-jobs") -> int:
    """Probe fitting processes: at most the usable cores (more only time-slice the same cores)."""
    if n > cores():
        raise ConfigError(f"{what} {n}: at most the {cores()} usable core(s) of this machine")
    return n


def seed(value: int, what: str) -> int:
    if not 0 <= value <= SEED_MAX:
        raise ConfigError(f"{what} must be in [0, {SEED_MAX}] (numpy's seed range), got {value}")
    return value


# ---------------------------------------------------------------- paths


def _links(p: Path, explicit: bool) -> None:
    """The user named `p` (explicit): writes may go through links on its way (safe_output.trust); otherwise a
    link on the way out of the project, or a link or special file at `p`, is refused now, before any work."""
    from . import safe_output

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
    if explicit:
        from . import safe_output

        safe_output.trust(p)
    from .safe_output import PROBE

    _links(p / PROBE, False)  # its folders, itself among them
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
    import stat

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


# ---------------------------------------------------------------- memory


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_memory() -> int:
    """Bytes this process can still get: MemAvailable, capped by the cgroup limit and RLIMIT_AS."""
    vals = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                vals.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    if not vals:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            vals.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for lim, cur in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                     ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        a, b = _read_int(lim), _read_int(cur)
        if a is not None and b is not None and a < 1 << 60:
            vals.append(max(0, a - b))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        vm = 0
        with contextlib.suppress(OSError, ValueError, IndexError):
            vm = next(int(ln.split()[1]) * 1024 for ln in Path("/proc/self/status").read_text().splitlines()
                      if ln.startswith("VmSize:"))
        vals.append(max(0, soft - vm))
    return min(vals) if vals else 1 << 62


def device_memory(device) -> int | None:
    """Free bytes on a CUDA device; None for the CPU (its terms count against host memory)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(dev.index or 0)
    return int(free)


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / (1 << 20):.0f} MiB"


def fits(need: Mapping[str, tuple[int, str]], *, host: int, device: int | None = None, times: int = 1,
         what: str = "this job") -> None:
    """ConfigError unless every pool holds its terms: "device" terms go to `device` bytes (host when None).

    `times` multiplies every term (parallel worker processes). The message names the dominant term.
    """
    pools: dict[str, dict[str, int]] = {"host": {}, "device": {}}
    for term, (b, where) in need.items():
        pools["device" if where == "device" and device is not None else "host"][term] = b * times
    for pool, terms in pools.items():
        if not terms:
            continue
        total, have = sum(terms.values()), host if pool == "host" else device
        if total > have:
            top = max(terms, key=terms.get)
            where = "this machine has" if pool == "host" else "the GPU has"
            raise ConfigError(f"{what} needs about {fmt_bytes(total)} of {'memory' if pool == 'host' else 'GPU memory'}"
                              f" (mostly {top}: {fmt_bytes(terms[top])}), {where} {fmt_bytes(have)} available; "
                              "make it smaller, or pass --force to try anyway")


def memory(need: Mapping[str, tuple[int, str]], *, device: str = "cpu", force: bool = False, times: int = 1,
           what: str = "this job") -> None:
    """Refuse a job whose estimate (memory_estimate) cannot fit here, unless `force`."""
    if force:
        return
    dev = device_memory(device) if any(w == "device" for _, w in need.values()) and device != "cpu" else None
    fits(need, host=host_memory(), device=dev, times=times, what=what)


def _span(s: float) -> str:
    for unit, n in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if s >= n:
            return f"{s / n:,.3g} {unit}" if s / n < 1e6 else f"{s / n:.1e} {unit}"
    return f"{s:.3g} s"


def duration(flops: float, *, device: str = "cpu", force: bool = False, what: str = "this job") -> float:
    """The floor in seconds of `flops` of work on `device` (every core, or the GPU, at its best possible rate);
    ConfigError naming it when it exceeds MAX_JOB_S, unless `force`."""
    gpu = not device.startswith("cpu")
    rate = PEAK_FLOPS_GPU if gpu else PEAK_FLOPS_PER_CORE * cores()
    floor = flops / rate
    if floor > MAX_JOB_S and not force:
        raise ConfigError(f"{what} would take at least {_span(floor)} on this machine ({flops:.2g} FLOP at no more "
                          f"than {rate:.2g} FLOP/s, {'one GPU' if gpu else f'{cores()} CPU cores'}); make it smaller, or "
                          f"pass --force to try anyway")
    return floor


def tokens_memory(n_seqs: int, length: int, bench: str) -> dict[str, tuple[int, str]]:
    """bench sample / filter on the benchmark HMM (V = 16): bytes per token of the arrays alive at the peak.

    sample: int32 tokens and states, their time-major chunk copies and the uniforms (about 40 B/token);
    filter: those, the int64 token tensor, float32 predictions (V = 16) and log-likelihoods, and the
    filter's int64 gather index and clamped tokens (about 120 B/token).
    """
    per = {"sample": 40, "filter": 120}[bench]
    return {"runtime": (RUNTIME_BYTES, "host"), f"{n_seqs} x {length} tokens": (per * n_seqs * length, "host")}


# ---------------------------------------------------------------- runs and sweeps


def live_run(uri: str, run_id: str, what: str = "MLflow run", *, resume: bool = False):
    """The run `run_id`, if it exists and is not deleted (a deleted run is never evaluated, analyzed or resumed:
    its artifacts would be overwritten and MLflow refuses to log to it half-way); else ConfigError.
    `resume`: also refuse a run whose owner still holds it (one writer per run: tracking.liveness)."""
    from . import tracking
    from .tracking.liveness import live_owner

    run = tracking.get_run(uri, run_id)
    if run is None:
        raise ConfigError(f"unknown MLflow run id {run_id!r} in {uri}")
    if run.info.lifecycle_stage == "deleted":
        raise ConfigError(f"{what} {run_id} is deleted (restore it in the MLflow UI, or `mlflow runs restore "
                          f"--run-id {run_id}`, first)")
    owner = live_owner(run) if resume else None
    if owner is not None:
        raise ConfigError(f"{what} {run_id} is still running in {owner}: one writer per run; wait for it, stop it, "
                          "or run `hmmscope runs gc` once it is gone")
    return run


def run_config(uri: str, run_id: str):
    """The Config a training run logged as params (None if it logged none that rebuild a valid one).

    ValueError "unknown MLflow run id" when the run does not exist; reads only.
    """

    run = live_run(uri, run_id)
    known = flatten(Config()).keys()
    params = {k: v for k, v in run.data.params.items() if k in known}
    if not params:
        return None
    try:
        return from_flat(params)
    except ConfigError:
        return None


def sweep_memory(spec, *, workers: int, force: bool = False) -> None:
    """Refuse a sweep whose largest trial, times the worker processes running at once, cannot fit.

    The largest trial: over every grid point (sampler grid), or with each parameter at whichever of its
    choices or bounds needs most (tpe / random). Analysis trials count the larger of training and analysis.
    """
    if force:
        return

    def need(pt) -> dict[str, tuple[int, str]]:
        cfg = spec.trial_config({**pt, "seed": spec.seeds[0]})
        if spec.kind == "theory":
            return memory_estimate(cfg, "theory")
        jobs = [memory_estimate(cfg, "train")] + ([memory_estimate(cfg, "analyze")] if spec.analyze else [])
        return max(jobs, key=lambda n: sum(b for b, _ in n.values()))

    total = lambda n: sum(b for b, _ in n.values())  # noqa: E731
    if spec.sampler == "grid":
        pts = [{k: v for k, v in pt.items() if k != "seed"} for pt in spec.grid_points()[::len(spec.seeds)]]
        worst = max((need(pt) for pt in pts), key=total)
    else:
        pt = {p.key: p.grid[0] if p.grid is not None else p.low for p in spec.space}
        for p in spec.space:
            vals = list(p.grid) if p.grid is not None else [p.low, p.high]
            pt[p.key] = max(vals, key=lambda v, key=p.key: total(need({**pt, key: v})))
        worst = need(pt)
    device = "cpu"
    if spec.kind == "train" and any(w == "device" for _, w in worst.values()):
        from .training.train import resolve_device

        device = str(resolve_device(spec.trial_config({"seed": spec.seeds[0]} | {
            p.key: p.grid[0] if p.grid is not None else p.low for p in spec.space}).train.device))
    memory(worst, device=device, times=max(1, min(workers, spec.n_trials)),
           what=f"sweep {spec.name!r} ({min(workers, spec.n_trials)} worker(s) at once)")


# ---------------------------------------------------------------- estimates: memory and work of a job


# The interpreter with what a job imports, as peak RSS: with torch and MLflow (RUNTIME_BYTES), or numpy only for
# generate (RUNTIME_NUMPY_BYTES); tests/measure_memory.py prints real jobs' peaks beside the estimates.
RUNTIME_BYTES = 5 * GIB // 8
RUNTIME_NUMPY_BYTES = GIB // 8
ORACLE_CHUNK = 256  # tasks per chunk of the mixture oracle (inference.mixture_oracle's default)


def _p2(k: int) -> int:
    return 1 << (k - 1).bit_length()


def model_params(m: ModelConfig, vocab_size: int) -> int:
    """Parameters of model.Transformer (tied embedding counted once; LayerNorms; no linear biases)."""
    D, M = m.d_model, m.d_mlp
    n = vocab_size * D + m.n_layers * (4 * D * D + 2 * D * M + 4 * D) + 2 * D
    return n + (m.max_len * D if m.pos_enc == "absolute" else 0)


def train_flops(cfg: Config, steps: int | None = None) -> float:
    """A floor on the floating-point work of training: 6 per parameter per token (forward and backward through
    every weight, the tied embedding's logits included) x batch_size x (episode tokens - 1) x steps (default
    train.steps). Attention, the optimizer and evaluations are not counted: the true work is larger."""
    tokens = cfg.train.batch_size * (seq_len(cfg.data) - 1)
    return 6.0 * model_params(cfg.model, cfg.hmm.n_tokens + 1) * tokens * (cfg.train.steps if steps is None else steps)


def _mixture_bytes(h: HMMConfig) -> int:
    """The larger of make_mixture's peak (float64 factors W, Q and three live (n, S, V) emission
    temporaries) and what stays: the float64 parameters, episodes' float32 inverse-CDF tables (rows
    padded to powers of two) and the float64 cumulative sum of the largest one."""
    n, S, d, V = h.n_tasks, h.n_states, h.rank, h.n_tokens
    build = 8 * n * S * (1 + 2 * d + 3 * V)
    rows = [(n, S), (n * S, d), (n * d, S), (n * S, V)]
    tables = sum(4 * r * _p2(k) for r, k in rows) + max(8 * r * k for r, k in rows)
    return max(build, 8 * n * S * (1 + 2 * d + V) + tables)


def _episodes_bytes(h: HMMConfig, d: DataConfig, n: int) -> int:
    """sample_episodes: tokens + states (N, T) and the sampler's (N (k+1), L) pair, int16 (int32 past 2**15)
    plus its float32 uniforms and intp task/state vectors per sequence."""
    it = 2 if max(h.n_tokens + 1, h.n_states) < 2**15 else 4
    L = max(d.l_demo, d.l_test)
    return n * (2 * it * seq_len(d) + (d.n_demos + 1) * (2 * it * L + 32))


def _oracle_bytes(h: HMMConfig, d: DataConfig, n: int, predictors: int = 1) -> int:
    """mixture_oracle over n episodes in float64, a chunk of C tasks at a time: the scaled forward tables
    (C, N, V d + V) (two buffers, the update, the gathered rows), the kernels (C, S, V d + V) x 2, and
    `predictors` (N, T, V) predictions with the running mixture (x 4)."""
    C, S, V, dd, T = min(ORACLE_CHUNK, h.n_tasks), h.n_states, h.n_tokens, h.rank, seq_len(d)
    return 8 * (4 * C * n * (V * dd + V) + 2 * C * S * (V * dd + V) + (3 + predictors) * n * T * V)


def _train_bytes(cfg: Config, batch_size: int, T: int) -> dict[str, int]:
    m = cfg.model
    vocab = cfg.hmm.n_tokens + 1
    D, M, H, L = m.d_model, m.d_mlp, m.n_heads, m.n_layers
    act = 4 * batch_size * T * (L * (14 * D + 3 * M) + 4 * vocab)  # float32 tensors kept for backward
    if m.window > 0:  # a boolean band mask pushes SDPA onto the math path: (B, H, T, T) weights per layer
        act += 4 * batch_size * H * T * T * 2 * L
    return {"model + AdamW state": 16 * model_params(m, vocab),  # float32 weights, grads and two moments
            "causal mask (max_len^2)": m.max_len ** 2, "activations": act}


def _theory_bytes(th: TheoryConfig) -> dict[str, int]:
    """One setting at a time, at the largest S and d: the dense S x S chain (transition, its factor check,
    the complex eigen-decomposition for the stationary law, Dobrushin's 64-row chunks), and the
    n_histories x (burn_in + max L) histories with the filter's gathers and (B, V d) tables."""
    S, d, V = max(th.n_states), max(th.ranks), th.n_tokens
    n, Hn = th.n_histories, th.burn_in + max(th.lengths)
    return {"dense transition (S x S)": 8 * S * S * (12 + 2 * min(S, 64)),
            "histories": n * Hn * 41 + 8 * n * (V * d + V) * 6}


def memory_estimate(cfg: Config, job: str = "train", *, n_episodes: int | None = None,
                    batch_size: int | None = None, seq: int | None = None,
                    probe_episodes: int = 0, n_perms: int = 0) -> dict[str, tuple[int, str]]:
    """Peak memory of `job` from the config alone: {term: (bytes, "host" | "device")}.

    "device" terms live on the training device (host memory too when it is the CPU). Jobs:
    generate (n_episodes episodes), train (training set, held-out set, mixture oracle, model with AdamW,
    activations of one batch), evaluate and analyze (n_episodes held-out episodes, default data.n_eval; analyze's
    probe_episodes and the shuffle test's n_perms too), theory, bench-train (batch_size x seq tokens),
    bench-oracle (the mixture oracle on n_episodes). The numbers are upper-leaning estimates of what the code keeps
    alive at its peak, read off the code (see each helper's docstring); they are meant to come out somewhat above
    the peak RSS of real CPU runs (tests/measure_memory.py prints both), which is what refusing an impossible job
    needs.
    """
    d = cfg.data
    h = dataclasses.replace(cfg.hmm, n_tasks=training_tasks(cfg.hmm, d))  # fresh tasks: one per training episode
    out: dict[str, tuple[int, str]] = {"runtime": (RUNTIME_NUMPY_BYTES if job == "generate" else RUNTIME_BYTES, "host")}
    if job == "theory":
        out.update({k: (v, "host") for k, v in _theory_bytes(cfg.theory).items()})
        return out
    if job == "bench-train":
        out.update({k: (v, "device") for k, v in _train_bytes(cfg, batch_size or 32, seq or 256).items()})
        return out
    out["mixture"] = (_mixture_bytes(h), "host")
    T = seq_len(d)
    if job == "generate":
        out["episodes"] = (_episodes_bytes(h, d, n_episodes or d.n_train), "host")
    elif job == "bench-oracle":
        out["episodes"] = (_episodes_bytes(h, d, n_episodes or d.n_eval), "host")
        out["mixture oracle"] = (_oracle_bytes(h, d, n_episodes or d.n_eval), "host")
    elif job == "train":
        out["episodes"] = (_episodes_bytes(h, d, d.n_train + d.n_eval), "host")
        out["training tokens (int64)"] = (8 * d.n_train * T, "device")
        out["mixture oracle"] = (_oracle_bytes(h, d, d.n_eval), "device")
        out.update({k: (v, "device") for k, v in _train_bytes(cfg, cfg.train.batch_size, T - 1).items()})
        n_em = min(cfg.train.emergence_episodes, d.n_eval)
        if n_em > 0:  # emergence.prepare: data.n_eval unseen tasks and episodes, the oracles on n_em episodes per
            # set, and what stays: 2 sets x (n_demos + 1) k of two oracles' predictions and 4 references' 4 metrics
            kept = 2 * (d.n_demos + 1) * n_em * d.l_test * 8 * (2 * h.n_tokens + 16)
            out["emergence references"] = (_mixture_bytes(dataclasses.replace(h, n_tasks=d.n_eval)) + _episodes_bytes(
                h, d, d.n_eval) + _oracle_bytes(h, d, n_em, predictors=2) + kept, "host")
    elif job in ("evaluate", "analyze"):
        n = n_episodes or d.n_eval
        out["episodes"] = (_episodes_bytes(h, d, n), "host")
        out["model"] = (4 * model_params(cfg.model, h.n_tokens + 1), "device")
        out["causal mask (max_len^2)"] = (cfg.model.max_len ** 2, "device")
        if job == "evaluate":  # figure1: the mixture oracle with model, task-oracle and mixture predictions
            out["oracles"] = (_oracle_bytes(h, d, n, predictors=3), "device")
            # seen and unseen tasks: each k keeps two oracles' predictions and 4 per-token metrics of 6 references
            # on the scored tokens; the EM learner (em_learner.fit_hmm_em, 8 states, 4 restarts) works in chunks of
            # at most em_learner.EM_CHUNK_BYTES (256 MiB)
            out["references (seen + unseen)"] = (2 * 8 * n * d.l_test * (d.n_demos + 1) * (2 * h.n_tokens + 24), "host")
            ev = cfg.eval  # the family-Bayes tasks (its oracle in chunks, as the mixture oracle's), unseen and fit tasks
            out["family, unseen and fit tasks"] = (_mixture_bytes(dataclasses.replace(h, n_tasks=max(1, ev.family_tasks)))
                                                   + _mixture_bytes(dataclasses.replace(h, n_tasks=n + ev.fit_episodes))
                                                   + _oracle_bytes(h, d, n, predictors=1), "host")
            em_rows = n * d.n_demos * (d.n_demos + 1) // 2 * 4
            out["EM learner"] = (min(256 << 20, em_rows * 8 * d.l_demo * 8 * 8), "host")
        else:  # probes: layer chunks within a 1 GiB budget, task beliefs and the shuffle test's batches
            out["residual streams"] = (min(GIB, 4 * n * 32 * cfg.model.d_model * (cfg.model.n_layers + 1)), "host")
            out["beliefs and targets"] = (n * 32 * (4 * h.n_states + 64), "host")
            if n_perms:  # shuffle.shuffle_test: the (n_perms, n, k) int64 orders drawn at once, then one episode's
                # 1 + n_perms rows at a time at least (their tokens, one layer's scores, the residual stream)
                T, m = seq_len(d), cfg.model
                out["shuffle permutations"] = (8 * n_perms * n * d.n_demos + (1 + n_perms) * (
                    (T - 1) ** 2 * m.n_heads * 4 + 8 * T + 4 * T * m.d_model), "host")
            if probe_episodes:  # episodes.probe_episodes: probe_tasks x per_task episodes and their beliefs
                out["probe episodes"] = (_episodes_bytes(h, d, probe_episodes)
                                         + probe_episodes * 32 * (4 * h.n_states + 64), "host")
    else:
        raise ValueError(f"unknown job {job!r}")
    return out
