"""Every verdict a kept record holds, re-decided under the current stats.decide and regime word (issue 34.3,
SCIENCE.md 9) from the record's files alone (`verdict_moves.py --redecide`):

- the claims of report.json (any folder depth), of every *claims*.csv / *claims*.json and of the per-run claims.csv
  files (each with its rule and 95% CI; requirements looked up in the same table, in the same setting or run);
- the per-run layerwise tables of report.json (rule from the pooled claim);
- the regime words of report.json's regime table and of task_diversity_regimes.csv (from the re-decided pooled
  claims);
- the per-trial regime claims in trials.csv (eval/retrieval_gap, eval/unseen/icl_gain, eval/unseen/vs_best_counting
  with their _lo / _hi: Figure 1's claims and the run's regime word).

Each is given beside the verdict the record keeps and the verdict under the rules before issue 34.3 (a failed
requirement made any verdict "inconclusive"; the regime word was "counting" only where the model was shown not below
best counting, lower end >= 0, else "undetermined"), so what issue 34 moved (previous -> now) is told apart from what
earlier issues moved (kept -> previous). Every file is read through records_io (RecordError: one line).
"""
from __future__ import annotations

import math
from pathlib import Path

from pooled import REGIME_CLAIMS, dependency_order, regime_rule
from records_io import number, read_csv, read_json

from hmmscope.measure.regimes import regime
from hmmscope.stats import NO_POWER, decide, no_power_reason, parse_rule

FIG1 = {n: (metric, regime_rule(n)) for n, (metric, _, _) in REGIME_CLAIMS.items()}  # claim -> (metric, rule)
PER_RUN = ["claim", "trial", "value", "95% CI", "verdict"]  # the header of report.json's per-run layerwise tables


def previous_decide(rule_: str, lo, hi, verdicts=None, *, df=None, degenerate: str = "") -> str:
    """stats.decide as it was before issue 34.3: a requirement not supported made the verdict "inconclusive",
    whatever the CI (after the no-power check)."""
    op, _, requires = parse_rule(rule_)
    if op == NO_POWER or no_power_reason(lo, hi, df, degenerate):
        return NO_POWER
    if requires and any((verdicts or {}).get(r) != "supported" for r in requires):
        return "inconclusive"
    return decide(rule_, lo, hi, verdicts, df=df, degenerate=degenerate)


def previous_regime(claims) -> str:
    """The regime word before issue 34.3 (commit 61533a3 to eb9d0b7): retrieval, inference beyond counting, then
    "counting" only where the model is shown not below best counting (lower end >= 0), else "undetermined"."""
    by = {c["name"]: c for c in claims}
    if by.get("retrieval_gap", {}).get("verdict") == "supported":
        return "retrieval"
    inf = by.get("inference_beyond_counting")
    if inf is None:
        return "undetermined"
    if inf["verdict"] == "supported":
        return "inference beyond counting"
    lo = number(inf.get("ci_lo"))
    return "counting" if math.isfinite(lo) and lo >= 0 else "undetermined"


def report_tables(d: dict, header: list[str]):
    """The rows of every table block of a report.json whose header is `header`."""
    for sec in d.get("sections", []):
        for b in sec.get("blocks", []):
            if b[0] == "table" and b[1] == header:
                yield from b[2]


