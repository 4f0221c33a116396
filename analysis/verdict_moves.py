"""Which verdicts of a kept training record the current report rules would move, without re-running it.

    python analysis/verdict_moves.py analysis/results/rope-vs-absolute-cpu [analysis/results/depth-vs-rank-cpu ...]

A record keeps trials.csv (one row per COMPLETE trial: the params that vary, every metric, the analysis
claims as claim/<name>/value|ci_lo|ci_hi; a column that is no config key, such as an older store's counting.*
params, is what a run fitted and is never read as a param: SCIENCE.md 9) and report.json (the claims with their
verdicts and rules, and the per-run table of each layerwise claim). This script rebuilds the report's training
frame from trials.csv (each claim's per-run rule from the record's pooled rule; per-run verdicts recomputed with stats.decide in
dependency order), runs the report's sections (positional encoding, layerwise claims, depth vs rank) with
the current code, and prints, per claim, the record's verdict and CI beside the new ones, marking the
verdicts that move; then the per-run verdicts that move (the report's per-run tables against
stats.decide on the same row). The store is not needed. The theory sections are not covered (they need the
per-draw metric histories): re-run a theory record instead.

    python analysis/verdict_moves.py --redecide analysis/results/NAME [...]

re-decides every verdict a record keeps under the current stats.decide and regime word (issue 34.3, SCIENCE.md 9),
from the record's files alone: the claims of report.json (any folder depth), of every *claims*.csv / *claims*.json
and of the per-run claims.csv files (each with its rule and 95% CI; requirements looked up in the same table, in
the same setting or run), the per-run layerwise tables of report.json (rule from the pooled claim), the regime
words of report.json's regime table and of task_diversity_regimes.csv (from the re-decided pooled claims), and the
per-trial regime claims in trials.csv (eval/retrieval_gap, eval/unseen/icl_gain, eval/unseen/vs_best_counting with
their _lo / _hi: Figure 1's claims and the run's regime word). Each is printed beside the verdict the record keeps
and the verdict under the rules before issue 34.3 (a failed requirement made any verdict "inconclusive"; the regime
word was "counting" only where the model was shown not below best counting, lower end >= 0, else "undetermined"), so
what issue 34 moved (previous -> now) is told apart from what earlier issues moved (kept -> previous).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from records_io import RecordError, check_numbers, read_csv, read_json


def _frame(rec: Path, old: dict):
    import pandas as pd

    from hmmscope.report.read import input_keys
    from hmmscope.stats import parse_rule, rule

    t = read_csv(rec / "trials.csv", required=("trial", "kind"), numbers=("trial",), unique=[("run_id",), ("trial",)])
    check_numbers(t, [c for c in t.columns if "/" in c])  # every metric and claim column: a number or nothing
    rows = t.rows
    rules = {}
    for c in old["claims"]:
        if c["name"].startswith("pooled: ") and c.get("rule"):
            op, t, req = parse_rule(c["rule"])
            rules[c["name"][len("pooled: "):]] = c["rule"] if op == "no power" else rule(
                op, t, [r[len("pooled: "):] if r.startswith("pooled: ") else r for r in req])
    out, inputs = [], input_keys()
    for r in rows:
        if r.get("kind") != "train":
            continue
        row = {"trial": int(r["trial"])}
        for k, v in r.items():
            if k in ("trial", "run_id", "run_name", "kind") or k.startswith("objective"):
                continue
            if "/" in k:
                row[f"metric:{k}"] = float(v) if v not in ("", None) else math.nan
            elif k not in inputs:  # what a run fitted (an older store's counting.* params): never a param
                continue
            else:
                try:
                    x = float(v)
                    row[f"param:{k}"] = int(x) if x.is_integer() else x
                except ValueError:
                    row[f"param:{k}"] = v
        out.append(row)
    df = pd.DataFrame(out)
    for name, r in rules.items():
        df[f"rule:{name}"] = r
    return df, rules


def _run_verdicts(df, rules: dict) -> dict:
    """{(claim, trial): verdict} by stats.decide on each run's own row, requirements decided first."""
    from hmmscope.stats import decide, parse_rule

    out = {}
    for _, row in df.iterrows():
        known: dict[str, str] = {}
        todo = [n for n in rules if f"metric:claim/{n}/value" in row and row[f"metric:claim/{n}/value"] == row[
            f"metric:claim/{n}/value"]]
        for _ in range(len(todo) + 1):
            for n in list(todo):
                req = parse_rule(rules[n])[2]
                if all(q in known or q not in todo for q in req):
                    known[n] = decide(rules[n], row[f"metric:claim/{n}/ci_lo"], row[f"metric:claim/{n}/ci_hi"], known)
                    todo.remove(n)
        for n, v in known.items():
            out[(n, int(row["trial"]))] = v
    return out


