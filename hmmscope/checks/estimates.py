"""A job's peak memory by term and its floor on the work, from the config alone (no allocation): `memory_estimate`
(train, analyze, evaluate, theory, generate, ...), `model_params`, `train_flops`; the interpreter's own footprint
(RUNTIME_BYTES). tests/measure_memory.py prints real jobs' peaks beside the estimates.
"""

from __future__ import annotations

import dataclasses

from ..config import Config, DataConfig, HMMConfig, ModelConfig, TheoryConfig, seq_len, training_tasks

GIB = 1 << 30


# The interpreter with what a job imports, as peak RSS: with torch and MLflow (RUNTIME_BYTES), or numpy only for
# generate (RUNTIME_NUMPY_BYTES); tests/measure_memory.py prints real jobs' peaks beside the estimates.
RUNTIME_BYTES = 5 * GIB // 8
RUNTIME_NUMPY_BYTES = GIB // 8
ORACLE_CHUNK = 256  # tasks per chunk of the mixture oracle (inference.mixture_oracle's default)


def _p2(k: int) -> int:
    return 1 << (k - 1).bit_length()


def model_params(m: ModelConfig, vocab_size: int) -> int:
    """Parameters of model.Transformer (tied embedding counted once; LayerNorms; no linear biases)."""
    D, M = m.d_model, m.d_mlp
    n = vocab_size * D + m.n_layers * (4 * D * D + 2 * D * M + 4 * D) + 2 * D
    return n + (m.max_len * D if m.pos_enc == "absolute" else 0)


def train_flops(cfg: Config, steps: int | None = None) -> float:
    """A floor on the floating-point work of training: 6 per parameter per token (forward and backward through
    every weight, the tied embedding's logits included) x batch_size x (episode tokens - 1) x steps (default
    train.steps). Attention, the optimizer and evaluations are not counted: the true work is larger."""
    tokens = cfg.train.batch_size * (seq_len(cfg.data) - 1)
    return 6.0 * model_params(cfg.model, cfg.hmm.n_tokens + 1) * tokens * (cfg.train.steps if steps is None else steps)


def _mixture_bytes(h: HMMConfig) -> int:
    """The larger of make_mixture's peak (float64 factors W, Q and three live (n, S, V) emission
    temporaries) and what stays: the float64 parameters, episodes' float32 inverse-CDF tables (rows
    padded to powers of two) and the float64 cumulative sum of the largest one."""
    n, S, d, V = h.n_tasks, h.n_states, h.rank, h.n_tokens
    build = 8 * n * S * (1 + 2 * d + 3 * V)
    rows = [(n, S), (n * S, d), (n * d, S), (n * S, V)]
    tables = sum(4 * r * _p2(k) for r, k in rows) + max(8 * r * k for r, k in rows)
    return max(build, 8 * n * S * (1 + 2 * d + V) + tables)


def _episodes_bytes(h: HMMConfig, d: DataConfig, n: int) -> int:
    """sample_episodes: tokens + states (N, T) and the sampler's (N (k+1), L) pair, int16 (int32 past 2**15)
    plus its float32 uniforms and intp task/state vectors per sequence."""
    it = 2 if max(h.n_tokens + 1, h.n_states) < 2**15 else 4
    L = max(d.l_demo, d.l_test)
    return n * (2 * it * seq_len(d) + (d.n_demos + 1) * (2 * it * L + 32))


def _oracle_bytes(h: HMMConfig, d: DataConfig, n: int, predictors: int = 1) -> int:
    """mixture_oracle over n episodes in float64, a chunk of C tasks at a time: the scaled forward tables
    (C, N, V d + V) (two buffers, the update, the gathered rows), the kernels (C, S, V d + V) x 2, and
    `predictors` (N, T, V) predictions with the running mixture (x 4)."""
    C, S, V, dd, T = min(ORACLE_CHUNK, h.n_tasks), h.n_states, h.n_tokens, h.rank, seq_len(d)
    return 8 * (4 * C * n * (V * dd + V) + 2 * C * S * (V * dd + V) + (3 + predictors) * n * T * V)


def _train_bytes(cfg: Config, batch_size: int, T: int) -> dict[str, int]:
    m = cfg.model
    vocab = cfg.hmm.n_tokens + 1
    D, M, H, L = m.d_model, m.d_mlp, m.n_heads, m.n_layers
    act = 4 * batch_size * T * (L * (14 * D + 3 * M) + 4 * vocab)  # float32 tensors kept for backward
    if m.window > 0:  # a boolean band mask pushes SDPA onto the math path: (B, H, T, T) weights per layer
        act += 4 * batch_size * H * T * T * 2 * L
    return {"model + AdamW state": 16 * model_params(m, vocab),  # float32 weights, grads and two moments
            "causal mask (max_len^2)": m.max_len ** 2, "activations": act}


def _theory_bytes(th: TheoryConfig) -> dict[str, int]:
    """One setting at a time, at the largest S and d: the dense S x S chain (transition, its factor check,
    the complex eigen-decomposition for the stationary law, Dobrushin's 64-row chunks), and the
    n_histories x (burn_in + max L) histories with the filter's gathers and (B, V d) tables."""
    S, d, V = max(th.n_states), max(th.ranks), th.n_tokens
    n, Hn = th.n_histories, th.burn_in + max(th.lengths)
    return {"dense transition (S x S)": 8 * S * S * (12 + 2 * min(S, 64)),
            "histories": n * Hn * 41 + 8 * n * (V * d + V) * 6}


