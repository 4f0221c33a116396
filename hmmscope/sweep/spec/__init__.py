"""Sweep specs: the TOML format, parsed and validated strictly before any study or run exists.

The package, by idea: `typed` (Param, SweepSpec: a trial's config and name, the identity hash), `objectives` (the
metrics each kind of trial logs, the pruning proxies), `checks` (validation table by table: keys, settings, [fixed]
and [set], [space], grid points, the objective), `parse` (TOML -> SweepSpec: `parse_spec`, `load_spec`, `with_sets`).
Imports run one way: objectives <- typed <- checks <- parse; this package imports `sweep.effects` and `sweep.space`
only (of the sweep package).

Spec format (TOML, validated strictly by `load_spec` before any study or run exists)::

    [sweep]
    name = "smoke"                 # the Optuna study name: 1-100 of [A-Za-z0-9._-] (it names folders)
    base = "tiny"                  # a preset, or: config = "path.toml" (relative to the spec file)
    kind = "train"                 # train | theory | headroom (the room above counting, hmm/data/eval keys only; trains nothing)
    objective = "eval/seen/excess_ce"   # a metric the trial logs (see OBJECTIVES below; checked here)
    direction = "minimize"         # minimize | maximize
    sampler = "grid"               # grid | tpe | random
    pruner = "none"                # none | median (train kind: reports objective at every evaluation)
    n_trials = 20                  # tpe / random only; grid = grid size x len(seeds)
    seeds = [0, 1]                 # replicates (see below), each in [0, 2**32 - 1]
    storage = ""                   # any SQLAlchemy URL; "" = sqlite:///<cwd>/mlruns/optuna.db
    analyze = false                # also run the layerwise analysis (jobs.analyze_run) per trial
    experiment = "hmmscope-sweeps"
    heartbeat_interval = 60        # seconds; a trial whose worker died is retried after grace_period
    grace_period = 180
    max_retry = 2
    sampler_seed = 0
    prune_startup = 2              # MedianPruner: trials completed before pruning starts

    [fixed]                        # dotted config overrides applied to every trial
    "train.steps" = 100

    [space]                        # dotted config key -> one of
    "model.pos_enc" = {grid = ["rope", "absolute"]}
    "train.lr" = {low = 1e-4, high = 1e-2, log = true}     # float (int when both bounds are ints)
    "model.n_layers" = {choices = [2, 4]}                  # categorical (a grid under sampler="grid")
    "x.y" = {low = 1, high = 8, step = 1}

    [report]                       # how the report reads the results (sweep.effects; not part of the identity)
    margin = 0.01                  # equivalence margin, objective's units (default: 0.01 for nats/token)
    reference = "other-sweep"      # a sweep holding this one's base cell; references = {key = level}; tuned = [keys]

Command-line overrides. `hmmscope sweep run SPEC --set key=value` (`with_sets`) fixes a config key for every
trial after [fixed], through `config.override` (unknown keys and wrong types refused); a key the spec sweeps
in [space] is refused. The values join the spec's text as a [set] table (a spec file may hold one too: it is
applied after [fixed]), so the study stores them and its workers use them, and they are part of the identity
below: a study created without them is not resumed with them (one line: rename the sweep, `--name NEW`), except the
run-time keys (config.RUNTIME_KEYS: train.device, train.compile, train.attention, train.figures, eval.bayes,
eval.bayes_tol), which do not.

Identity. A study remembers its spec; running a spec under an existing study's name needs the same
identity (`SweepSpec.hash`, sha256 of the canonical parsed spec), or one that grows it (more seeds, more numeric
grid levels: spec_diff.py): the keys that change what a trial computes or how trials are chosen and scored.
Run-time keys do not count: storage, heartbeat_interval, grace_period, max_retry (sweep table), and the config keys
train.device, train.compile, train.attention, train.figures, eval.bayes and eval.bayes_tol (config.RUNTIME_KEYS, in
[fixed] or in the base config; the trainer accepts the same keys changed on resume). So moving a sweep to a GPU,
giving it a longer heartbeat or turning its trials' own figures off keeps its name; the study then stores the new
text.
The experiment counts: a sweep's runs stay in one MLflow experiment. Defaults and explicit values are the
same identity (the canonical form is the parsed spec, not its text).

Trial names. A trial's MLflow run is named after what varies (`SweepSpec.trial_name`): each [space] key
as a short label and value (strings as they are: `rope`; numbers after an abbreviation: `g0.5` for
hmm.gamma, see ABBREV), then the replicate seed (`s0`), e.g. `rope-g0.5-s0`.

Pruning. The median pruner compares a trial's intermediate values at each evaluation of the training
loop, which logs the learning curve val/* (training/train.py), not the Figure 1 metrics eval/* (computed once, at
the end). A pruned spec's objective must be a val/* key or an eval/* key with a learning-curve proxy
(PRUNE_PROXY: eval/seen/excess_ce -> val/excess_ce, eval/seen/test_acc -> val/test_acc, eval/seen/test_ce ->
val/test_loss; the learning curve is measured on the seen tasks' eval episodes); the proxy is what the trial
reports at each evaluation (`SweepSpec.prune_metric`).

Renamed keys. Figure 1's metrics were eval/<name> before seen and unseen tasks were evaluated apart; they are
eval/seen/<name> now, and a training run's oracle/test_acc, oracle/test_loss (the same numbers as Figure 1's
eval/seen/oracle_mix_test_acc, _ce) are no longer logged (LEGACY_OBJECTIVES); a spec naming an old key is
refused with the new name in the message.
"""

from .checks import DIST_KEYS, HEADROOM_SECTIONS, MAX_GRID, SWEEP_KEYS, TABLES
from .objectives import (
    GAMMA_M_OBJECTIVES,
    LEGACY_OBJECTIVES,
    PRUNE_PROXY,
    THEORY_OBJECTIVES,
    TRAIN_OBJECTIVES,
    VS_OBJECTIVE,
    objectives,
)
from .parse import load_spec, parse_spec, with_sets
from .typed import (
    ABBREV,
    RUNTIME_CONFIG,
    RUNTIME_SWEEP_KEYS,
    Param,
    SweepSpec,
    identity_hash,
    legacy_hash,
    seed_keys,
    short_labels,
)

__all__ = ["ABBREV", "DIST_KEYS", "GAMMA_M_OBJECTIVES", "HEADROOM_SECTIONS", "LEGACY_OBJECTIVES", "MAX_GRID",
           "PRUNE_PROXY", "RUNTIME_CONFIG", "RUNTIME_SWEEP_KEYS", "SWEEP_KEYS", "TABLES", "THEORY_OBJECTIVES",
           "TRAIN_OBJECTIVES", "VS_OBJECTIVE", "Param", "SweepSpec", "identity_hash", "legacy_hash", "load_spec",
           "objectives", "parse_spec", "seed_keys", "short_labels", "with_sets"]