def _old_run_verdicts(old: dict) -> dict:
    out = {}
    for sec in old["sections"]:
        for b in sec["blocks"]:
            if b[0] == "table" and b[1] == ["claim", "trial", "value", "95% CI", "verdict"]:
                out.update({(r[0], int(r[1])): r[4] for r in b[2]})
    return out


def main(argv=None) -> int:
    import warnings

    warnings.simplefilter("ignore")
    args = list(argv if argv is not None else sys.argv[1:])
    again = "--redecide" in args
    recs = [Path(a) for a in args if a != "--redecide"]
    if not recs:
        print("error: give one or more record folders (analysis/results/NAME)", file=sys.stderr)
        return 2
    missing = [str(r) for r in recs if not r.is_dir()]
    if missing:
        print(f"error: no record folder {missing[0]}", file=sys.stderr)
        return 2
    try:  # every file read is checked (records_io): a bad one is one line naming it and the row, exit 2
        return _main(recs, again)
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(recs: list[Path], again: bool) -> int:
    from hmmscope.report.layerwise import depth_rank_section, layerwise_section
    from hmmscope.report.posenc import posenc_section

    if again:
        for rec in recs:
            print(redecide_report(rec))
        return 0
    for rec in recs:
        old = read_json(rec / "report.json")
        df, rules = _frame(rec, old)
        runs = _run_verdicts(df, rules)
        for (n, t), v in runs.items():
            df.loc[df["trial"] == t, f"verdict:{n}"] = v
        new = {}
        for fn in (posenc_section, layerwise_section, depth_rank_section):
            for c in fn(df)[1]:
                new[c.name] = c
        print(f"## {rec.name}\n")
        print("| claim | record: verdict [95% CI] | now: verdict [95% CI] (df) | moved |")
        print("|---|---|---|---|")
        moved = 0
        for c in old["claims"]:
            if c["name"].startswith("theory: "):
                continue
            n = new.get(c["name"])
            lo, hi = (c["ci_lo"] if c["ci_lo"] is not None else math.nan), (c["ci_hi"] if c["ci_hi"] is not None
                                                                            else math.nan)
            was = f"{c['verdict']} [{lo:.4g}, {hi:.4g}]"
            now = f"{n.verdict} [{n.ci_lo:.4g}, {n.ci_hi:.4g}] ({n.df:g})" if n else "(not produced)"
            mv = n is None or n.verdict != c["verdict"]
            moved += mv
            print(f"| {c['name']} | {was} | {now} | {'**moved**' if mv else ''} |")
        print(f"\n{moved} of {sum(not c['name'].startswith('theory: ') for c in old['claims'])} verdicts move.\n")
        olds = _old_run_verdicts(old)
        changes = {}
        for k, v in runs.items():
            if k in olds and olds[k] != v:
                changes.setdefault((k[0], olds[k], v), []).append(k[1])
        if changes:
            print("Per-run verdicts that move (stats.decide on the run's own row):\n")
            for (n, a, b), ts in sorted(changes.items()):
                print(f"- {n}: {a} -> {b} in trials {', '.join(map(str, sorted(ts)))}")
            print()
    return 0


