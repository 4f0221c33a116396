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

The package, by idea: `values` (names, counts, seeds), `paths` (output folders and files, input files), `runs` (the
MLflow run a command names), `estimates` (a job's memory by term and its work, from the config alone), `resources`
(those against what this machine has: memory, time, a sweep's workers at once). Imports run estimates <- resources,
values <- resources; `store_files` <- paths; tracking, torch and safe_output only inside functions (`# lazy:`).
"""

from .estimates import GIB, ORACLE_CHUNK, RUNTIME_BYTES, RUNTIME_NUMPY_BYTES, memory_estimate, model_params, train_flops
from .paths import input_file, output_dir, output_file
from .resources import (
    MAX_JOB_S,
    PEAK_FLOPS_GPU,
    PEAK_FLOPS_PER_CORE,
    device_memory,
    duration,
    fits,
    fmt_bytes,
    host_memory,
    memory,
    sweep_memory,
    tokens_memory,
)
from .runs import live_run, run_config
from .values import WORKERS_PER_CORE, cores, probe_jobs, safe_name, seed, workers

__all__ = ["GIB", "MAX_JOB_S", "ORACLE_CHUNK", "PEAK_FLOPS_GPU", "PEAK_FLOPS_PER_CORE", "RUNTIME_BYTES",
           "RUNTIME_NUMPY_BYTES", "WORKERS_PER_CORE", "cores", "device_memory", "duration", "fits", "fmt_bytes",
           "host_memory", "input_file", "live_run", "memory", "memory_estimate", "model_params", "output_dir",
           "output_file", "probe_jobs", "run_config", "safe_name", "seed", "sweep_memory", "tokens_memory",
           "train_flops", "workers"]
