"""`hmmscope sweep run SPEC --name NEW` (sweep/rename.py): a copy of a spec under another name, the spec's file
unchanged; the study, its runs, its stored text and its report carry the new name, and the same command resumes it."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmmscope.cli.app import app
from hmmscope.config import ConfigError
from hmmscope.sweep.rename import renamed
from hmmscope.sweep.spec import load_spec, parse_spec

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"

THEORY = """
# a tiny Theorem 1 sweep
[sweep]
name = "tiny-theory"   # its study
kind = "theory"
seeds = [0]
experiment = "rename"

[fixed]
"theory.rhos" = [0.05]
"theory.n_states" = [8]
"theory.n_tokens" = 4
"theory.lengths" = [1, 2, 4]
"theory.n_histories" = 50
"theory.burn_in" = 10
"theory.gamma_m" = 0

[space]
"theory.gammas" = {grid = [0.5, 0.8]}
"theory.ranks" = {grid = [2]}
"""


def test_a_copy_differs_from_its_spec_in_its_name_only():
    s = load_spec(SWEEPS / "smoke.toml")
    c = renamed(s, "my-smoke")
    assert c.name == "my-smoke" and c.hash != s.hash and c.path == s.path
    assert (c.fixed, c.space, c.seeds, c.objective, c.base, c.n_trials) == (s.fixed, s.space, s.seeds, s.objective,
                                                                             s.base, s.n_trials)
    assert 'name = "my-smoke"  # hmmscope sweep run --name (a copy of \'smoke\')' in c.text
    assert parse_spec(c.text, c.path).hash == c.hash  # what the study stores is the copy
    assert renamed(s, "smoke") is s


@pytest.mark.parametrize("text, name, needle", [
    ('sweep.name = "x"\n[space]\n"hmm.gamma" = {grid = [0.5]}\n', "y", "no line `name"),
    ('[sweep]\nname = "x"\n[space]\n"hmm.gamma" = {grid = [0.5]}\n', "../up", "not a safe name"),
])
def test_a_name_that_cannot_be_given_is_one_line(text, name, needle):
    with pytest.raises(ConfigError, match=needle):
        renamed(parse_spec(text, "s.toml"), name)


def test_sweep_run_name_runs_a_copy_and_resumes_it(project):
    (project / "t.toml").write_text(THEORY)
    runner = CliRunner()
    r = runner.invoke(app, ["sweep", "run", "t.toml", "--name", "copy-1", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert (project / "t.toml").read_text() == THEORY  # the spec's file is unchanged
    assert "sweep copy-1: 2 complete, 0 failed" in r.output and (project / "out" / "copy-1" / "report.html").exists()
    r = runner.invoke(app, ["sweep", "list"])
    assert "copy-1" in r.output and "tiny-theory" not in r.output
    r = runner.invoke(app, ["sweep", "run", "t.toml", "--name", "copy-1", "--workers", "1", "--no-report"])
    assert r.exit_code == 0 and "sweep copy-1 is already complete: nothing to do" in r.output, r.output
    r = runner.invoke(app, ["sweep", "run", "t.toml", "--name", "a/b"])
    assert r.exit_code == 2 and "--name 'a/b' is not a safe name" in r.output