def _decide_all(rows: list[dict], scope) -> None:
    """Adds 'now' and 'previous' to each row (name, rule, ci_lo, ci_hi, df, degenerate, verdict), requirements
    resolved within scope(row) (rows of the same setting or run): by exact name, or as '<setting>: <requirement>'."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(scope(r), []).append(r)
    for members in groups.values():
        names = {m["name"] for m in members}

        def key(m, req, names=names):
            if req in names:
                return req
            if req.startswith("pooled: ") and req[len("pooled: "):] in names:  # a pooled table names its rows bare
                return req[len("pooled: "):]
            head = m["name"].rsplit(": ", 1)[0] if ": " in m["name"] else ""
            return f"{head}: {req}" if head and f"{head}: {req}" in names else req

        order = dependency_order([m for m in members if m.get("rule")],
                                 lambda m: [key(m, q) for q in parse_rule(m["rule"])[2]], lambda m: m["name"], names)
        for mode, fn in (("now", decide), ("previous", previous_decide)):
            known: dict[str, str] = {}
            for m in order:
                got = {q0: known.get(key(m, q0), "") for q0 in parse_rule(m["rule"])[2]}
                m[mode] = fn(m["rule"], number(m.get("ci_lo")), number(m.get("ci_hi")), got, df=number(m.get("df")),
                             degenerate=m.get("degenerate") or "")
                known[m["name"]] = m[mode]


def _ci(s: str) -> tuple[float, float]:
    a, _, b = str(s).strip("[] ").partition(",")
    return number(a), number(b)


def _report_claims(rec: Path) -> list[dict]:
    """Every claim of every report.json under rec, with its per-run layerwise rows; each row names its source."""
    out = []
    for f in sorted(rec.rglob("report.json")):
        d = read_json(f)
        src = str(f.relative_to(rec))
        rows = [{"src": src, "name": c["name"], "rule": c.get("rule") or "", "ci_lo": c.get("ci_lo"),
                 "ci_hi": c.get("ci_hi"), "df": c.get("df"), "degenerate": c.get("degenerate") or "",
                 "verdict": c.get("verdict")} for c in d.get("claims", []) if c.get("rule")]
        _decide_all(rows, lambda r: 0)
        out += rows
        pooled = {c["name"][len("pooled: "):]: c["rule"] for c in rows if c["name"].startswith("pooled: ")}
        per_run = []
        for name, trial, _, ci, verdict in report_tables(d, PER_RUN):
            if name not in pooled:
                continue
            lo, hi = _ci(ci)
            per_run.append({"src": f"{src} (trial {trial})", "name": name, "rule": pooled[name].replace("pooled: ", ""),
                            "ci_lo": lo, "ci_hi": hi, "verdict": verdict, "trial": trial})
        _decide_all(per_run, lambda r: r["trial"])
        out += per_run
    return out


def _table_claims(rec: Path) -> list[dict]:
    """The claims of every *claims*.csv and *claims*.json under rec (a per-run claims.csv is one run's table)."""
    out = []
    files = sorted({*rec.rglob("*claims*.csv"), *rec.rglob("*claims*.json")})
    for f in files:
        if f.suffix == ".json":
            d = read_json(f)
            items = d if isinstance(d, list) else d.get("claims", []) if isinstance(d, dict) else []
        else:
            items = read_csv(f, allow_empty=True, numbers=("ci_lo", "ci_hi", "df")).rows
        src = str(f.relative_to(rec))
        rows = []
        for c in items:
            if not isinstance(c, dict) or not c.get("rule") or "ci_lo" not in c:
                continue
            cell = c.get("n_tasks", c.get("setting", ""))
            name = c.get("name") or c.get("claim")
            rows.append({"src": src + (f" (n_tasks {cell})" if cell != "" else ""), "name": name, "rule": c["rule"],
                         "ci_lo": c.get("ci_lo"), "ci_hi": c.get("ci_hi"), "df": c.get("df"),
                         "degenerate": c.get("degenerate") or "", "verdict": c.get("verdict"), "cell": cell})
        _decide_all(rows, lambda r: r["cell"])
        out += rows
    return out


def _redecided(cis: list[tuple[str, float, float]], df: float) -> list[dict]:
    """Figure 1's regime claims from their CIs ((name, lo, hi) in FIG1's order), each decided now and under the
    previous rules, with the verdicts it requires."""
    mine, known_now, known_prev = [], {}, {}
    for n, lo, hi in cis:
        rl = FIG1[n][1]
        now, prev = decide(rl, lo, hi, known_now, df=df), previous_decide(rl, lo, hi, known_prev, df=df)
        known_now[n], known_prev[n] = now, prev
        mine.append({"name": n, "ci_lo": lo, "ci_hi": hi, "now": now, "previous": prev})
    return mine


def _word(src: str, name: str, kept: str, mine: list[dict]) -> dict:
    """A regime word's row: the word kept, and the words the re-decided claims give now and under the previous rules."""
    return {"src": src, "name": name, "verdict": kept, "now": regime([{**m, "verdict": m["now"]} for m in mine]),
            "previous": previous_regime([{**m, "verdict": m["previous"]} for m in mine]), "ci": _inf_ci(mine)}


def _regime_words(rec: Path, claims: list[dict]) -> list[dict]:
    """Regime words a record keeps, recomputed from the re-decided pooled claims: report.json's regime table
    (claims '<setting>: <claim>') and task_diversity_regimes.csv (its own columns)."""
    out = []
    for f in sorted(rec.rglob("report.json")):
        src = str(f.relative_to(rec))
        by = {c["name"]: c for c in claims if c["src"] == src}
        for setting, _, word in report_tables(read_json(f), ["setting", "runs", "regime"]):
            mine = [{**by[f"{setting}: {n}"], "name": n} for n in FIG1 if f"{setting}: {n}" in by]
            out.append(_word(f"{src} (regime)", setting, word, mine))
    for f in sorted(rec.rglob("task_diversity_regimes.csv")):
        for r in read_csv(f, required=("cell", "regime"), allow_empty=True).rows:  # checked (records_io)
            cis = [(n, number(r.get(f"{n}_lo")), number(r.get(f"{n}_hi"))) for n in FIG1 if r.get(n, "") != ""]
            out.append(_word(str(f.relative_to(rec)), f"n_tasks={r['cell']}", r["regime"],
                             _redecided(cis, number(r.get("seeds")) - 1)))
    return out


def _inf_ci(mine: list[dict]) -> str:
    inf = next((m for m in mine if m["name"] == "inference_beyond_counting"), None)
    return f"[{number(inf['ci_lo']):.4g}, {number(inf['ci_hi']):.4g}]" if inf else ""


def _trial_regimes(rec: Path) -> list[dict]:
    """Per trial of trials.csv: Figure 1's regime claims (each run's own paired CI) re-decided, and the run's regime
    word; the record keeps no per-run verdict text here ('kept' is empty)."""
    out = []
    for f in sorted(rec.rglob("trials.csv")):
        for r in read_csv(f, allow_empty=True, unique=[("run_id",), ("trial",)]).rows:
            if f"{FIG1['inference_beyond_counting'][0]}_lo" not in r or r.get("eval/unseen/vs_best_counting") in ("",
                                                                                                          None):
                continue
            src = f"{f.relative_to(rec)} (trial {r.get('trial')})"
            cis = [(n, number(r.get(f"{m}_lo")), number(r.get(f"{m}_hi"))) for n, (m, _) in FIG1.items()]
            mine = _redecided([c for c in cis if math.isfinite(c[1]) and math.isfinite(c[2])], math.inf)
            out += [{"src": src, "name": m["name"], "verdict": "", "now": m["now"], "previous": m["previous"],
                     "ci": f"[{m['ci_lo']:.4g}, {m['ci_hi']:.4g}]"} for m in mine
                    if m["name"] == "inference_beyond_counting"]
            out.append(_word(src, "regime word", "", mine))
    return out


def redecide(rec: Path) -> list[dict]:
    """Every verdict and regime word the record keeps (module docstring): dicts with src, name, ci, verdict (kept,
    '' where the record keeps none), previous (the rules before issue 34.3) and now (the current rules)."""
    claims = _report_claims(rec) + _table_claims(rec)
    for c in claims:
        c.setdefault("ci", f"[{number(c.get('ci_lo')):.4g}, {number(c.get('ci_hi')):.4g}]")
    return claims + _regime_words(rec, claims) + _trial_regimes(rec)


def redecide_report(rec: Path) -> str:
    """Markdown: the rows where the kept, previous or current verdict differ, and the counts."""
    rows = redecide(rec)
    moved = [r for r in rows if r["now"] != r["previous"]]
    earlier = [r for r in rows if r["verdict"] and r["verdict"] != r["previous"] and r["now"] == r["previous"]]
    lines = [f"## {rec.name}: verdicts under the current rules (issue 34.3)", "",
             f"{len(rows)} verdicts and regime words re-decided from the record's files; {len(moved)} moved by issue "
             f"34.3 (previous rules -> now); {len(earlier)} differ from the kept text for earlier reasons only.", ""]
    if moved or earlier:
        lines += ["| source | claim | 95% CI | kept | previous rules | now | moved by 34.3 |", "|---|---|---|---|---|---|---|"]
        for r in moved + earlier:
            lines.append(f"| {r['src']} | {r['name']} | {r['ci']} | {r['verdict'] or '-'} | {r['previous']} | "
                         f"{r['now']} | {'**moved**' if r in moved else ''} |")
        lines.append("")
    return "\n".join(lines)
