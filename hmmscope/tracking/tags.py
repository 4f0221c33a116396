"""What a run carries besides its metrics: MLflow's standard tags, the params of its kind, safe keys, claims.

Runs that compare side by side. Every new run carries MLflow's standard tags: `mlflow.user`,
`mlflow.source.name` (the entry point, e.g. `hmmscope train` or `hmmscope.sweep worker`),
`mlflow.source.type` LOCAL, `mlflow.source.git.commit` (when the code is a git checkout) and, given a
`note`, `mlflow.note.content` (the run's one-line description, shown as its Description). A run logs
as params only the config sections of its kind (`config_params`: a training run hmm/data/model/train,
a theory run theory). Claims go into a logged table `claims.json` (`Run.log_claims`: MLflow's
`log_table` format, listed in the tag `mlflow.loggedArtifacts`), one row per claim with its value,
CI, rule, verdict and reason (`claims_table`; headline counts and reading back: the `claims` module).
A sweep trial's objective is logged once, under the key its spec names (no second copy under another name, which
`api` and `runs compare` would show twice).

Part of `tracking`, the one package that talks to MLflow; this module itself never calls it (pure
functions, git and the process's argv). Imports `config` (its `flatten`, for config_params); must not import
the other tracking modules or anything else of hmmscope.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..config import flatten

_PKG = Path(__file__).resolve().parents[1]  # the hmmscope package folder
PARAM_MAX = 6000  # MLflow's limit on a param value's length


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The code version: the commit of the git checkout this package runs from, if it runs from one.

    None for an installed copy (even one inside some other repository's folder, e.g. a venv in a project):
    the package folder must sit at the top of the checkout, as it does in hmmscope's own repository.
    """
    pkg = _PKG
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=pkg)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != pkg.parent:
        return None
    return lines[1]


def source_name(argv: list[str] | None = None) -> str:
    """The entry point, for `mlflow.source.name`: `hmmscope <command ...>` for the CLI, `hmmscope.<module>
    <command>` for `python -m hmmscope.<module>` (a module of a subpackage: `hmmscope.<package>.<module>`; a
    package's __main__.py: `hmmscope.<package>`), else the program's file name (e.g. `pytest`)."""
    argv = list(sys.argv if argv is None else argv) or [""]
    prog = Path(argv[0])
    words = []
    for a in argv[1:3]:  # the (sub)command words, not options or paths
        if a.startswith("-") or "/" in a or "." in a:
            break
        words.append(a)
    with contextlib.suppress(OSError, ValueError):  # ValueError: a file outside the package
        if prog.suffix == ".py":
            parts = [p for p in prog.resolve().relative_to(_PKG).with_suffix("").parts if p != "__main__"]
            return " ".join([".".join([_PKG.name, *parts]), *words])
    if prog.name == "hmmscope":
        return " ".join([prog.name, *words])
    return "python" if not prog.name or prog.name.startswith("-") else prog.name


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no login name (some containers)
        return "unknown"


def standard_tags(note: str | None = None) -> dict[str, str]:
    """MLflow's standard run tags (module docstring); the note is cut to its first line."""
    tags = {"mlflow.user": _user(), "mlflow.source.name": source_name(), "mlflow.source.type": "LOCAL"}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    if note:
        tags["mlflow.note.content"] = note_line(note)
    return tags


def note_line(note: str) -> str:
    """One line (newlines folded), at most 500 characters."""
    return " ".join(str(note).split())[:500]


TRAIN_SECTIONS, THEORY_SECTIONS = ("hmm", "data", "model", "train", "eval"), ("theory",)


def config_params(cfg: Any, sections: Iterable[str]) -> dict[str, Any]:
    """The flat config keys of `sections` (e.g. TRAIN_SECTIONS): the params of one run kind."""
    keep = set(sections)
    return {k: v for k, v in flatten(cfg).items() if k.split(".", 1)[0] in keep}


def train_run_name(cfg: Any) -> str:
    """A training run's default name, saying what it is: train-<pos_enc>-L<layers>-g<gamma>-s<seed>,
    e.g. train-rope-L4-g0.8-s0."""
    return f"train-{cfg.model.pos_enc}-L{cfg.model.n_layers}-g{cfg.hmm.gamma:g}-s{cfg.train.seed}"


CLAIM_COLUMNS = ("claim", "value", "ci_lo", "ci_hi", "rule", "verdict", "reason", "statistic")


def claims_table(claims: Iterable[Any]) -> dict[str, list]:
    """stats.Claim objects -> columns (CLAIM_COLUMNS); non-finite numbers become None."""
    def num(v: Any) -> float | None:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return None
        return f if math.isfinite(f) else None

    cols: dict[str, list] = {c: [] for c in CLAIM_COLUMNS}
    for c in claims:
        for col, v in (("claim", c.name), ("value", num(c.value)), ("ci_lo", num(c.ci_lo)), ("ci_hi", num(c.ci_hi)),
                       ("rule", c.rule or ""), ("verdict", c.verdict), ("reason", c.reason),
                       ("statistic", c.statistic)):
            cols[col].append(v)
    return cols


def safe_key(key: str) -> str:
    """MLflow keys allow only alphanumerics and _ - . space : /; anything else becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)[:250]


def _display(v: Any) -> Any:
    """Floats rounded to 6 significant digits for display (0.30000000000000004 -> 0.3), in lists too."""
    if isinstance(v, float) and math.isfinite(v):
        return float(f"{v:.6g}")
    if isinstance(v, (list, tuple)):
        return [_display(x) for x in v]
    return v


def param_value(v: Any) -> str:
    """A param or tag value as MLflow shows it (text): JSON for lists, dicts, booleans and None; floats rounded
    for display (`_display`; metrics keep full precision)."""
    v = _display(v)
    s = json.dumps(v) if isinstance(v, (list, tuple, dict, bool)) or v is None else str(v)
    return s[:PARAM_MAX]


VERDICTS = ("supported", "not supported", "inconclusive", "no power")


def claim_headline(claims: Iterable[Any]) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, tags) that summarize the claims: how many, how many of each verdict; {} for no claims."""
    claims = list(claims)
    if not claims:
        return {}, {}
    counts = {v: sum(c.verdict == v for c in claims) for v in VERDICTS}
    counts.update({c.verdict: sum(x.verdict == c.verdict for x in claims) for c in claims})
    metrics = {"claims/n": float(len(claims)), **{f"claims/{v.replace(' ', '_')}": float(n) for v, n in counts.items()}}
    line = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    return metrics, {"hmmscope.claims": f"{len(claims)} claims: {line}"}
