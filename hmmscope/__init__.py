"""hmmscope: what transformers learn from mixtures of low-rank hidden Markov models.

The public API (see README.md): HMMs and mixtures, the sampler and episodes, exact
inference (filtering, task / mixture oracles, the L-memory predictor and eps(L)),
and observability coefficients. Names are loaded on first use (PEP 562), so the
command line starts without importing torch until a command needs it. The observability
names are bound eagerly: the function `observability` shares its submodule's name, and
a lazy binding would be replaced by the module once anything imports the submodule.
"""

from importlib import import_module

from .observability import Observability, gamma_eff, gamma_m, observability

__version__ = "0.1.0"

_API = {
    "Config": "config", "ConfigError": "config",
    "HMM": "hmm", "Mixture": "hmm", "make_hmm": "hmm", "make_mixture": "hmm",
    "Episodes": "episodes", "sample_episodes": "episodes", "save_episodes": "episodes", "load_episodes": "episodes",
    "predictive": "inference", "task_oracle": "inference", "mixture_oracle": "inference",
    "memory_predictor": "inference", "memory_error": "inference",
}

__all__ = [*_API, "Observability", "observability", "gamma_eff", "gamma_m", "__version__"]


def __getattr__(name: str):
    if name in _API:
        value = getattr(import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hmmscope' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
