"""The suite's own setup: pyproject's [tool.pytest.ini_options] leaves no temp folders behind a green run, and CI
(.ci/run) runs exactly the README's test command, which says why a test was skipped (-rs)."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    """The test command of the README's first code block (the lines a newcomer copies)."""
    block = (REPO / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    (line,) = [ln for ln in block.splitlines() if " -m pytest " in ln]
    return line.split("#", 1)[0].strip()


def test_ci_runs_exactly_the_readmes_test_command_and_it_names_skip_reasons():
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines() if " -m pytest " in ln]
    cmd = readme_test_command()
    assert ci == [cmd]
    assert re.search(r"(^| )-rs( |$)", cmd), cmd  # before: -q alone, so a skipped test said no reason


def test_a_green_run_leaves_no_temp_folder_and_a_failed_test_keeps_its_own(pytester):
    """The project's retention settings, in an inline run whose temp root is this test's (PYTEST_DEBUG_TEMPROOT, so
    no other run's folders are touched): a green run leaves nothing; a red one keeps the failed test's tmp_path only.
    Before: pytest's default kept every test's folder of the last 3 runs (264 MB after one run of the suite)."""
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    pytester.makeini("[pytest]\n" + "".join(f"{k} = {ini[k]}\n" for k in ini if k.startswith("tmp_path_retention")))
    root = pytester.path / "temproot"
    root.mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTEST_DEBUG_TEMPROOT": str(root)}

    def run() -> int:  # pytest itself, as the suite runs it (pytester's own runs pass --basetemp, which is kept)
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=pytester.path,
                              env=env, capture_output=True, timeout=120).returncode

    pytester.makepyfile(test_a="def test_ok(tmp_path):\n    (tmp_path / 'f').write_text('x')\n")
    assert run() == 0

    def kept() -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name not in (".lock",)
                      and not p.is_symlink())

    assert [p for p in kept() if re.search(r"pytest-\d+", p)] == [], kept()
    pytester.makepyfile(test_a="def test_ok(tmp_path):\n    pass\n\ndef test_bad(tmp_path):\n    assert False\n")
    assert run() == 1
    folders = [p for p in kept() if re.fullmatch(r"pytest-of-[^/]+/pytest-\d+/test_\w+", p)]
    assert [f.rsplit("/", 1)[1] for f in folders] == ["test_bad0"], kept()
