"""The package's layout: no import cycle between modules or between top-level units, a small package root.

The import graph is read from the source with `ast` (nothing is imported): every `import` and `from ... import`
anywhere in a module counts, at module level, inside functions and under `if TYPE_CHECKING:`. An arrow goes from a
module to each hmmscope module it names: `from hmmscope.a import b` points at `hmmscope.a.b` when that is a module,
else at `hmmscope.a` (its `__init__`). The implicit import of a parent package is not an arrow (every submodule would
make one with a package that re-exports it). A top-level unit is `hmmscope.X`: a subpackage with everything under it,
or one module at the root; the package's own `__init__` is left out of the units (it only names the public API).

Every module of the package and of analysis/ stays under 600 lines; the package's open with a docstring. No shims
(in hmmscope/, analysis/ and tests/): a name is imported from the module that defines it (a package's `__init__` may
gather its modules' names: that is its interface), a name with a leading underscore is never imported from another
module, and no `noqa: E402` / `noqa: F401` stands outside an `__init__.py`.

Run as a script for the numbers: `python tests/test_layout.py` prints modules, arrows, cycles and root modules.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "hmmscope"
ROOT_MODULES_MAX = 10
MODULE_LINES_MAX = 450  # a module of the package (issue 49)
SCRIPT_LINES_MAX = 250  # a script or module of analysis/ (issue 49: each record script its own choices)
FUNCTION_LINES_MAX = 100  # a function of the package (issue 49: longer ones delegate to named steps)
# Stated exceptions, each with its reason (issue 49 left them; the closing note says so):
LONG_FUNCTIONS_KEPT = {  # a numba kernel is one compiled loop nest; split into @njit helpers only with `hmmscope bench
    "hmmscope/oracles/bayes_kernel.py:bayes_block": 240,  # bayes` showing no slowdown (not yet measured: a busy machine)
}
GPU_SCRIPTS = REPO / "analysis" / "gpu"  # the GPU session's orchestrator (issue 50): the old 600-line cap until it is
GPU_SCRIPT_LINES_MAX = 600  # cut, which needs a rehearsal on a GPU machine (none was lent)
LAZY = "# lazy:"  # the comment a function-level import of the package carries, saying what it defers


@functools.cache
def _source(path: Path) -> tuple[str, ast.Module]:
    """A file's text and syntax tree, read and parsed once per test process."""
    text = path.read_text()
    return text, ast.parse(text, filename=str(path))


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, from its `__init__.py`)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement names (`from X import a, b`: X.a and X.b, each may be a module or not)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [source] + [f"{source}.{a.name}" for a in node.names]


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports (see the module docstring)."""
    modules = module_names(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = _source(path)[1]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            named = _imported(node, name, path.name == "__init__.py")
            source, members = (named[0], named[1:]) if isinstance(node, ast.ImportFrom) else (None, named)
            targets = {m for m in members if m in modules}
            if source is not None and source in modules and len(targets) < len(members):
                targets.add(source)  # a name defined in `source` (not a submodule of it)
            if source is None:  # `import a.b.c`: the deepest module named
                targets = {next((p for p in _prefixes(m) if p in modules), None) for m in members} - {None}
            graph[name] |= targets - {name}
    return graph


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


@functools.lru_cache(maxsize=1)
def _package_graph() -> dict[str, set[str]]:
    return import_graph()


def unit_of(module: str) -> str | None:
    """`hmmscope.sweep.worker` -> `hmmscope.sweep`; `hmmscope.config` -> itself; the package's `__init__`: None."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for a, targets in graph.items():
        ua = unit_of(a)
        if ua is None:
            continue
        units.setdefault(ua, set())
        for b in targets:
            ub = unit_of(b)
            if ub is not None and ub != ua:
                units[ua].add(ub)
    return units


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted; sorted by their first node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def root_modules(package: Path = PACKAGE) -> list[str]:
    """The modules directly in the package folder, its `__init__` and `__main__` aside."""
    return sorted(p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__"))


def _path(cycle: list[str], graph: dict[str, set[str]]) -> str:
    """One closed walk through a cycle's nodes, for the failure message: a -> b -> ... -> a."""
    members = set(cycle)
    start = cycle[0]
    walk, seen = [start], {start}
    while True:
        nxt = sorted(graph[walk[-1]] & members)
        back = [n for n in nxt if n == start]
        if back and len(walk) > 1:
            return " -> ".join(walk + [start])
        fresh = [n for n in nxt if n not in seen]
        if not fresh:
            return " -> ".join(walk + [nxt[0]]) if nxt else " , ".join(cycle)
        walk.append(fresh[0])
        seen.add(fresh[0])


def test_the_graph_reads_every_kind_of_import(tmp_path):
    """The reader sees module-level, function-level, TYPE_CHECKING and relative imports, and finds their cycle."""
    pkg = tmp_path / "hmmscope"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import B\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hmmscope.sub.b import B\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    from ..c import C\n")
    (pkg / "c.py").write_text("import hmmscope.sub\nC = 1\n")
    graph = import_graph(pkg)
    assert graph == {"hmmscope": set(), "hmmscope.a": {"hmmscope.sub.b"}, "hmmscope.sub": {"hmmscope.sub.b"},
                     "hmmscope.sub.b": {"hmmscope.a", "hmmscope.c"}, "hmmscope.c": {"hmmscope.sub"}}
    assert cycles(graph) == [["hmmscope.a", "hmmscope.c", "hmmscope.sub", "hmmscope.sub.b"]]
    assert cycles(unit_graph(graph)) == [["hmmscope.a", "hmmscope.c", "hmmscope.sub"]]
    assert root_modules(pkg) == ["a", "c"]


def test_no_import_cycle_between_modules():
    graph = _package_graph()
    found = cycles(graph)
    assert not found, "import cycles between modules:\n" + "\n".join(f"{_path(c, graph)} (all: {c})" for c in found)


def test_no_import_cycle_between_top_level_units():
    graph = unit_graph(_package_graph())
    found = cycles(graph)
    assert not found, "import cycles between top-level units:\n" + "\n".join(f"{_path(c, graph)} (all: {c})" for c in found)


def test_the_package_root_holds_at_most_ten_modules():
    root = root_modules()
    assert len(root) <= ROOT_MODULES_MAX, f"{len(root)} modules at the package root (at most {ROOT_MODULES_MAX}): {root}"


def test_every_module_is_one_readable_room():
    """No module of the package over 450 lines, no script of analysis/ over 250 (analysis/gpu/: 600, above), and
    each of the package's modules opens with a docstring saying what it owns (issue 49: modules cut by idea, not
    trimmed to a cap)."""
    mods = sorted(PACKAGE.rglob("*.py"))
    assert len(mods) > 40  # the package, not an empty folder
    scripts = sorted((REPO / "analysis").rglob("*.py"))
    gpu = [p for p in scripts if GPU_SCRIPTS in p.parents]
    scripts = [p for p in scripts if p not in gpu]
    long = {str(p.relative_to(REPO)): n for cap, paths in ((MODULE_LINES_MAX, mods), (SCRIPT_LINES_MAX, scripts),
                                                          (GPU_SCRIPT_LINES_MAX, gpu))
            for p in paths if (n := len(_source(p)[0].splitlines())) > cap}
    assert long == {}
    bare = [str(p.relative_to(REPO)) for p in mods if not ast.get_docstring(_source(p)[1])]
    assert bare == []


def long_functions(package: Path = PACKAGE) -> dict[str, int]:
    """Every function (or method) of the package over FUNCTION_LINES_MAX lines, as 'path:name': its lines."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(_source(path)[1]):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := node.end_lineno - node.lineno + 1) > FUNCTION_LINES_MAX:
                    out[f"{path.relative_to(package.parent)}:{node.name}"] = n
    return out


def unexplained_lazy_imports(package: Path = PACKAGE) -> list[str]:
    """Every import inside a function of the package without a `# lazy: <what it defers>` comment on its first line or
    the line above it (issue 49: a function-level import hides a dependency from the reader; it stays only where it
    buys start-up time or load order, and says so). `if TYPE_CHECKING:` imports are at module level: not counted."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text, tree = _source(path)
        lines = text.splitlines()
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    here, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
                    if LAZY not in here and not above.strip().startswith(LAZY):
                        found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {here.strip()}")
    return sorted(set(found))


def test_the_function_and_lazy_import_checks_find_each_kind(tmp_path):
    """A long function, an import inside a function with no reason, one with its reason on the line or above it."""
    pkg = tmp_path / "hmmscope"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES_MAX))
    (pkg / "a.py").write_text(f'"""A."""\n\n\ndef long():\n{body}\n\n\ndef short():\n    return 1\n')
    (pkg / "b.py").write_text('"""B."""\n\n\ndef f():\n    import json\n    import torch  # lazy: torch off the '
                              'start-up\n    # lazy: numpy, measured\n    import numpy\n    return json, torch, numpy\n')
    assert long_functions(pkg) == {"hmmscope/a.py:long": FUNCTION_LINES_MAX + 1}
    assert unexplained_lazy_imports(pkg) == ["hmmscope/b.py:5: import json"]


