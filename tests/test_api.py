"""The top-level API: every documented name resolves, and importing the package stays light."""

import subprocess
import sys

import hmmscope


def test_public_names_resolve_to_their_objects():
    from hmmscope.data import episodes, hmm
    from hmmscope.oracles import filtering, observability

    assert hmmscope.HMM is hmm.HMM and hmmscope.predictive is filtering.predictive
    assert hmmscope.sample_episodes is episodes.sample_episodes
    assert hmmscope.observability is observability.observability  # the function, from oracles/observability.py
    assert callable(hmmscope.observability)
    assert set(hmmscope.__all__) <= set(dir(hmmscope))


def test_import_does_not_load_torch():
    code = "import sys, hmmscope, hmmscope.cli; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_is_light():
    """`import hmmscope` loads no hmmscope submodule and none of torch, mlflow, optuna, sklearn, scipy, numpy (the
    observability names are lazy too); `import hmmscope.cli` (what `hmmscope --help` runs) none of the first five."""
    heavy = "{'torch', 'mlflow', 'optuna', 'sklearn', 'scipy', 'numpy'}"
    code = "import sys, {0}; print(sorted(m for m in sys.modules if m.split('.')[0] in {1} or m.startswith('hmmscope.')))"
    assert _run(code.format("hmmscope", heavy)) == "[]"
    cli = set(eval(_run(code.format("hmmscope.cli", heavy))))
    assert not {m for m in cli if not m.startswith("hmmscope.")} - {"numpy"}, cli
    assert {"hmmscope.cli.app", "hmmscope.cli.sweep"} <= cli and "hmmscope.oracles.observability" not in cli, cli


def test_observability_is_the_function_whichever_is_imported_first():
    """The lazy `hmmscope.observability` is the function whether its module is loaded before or after it, and a value
    set on the package (a monkeypatch) is kept; the other lazy names are the module's objects."""
    code = ("import sys, hmmscope\n"
            "f = hmmscope.observability\n"
            "from hmmscope.oracles.observability import Observability, gamma_m\n"
            "m = sys.modules['hmmscope.oracles.observability']\n"
            "ok = [f is m.observability, hmmscope.observability is f, hmmscope.gamma_m is gamma_m,\n"
            "      hmmscope.Observability is Observability, 'hmmscope.theory.theorem1' not in sys.modules]\n"
            "import hmmscope.theory.theorem1\n"
            "ok.append(hmmscope.observability is f)\n"
            "hmmscope.observability = len\n"
            "ok.append(hmmscope.observability is len)\n"
            "print(ok)")
    assert _run(code) == str([True] * 7)
    code = "import hmmscope.oracles.observability, hmmscope; print(callable(hmmscope.observability))"
    assert _run(code) == "True"
