"""`hmmscope sweep run SPEC --set key=value` (sweep.spec.with_sets): the same strict override as `train --set`,
part of the sweep's identity, stored with the study for its workers; bad input is one line, exit 2, nothing
written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope.cli import app
from hmmscope.config import ConfigError
from hmmscope.sweep.spec import load_spec, parse_spec, with_sets

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "sweeps" / "smoke.toml"
runner = CliRunner()


@pytest.mark.parametrize("sets, says", [
    (["nope.x=1"], "--set nope.x=1: unknown config key 'nope.x'"),
    (["model.nope=1"], "--set model.nope=1: unknown config key 'model.nope'"),
    (["train.steps=abc"], "--set train.steps=abc: train.steps: cannot parse 'abc' as int"),
    (["hmm.gamma=0.3"], "--set hmm.gamma: the spec sweeps hmm.gamma in [space]"),
    (["train.steps"], "--set expects key=value, got 'train.steps'"),
    (["train.steps=50", "hmm.rank=99"], "--set hmm.rank=99: "),  # valid alone, not with the spec's hmm.n_states
])
def test_bad_set_is_one_line_and_writes_nothing(tmp_path, monkeypatch, sets, says):
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "run", "smoke", *(a for s in sets for a in ("--set", s))]
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []  # no mlruns/, no study, no run


def test_print_config_shows_the_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["sweep", "run", "smoke", "--print-config", "--set", "train.steps=7",
                            "--set", "hmm.n_tasks=3"])
    assert r.exit_code == 0, r.output
    assert "steps = 7" in r.stdout and "n_tasks = 3" in r.stdout
    assert "steps = 100" not in r.stdout  # the spec's [fixed] value is overridden
    assert list(tmp_path.iterdir()) == []


def test_set_is_part_of_the_identity_except_run_time_keys():
    spec = load_spec(SMOKE)
    assert with_sets(spec, {}) is spec
    s7 = with_sets(spec, {"train.steps": "7"})
    assert s7.hash != spec.hash and s7.fixed["train.steps"] == 7 and s7.trial_config({}).train.steps == 7
    # the same as a spec file that says it in [fixed]: the identity is the parsed spec, not how it was written
    edited = parse_spec(SMOKE.read_text().replace('"train.steps" = 100', '"train.steps" = 7'), SMOKE)
    assert edited.hash == s7.hash
    assert with_sets(spec, {"train.steps": "100"}).hash == spec.hash  # the value the spec has: the same sweep
    moved = with_sets(spec, {"train.device": "auto"})  # a run-time key: the same study, new stored text
    assert moved.hash == spec.hash and moved.text != spec.text and moved.trial_config({}).train.device == "auto"
    assert "[set]" in s7.text and '"train.steps" = 7' in s7.text
    with pytest.raises(ConfigError, match="has a \\[set\\] table already"):
        with_sets(s7, {"train.steps": "8"})


def test_a_study_stores_its_overrides_and_refuses_other_ones(tmp_path):
    """Workers read the spec from the study: the override is there; the same name run with another --set (or
    without it) is refused, not silently resumed."""
    from hmmscope.sweep import create_study, spec_of_study

    storage, uri = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    spec = with_sets(load_spec(SMOKE), {"train.steps": "7", "data.n_train": "64"})
    create_study(spec, storage, uri)
    stored = spec_of_study("smoke", storage)
    assert stored.hash == spec.hash and stored.trial_config({}).train.steps == 7
    assert stored.trial_config({}).data.n_train == 64
    for other in (load_spec(SMOKE), with_sets(load_spec(SMOKE), {"train.steps": "8", "data.n_train": "64"})):
        with pytest.raises(ConfigError, match="different spec"):
            create_study(other, storage, uri)
    create_study(with_sets(load_spec(SMOKE), {"train.steps": "7", "data.n_train": "64", "train.device": "auto"}),
                 storage, uri)  # a run-time key on top: the same sweep, resumed
    assert spec_of_study("smoke", storage).trial_config({}).train.device == "auto"


def test_a_set_table_in_a_spec_file_is_checked_like_fixed(tmp_path):
    text = SMOKE.read_text()
    with pytest.raises(ConfigError, match="set.hmm.gamma: is swept in \\[space\\]"):
        parse_spec(text + '\n[set]\n"hmm.gamma" = 0.3\n', tmp_path / "s.toml")
    with pytest.raises(ConfigError, match="set.train.nope"):
        parse_spec(text + '\n[set]\n"train.nope" = 1\n', tmp_path / "s.toml")
    assert parse_spec(text + '\n[set]\n"train.steps" = 9\n', tmp_path / "s.toml").fixed["train.steps"] == 9