# ---------------------------------------------------------------- --redecide (issue 34.3)

FIG1 = {"retrieval_gap": ("eval/retrieval_gap", "> 0"), "icl_gain": ("eval/unseen/icl_gain", "> 0"),
        "inference_beyond_counting": ("eval/unseen/vs_best_counting", "< 0; requires icl_gain")}


def previous_decide(rule_: str, lo, hi, verdicts=None, *, df=None, degenerate: str = "") -> str:
    """stats.decide as it was before issue 34.3: a requirement not supported made the verdict "inconclusive",
    whatever the CI (after the no-power check)."""
    from hmmscope.stats import NO_POWER, decide, no_power_reason, parse_rule

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
    lo = _f(inf.get("ci_lo"))
    return "counting" if math.isfinite(lo) and lo >= 0 else "undetermined"


def _f(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _decide_all(rows: list[dict], scope) -> None:
    """Adds 'now' and 'previous' to each row (name, rule, ci_lo, ci_hi, df, degenerate, verdict), requirements
    resolved within scope(row) (rows of the same setting or run): by exact name, or as '<setting>: <requirement>'."""
    from hmmscope.stats import decide, parse_rule

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

        for mode, fn in (("now", decide), ("previous", previous_decide)):
            known: dict[str, str] = {}
            todo = [m for m in members if m.get("rule")]
            for _ in range(len(todo) + 1):
                for m in list(todo):
                    req = [key(m, q) for q in parse_rule(m["rule"])[2]]
                    if all(q in known or q not in names for q in req):
                        got = {q0: known.get(key(m, q0), "") for q0 in parse_rule(m["rule"])[2]}
                        m[mode] = fn(m["rule"], _f(m.get("ci_lo")), _f(m.get("ci_hi")), got, df=_f(m.get("df")),
                                     degenerate=m.get("degenerate") or "")
                        known[m["name"]] = m[mode]
                        todo.remove(m)


def _ci(s: str) -> tuple[float, float]:
    a, _, b = str(s).strip("[] ").partition(",")
    return _f(a), _f(b)


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
        for sec in d.get("sections", []):
            for b in sec.get("blocks", []):
                if b[0] == "table" and b[1] == ["claim", "trial", "value", "95% CI", "verdict"]:
                    for name, trial, _, ci, verdict in b[2]:
                        if name not in pooled:
                            continue
                        lo, hi = _ci(ci)
                        rule_ = pooled[name].replace("pooled: ", "")
                        per_run.append({"src": f"{src} (trial {trial})", "name": name, "rule": rule_, "ci_lo": lo,
                                        "ci_hi": hi, "verdict": verdict, "trial": trial})
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


def _regime_words(rec: Path, claims: list[dict]) -> list[dict]:
    """Regime words a record keeps, recomputed from the re-decided pooled claims: report.json's regime table
    (claims '<setting>: <claim>') and task_diversity_regimes.csv (its own columns)."""
    from hmmscope.measure.regimes import regime
    from hmmscope.stats import decide, rule

    out = []
    for f in sorted(rec.rglob("report.json")):
        d = read_json(f)
        src = str(f.relative_to(rec))
        by = {c["name"]: c for c in claims if c["src"] == src}
        for sec in d.get("sections", []):
            for b in sec.get("blocks", []):
                if b[0] == "table" and b[1] == ["setting", "runs", "regime"]:
                    for setting, _, word in b[2]:
                        mine = [{**by[f"{setting}: {n}"], "name": n} for n in FIG1 if f"{setting}: {n}" in by]
                        out.append({"src": f"{src} (regime)", "name": setting, "verdict": word,
                                    "now": regime([{**m, "verdict": m["now"]} for m in mine]),
                                    "previous": previous_regime([{**m, "verdict": m["previous"]} for m in mine]),
                                    "ci": _inf_ci(mine)})
    for f in sorted(rec.rglob("task_diversity_regimes.csv")):
        for r in read_csv(f, required=("cell", "regime"), allow_empty=True).rows:  # checked (records_io)
            mine, known_now, known_prev = [], {}, {}
            for n, (_, rl) in FIG1.items():
                if r.get(n, "") == "":
                    continue
                rl = rl if n != "inference_beyond_counting" else str(rule("<", 0, ["icl_gain"]))
                lo, hi = _f(r.get(f"{n}_lo")), _f(r.get(f"{n}_hi"))
                now = decide(rl, lo, hi, known_now, df=_f(r.get("seeds")) - 1)
                prev = previous_decide(rl, lo, hi, known_prev, df=_f(r.get("seeds")) - 1)
                known_now[n], known_prev[n] = now, prev
                mine.append({"name": n, "ci_lo": lo, "ci_hi": hi, "now": now, "previous": prev})
            out.append({"src": str(f.relative_to(rec)), "name": f"n_tasks={r['cell']}", "verdict": r["regime"],
                        "now": regime([{**m, "verdict": m["now"]} for m in mine]),
                        "previous": previous_regime([{**m, "verdict": m["previous"]} for m in mine]),
                        "ci": _inf_ci(mine)})
    return out


def _inf_ci(mine: list[dict]) -> str:
    inf = next((m for m in mine if m["name"] == "inference_beyond_counting"), None)
    return f"[{_f(inf['ci_lo']):.4g}, {_f(inf['ci_hi']):.4g}]" if inf else ""


def _trial_regimes(rec: Path) -> list[dict]:
    """Per trial of trials.csv: Figure 1's regime claims (each run's own paired CI) re-decided, and the run's regime
    word; the record keeps no per-run verdict text here ('kept' is empty)."""
    from hmmscope.measure.regimes import regime

    out = []
    for f in sorted(rec.rglob("trials.csv")):
        rows = read_csv(f, allow_empty=True, unique=[("run_id",), ("trial",)]).rows
        for r in rows:
            if f"{FIG1['inference_beyond_counting'][0]}_lo" not in r or r.get("eval/unseen/vs_best_counting") in ("",
                                                                                                          None):
                continue
            mine, kn, kp = [], {}, {}
            for n, (m, rl) in FIG1.items():
                lo, hi = _f(r.get(f"{m}_lo")), _f(r.get(f"{m}_hi"))
                if not (math.isfinite(lo) and math.isfinite(hi)):
                    continue
                from hmmscope.stats import decide

                now, prev = decide(rl, lo, hi, kn, df=math.inf), previous_decide(rl, lo, hi, kp, df=math.inf)
                kn[n], kp[n] = now, prev
                mine.append({"name": n, "ci_lo": lo, "ci_hi": hi, "now": now, "previous": prev})
                if n == "inference_beyond_counting":
                    out.append({"src": f"{f.relative_to(rec)} (trial {r.get('trial')})", "name": n, "verdict": "",
                                "now": now, "previous": prev, "ci": f"[{lo:.4g}, {hi:.4g}]"})
            out.append({"src": f"{f.relative_to(rec)} (trial {r.get('trial')})", "name": "regime word", "verdict": "",
                        "now": regime([{**x, "verdict": x["now"]} for x in mine]),
                        "previous": previous_regime([{**x, "verdict": x["previous"]} for x in mine]),
                        "ci": _inf_ci(mine)})
    return out


def redecide(rec: Path) -> list[dict]:
    """Every verdict and regime word the record keeps (module docstring): dicts with src, name, ci, verdict (kept,
    '' where the record keeps none), previous (the rules before issue 34.3) and now (the current rules)."""
    claims = _report_claims(rec) + _table_claims(rec)
    for c in claims:
        c.setdefault("ci", f"[{_f(c.get('ci_lo')):.4g}, {_f(c.get('ci_hi')):.4g}]")
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


if __name__ == "__main__":
    raise SystemExit(main())
