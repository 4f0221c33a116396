"""One typed configuration object: defaults -> preset -> TOML file -> overrides.

Every knob lives in a frozen dataclass below. `override` is the only way to change one: it walks dotted keys
(`hmm.gamma`), rejects unknown keys, wrong types and non-finite floats (inf, nan), and re-validates the result, so a
bad value fails before any work starts. Seeds lie in [0, 2**32 - 1] (numpy's legacy seed range, also what
torch.manual_seed and SeedSequence take without complaint). `memory_estimate(cfg, job)` is the peak memory of a job,
by term, computed from the config alone (no allocation): the CLI refuses a job that cannot fit before it starts.

The package, by idea: `schema` (the dataclasses, their ranges, `validate`, the safe-name rule), `overrides` (the one
strict `override`, the flat form, presets, the content hash), `files` (config text read safely from files, TOML parsed
with a depth bound, `load_toml`). Imports run schema <- overrides <- files; nothing of hmmscope beyond this package.
"""

from .files import MAX_TEXT_BYTES, MAX_TOML_DEPTH, load_toml, parse_toml, read_text
from .overrides import PRESETS, config_hash, flatten, from_flat, override, preset, to_dict
from .schema import (
    ATTENTION,
    COMPILE,
    EM_STATES_CAP,
    FAMILIES,
    INT_MAX,
    NAME_RE,
    POS_ENCODINGS,
    PRECISIONS,
    RUNTIME_KEYS,
    SCHEDULES,
    SEED_MAX,
    STRUCTURES,
    TEST_STARTS,
    Config,
    ConfigError,
    DataConfig,
    EvalConfig,
    HMMConfig,
    ModelConfig,
    TheoryConfig,
    TrainConfig,
    check_name,
    em_states,
    seq_len,
    training_tasks,
    validate,
)

__all__ = ["ATTENTION", "COMPILE", "EM_STATES_CAP", "FAMILIES", "INT_MAX", "MAX_TEXT_BYTES", "MAX_TOML_DEPTH", "NAME_RE",
           "POS_ENCODINGS", "PRECISIONS", "PRESETS", "RUNTIME_KEYS", "SCHEDULES", "SEED_MAX", "STRUCTURES", "TEST_STARTS",
           "Config", "ConfigError", "DataConfig", "EvalConfig", "HMMConfig", "ModelConfig", "TheoryConfig", "TrainConfig",
           "check_name", "config_hash", "em_states", "flatten", "from_flat", "load_toml", "override", "parse_toml",
           "preset", "read_text", "seq_len", "to_dict", "training_tasks", "validate"]
