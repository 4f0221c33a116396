"""Inference ablations (issue 33, SCIENCE.md 9): depth, RoPE vs absolute, gamma, rank and context in the family where a
model infers beyond counting; the paper's layerwise claims at every depth; Theorem 1 against a learner that infers.

    python analysis/inference_ablations.py --tracking-uri URI --storage URL [--out DIR] [--headroom DIR]
    python analysis/inference_ablations.py --from-record analysis/results/inference-ablations-cpu

The first form reads the four sweeps of sweeps/inference-ablations-{depth,gamma,rank,context}.toml (their COMPLETE
trials, Figure 1 metrics, emergence curves, memory/* metrics and the depth sweep's analysis runs) and writes the
per-run tables the record keeps (runs.csv, curves.csv, layerwise_runs.csv), then everything below from them. The
second form recomputes everything from those kept tables alone (no store), checked first (RECORD, records_io.py);
every table is computed before any is written, each atomically, so a bad record is never overwritten.

Cells and axes. A cell is (n_layers, pos_enc, gamma, rank, window); seeds are its replicates (train.seed = data.seed:
each seed draws its own unseen, fit and family tasks, so an interval over seeds covers those draws). The base cell is
2 layers, RoPE, gamma 0.8, d = 4, full context; each axis moves one key from it (depth and pos_enc: the depth sweep's
3 x 2 grid; context: the window at gamma 0.6 and 0.8, beside the full-context cell of that gamma).

Statistics (seeds are the unit; t intervals on G - 1 df, stats.t_mean, as `hmmscope report`):
- per cell: the model's CE and best counting's at k_max (unseen tasks), diff = model - best counting (each run's
  paired mean over its 512 episodes, pooled over seeds), the room (best counting - family Bayes at M = 4096: a lower
  bound in expectation, SCIENCE.md 9; and the legitimate room, best counting minus the EM learner or a converged family
  Bayes), the share of the room closed ((best counting - model) / (best counting - family Bayes)), the regime word
  from the pooled claims (regimes.regime). A cell whose room is not above 0 on its CI is "no room" and enters no
  axis effect.
- effects (stats.claim with a rule fixed before the data): RoPE - absolute on diff per depth and pooled over depths
  (stats.paired_effect: seeds the unit, depth the block); the slope of diff on n_layers (RoPE) per seed; the slope of
  diff and of the excess over the task oracle on gamma, on d, and on the receptive field R per seed (OLS within a
  seed, then t over seeds), each slope with its adjacent steps ("not monotone" unless they all follow it). Each
  effect (hmmscope.sweep.effects, the report's implementation) also gets its TOST at the margin (0.01 nats/token,
  stats.DEFAULT_MARGIN; a slope's over the swept range), what the design excludes, the seeds needed to decide +-margin
  with 80% power, and a Holm-adjusted verdict over the family of effects (columns margin, tost_p, equivalence,
  excluded_beyond, seeds_needed, holm_verdict).
- Theorem 1 (context cells): the model's TV to the task oracle at test positions j >= R (memory/model_tv), the
  L-memory predictor's on the same tokens (memory/lmem_tv: eps(R) measured there), eps(R) on stationary histories
  (memory/eps), family Bayes with the full history (memory/mix_tv), per gamma and R pooled over seeds; decay rates in
  R from per-seed log-linear fits.
- layerwise: every claim the depth sweep's analyses logged, pooled per (n_layers, pos_enc) over seeds by the report's
  own pooling (hmmscope.report.layerwise), the claim's logged rule applied to the pooled CI.

Writes, under --out: ablations.csv, effects.csv, theorem1.csv, theorem1_rates.csv, layerwise.csv, cost.csv, curves.csv,
runs.csv, layerwise_runs.csv, and the figures ablations.png, depth_curves.png, theorem1.png, layerwise.png (+ PDF).
The package never imports this folder.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import ablations_bayes as ab
import record_effects as fx
from ablations_bayes import read_bayes
from ablations_collect import PUSH, RECORD, collect, collect_push, read_record
from ablations_figures import figures
from ablations_tables import cell_rows, cost, effects, layerwise, theorem1
from records_io import Outputs, RecordError, check_out
from sweepdata import RESULTS, fail


def _budget_label(c: dict) -> str:
    """The budget fit's label of a curve point: its cell (depth and encoding) or the push."""
    return "push" if c.get("study") == "push" else f"{int(float(c['n_layers']))} layers {c['pos_enc']}" + (
        "" if float(c["gamma"]) == 0.8 and float(c["rank"]) == 4 and float(c["window"]) == 0 else
        f", gamma {float(c['gamma']):g}, d {int(float(c['rank']))}, window {int(float(c['window']))}")

