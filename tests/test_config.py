import dataclasses

import pytest

from hmmscope.config import (
    Config,
    ConfigError,
    config_hash,
    flatten,
    from_flat,
    load_toml,
    override,
    preset,
    seq_len,
)


def test_defaults_validate_and_flatten_roundtrip():
    cfg = Config()
    flat = flatten(cfg)
    assert flat["hmm.gamma"] == cfg.hmm.gamma and flat["theory.gammas"] == list(cfg.theory.gammas)
    assert from_flat(flat) == cfg


def test_override_types_and_strings_from_cli():
    cfg = override(Config(), {"hmm.gamma": "0.5", "hmm.n_tasks": "3", "theory.gammas": "[0.2, 1]", "model.pos_enc": "none"})
    assert cfg.hmm.gamma == 0.5 and cfg.hmm.n_tasks == 3 and cfg.theory.gammas == (0.2, 1.0)
    assert cfg.model.pos_enc == "none"
    assert override(Config(), {"hmm.gamma": 1}).hmm.gamma == 1.0  # int accepted for float


@pytest.mark.parametrize(
    "updates, match",
    [
        ({"hmm.nope": 1}, "unknown config key 'hmm.nope'"),
        ({"nope.gamma": 1}, "unknown config key"),
        ({"gamma": 1}, "unknown config key"),
        ({"hmm.n_tasks": "2.5"}, "expected int"),
        ({"hmm.n_tasks": True}, "expected int"),
        ({"hmm.gamma": "abc"}, "cannot parse"),
        ({"hmm.gamma": 0.0}, r"hmm.gamma must be in \(0, 1\]"),
        ({"hmm.gamma": 1.5}, r"hmm.gamma must be in \(0, 1\]"),
        ({"hmm.rank": 99}, "hmm.rank must be in"),
        ({"hmm.family": "gaussian"}, "hmm.family must be one of"),
        ({"model.n_heads": 3}, "must divide"),
        ({"model.window": -1}, "model.window"),
        ({"model.pos_enc": "alibi"}, "model.pos_enc must be one of"),
        ({"data.l_test": -4}, "data.l_test"),
        ({"theory.lengths": [4]}, "theory.lengths"),
    ],
)
def test_override_rejects(updates, match):
    with pytest.raises(ConfigError, match=match):
        override(Config(), updates)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().hmm.gamma = 0.1  # type: ignore[misc]


def test_load_toml(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[hmm]\ngamma = 0.6\nfamily = "dirichlet"\n[train]\nsteps = 7\n')
    cfg = load_toml(p)
    assert cfg.hmm.gamma == 0.6 and cfg.hmm.family == "dirichlet" and cfg.train.steps == 7
    p.write_text("[hmm]\nbogus = 1\n")
    with pytest.raises(ConfigError, match=r"c.toml: unknown config key 'hmm.bogus'"):
        load_toml(p)
    with pytest.raises(ConfigError, match="not found"):
        load_toml(tmp_path / "missing.toml")


def test_presets_and_hash():
    paper = preset("paper")
    assert (paper.hmm.n_tasks, paper.hmm.n_states, paper.hmm.n_tokens) == (8192, 128, 16)
    assert (paper.model.n_layers, paper.model.n_heads, paper.model.d_model) == (16, 16, 1024)
    assert paper.data.n_train == 131072 and paper.train.steps == 4096 and paper.train.batch_size == 32
    assert seq_len(paper.data) <= paper.model.max_len
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("huge")
    h = config_hash(Config().hmm)
    assert h == config_hash(Config().hmm) and len(h) == 16
    assert h != config_hash(override(Config(), {"hmm.seed": 1}).hmm)
