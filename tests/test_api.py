"""The top-level API: every documented name resolves, and importing the package stays light."""

import subprocess
import sys

import hmmscope


def test_public_names_resolve_to_their_objects():
    from hmmscope import episodes, hmm, inference

    obs_module = sys.modules["hmmscope.observability"]
    assert hmmscope.HMM is hmm.HMM and hmmscope.predictive is inference.predictive
    assert hmmscope.sample_episodes is episodes.sample_episodes
    assert hmmscope.observability is obs_module.observability  # the function, not its submodule
    assert callable(hmmscope.observability)
    assert set(hmmscope.__all__) <= set(dir(hmmscope))


def test_observability_stays_the_function_after_importing_its_submodule():
    code = "import hmmscope.observability, hmmscope; print(callable(hmmscope.observability))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "True"


def test_import_does_not_load_torch():
    code = "import sys, hmmscope, hmmscope.cli; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
