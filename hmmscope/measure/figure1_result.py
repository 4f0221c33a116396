"""Figure 1's result (SCIENCE.md 6, 8, 9): its tables as lists of dicts, the headline metrics logged to MLflow, the
per-episode arrays, JSON and CSV; the names of its predictors, references and task sets.

Built by measure.evaluate.figure1_tables; drawn by measure.figure1_plot; read back by the report and the sweeps
through the headline metrics' names (`Figure1Result.headline`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..safe_output import write_tables
from ..stats import jsonable

__all__ = ["Figure1Result", "PREDICTORS", "REFERENCES", "BASELINES", "FITTED_COUNTING", "TASKS"]

FITTED_COUNTING = ("incontext_ngram", "incontext_ctw", "best_counting")
REFERENCES = ("task_oracle", "mixture_oracle", "family_bayes", "bayes", "incontext_unigram", "incontext_bigram",
              *FITTED_COUNTING, "incontext_hmm")
PREDICTORS = ("model", *REFERENCES)
BASELINES = REFERENCES[2:]  # logged under baseline/<tasks>/<name>/...; compared with the model, paired
TASKS = ("seen", "unseen")


@dataclass
class Figure1Result:
    """Figure 1 tables as lists of dicts. by_k: one row per (tasks, k, predictor); by_position: one row per
    (tasks, test position, predictor) at k = k_max (the largest k evaluated, normally n_demos).
    Columns: tasks (seen / unseen), k, [position], predictor, n_episodes, [n_tokens], p_true_task (mixture
    posterior of the true task at the test start, same on every predictor row; empty on unseen tasks), and for
    each metric acc, ce, kl_mix (KL(mixture reference || predictor)), kl_task (KL(task oracle || predictor)),
    excess_ce (CE - mixture reference CE), excess_ce_task (CE - task oracle CE): the mean and its 95% CI as
    <metric>_lo/_hi. (A row's n_tokens counts the scored tokens; meta['n_tokens'] is V.) paired: one row per
    (tasks, k, baseline): model minus baseline CE on the same episodes (diff, diff_lo, diff_hi). gains: one row per
    (tasks, predictor): the in-context gain on the same tokens (icl_gain, icl_gain_lo, icl_gain_hi). claims: the
    retrieval gap (when both task sets were evaluated), icl_gain and inference_beyond_counting (unseen tasks, with
    best_counting); retrieval: the gap's numbers; regime: the regime word."""

    by_k: list[dict]
    by_position: list[dict]
    k_max: int
    meta: dict = field(default_factory=dict)
    claims: list = field(default_factory=list)
    retrieval: dict | None = None
    paired: list[dict] = field(default_factory=list)
    gains: list[dict] = field(default_factory=list)
    regime: str = "undetermined"
    bayes: dict | None = None  # unseen tasks at k_max: the Bayes gap, the room, the share closed (`bayes_gap`)
    per_episode: dict = field(default_factory=dict)  # {"<tasks>/k<k>/<predictor>": per-episode CE (N,)} (`episode_arrays`)

    @property
    def tasks(self) -> list[str]:
        return [t for t in TASKS if any(r["tasks"] == t for r in self.by_k)]

    def row(self, predictor: str, k: int | None = None, tasks: str = "seen") -> dict:
        k = self.k_max if k is None else k
        return next(r for r in self.by_k if r["k"] == k and r["predictor"] == predictor and r["tasks"] == tasks)

    def headline(self) -> dict[str, float]:
        """Scalar metrics at k = k_max for MLflow: eval/<tasks>/... (the model, the task oracle and, with a
        training mixture, the mixture oracle; excess_ce and kl_mix against the mixture reference),
        eval/<tasks>/icl_gain (+ _lo / _hi, on the same tokens), baseline/<tasks>/<reference>/{ce, acc, ce_k0,
        acc_k0, icl_gain} (the references; the mixture oracle's k = 0 values as baseline/<tasks>/mixture_oracle/
        {ce_k0, acc_k0}), baseline/unseen/family_bayes/ce_M<M> (its convergence in M), on unseen tasks
        eval/unseen/vs/<baseline>/k<k> (+ _lo / _hi: model minus baseline, paired) and eval/unseen/vs_best_counting
        (+ _lo / _hi, at k_max), eval/retrieval_gap with _lo / _hi."""
        out: dict[str, float] = {}
        k0 = 0 in {r["k"] for r in self.by_k}
        for tasks in self.tasks:
            names = {r["predictor"] for r in self.by_k if r["tasks"] == tasks}
            m, t = self.row("model", tasks=tasks), self.row("task_oracle", tasks=tasks)
            p = f"eval/{tasks}/"
            out.update({p + "test_acc": m["acc"], p + "test_ce": m["ce"],
                        p + "oracle_task_test_acc": t["acc"], p + "oracle_task_test_ce": t["ce"],
                        p + "kl_mix": m["kl_mix"], p + "kl_task": m["kl_task"], p + "excess_ce": m["excess_ce"],
                        p + "excess_ce_task": m["excess_ce_task"], p + "gap_to_task": t["acc"] - m["acc"]})
            if "mixture_oracle" in names:
                x = self.row("mixture_oracle", tasks=tasks)
                out.update({p + "oracle_mix_test_acc": x["acc"], p + "oracle_mix_test_ce": x["ce"],
                            p + "gap_to_mix": x["acc"] - m["acc"]})
            if tasks == "seen":
                out[p + "p_true_task"] = m["p_true_task"]
            for name in [n for n in BASELINES if n in names]:
                r = self.row(name, tasks=tasks)
                out.update({f"baseline/{tasks}/{name}/ce": r["ce"], f"baseline/{tasks}/{name}/acc": r["acc"]})
            for name in [n for n in ("mixture_oracle", *BASELINES) if n in names] if k0 else []:
                r = self.row(name, 0, tasks)
                out.update({f"baseline/{tasks}/{name}/ce_k0": r["ce"], f"baseline/{tasks}/{name}/acc_k0": r["acc"]})
            for g in (g for g in self.gains if g["tasks"] == tasks):
                key = p + "icl_gain" if g["predictor"] == "model" else f"baseline/{tasks}/{g['predictor']}/icl_gain"
                out.update({key: g["icl_gain"], **({key + "_lo": g["icl_gain_lo"], key + "_hi": g["icl_gain_hi"]}
                                                   if g["predictor"] == "model" else {})})
        for c in (self.meta.get("sets", {}).get("unseen", {}) or {}).get("family_bayes_convergence", []):
            out[f"baseline/unseen/family_bayes/ce_M{c['M']}"] = c["ce"]
        for tasks, es_meta in self.meta.get("sets", {}).items():  # flagged: shown, never used (SCIENCE.md 9)
            for name in (es_meta or {}).get("degenerate", {}):
                out[f"baseline/{tasks}/{name}/degenerate"] = 1.0
        for r in (r for r in self.paired if r["tasks"] == "unseen" and not r.get("degenerate")):
            key = f"eval/unseen/vs/{r['baseline']}/k{r['k']}"
            out.update({key: r["diff"], key + "_lo": r["diff_lo"], key + "_hi": r["diff_hi"]})
            if r["baseline"] == "best_counting" and r["k"] == self.k_max:
                out.update({"eval/unseen/vs_best_counting": r["diff"], "eval/unseen/vs_best_counting_lo": r["diff_lo"],
                            "eval/unseen/vs_best_counting_hi": r["diff_hi"]})
        if self.retrieval is not None:
            g = self.retrieval
            out.update({"eval/retrieval_gap": g["value"], "eval/retrieval_gap_lo": g["lo"],
                        "eval/retrieval_gap_hi": g["hi"]})
        if self.bayes is not None:
            b = self.bayes
            out.update({"eval/unseen/vs_bayes": b["gap"], "eval/unseen/vs_bayes_lo": b["gap_lo"],
                        "eval/unseen/vs_bayes_hi": b["gap_hi"], "eval/unseen/bayes_mc_se": b["mc_se"],
                        "eval/unseen/bayes_fault": float(b["fault"])})
            if "share" in b:
                out.update({"eval/unseen/bayes_share": b["share"], "eval/unseen/bayes_share_lo": b["share_lo"],
                            "eval/unseen/bayes_share_hi": b["share_hi"], "eval/unseen/bayes_room": b["room"],
                            "eval/unseen/bayes_room_lo": b["room_lo"], "eval/unseen/bayes_room_hi": b["room_hi"]})
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}

    def episode_arrays(self) -> dict[str, np.ndarray]:
        """Per-episode CE arrays {"<tasks>/k<k>/<predictor>": (N,) float32}, on the same episodes for every
        predictor: a run's artifact (evaluation/per_episode.npz), so that two runs on the same episodes (another
        depth, the same seed) compare paired per episode, and a record re-scores without retraining."""
        return dict(self.per_episode)

    def to_dict(self) -> dict:
        """JSON-safe (NaN / inf -> None)."""
        return jsonable({"by_k": self.by_k, "by_position": self.by_position, "k_max": self.k_max,
                         "meta": self.meta, "headline": self.headline(), "claims": self.claims,
                         "retrieval": self.retrieval, "paired": self.paired, "gains": self.gains,
                         "regime": self.regime, "bayes": self.bayes})

    def to_csv(self, directory) -> list[Path]:
        """Write figure1_by_k.csv, figure1_by_position.csv, figure1_paired.csv and figure1_gains.csv (those with rows)
        into directory; returns the paths."""
        return write_tables(directory, {"figure1_by_k": self.by_k, "figure1_by_position": self.by_position,
                                        "figure1_paired": self.paired, "figure1_gains": self.gains})
