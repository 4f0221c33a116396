"""The docs a newcomer writes a sweep from: the README's spec reference names every table and key the parser knows,
its complete example parses, and the run-time keys are one list (config.RUNTIME_KEYS) that the README, the spec
module's docstring, `sweep run --set`'s help, the trainer's resume and the sweep identity all take from."""

import re
from pathlib import Path

import pytest

from hmmscope.config import RUNTIME_KEYS, ConfigError
from hmmscope.sweep import spec as spec_module
from hmmscope.sweep.spec import DIST_KEYS, RUNTIME_CONFIG, SWEEP_KEYS, TABLES, parse_spec

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def reference() -> str:
    """The README's section "Sweep specs"."""
    return README.split("## Sweep specs\n", 1)[1].split("\n## ", 1)[0]


def test_the_readmes_example_spec_parses_and_the_reference_names_every_table_and_key():
    ref = reference()
    example = ref.split("```toml\n", 1)[1].split("```", 1)[0]
    spec = parse_spec(example, "README.md")  # the example is a spec the parser takes (a bad one: ConfigError)
    assert spec.name == "my-gamma" and spec.n_trials == 4 and spec.fixed["train.figures"] is False
    rows = [ln for ln in ref.splitlines() if ln.startswith("| `")]
    named = {m for ln in rows for m in re.findall(r"`\[?([a-z_]+)\]?`", ln.split(" | ")[0])}
    assert SWEEP_KEYS | TABLES <= named, sorted((SWEEP_KEYS | TABLES) - named)
    space_row = next(ln for ln in rows if ln.startswith("| `[space]`"))
    assert all(f"{k} =" in space_row or f"`{k}" in space_row for k in DIST_KEYS), space_row


def test_run_time_keys_are_one_list_in_the_docs_the_help_and_the_code():
    from typer.main import get_command

    from hmmscope.cli.app import app
    from hmmscope.training.train import RESUME_KEYS

    ref = reference()
    said = re.search(r"Run-time keys \(`config\.RUNTIME_KEYS`\):\s*(.*?);", ref, re.S)
    assert said, "the README's reference names the run-time keys and the constant"
    assert re.findall(r"`((?:train|eval)\.\w+)`", said.group(1)) == list(RUNTIME_KEYS)
    doc = " ".join(spec_module.__doc__.split())
    listed = [x for x in doc.split(". ") if "config.RUNTIME_KEYS" in x]  # each sentence of the docstring citing it
    assert len(listed) == 2 and all(set(re.findall(r"(?:train|eval)\.\w+", x)) == set(RUNTIME_KEYS) for x in listed), listed
    run = get_command(app).commands["sweep"].commands["run"]
    (opt,) = [p for p in run.params if p.name == "set_"]
    assert opt.help.endswith(f"except the run-time keys {', '.join(RUNTIME_KEYS)}.")  # before: two of the four
    assert RUNTIME_CONFIG == frozenset(RUNTIME_KEYS) and RESUME_KEYS == ("train.steps", *RUNTIME_KEYS)


def test_the_readmes_run_time_keys_move_a_sweep_without_renaming_it():
    text = reference().split("```toml\n", 1)[1].split("```", 1)[0]
    a = parse_spec(text, "a.toml")
    b = parse_spec(text.replace('"train.figures" = false', '"train.figures" = true\n"train.device" = "auto"'), "b.toml")
    assert a.hash == b.hash
    with pytest.raises(ConfigError):
        parse_spec(text.replace('"hmm.gamma" = {grid', '"hmm.gamma" = {bad'), "c.toml")