def memory_estimate(cfg: Config, job: str = "train", *, n_episodes: int | None = None,
                    batch_size: int | None = None, seq: int | None = None,
                    probe_episodes: int = 0, n_perms: int = 0) -> dict[str, tuple[int, str]]:
    """Peak memory of `job` from the config alone: {term: (bytes, "host" | "device")}.

    "device" terms live on the training device (host memory too when it is the CPU). Jobs:
    generate (n_episodes episodes), train (training set, held-out set, mixture oracle, model with AdamW,
    activations of one batch), evaluate and analyze (n_episodes held-out episodes, default data.n_eval; analyze's
    probe_episodes and the shuffle test's n_perms too), theory, bench-train (batch_size x seq tokens),
    bench-oracle (the mixture oracle on n_episodes). The numbers are upper-leaning estimates of what the code keeps
    alive at its peak, read off the code (see each helper's docstring); they are meant to come out somewhat above
    the peak RSS of real CPU runs (tests/measure_memory.py prints both), which is what refusing an impossible job
    needs.
    """
    d = cfg.data
    h = dataclasses.replace(cfg.hmm, n_tasks=training_tasks(cfg.hmm, d))  # fresh tasks: one per training episode
    out: dict[str, tuple[int, str]] = {"runtime": (RUNTIME_NUMPY_BYTES if job == "generate" else RUNTIME_BYTES, "host")}
    if job == "theory":
        out.update({k: (v, "host") for k, v in _theory_bytes(cfg.theory).items()})
        return out
    if job == "bench-train":
        out.update({k: (v, "device") for k, v in _train_bytes(cfg, batch_size or 32, seq or 256).items()})
        return out
    out["mixture"] = (_mixture_bytes(h), "host")
    T = seq_len(d)
    if job == "generate":
        out["episodes"] = (_episodes_bytes(h, d, n_episodes or d.n_train), "host")
    elif job == "bench-oracle":
        out["episodes"] = (_episodes_bytes(h, d, n_episodes or d.n_eval), "host")
        out["mixture oracle"] = (_oracle_bytes(h, d, n_episodes or d.n_eval), "host")
    elif job == "train":
        out["episodes"] = (_episodes_bytes(h, d, d.n_train + d.n_eval), "host")
        out["training tokens (int64)"] = (8 * d.n_train * T, "device")
        out["mixture oracle"] = (_oracle_bytes(h, d, d.n_eval), "device")
        out.update({k: (v, "device") for k, v in _train_bytes(cfg, cfg.train.batch_size, T - 1).items()})
        n_em = min(cfg.train.emergence_episodes, d.n_eval)
        if n_em > 0:  # emergence.prepare: data.n_eval unseen tasks and episodes, the oracles on n_em episodes per
            # set, and what stays: 2 sets x (n_demos + 1) k of two oracles' predictions and 4 references' 4 metrics
            kept = 2 * (d.n_demos + 1) * n_em * d.l_test * 8 * (2 * h.n_tokens + 16)
            out["emergence references"] = (_mixture_bytes(dataclasses.replace(h, n_tasks=d.n_eval)) + _episodes_bytes(
                h, d, d.n_eval) + _oracle_bytes(h, d, n_em, predictors=2) + kept, "host")
    elif job in ("evaluate", "analyze"):
        n = n_episodes or d.n_eval
        out["episodes"] = (_episodes_bytes(h, d, n), "host")
        out["model"] = (4 * model_params(cfg.model, h.n_tokens + 1), "device")
        out["causal mask (max_len^2)"] = (cfg.model.max_len ** 2, "device")
        if job == "evaluate":  # figure1: the mixture oracle with model, task-oracle and mixture predictions
            out["oracles"] = (_oracle_bytes(h, d, n, predictors=3), "device")
            # seen and unseen tasks: each k keeps two oracles' predictions and 4 per-token metrics of 6 references
            # on the scored tokens; the EM learner (em_learner.fit_hmm_em, 8 states, 4 restarts) works in chunks of
            # at most em_learner.EM_CHUNK_BYTES (256 MiB)
            out["references (seen + unseen)"] = (2 * 8 * n * d.l_test * (d.n_demos + 1) * (2 * h.n_tokens + 24), "host")
            ev = cfg.eval  # the family-Bayes tasks (its oracle in chunks, as the mixture oracle's), unseen and fit tasks
            out["family, unseen and fit tasks"] = (_mixture_bytes(dataclasses.replace(h, n_tasks=max(1, ev.family_tasks)))
                                                   + _mixture_bytes(dataclasses.replace(h, n_tasks=n + ev.fit_episodes))
                                                   + _oracle_bytes(h, d, n, predictors=1), "host")
            em_rows = n * d.n_demos * (d.n_demos + 1) // 2 * 4
            out["EM learner"] = (min(256 << 20, em_rows * 8 * d.l_demo * 8 * 8), "host")
        else:  # probes: layer chunks within a 1 GiB budget, task beliefs and the shuffle test's batches
            out["residual streams"] = (min(GIB, 4 * n * 32 * cfg.model.d_model * (cfg.model.n_layers + 1)), "host")
            out["beliefs and targets"] = (n * 32 * (4 * h.n_states + 64), "host")
            if n_perms:  # shuffle.shuffle_test: the (n_perms, n, k) int64 orders drawn at once, then one episode's
                # 1 + n_perms rows at a time at least (their tokens, one layer's scores, the residual stream)
                T, m = seq_len(d), cfg.model
                out["shuffle permutations"] = (8 * n_perms * n * d.n_demos + (1 + n_perms) * (
                    (T - 1) ** 2 * m.n_heads * 4 + 8 * T + 4 * T * m.d_model), "host")
            if probe_episodes:  # episodes.probe_episodes: probe_tasks x per_task episodes and their beliefs
                out["probe episodes"] = (_episodes_bytes(h, d, probe_episodes)
                                         + probe_episodes * 32 * (4 * h.n_states + 64), "host")
    else:
        raise ValueError(f"unknown job {job!r}")
    return out
