"""The objective catalogue of a sweep spec: the metrics each kind of trial returns, hence the objectives a spec may
name (`objectives`), the learning-curve proxy a pruned trial reports (PRUNE_PROXY) and the renamed Figure 1 keys
(LEGACY_OBJECTIVES). Checked against a spec by `spec.checks.check_points`; imports nothing of the sweep package.
"""

from __future__ import annotations

import re

from ...config import Config

# The metrics a trial returns (sweep.run_trial), hence the objectives a spec may name. Train trials:
# train.train's final val/* and oracle/*, then jobs.evaluate_run's Figure 1 headline (evaluate.Figure1Result
# .headline), memory/* when model.window > 0 (evaluate.memory_comparison), and with analyze = true the
# analysis metrics (jobs._analysis_metrics). Theory trials: sweep.trial.theory_metrics. tests/test_sweep_spec
# checks these sets against the metrics real trials return.
_FIGURE1 = ("test_acc", "test_ce", "oracle_mix_test_acc", "oracle_mix_test_ce", "oracle_task_test_acc",
            "oracle_task_test_ce", "kl_mix", "kl_task", "excess_ce", "excess_ce_task", "gap_to_mix", "gap_to_task")
TRAIN_OBJECTIVES = frozenset(
    [f"val/{k}" for k in ("loss", "acc", "test_loss", "test_acc")] + ["oracle/loss", "oracle/acc"]
    + ["val/excess_ce", "eval/seen/p_true_task", "eval/retrieval_gap", "eval/retrieval_gap_lo", "eval/retrieval_gap_hi"]
    + [f"eval/{t}/{k}" for t in ("seen", "unseen") for k in _FIGURE1]
    + [f"eval/{t}/icl_gain{s}" for t in ("seen", "unseen") for s in ("", "_lo", "_hi")]
    + [f"eval/unseen/vs_best_counting{s}" for s in ("", "_lo", "_hi")] + ["eval/figure1_s"])
_MIXTURE_ONLY = frozenset(k for k in TRAIN_OBJECTIVES if k.startswith("eval/seen/") or k.startswith("eval/retrieval_gap")
                          or "oracle_mix" in k or k.endswith("/gap_to_mix"))  # absent with fresh tasks
BASELINE_OBJECTIVE = re.compile(r"baseline/(seen|unseen)/(mixture_oracle|family_bayes|incontext_unigram|incontext_bigram"
                                r"|incontext_ngram|incontext_ctw|best_counting|incontext_hmm)/(ce|acc|icl_gain)(_k0)?")
VS_OBJECTIVE = re.compile(r"eval/unseen/vs/[a-z_]+/k\d+(_lo|_hi)?")
HEADROOM_OBJECTIVES = frozenset(["headroom/room", "headroom/room_lo", "headroom/room_hi", "headroom/seconds"])
HEADROOM_OBJECTIVE = re.compile(r"headroom/room/k\d+(_lo|_hi)?|headroom/[a-z_0-9]+/ce/k\d+")
LEGACY_OBJECTIVES = {**{f"eval/{k}": f"eval/seen/{k}" for k in (*_FIGURE1, "p_true_task")},
                     "oracle/test_acc": "eval/seen/oracle_mix_test_acc", "oracle/test_loss": "eval/seen/oracle_mix_test_ce"}
MEMORY_OBJECTIVE = re.compile(r"memory/[a-z0-9_]+")
ANALYSIS_OBJECTIVE = re.compile(r"shuffle/layer\d+/norm_change(_lo|_hi)?|probe/[a-z0-9_]+/layer\d+/[a-z0-9_]+"
                                r"|claim/[A-Za-z0-9_]+/(value|ci_lo|ci_hi)")
THEORY_OBJECTIVES = frozenset(
    ["theory/dobrushin", "theory/rate", "theory/rate_lo", "theory/rate_hi", "theory/log_intercept"]
    + [f"theory/{k}{s}" for k in ("gamma_O", "gamma_eff") for s in ("", "_lower", "_upper")])
GAMMA_M_OBJECTIVES = frozenset(f"theory/gamma_m{s}" for s in ("", "_lower", "_upper"))
PRUNE_PROXY = {"eval/seen/excess_ce": "val/excess_ce", "eval/seen/test_acc": "val/test_acc",
               "eval/seen/test_ce": "val/test_loss"}


def objectives(kind: str, analyze: bool, cfg: Config) -> tuple[frozenset[str], tuple[re.Pattern, ...]]:
    """(names, patterns) of the metrics a trial of a spec of `kind` (with `analyze`) and config `cfg` returns."""
    if kind == "theory":
        return THEORY_OBJECTIVES | (GAMMA_M_OBJECTIVES if cfg.theory.gamma_m > 0 else frozenset()), ()
    if kind == "headroom":
        return HEADROOM_OBJECTIVES, (HEADROOM_OBJECTIVE,)
    pats = ((BASELINE_OBJECTIVE, VS_OBJECTIVE) + ((MEMORY_OBJECTIVE,) if cfg.model.window > 0 else ())
            + ((ANALYSIS_OBJECTIVE,) if analyze else ()))
    names = TRAIN_OBJECTIVES - _MIXTURE_ONLY if cfg.hmm.n_tasks == 0 else TRAIN_OBJECTIVES
    if cfg.hmm.n_tasks == 0 and cfg.eval.family_tasks == 0:  # no oracle/* without a mixture or family Bayes
        names = names - {"oracle/loss", "oracle/acc", "val/excess_ce"}
    if cfg.eval.fit_episodes == 0:
        names = names - {f"eval/unseen/vs_best_counting{s}" for s in ("", "_lo", "_hi")}
    return names, pats
