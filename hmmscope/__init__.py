"""hmmscope: what transformers learn from mixtures of low-rank hidden Markov models.

The public API (see README.md): HMMs and mixtures, the sampler and episodes, exact
inference (filtering, task / mixture oracles, the L-memory predictor and eps(L)),
and observability coefficients.
"""

from .config import Config, ConfigError
from .episodes import Episodes, load_episodes, sample_episodes, save_episodes
from .hmm import HMM, Mixture, make_hmm, make_mixture
from .inference import memory_error, memory_predictor, mixture_oracle, predictive, task_oracle
from .observability import Observability, gamma_eff, gamma_m, observability

__version__ = "0.1.0"

__all__ = [
    "Config", "ConfigError", "HMM", "Mixture", "make_hmm", "make_mixture",
    "Episodes", "sample_episodes", "save_episodes", "load_episodes",
    "predictive", "task_oracle", "mixture_oracle", "memory_predictor", "memory_error",
    "Observability", "observability", "gamma_eff", "gamma_m", "__version__",
]
