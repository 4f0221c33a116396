"""A sweep spec under another name: `hmmscope sweep run SPEC --name NEW` runs a copy of SPEC as the study NEW.

The copy is the spec's own text with its `[sweep]` table's `name = ...` line replaced by `name = "NEW"` (a comment on
that line says what it was), parsed again: the study stores that text, so its workers, `sweep status`, the report and
a later `sweep run SPEC --name NEW` (which resumes it) all see NEW, and everything else in the spec is unchanged
(checked: the two parse to the same tables but for the name). A spec whose name is not on a line of its own in its
`[sweep]` table (a dotted key `sweep.name = ...`, an inline table) is refused with one line: edit a copy of it.

Imports only `config` and `sweep.spec`.
"""

from __future__ import annotations

import json
import re

from ..config import ConfigError, check_name, parse_toml
from .spec import SweepSpec, parse_spec

_TABLE = re.compile(r"\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?")  # a table header [name] (not an array of tables [[...]])
_NAME = re.compile(r"""\s*(name|"name"|'name')\s*=.*""")


def renamed(spec: SweepSpec, name: str) -> SweepSpec:
    """`spec` as the sweep `name` (module docstring); ConfigError (one line) for a bad name or a spec whose name line
    cannot be found. The same spec when `name` is already its name."""
    check_name(name, "--name")
    if name == spec.name:
        return spec
    lines, table, hits = spec.text.splitlines(), None, []
    for i, line in enumerate(lines):
        m = _TABLE.fullmatch(line)
        if m:
            table = m.group(1).strip("\"' ")
        elif table == "sweep" and _NAME.fullmatch(line):
            hits.append(i)
    refused = ConfigError(f"--name {name}: {spec.path}: its [sweep] table has no line `name = \"...\"` of its own to "
                          f"replace; copy the spec and set its name there")
    if len(hits) != 1:
        raise refused
    lines[hits[0]] = f"name = {json.dumps(name)}  # hmmscope sweep run --name (a copy of {spec.name!r})"
    text = "\n".join(lines) + "\n"
    before, after = parse_toml(spec.text, spec.path), parse_toml(text, spec.path)
    after.get("sweep", {})["name"] = spec.name
    if after != before:  # the line was not the whole value (a multi-line string, say): nothing else may change
        raise refused
    return parse_spec(text, spec.path, base=spec.base)
