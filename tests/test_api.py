"""The top-level API: every documented name resolves, and importing the package stays light."""

import subprocess
import sys

import hmmscope


def test_public_names_resolve_to_their_objects():
    from hmmscope.data import episodes, hmm
    from hmmscope.oracles import inference, observability

    assert hmmscope.HMM is hmm.HMM and hmmscope.predictive is inference.predictive
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


def test_no_import_cycles():
    """No cycle among hmmscope's modules, counting every relative import (module level and inside functions;
    not those under `if TYPE_CHECKING:`);
    a package's `__init__` counts as the package."""
    import ast
    from pathlib import Path

    root = Path(hmmscope.__file__).parent
    mods = {}
    for p in root.rglob("*.py"):
        parts = p.relative_to(root.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        tree = ast.parse(p.read_text())
        typing_only = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and ast.unparse(b.test).endswith(
            "TYPE_CHECKING") for s in b.body for n in ast.walk(s)}  # annotations only, never imported at run time
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and id(node) not in typing_only:
                base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
                base += f".{node.module}" if node.module else ""
                graph[m] |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names} & set(mods)
    state, cycles = {}, []

    def visit(u, path):
        state[u] = "open"
        for v in sorted(graph[u] - {u}):
            if state.get(v) == "open":
                cycles.append([*path[path.index(v):], v])
            elif v not in state:
                visit(v, [*path, v])
        state[u] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert {"hmmscope.cli.app", "hmmscope.ui.servers", "hmmscope.cli.common"} <= set(mods)
    assert "hmmscope.cli.common" in graph["hmmscope.cli.jobs"] and "hmmscope.checks" in graph["hmmscope.cli.jobs"]
    assert cycles == []


def test_every_module_is_one_readable_room():
    """Issue 23: no module of the package over 600 lines, and each opens with a docstring saying what it owns."""
    import ast
    from pathlib import Path

    root = Path(hmmscope.__file__).parent
    mods = sorted(root.rglob("*.py"))
    assert len(mods) > 40  # the package, not an empty folder
    long = {str(p.relative_to(root)): n for p in mods if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}
    bare = [str(p.relative_to(root)) for p in mods if not ast.get_docstring(ast.parse(p.read_text()))]
    assert bare == []