# ---------------------------------------------------------------- main


def _as_kept(path: Path, joined: list[dict], added: tuple[str, ...]) -> list[dict]:
    """The record's rows as its file has them (text: an integer stays '0', never '0.0'), with the columns `added`
    from `joined` (the same rows, in order, read as numbers)."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        text = list(csv.DictReader(f))
    assert len(text) == len(joined) and all(t["run_id"] == j["run_id"] for t, j in zip(text, joined))
    return [{**t, **{k: j[k] for k in added}} for t, j in zip(text, joined)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracking-uri", default=None, help="MLflow store of the four sweeps")
    p.add_argument("--storage", default=None, help="their Optuna storage")
    p.add_argument("--from-record", type=Path, default=None, help="recompute from a record's kept tables (no store)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: analysis/results/"
                                                          "inference-ablations-cpu, or --from-record's)")
    p.add_argument("--push-tracking-uri", default=None, help="with --push-storage: collect the push's runs from its own "
                                                              "store into push_runs.csv, push_curves.csv")
    p.add_argument("--push-storage", default=None)
    p.add_argument("--no-figures", action="store_true")
    args = p.parse_args(argv)
    out = args.out or args.from_record or RESULTS / "inference-ablations-cpu"
    try:  # every input checked, every table computed, then written together (records_io): a bad record writes nothing
        check_out(out, "--out" if args.out else "--from-record", named=args.out is not None)
        if args.from_record is not None and not args.from_record.is_dir():
            raise RecordError(f"--from-record {str(args.from_record)!r}: no folder holding runs.csv there (a record of "
                              "this script's tables)")
        src = args.from_record or out
        if args.from_record is None:
            out.mkdir(parents=True, exist_ok=True)
            collect(args.tracking_uri, args.storage, out)
        if args.push_storage:
            collect_push(args.push_tracking_uri, args.push_storage, src)
        runs, curves, claim_rows = (read_record(src / name) for name in RECORD)
        outs = Outputs(out)
        rows, has_room = cell_rows(runs)
        bayes = read_bayes(src / "bayes")  # the Bayes-optimal reference on the same episodes (ablations_bayes)
        if bayes is not None:
            runs = ab.join(runs, bayes[0])
            rows = ab.cells(rows, runs)
            push = read_record(src / "push_runs.csv", PUSH) if (src / "push_runs.csv").exists() else []
            rows += ab.push_rows(push, bayes[0])
            outs.table(_as_kept(src / "runs.csv", runs, ab.JOINED), "runs")
            outs.table(fx.table(ab.effects(runs, bayes[1]), "bayes_effects.csv"), "bayes_effects")
            push_c = read_record(src / "push_curves.csv", RECORD["curves.csv"]) if push else []
            gap = ab.curves(curves + push_c, bayes[0], runs + push)
            outs.table(gap, "bayes_curves")
            full = [g for g in gap if float(g["window"]) == 0]  # a window's gap to full Bayes has a floor: no fit
            outs.table(ab.budget_fit(full, _budget_label, 1600, 6400) + ab.budget_fit(
                [g for g in gap if g.get("study") == "push"], _budget_label, 1600, 12800), "budget")
        outs.table(rows, "ablations")
        eff = effects(runs, has_room)
        outs.table(eff, "effects")
        th, rates = theorem1(runs)
        if th and bayes is not None and bayes[1]:
            th = ab.theorem1_windowed(th, bayes[1])
        if th:
            outs.table(th, "theorem1")
            outs.table(rates, "theorem1_rates")
        lw = layerwise(claim_rows) if claim_rows else []
        if lw:
            outs.table(lw, "layerwise")
        outs.table(cost(runs), "cost")
        outs.write()
    except RecordError as e:
        fail(str(e))
    if not args.no_figures:
        figures(rows, runs, curves, th, lw, out)
    for e in eff:
        print(f"{e['effect']}: {e['value']:+.4f} [{e['ci_lo']:+.4f}, {e['ci_hi']:+.4f}] {e['unit']}, df {e['df']:g}, "
              f"rule {e['rule']}: {e['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
