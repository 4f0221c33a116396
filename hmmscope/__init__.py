"""hmmscope: what transformers learn from mixtures of low-rank hidden Markov models.

The public API (see README.md): HMMs and mixtures, the sampler and episodes, exact
inference (filtering, task / mixture oracles, the L-memory predictor and eps(L)),
and observability coefficients. Names are loaded on first use (PEP 562), so
`import hmmscope` and the command line start without torch, scipy or numpy until a
command needs them.

The package, in pipeline order: `data/` (HMMs, episodes, seed streams), `oracles/` (exact
inference, observability, baselines), `model/`, `training/`, `measure/` (Figure 1, emergence,
headroom, shuffle, probes), `theory/`, then `jobs` (what the CLI launches), `sweep/`, `report/`,
`ui/`, `api` and `cli/`; beside them `tracking/` (MLflow) and the modules everything uses:
`config`, `stats`, `units`, `figures`, `safe_output`, `interrupts`, `checks`, `store_checks`.

Must not import, at module level, anything beyond the standard library (no torch,
mlflow, optuna, sklearn, scipy, numpy; no hmmscope submodule).
"""

from importlib import import_module

__version__ = "0.1.0"

_API = {
    "Config": "config", "ConfigError": "config",
    "HMM": "data.hmm", "Mixture": "data.hmm", "make_hmm": "data.hmm", "make_mixture": "data.hmm",
    "Episodes": "data.episodes", "sample_episodes": "data.episodes", "save_episodes": "data.episodes",
    "load_episodes": "data.episodes",
    "predictive": "oracles.filtering", "task_oracle": "oracles.inference", "mixture_oracle": "oracles.inference",
    "memory_predictor": "oracles.memory", "memory_error": "oracles.memory",
    "Observability": "oracles.observability", "observability": "oracles.observability",
    "gamma_eff": "oracles.observability", "gamma_m": "oracles.observability",
}

__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    if name in _API:
        value = getattr(import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hmmscope' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
