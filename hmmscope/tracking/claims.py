"""A run's claims: written as ONE logged table (`claims.json`, `Run.log_claims`) plus a handful of headline
numbers (`claim_headline`), and read back (`read_claims`) as the flat keys the report and sweep objectives use.

A run carries (one table, not metrics and tags per claim: those would make hundreds of columns in the MLflow UI,
with names mangled by MLflow's key rules):
- the table `claims.json` (columns `tags.CLAIM_COLUMNS`: claim, value, ci_lo, ci_hi, rule, verdict, reason,
  statistic), shown by the MLflow UI's artifact view and its evaluation table;
- the metrics `claims/n` and `claims/<verdict>` (supported, not_supported, inconclusive, no_power counts);
- the tag `hmmscope.claims`, one line: "12 claims: 9 supported, 3 inconclusive".
`claim_rows` gives the table back as written (a row per claim); `read_claims` gives back
{`claim/<safe name>/value|ci_lo|ci_hi`: float}, {safe name: verdict}, {safe name: rule}
from the table, or, for runs recorded before claims.json existed, from the three metrics
(`claim/<name>/value|ci_lo|ci_hi`) and two tags (`verdict/<name>`, `rule/<name>`) per claim they carry instead
(the same keys either way).

Part of `tracking`, the one package that talks to MLflow. Imports tags (at import) and runs (inside
`read_claims`; runs never imports this module: `claim_headline` lives in tags); never anything of
hmmscope outside tracking; mlflow only through them.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .artifacts import ArtifactNotFound
from .runs import Run
from .tags import safe_key

CLAIMS_FILE = "claims.json"


def claim_keys(claims: Iterable[Any]) -> dict[str, float]:
    """The flat numbers of the claims (`claim/<safe name>/value|ci_lo|ci_hi`), for sweep objectives in memory;
    not logged as metrics (the table carries them)."""
    out: dict[str, float] = {}
    for c in claims:
        for k in ("value", "ci_lo", "ci_hi"):
            v = getattr(c, k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f"claim/{safe_key(c.name)}/{k}"] = float(v)
    return out


def _table(uri: str, run) -> dict | None:
    """The run's claims.json table ({"columns": [...], "data": [[...], ...]}), or None if it has none."""
    if CLAIMS_FILE not in run.data.tags.get("mlflow.loggedArtifacts", ""):
        return None
    try:
        path = Run(uri, run.info.run_id).require(CLAIMS_FILE)
        if "://" in path:
            with tempfile.TemporaryDirectory() as tmp:
                text = Path(Run(uri, run.info.run_id).download(CLAIMS_FILE, tmp)).read_text()
        else:
            with open(path) as f:
                text = f.read()
        return json.loads(text)
    except (ArtifactNotFound, OSError, ValueError):
        return None


def claim_rows(uri: str, run) -> list[dict[str, Any]]:
    """A run's claims as its claims.json holds them, one dict per claim with the columns `tags.CLAIM_COLUMNS`
    (claim: the name as written; value, ci_lo, ci_hi, rule, verdict, reason, statistic); [] if it has no table."""
    table = _table(uri, run)
    return [dict(zip(table["columns"], row, strict=True)) for row in table["data"]] if table is not None else []


def read_claims(uri: str, run) -> tuple[dict[str, float], dict[str, str], dict[str, str]]:
    """A run's claims (`run`: an MLflow run as searches return it): (numbers by `claim/<name>/<col>`, verdicts
    by name, rules by name); from its claims.json table, else from the metrics and tags of older runs."""
    if CLAIMS_FILE in run.data.tags.get("mlflow.loggedArtifacts", ""):
        table = _table(uri, run)
        if table is not None:
            cols = table["columns"]
            nums: dict[str, float] = {}
            verdicts: dict[str, str] = {}
            rules: dict[str, str] = {}
            for row in table["data"]:
                r = dict(zip(cols, row, strict=True))
                name = safe_key(str(r["claim"]))
                nums.update({f"claim/{name}/{k}": float(r[k]) for k in ("value", "ci_lo", "ci_hi")
                             if r.get(k) is not None})
                verdicts[name] = str(r["verdict"])
                if r.get("rule"):
                    rules[name] = str(r["rule"])
            return nums, verdicts, rules
    nums = {k: v for k, v in run.data.metrics.items() if k.startswith("claim/")}
    verdicts = {k[len("verdict/"):]: v.split(":", 1)[0].strip() for k, v in run.data.tags.items()
                if k.startswith("verdict/")}
    rules = {k[len("rule/"):]: v for k, v in run.data.tags.items() if k.startswith("rule/")}
    return nums, verdicts, rules