def test_no_function_is_over_a_hundred_lines():
    long = long_functions()
    kept = {k: n for k, n in long.items() if n <= LONG_FUNCTIONS_KEPT.get(k, 0)}
    assert {k: n for k, n in long.items() if k not in kept} == {}


def test_every_function_level_import_says_why():
    found = unexplained_lazy_imports()
    assert not found, f"imports inside functions without a '{LAZY}' reason ({len(found)}):\n" + "\n".join(found[:40])


def defined_names(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments; also under if / try)."""
    names: set[str] = set()
    for node in _source(path)[1].body:
        for n in [node] if not isinstance(node, ast.If | ast.Try) else ast.walk(node):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(n.name)
            elif isinstance(n, ast.Assign | ast.AnnAssign):
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    names |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
    return names


def imports_of_the_package(root: Path = REPO, package: Path = PACKAGE):
    """(file, line, source module, name) for every `from <hmmscope module> import name` in hmmscope/, analysis/ and
    tests/ under `root` (relative imports inside the package resolved), at any depth of the file."""
    modules = module_names(package)
    for folder in ("hmmscope", "analysis", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            in_package = folder == "hmmscope"
            me = ".".join(path.relative_to(root).with_suffix("").parts)
            me = me[: -len(".__init__")] if path.name == "__init__.py" else me
            for node in ast.walk(_source(path)[1]):
                if not isinstance(node, ast.ImportFrom) or (node.level and not in_package):
                    continue
                source = _imported(node, me, path.name == "__init__.py")[0] if node.level else node.module or ""
                if source in modules:
                    for a in node.names:
                        if f"{source}.{a.name}" not in modules:
                            yield path.relative_to(root), node.lineno, source, a.name


def shims(root: Path = REPO, package: Path = PACKAGE) -> list[str]:
    """Every import of a private name from another module, of a name from a plain module that does not define it,
    and every noqa: E402 / F401 outside an __init__.py (module docstring)."""
    modules = module_names(package)
    defined = {m: defined_names(p) for m, p in modules.items()}
    found = []
    for where, line, source, name in imports_of_the_package(root, package):
        if name.startswith("_") and not name.startswith("__"):
            found.append(f"{where}:{line}: imports the private {source}.{name}")
        elif modules[source].name != "__init__.py" and name not in defined[source]:
            found.append(f"{where}:{line}: imports {name} from {source}, which only imports it")
    for folder in ("hmmscope", "analysis", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            text = _source(path)[0]
            if "noqa" not in text:
                continue
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):  # comments, not strings with the words
                if tok.type == tokenize.COMMENT and re.search(r"noqa:[^#]*\b(E402|F401)\b", tok.string):
                    found.append(f"{path.relative_to(root)}:{tok.start[0]}: {tok.string}")
    return found


def test_the_shim_check_finds_each_kind(tmp_path):
    """A private name imported across modules, a re-export, and a noqa for one: each is found; a package interface
    (an __init__ gathering its modules' names) and a name the module defines are not."""
    pkg = tmp_path / "hmmscope"
    (pkg / "sub").mkdir(parents=True)
    for folder in ("analysis", "tests"):
        (tmp_path / folder).mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import B\n")
    (pkg / "sub" / "b.py").write_text("B = 1\n_hidden = 2\n")
    (pkg / "a.py").write_text("from .sub.b import B, _hidden  # noqa: F401\n")
    (tmp_path / "tests" / "test_x.py").write_text("from hmmscope.a import B\nfrom hmmscope.sub import B as C\n")
    assert shims(tmp_path, pkg) == ["hmmscope/a.py:1: imports the private hmmscope.sub.b._hidden",
                                    "tests/test_x.py:1: imports B from hmmscope.a, which only imports it",
                                    "hmmscope/a.py:1: # noqa: F401"]


def test_no_shims():
    found = shims()
    assert not found, "imports that are not from the defining module, or shims:\n" + "\n".join(found)


if __name__ == "__main__":
    g = import_graph()
    u = unit_graph(g)
    print(f"modules {len(g)}, arrows {sum(map(len, g.values()))}, module cycles {len(cycles(g))}, "
          f"units {len(u)}, unit arrows {sum(map(len, u.values()))}, unit cycles {len(cycles(u))}, "
          f"root modules {len(root_modules())}")
    for c in cycles(g):
        print("module cycle:", _path(c, g))
    for c in cycles(u):
        print("unit cycle:", _path(c, u))
