"""The inference regime (issue 27.7, SCIENCE.md 9): Figure 1 on unseen tasks of models trained on fresh tasks, pooled
over replicate seeds, against every counting baseline and family Bayes; the paired comparison with best counting; the
emergence curves.

    python analysis/inference_regime.py --sweep inference-regime-cpu [--out DIR]

Reads each COMPLETE trial's Figure 1 tables (artifacts evaluation/figure1_by_k.csv, figure1_paired.csv,
figure1_gains.csv) and its emergence table (emergence/curves.json). Statistics: per seed, the run's mean over its
unseen episodes (each episode its own unseen task; the unseen tasks are drawn per data.seed); then the mean over seeds
with a t interval on G - 1 df (the seed is the unit: stats.t_mean). With one seed, the run's own normal CI over
episodes is given instead (df inf).

Writes:
- inference.csv: k, predictor, ce, ci_lo, ci_hi, df, n_seeds (unseen tasks, test segment, nats/token);
- vs_best_counting.csv: k, diff, ci_lo, ci_hi, df, n_seeds: model - best_counting, paired over episodes within each
  run, pooled over seeds by t; also the same against family Bayes and the add-one bigram (vs_references.csv);
- gains.csv: per predictor, the in-context gain on the same tokens, pooled over seeds; the share of family Bayes' gain
  the model reaches (model gain / family Bayes gain) and the share of the room it closes at k_max
  ((best counting - model) / (best counting - family Bayes)), per seed and pooled;
- inference.{png,pdf}: CE vs k (the model with its CI band, every reference), model - best counting vs k, and the
  emergence of the model's gap to best counting and its gain over training steps (each seed, and their mean).
"""
from __future__ import annotations

import json
import math
import tempfile
from collections import defaultdict

import numpy as np
from sweepdata import fail, load_sweep, out_dir, parser, save, write_table

PREDICTORS = ("model", "task_oracle", "family_bayes", "best_counting", "incontext_ngram", "incontext_ctw",
              "incontext_bigram", "incontext_unigram", "incontext_hmm")


def _pool(values: list[float], own: tuple[float, float] | None = None) -> dict:
    from hmmscope.stats import t_mean

    e = t_mean(values, unit="seed")
    if e.n >= 2:
        return {"value": e.value, "ci_lo": e.lo, "ci_hi": e.hi, "df": e.df, "n_seeds": e.n}
    lo, hi = own if own else (math.nan, math.nan)
    return {"value": e.value, "ci_lo": lo, "ci_hi": hi, "df": math.inf, "n_seeds": e.n}


def _table(rows, key):
    return {tuple(r[k] for k in key): r for r in rows}


