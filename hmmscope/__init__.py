"""hmmscope: what transformers learn from mixtures of low-rank hidden Markov models."""

from .config import Config, ConfigError
from .hmm import HMM, Mixture, make_hmm, make_mixture

__version__ = "0.1.0"

__all__ = ["Config", "ConfigError", "HMM", "Mixture", "make_hmm", "make_mixture", "__version__"]
