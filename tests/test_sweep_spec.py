"""Sweep specs: identity (run-time keys do not count), trial names, the pruning proxy, objective sets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hmmscope.config import ConfigError
from hmmscope.sweep import ATTR_HASH, ATTR_SPEC, create_study, spec_of_study
from hmmscope.sweep.spec import PRUNE_PROXY, TRAIN_OBJECTIVES, legacy_hash, parse_spec, short_labels

BASE = """
[sweep]
name = "ident"
experiment = "sw"
{sweep}

[fixed]
"train.steps" = 10
"train.min_lr" = 1e-6
{fixed}

[space]
"model.pos_enc" = {{grid = ["rope", "absolute"]}}
"hmm.gamma" = {{grid = [0.5, 0.9]}}
"""


def spec(sweep: str = "", fixed: str = "", path: str | Path = "ident.toml"):
    return parse_spec(BASE.format(sweep=sweep, fixed=fixed), path)


# ---------------------------------------------------------------- identity


RUNTIME = [('heartbeat_interval = 5\ngrace_period = 20', ""), ("max_retry = 7", ""),
           ('storage = "sqlite:////elsewhere/optuna.db"', ""), ("", '"train.device" = "cuda"'),
           ("", '"train.compile" = true'), ("", '"train.figures" = false'),
           ('objective = "eval/seen/excess_ce"\ndirection = "minimize"', "")]


@pytest.mark.parametrize("sweep,fixed", RUNTIME, ids=["heartbeat", "retries", "storage", "device", "compile", "figures",
                                                      "explicit-defaults"])
def test_run_time_keys_leave_the_identity_alone(sweep, fixed):
    assert spec(sweep, fixed).hash == spec().hash


RESULT = [("seeds = [0, 1]", ""), ('objective = "eval/seen/test_acc"', ""), ('direction = "maximize"', ""),
          ("analyze = true", ""), ('experiment = "other"', ""), ("", '"train.lr" = 1e-3'),
          ("", '"train.precision" = "bf16"'), ('base = "paper"', "")]


@pytest.mark.parametrize("sweep,fixed", RESULT, ids=["seeds", "objective", "direction", "analyze", "experiment",
                                                     "lr", "precision", "base"])
def test_result_keys_change_the_identity(sweep, fixed):
    text = BASE.format(sweep=sweep, fixed=fixed)
    if sweep.startswith("experiment"):
        text = text.replace('experiment = "sw"\n', "")
    assert parse_spec(text, "ident.toml").hash != spec().hash


def test_device_in_the_base_config_is_run_time_too(tmp_path):
    for dev in ("cpu", "cuda"):
        (tmp_path / f"{dev}.toml").write_text(f'[train]\ndevice = "{dev}"\n')
    a, b = (parse_spec(BASE.format(sweep=f'config = "{d}.toml"', fixed=""), tmp_path / "s.toml") for d in ("cpu", "cuda"))
    assert a.base.train.device != b.base.train.device and a.hash == b.hash


def test_changing_a_run_time_key_keeps_the_sweep_name_and_workers_see_the_change(tmp_path):
    storage, uri = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    first = spec(path=tmp_path / "ident.toml")
    create_study(first, storage, uri)
    moved = spec('heartbeat_interval = 7\ngrace_period = 30', '"train.device" = "cuda"', tmp_path / "ident.toml")
    study, _, created = create_study(moved, storage, uri)  # no "rename the sweep"
    assert not created
    stored = spec_of_study("ident", storage)  # what workers run with: the new run-time keys
    assert stored.heartbeat_interval == 7 and stored.grace_period == 30
    assert stored.fixed["train.device"] == "cuda" and stored.hash == first.hash
    with pytest.raises(ConfigError, match="different spec"):  # a key that changes results still needs a new name
        create_study(spec('objective = "eval/seen/test_acc"', path=tmp_path / "ident.toml"), storage, uri)


def test_a_study_stored_with_the_old_hash_is_the_same_sweep(tmp_path):
    storage, uri = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    s = spec(path=tmp_path / "ident.toml")
    study, _, _ = create_study(s, storage, uri)
    study.set_user_attr(ATTR_SPEC, None)  # as a study created before the spec was stored in one attr ...
    study.set_user_attr(ATTR_HASH, legacy_hash(s))  # ... and before run-time keys were left out
    assert legacy_hash(s) != s.hash
    study, _, created = create_study(s, storage, uri)
    assert not created and study.user_attrs[ATTR_HASH] == s.hash and study.user_attrs[ATTR_SPEC]["hash"] == s.hash
    study.set_user_attr(ATTR_SPEC, None)
    study.set_user_attr(ATTR_HASH, legacy_hash(spec('objective = "eval/seen/test_acc"')))
    with pytest.raises(ConfigError, match="different spec"):
        create_study(s, storage, uri)


def test_shipped_main_sweep_keeps_its_identity():
    from hmmscope.pipeline.job import MAIN_SWEEP

    root = Path(__file__).resolve().parents[1]
    shipped = parse_spec((root / "sweeps" / "smoke.toml").read_text(), root / "sweeps" / "smoke.toml")
    assert parse_spec(MAIN_SWEEP, "main").hash == shipped.hash


# ---------------------------------------------------------------- trial names


def test_trial_names_say_what_differs():
    s = spec()
    assert s.trial_name({"model.pos_enc": "rope", "hmm.gamma": 0.5}, 0) == "rope-g0.5-s0"
    assert s.trial_name({"model.pos_enc": "absolute", "hmm.gamma": 0.9, "seed": 3}) == "absolute-g0.9-s3"
    tpe = parse_spec('[sweep]\nname = "t"\nsampler = "tpe"\nn_trials = 2\n[fixed]\n"train.min_lr" = 1e-6\n[space]\n'
                     '"train.lr" = {low = 1e-4, high = 1e-2, log = true}\n"model.n_layers" = {choices = [1, 2]}\n'
                     '"train.compile" = {choices = [true, false]}\n', "t.toml")
    assert tpe.trial_name({"train.lr": 0.000316227766, "model.n_layers": 2, "train.compile": False}, 1) == \
        "lr0.0003162-L2-nocompile-s1"
    bare = parse_spec('[sweep]\nname = "bare"\nseeds = [4]\n[space]\n', "bare.toml")  # [space] empty on purpose
    assert bare.trial_name({}, 4) == "bare-s4"
    theory = parse_spec('[sweep]\nname = "th"\nkind = "theory"\n[fixed]\n"theory.rhos" = [0.05]\n'
                        '"theory.n_states" = [8]\n[space]\n"theory.gammas" = {grid = [0.5]}\n'
                        '"theory.ranks" = {grid = [2]}\n', "th.toml")
    assert theory.trial_name({"theory.gammas": 0.5, "theory.ranks": 2}, 0) == "g0.5-d2-s0"


def test_labels_of_keys_that_share_an_abbreviation_fall_back_to_something_distinct():
    assert short_labels(["hmm.gamma", "theory.gammas"]) == {"hmm.gamma": "gamma", "theory.gammas": "gammas"}
    assert short_labels(["data.seed", "hmm.seed"]) == {"data.seed": "data.seed", "hmm.seed": "hmm.seed"}
    assert short_labels(["model.pos_enc", "hmm.family"]) == {"model.pos_enc": "", "hmm.family": ""}


# ---------------------------------------------------------------- objectives and pruning


def test_learning_curve_and_figure1_objectives_are_distinct_keys():
    assert {"val/loss", "val/acc", "val/test_loss", "val/test_acc", "val/excess_ce"} <= TRAIN_OBJECTIVES
    assert {"eval/seen/excess_ce", "eval/seen/test_acc", "eval/seen/kl_mix", "eval/unseen/excess_ce_task",
            "eval/retrieval_gap"} <= TRAIN_OBJECTIVES
    assert not {"eval/excess_ce", "eval/test_acc", "eval/kl_mix"} & TRAIN_OBJECTIVES  # renamed: one key, one meaning
    assert "eval/loss" not in TRAIN_OBJECTIVES and "eval/acc" not in TRAIN_OBJECTIVES


def test_pruning_reports_the_learning_curve_proxy_of_the_objective():
    assert spec('pruner = "median"').prune_metric == "val/excess_ce" == PRUNE_PROXY["eval/seen/excess_ce"]
    assert spec('pruner = "median"\nobjective = "val/loss"').prune_metric == "val/loss"
    assert spec('objective = "eval/seen/kl_mix"').prune_metric is None  # no pruner: fine
    with pytest.raises(ConfigError, match=r"ident.toml: sweep.pruner: pruning needs an objective"):
        spec('pruner = "median"\nobjective = "eval/seen/kl_mix"')


def test_an_old_figure1_key_is_refused_with_its_new_name():
    with pytest.raises(ConfigError, match=r"'eval/excess_ce' is not a metric .*renamed eval/seen/excess_ce"):
        spec('objective = "eval/excess_ce"')
    assert spec('objective = "baseline/unseen/incontext_hmm/ce_k0"').objective == "baseline/unseen/incontext_hmm/ce_k0"
    with pytest.raises(ConfigError, match="is not a metric"):
        spec('objective = "baseline/seen/model/ce"')


# ---------------------------------------------------------------- refused up front (issue 22)


def _space(space: str, sweep: str = "") -> str:
    exp = "" if "experiment" in sweep else 'experiment = "sw"\n'
    return f'[sweep]\nname = "up"\n{exp}{sweep}\n[fixed]\n"train.steps" = 10\n[space]\n{space}\n'


@pytest.mark.parametrize("text, needle", [
    (_space('"model.n_heads" = {low = 1, high = 8}', 'sampler = "random"\nn_trials = 4'), "inside the range"),
    (_space('"hmm.gamma" = {grid = [1, 1.0]}'), "are the same value"),
    (_space('"hmm.gamma" = {grid = [0.5]}', 'experiment = "a\\tb"'), "sweep.experiment"),
    (_space('"hmm.gamma" = {grid = [0.5]}', f'experiment = "{"x" * 300}"'), "sweep.experiment"),
    (_space('"hmm.gamma" = {grid = [0.5]}', "heartbeat_interval = 9223372036854775807"), "at most"),
    (_space('"hmm.gamma" = {grid = [0.5]}', "max_retry = 1000000"), "at most"),
    (_space('"hmm.gamma" = {low = 0.1, high = 0.9}', 'sampler = "random"\nn_trials = 100000000'), "at most"),
], ids=["interior-of-range", "grid-1-and-1.0", "experiment-tab", "experiment-300", "heartbeat-int64",
        "max-retry", "n-trials-1e8"])
def test_specs_that_could_never_succeed_are_refused_up_front(text, needle):
    """Before: 3 of 4 random trials failed at runtime (n_heads 3, 5, 6, 7 do not divide d_model); 1 and 1.0
    ran as two cells of one name; an experiment name --experiment refuses was accepted; int64 intervals
    were accepted; n_trials = 1e8 ran into MemoryError after building half a study."""
    with pytest.raises(ConfigError, match=needle) as e:
        parse_spec(text, "up.toml")
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- accepted and silently wrong before (issue 36, item 8)

TRUNCATED = '[sweep]\nname = "cut"\nexperiment = "sw"\n[fixed]\n"train.steps" = 10\n'


@pytest.mark.parametrize("text, needle", [
    (TRUNCATED, "cut off before its [space]"),
    (_space('"train.lr" = {low = 0.1, high = 0.5, step = 5.0}', 'sampler = "random"\nn_trials = 4'),
     "every trial would get low = 0.1"),
    (_space('"train.lr" = {low = 0.1, high = 0.5, step = 0.15}', 'sampler = "random"\nn_trials = 4'),
     "does not divide high - low"),
    (_space('"model.n_layers" = {low = 1, high = 8, step = 3}', 'sampler = "random"\nn_trials = 4'),
     "would end at 7"),
    (_space('"hmm.gamma" = {grid = [0.5, 0.50000001]}'), "name the same trial ('g0.5'"),
    (_space('"hmm.gamma" = {grid = [0.5, "0.9"]}'), "'0.9' is a string"),
    (_space('"model.n_layers" = {choices = [1, "2"]}', 'sampler = "random"\nn_trials = 4'), "'2' is a string"),
], ids=["cut-before-space", "step-beyond-range", "step-not-dividing", "int-step-not-dividing", "same-trial-name",
        "string-in-float-grid", "string-in-int-choices"])
def test_specs_that_ran_silently_wrong_are_refused(text, needle):
    """Before: a spec cut before [space] ran as a one-point sweep; step 5.0 over 0.1..0.5 gave every trial 0.1; a
    step that does not divide was cut at the last step that fits; 0.5 and 0.50000001 made two trials named
    g0.5-s0; a string "0.9" in a float grid was converted silently."""
    with pytest.raises(ConfigError, match=re.escape(needle)) as e:
        parse_spec(text, "up.toml")
    assert "\n" not in str(e.value)


def test_what_those_checks_leave_alone_still_parses(tmp_path):
    """Replicates of the fixed config (no [space], several seeds), an explicit empty [space], a dividing step, a
    string grid of a string key, and a spec with a UTF-8 BOM (before: 'Invalid statement')."""
    assert parse_spec(TRUNCATED.replace('experiment = "sw"', 'experiment = "sw"\nseeds = [0, 1]'), "r.toml").n_trials == 2
    assert parse_spec(TRUNCATED + "[space]\n", "r.toml").n_trials == 1
    s = parse_spec(_space('"train.lr" = {low = 0.1, high = 0.5, step = 0.1}\n"model.pos_enc" = {choices = ["rope", '
                          '"absolute"]}', 'sampler = "random"\nn_trials = 4'), "up.toml")
    assert [p.key for p in s.space] == ["train.lr", "model.pos_enc"]
    from hmmscope.sweep.spec import load_spec

    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + _space('"hmm.gamma" = {grid = [0.5]}').encode())
    assert load_spec(tmp_path / "bom.toml").name == "up"


def test_a_range_whose_every_value_is_valid_is_accepted():
    s = parse_spec(_space('"model.n_heads" = {low = 2, high = 4, step = 2}\n"train.lr" = {low = 1e-3, high = 1e-2, '
                          'log = true}', 'sampler = "tpe"\nn_trials = 4'), "up.toml")
    assert [p.key for p in s.space] == ["model.n_heads", "train.lr"]


def test_a_report_table_states_margins_and_references_and_leaves_the_identity_alone():
    """[report] (sweep.effects.options; issues 45, 46.1): how the results are read, not what a trial computes, so a
    margin or a reference can change without renaming the sweep; a bad one is refused when the spec is parsed."""
    from hmmscope.sweep.effects import options

    base = '[sweep]\nname = "r"\nseeds = [0, 1]\n[space]\n"hmm.gamma" = {grid = [0.6, 0.95]}\n'
    plain = parse_spec(base, "r.toml")
    stated = parse_spec(base + '[report]\nmargin = 0.02\nreference = "inference-ablations-depth"\n', "r.toml")
    assert stated.hash == plain.hash and legacy_hash(stated) == legacy_hash(plain)
    opts = options(stated)
    assert (opts.margin, opts.reference, options(plain).margin_for("nats/token")) == (
        0.02, "inference-ablations-depth", 0.01)
    with pytest.raises(ConfigError, match=r"r.toml: report.references: 'hmm.rank' is not a key of \[space\]"):
        parse_spec(base + '[report]\nreferences = {"hmm.rank" = "2"}\n', "r.toml")
    with pytest.raises(ConfigError, match="r.toml: report.margin: must be a number > 0"):
        parse_spec(base + "[report]\nmargin = 0\n", "r.toml")
def test_a_typo_in_fixed_is_named_not_a_key_that_needs_another():
    """Before: "fixed.hmm.rank: unknown config key 'train.stepz'" (rank = 100 is invalid alone on the base, with its
    n_states = 128 from [fixed] it is fine); the closest config key is suggested."""
    text = ('[sweep]\nname = "typo"\n[fixed]\n"hmm.n_states" = 128\n"hmm.rank" = 100\n"train.stepz" = 5\n[space]\n'
            '"hmm.gamma" = {grid = [0.5]}\n')
    with pytest.raises(ConfigError) as e:
        parse_spec(text, "typo.toml")
    assert str(e.value).startswith("typo.toml: fixed.train.stepz: unknown config key 'train.stepz' (known in train: ")
    assert str(e.value).endswith("; did you mean train.steps?"), str(e.value)
    with pytest.raises(ConfigError, match="typo.toml: fixed.hmm.rank: "):  # a value that fails with the keys before it
        parse_spec(text.replace("128", "64").replace('"train.stepz" = 5\n', ""), "typo.toml")
    with pytest.raises(ConfigError, match="typo.toml: set.train.stepz: "):  # a [set] table's key: named there
        parse_spec(text.replace('"train.stepz" = 5\n', "") + '[set]\n"train.stepz" = 5\n', "typo.toml")