def _emergence(sw, run_id) -> list[dict]:
    from hmmscope import tracking

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = tracking.Run(sw.uri, run_id).download("emergence/curves.json", tmp)
        except FileNotFoundError:
            return []
        t = json.loads(open(path).read())
    return [dict(zip(t["columns"], row)) for row in t["data"]]


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    if sw.kind != "train":
        fail(f"sweep {sw.name!r} is a {sw.kind} sweep; the inference regime needs training trials")
    out = out_dir(args)
    per = []  # per trial: seed, by_k rows (unseen), paired rows (unseen), gains rows (unseen), emergence rows
    for t in sw.trials:
        by_k = [r for r in sw.artifact_csv(t.run_id, "evaluation/figure1_by_k.csv") if r["tasks"] == "unseen"]
        if not by_k:
            continue
        per.append({"seed": t.seed, "by_k": by_k,
                    "paired": [r for r in sw.artifact_csv(t.run_id, "evaluation/figure1_paired.csv")
                               if r["tasks"] == "unseen"],
                    "gains": [r for r in sw.artifact_csv(t.run_id, "evaluation/figure1_gains.csv")
                              if r["tasks"] == "unseen"],
                    "emergence": _emergence(sw, t.run_id), "run_id": t.run_id, "metrics": t.metrics})
    if not per:
        fail(f"no trial of {sw.name!r} has Figure 1 tables on unseen tasks")
    ks = sorted({int(r["k"]) for p in per for r in p["by_k"]})
    k_max = max(ks)
    own = len(per) == 1

    rows = []
    for k in ks:
        for pred in PREDICTORS:
            vals, ci = [], None
            for p in per:
                r = next((r for r in p["by_k"] if int(r["k"]) == k and r["predictor"] == pred), None)
                if r is not None:
                    vals.append(float(r["ce"]))
                    ci = (float(r["ce_lo"]), float(r["ce_hi"]))
            if vals:
                q = _pool(vals, ci if own else None)
                rows.append({"k": k, "predictor": pred, "ce": q["value"], "ci_lo": q["ci_lo"], "ci_hi": q["ci_hi"],
                             "df": q["df"], "n_seeds": q["n_seeds"]})
    write_table(rows, out, "inference")

    def vs(baseline: str) -> list[dict]:
        res = []
        for k in ks:
            vals, ci = [], None
            for p in per:
                r = next((r for r in p["paired"] if int(r["k"]) == k and r["baseline"] == baseline), None)
                if r is not None:
                    vals.append(float(r["diff"]))
                    ci = (float(r["diff_lo"]), float(r["diff_hi"]))
            if vals:
                q = _pool(vals, ci if own else None)
                res.append({"k": k, "diff": q["value"], "ci_lo": q["ci_lo"], "ci_hi": q["ci_hi"], "df": q["df"],
                            "n_seeds": q["n_seeds"], "per_seed": " ".join(f"{v:.4f}" for v in vals)})
        return res

    best = vs("best_counting")
    write_table(best, out, "vs_best_counting")
    refs = [{"baseline": b, **r} for b in ("best_counting", "family_bayes", "incontext_bigram", "incontext_hmm")
            for r in vs(b)]
    write_table(refs, out, "vs_references")

    gains, share, closed = [], [], []
    for p in per:
        g = {r["predictor"]: float(r["icl_gain"]) for r in p["gains"]}
        if "model" in g and g.get("family_bayes", 0) > 0:
            share.append(g["model"] / g["family_bayes"])
        ce = {r["predictor"]: float(r["ce"]) for r in p["by_k"] if int(r["k"]) == k_max}
        if {"model", "best_counting", "family_bayes"} <= set(ce) and ce["best_counting"] > ce["family_bayes"]:
            closed.append((ce["best_counting"] - ce["model"]) / (ce["best_counting"] - ce["family_bayes"]))
    for pred in PREDICTORS:
        vals = [float(r["icl_gain"]) for p in per for r in p["gains"] if r["predictor"] == pred]
        if vals:
            q = _pool(vals)
            gains.append({"predictor": pred, "icl_gain": q["value"], "ci_lo": q["ci_lo"], "ci_hi": q["ci_hi"],
                          "df": q["df"], "n_seeds": q["n_seeds"], "per_seed": " ".join(f"{v:.4f}" for v in vals)})
    for name, vals in (("share of family Bayes' gain (model gain / family Bayes gain)", share),
                       (f"share of the room closed at k = {k_max} ((best counting - model) / (best counting - family "
                        "Bayes))", closed)):
        if vals:
            q = _pool(vals)
            gains.append({"predictor": name, "icl_gain": q["value"], "ci_lo": q["ci_lo"], "ci_hi": q["ci_hi"],
                          "df": q["df"], "n_seeds": q["n_seeds"], "per_seed": " ".join(f"{v:.4f}" for v in vals)})
    write_table(gains, out, "gains")

    _figure(rows, best, per, ks, out, sw.name)
    b = next(r for r in best if r["k"] == k_max)
    print(f"model - best counting at k = {k_max}: {b['diff']:.4f} [{b['ci_lo']:.4f}, {b['ci_hi']:.4f}] "
          f"(t over {b['n_seeds']} seeds, df {b['df']:g}); per seed {b['per_seed']}")
    return 0


