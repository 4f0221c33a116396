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
from the record's files alone, beside the verdict the record keeps and the verdict under the rules before issue 34.3
(analysis/redecide.py says which files and how).
"""
from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import pandas as pd
from pooled import dependency_order
from records_io import RecordError, read_json, read_trials
from redecide import PER_RUN, redecide_report, report_tables

from hmmscope.report.layerwise import depth_rank_section, layerwise_section
from hmmscope.report.posenc import posenc_section
from hmmscope.report.read import input_keys
from hmmscope.stats import decide, parse_rule, rule


def _frame(rec: Path, old: dict):
    t = read_trials(rec / "trials.csv", required=("trial", "kind"), numbers=("trial",))
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
    out = {}
    for _, row in df.iterrows():
        known: dict[str, str] = {}
        todo = [n for n in rules if f"metric:claim/{n}/value" in row and row[f"metric:claim/{n}/value"] == row[
            f"metric:claim/{n}/value"]]
        for n in dependency_order(todo, lambda n: parse_rule(rules[n])[2], lambda n: n):
            known[n] = decide(rules[n], row[f"metric:claim/{n}/ci_lo"], row[f"metric:claim/{n}/ci_hi"], known)
        for n, v in known.items():
            out[(n, int(row["trial"]))] = v
    return out


def _old_run_verdicts(old: dict) -> dict:
    return {(r[0], int(r[1])): r[4] for r in report_tables(old, PER_RUN)}


def main(argv=None) -> int:
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


if __name__ == "__main__":
    raise SystemExit(main())
