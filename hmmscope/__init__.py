"""hmmscope: what transformers learn from mixtures of low-rank hidden Markov models.

The public API (see README.md): HMMs and mixtures, the sampler and episodes, exact
inference (filtering, task / mixture oracles, the L-memory predictor and eps(L)),
and observability coefficients. Names are loaded on first use (PEP 562), so
`import hmmscope` and the command line start without torch, scipy or numpy until a
command needs them.

`hmmscope.observability` is the function, although its submodule has the same name:
the import system binds a submodule to its package's attribute once it loads it, so
this package's module type makes that attribute a property that keeps the function
(loaded on first use) and ignores the binding of the submodule.

Must not import, at module level, anything beyond the standard library (no torch,
mlflow, optuna, sklearn, scipy, numpy; no hmmscope submodule).
"""

import sys
import types
from importlib import import_module

__version__ = "0.1.0"

_API = {
    "Config": "config", "ConfigError": "config",
    "HMM": "hmm", "Mixture": "hmm", "make_hmm": "hmm", "make_mixture": "hmm",
    "Episodes": "episodes", "sample_episodes": "episodes", "save_episodes": "episodes", "load_episodes": "episodes",
    "predictive": "inference", "task_oracle": "inference", "mixture_oracle": "inference",
    "memory_predictor": "inference", "memory_error": "inference",
    "Observability": "observability", "gamma_eff": "observability", "gamma_m": "observability",
}

__all__ = [*_API, "observability", "__version__"]


def __getattr__(name: str):
    if name in _API:
        value = getattr(import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hmmscope' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)


class _Package(types.ModuleType):
    """hmmscope's module type: `observability` is the function, whoever imports the submodule, and when."""

    @property
    def observability(self):
        fn = self.__dict__.get("_observability_function")
        if fn is None:
            fn = import_module(".observability", __name__).observability  # binds the submodule: ignored below
            self.__dict__["_observability_function"] = fn
        return fn

    @observability.setter
    def observability(self, value) -> None:
        if not isinstance(value, types.ModuleType):  # the import system binding the submodule: keep the function
            self.__dict__["_observability_function"] = value


sys.modules[__name__].__class__ = _Package