def _figure(rows, best, per, ks, out, name) -> None:
    import matplotlib.pyplot as plt

    fig, (ax, axd, axe) = plt.subplots(1, 3, figsize=(18, 4.8), layout="constrained")
    style = {"model": ("C0", "-", 2.2), "task_oracle": ("C2", "--", 1.2), "family_bayes": ("C1", "-", 1.4),
             "best_counting": ("k", "-.", 1.6), "incontext_ngram": ("C8", "-.", 1.0), "incontext_ctw": ("C9", "-.", 1.0),
             "incontext_bigram": ("C5", ":", 1.0), "incontext_unigram": ("C7", ":", 1.0), "incontext_hmm": ("C4", "--", 1.0)}
    for pred, (c, ls, lw) in style.items():
        r = [q for q in rows if q["predictor"] == pred]
        if not r:
            continue
        x = [q["k"] for q in r]
        ax.plot(x, [q["ce"] for q in r], marker="o", ms=3, color=c, ls=ls, lw=lw, label=pred.replace("_", " "))
        if pred == "model":
            ax.fill_between(x, [q["ci_lo"] for q in r], [q["ci_hi"] for q in r], color=c, alpha=0.2)
    ax.set(xlabel="demonstrations k", ylabel="test CE (nats / token)", xticks=ks,
           title="unseen tasks: CE vs k (mean over seeds; model: 95% t CI)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    x = [q["k"] for q in best]
    axd.errorbar(x, [q["diff"] for q in best], yerr=[[q["diff"] - q["ci_lo"] for q in best],
                                                    [q["ci_hi"] - q["diff"] for q in best]], marker="o", capsize=3,
                 color="k", label="model - best counting (mean over seeds, 95% t CI)")
    for p in per:
        d = [float(r["diff"]) for r in sorted(p["paired"], key=lambda r: int(r["k"])) if r["baseline"] == "best_counting"]
        axd.plot(sorted({int(r["k"]) for r in p["paired"]}), d, ".", color="gray", alpha=0.7)
    axd.axhline(0, color="gray", lw=0.8)
    axd.set(xlabel="demonstrations k", ylabel="CE difference (nats / token)", xticks=ks,
            title="model minus best counting, paired per episode (< 0: beyond counting); dots: seeds")
    axd.legend(fontsize=7)
    axd.grid(alpha=0.3)
    curves = defaultdict(list)
    for p in per:
        e = [r for r in p["emergence"] if r["tasks"] == "unseen" and r["predictor"] == "model"]
        for metric, color in (("vs_best_counting", "k"), ("icl_gain", "C0")):
            pts = sorted((int(r["step"]), float(r["value"])) for r in e if r["metric"] == metric)
            if pts:
                s, v = zip(*pts)
                axe.plot(np.maximum(s, 1), v, "-", color=color, alpha=0.35, lw=1)
                curves[metric].append(dict(pts))
    for metric, color, label in (("vs_best_counting", "k", "model - best counting at k_max"),
                                 ("icl_gain", "C0", "model's in-context gain (same tokens)")):
        if curves[metric]:
            steps = sorted(set.intersection(*(set(c) for c in curves[metric])))
            axe.plot(np.maximum(steps, 1), [np.mean([c[s] for c in curves[metric]]) for s in steps], "-o", ms=3,
                     color=color, lw=2, label=f"{label} (mean over seeds; thin: seeds)")
    axe.axhline(0, color="gray", lw=0.8)
    axe.set(xscale="log", xlabel="optimizer step", ylabel="nats / token",
            title="emergence on unseen tasks (the curves' episodes)")
    if axe.get_legend_handles_labels()[0]:
        axe.legend(fontsize=7)
    else:  # runs trained with train.emergence_episodes = 0 logged no curves: say so, not an empty legend
        axe.text(0.5, 0.5, "no emergence curves in these runs\n(train.emergence_episodes = 0)", ha="center",
                 va="center", transform=axe.transAxes, fontsize=8, color="gray")
    axe.grid(alpha=0.3)
    fig.suptitle(f"{name}: in-context inference beyond counting on unseen tasks")
    save(fig, out, "inference")


if __name__ == "__main__":
    raise SystemExit(main())
