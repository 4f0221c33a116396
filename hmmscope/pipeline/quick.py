"""`hmmscope run --quick`: every phase of the main job at a size that runs in about a minute on one idle core.

The same phases, runs, files and links as the full job (`hmmscope run`), each smaller: a Theorem 1 sweep over three
gammas at 16 states (2 HMM draws per setting, so the rates have CIs), a 2-layer model trained 150 steps on a mixture
of 8 tasks (its evaluation's references on 32 tasks and fit episodes), the layerwise analysis of that model, and the
smoke sweep's 4 trials at a third of their steps and data, run as the sweep `smoke-quick` (its own study, so a full
`smoke` in the same project is neither resumed nor refused by it). Its trials draw no figures of their own
(train.figures = false: matplotlib was about three quarters of a quick trial's CPU; `hmmscope evaluate RUN` draws a
trial's Figure 1); the sweep's comparison and report draw theirs. The numbers are a demonstration of the pipeline, not
results: the claims are about models this small. `hmmscope run --quick` runs it on one torch thread unless
HMMSCOPE_THREADS says otherwise (its models are tiny; more threads only spin on a busy machine). `QUICK` applies after
`--config` and before `--set`; `cli.run.quick_sweep` makes the sweep from the main job's spec with QUICK_SWEEP and
QUICK_SWEEP_SETS (the sweep layer calls the pipeline, so the pipeline never imports it). The wall time is measured in
the README's first lines (`time hmmscope run --quick`), not here.

Plain sizes: imports nothing of hmmscope.
"""

from __future__ import annotations

from typing import Any

QUICK: dict[str, Any] = {
    # training: the smoke sweep's trial size, with 2 layers (the analysis compares layers)
    "hmm.n_tasks": 8, "hmm.n_states": 8, "hmm.rank": 4,
    "data.n_demos": 2, "data.l_demo": 16, "data.l_test": 16, "data.n_train": 512, "data.n_eval": 64,
    "model.n_layers": 2, "model.n_heads": 2, "model.d_model": 32, "model.d_mlp": 64, "model.max_len": 64,
    "train.steps": 150, "train.batch_size": 16, "train.warmup": 10, "train.eval_every": 50, "train.ckpt_every": 50,
    "train.emergence_episodes": 16, "eval.family_tasks": 32, "eval.fit_episodes": 32,
    # theory: three gammas (an exponent fit), 2 HMM draws per setting (the rates' CIs)
    "theory.gammas": (0.3, 0.6, 0.9), "theory.ranks": (4,), "theory.n_states": (16,), "theory.n_tokens": 8,
    "theory.lengths": (1, 2, 4, 8, 12), "theory.n_histories": 200, "theory.burn_in": 50, "theory.draws": 2,
}
QUICK_SWEEP = "smoke-quick"
QUICK_SWEEP_SETS = {"train.steps": 40, "data.n_train": 256, "data.n_eval": 32, "train.emergence_episodes": 8,
                    "eval.family_tasks": 16, "eval.fit_episodes": 16, "train.figures": False}
