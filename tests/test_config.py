import dataclasses

import pytest

from hmmscope.checks import memory_estimate, model_params
from hmmscope.config import (
    SEED_MAX,
    Config,
    ConfigError,
    check_name,
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


@pytest.mark.parametrize(
    "updates, match",
    [
        ({"train.lr": "inf"}, "train.lr: must be a finite number"),
        ({"train.lr": float("nan")}, "train.lr: must be a finite number"),
        ({"train.lr": "1e400"}, "train.lr: must be a finite number"),  # TOML reads it as inf
        ({"train.lr": 10**400}, "train.lr: must be a finite number"),  # an int too large for a float
        ({"hmm.alpha": "inf"}, "hmm.alpha: must be a finite number"),
        ({"train.grad_clip": "inf"}, "train.grad_clip: must be a finite number"),
        ({"theory.gammas": "[0.5, nan]"}, "theory.gammas: must be a finite number"),
        ({"train.weight_decay": -1}, "train.weight_decay must be >= 0"),
        ({"train.beta1": 1.0}, r"train.beta1 and train.beta2 must be in \[0, 1\)"),
        ({"train.beta2": -0.1}, r"train.beta1 and train.beta2 must be in \[0, 1\)"),
        ({"hmm.seed": -1}, r"hmm.seed must be in \[0, 4294967295\]"),
        ({"data.seed": 2**32}, r"data.seed must be in \[0, 4294967295\]"),
        ({"train.seed": 2**64}, r"train.seed must be in \[0, 4294967295\]"),
        ({"theory.seed": 2**63 - 1}, r"theory.seed must be in \[0, 4294967295\]"),
    ],
)
def test_override_rejects_non_finite_floats_and_out_of_range_values(updates, match):
    with pytest.raises(ConfigError, match=match):
        override(Config(), updates)


def test_seed_range_is_what_numpy_and_torch_accept():
    import numpy as np
    import torch

    cfg = override(Config(), {"train.seed": SEED_MAX, "data.seed": 0, "hmm.seed": SEED_MAX})
    np.random.seed(cfg.train.seed)  # the legacy seeder takes exactly [0, 2**32 - 1]
    torch.manual_seed(cfg.train.seed)
    np.random.default_rng(np.random.SeedSequence([cfg.hmm.seed, 1]))
    with pytest.raises(ValueError):
        np.random.seed(SEED_MAX + 1)


def test_load_toml_refuses_folders_binary_files_and_bad_toml(tmp_path):
    (tmp_path / "d.toml").mkdir()
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        load_toml(tmp_path / "d.toml")
    (tmp_path / "b.toml").write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="is not a text"):
        load_toml(tmp_path / "b.toml")
    (tmp_path / "t.toml").write_text("[hmm\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_toml(tmp_path / "t.toml")
    (tmp_path / "i.toml").write_text("[train]\nlr = inf\n")
    with pytest.raises(ConfigError, match=r"i.toml: train.lr: must be a finite number"):
        load_toml(tmp_path / "i.toml")


@pytest.mark.parametrize("name", ["smoke", "rope-vs-absolute", "a.b_c-1", "0123456789abcdef0123456789abcdef", "x" * 100])
def test_check_name_accepts_safe_names(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "../x", "a/b", "..", "a..b", ".hidden", "-x", "a b", "a;b", "x" * 101, "é", "/abs"])
def test_check_name_refuses_unsafe_names(name):
    with pytest.raises(ConfigError, match="not a safe name"):
        check_name(name, "sweep")


@pytest.mark.parametrize("kw", [{}, {"model.pos_enc": "absolute"}, {"model.pos_enc": "sinusoidal", "model.n_layers": 3},
                                {"model.d_model": 48, "model.n_heads": 3, "model.pos_enc": "none", "model.d_mlp": 20},
                                {"hmm.n_tokens": 40, "model.window": 8}])
def test_model_params_counts_the_transformer(kw):
    from hmmscope.model.transformer import Transformer

    cfg = override(Config(), kw)
    model = Transformer(cfg.model, cfg.hmm.n_tokens + 1)
    assert model_params(cfg.model, cfg.hmm.n_tokens + 1) == model.num_params(exclude_pos_emb=False)


def test_memory_estimate_terms_follow_the_config():
    base = memory_estimate(Config(), "train")
    assert {"runtime", "mixture", "episodes", "mixture oracle", "model + AdamW state", "activations"} <= set(base)
    assert all(where in ("host", "device") and b > 0 for b, where in base.values())
    more = memory_estimate(override(Config(), {"data.n_train": 4 * Config().data.n_train}), "train")
    assert more["training tokens (int64)"][0] == 4 * base["training tokens (int64)"][0]
    assert more["activations"] == base["activations"]
    assert "emergence references" in base and "emergence references" not in memory_estimate(
        override(Config(), {"train.emergence_episodes": 0}), "train")
    wide = memory_estimate(override(Config(), {"train.batch_size": 64}), "train")
    assert wide["activations"][0] == 2 * base["activations"][0]
    gen = memory_estimate(Config(), "generate", n_episodes=10**9)
    assert max(gen, key=lambda k: gen[k][0]) == "episodes" and gen["episodes"][0] > 10**12
    th = memory_estimate(override(Config(), {"theory.n_states": [100000], "theory.ranks": [2]}), "theory")
    assert th["dense transition (S x S)"][0] > 8 * 100000**2
    with pytest.raises(ValueError, match="unknown job"):
        memory_estimate(Config(), "nope")
