"""`hmmscope bench sample | filter | oracle | counting | train | headroom`: speed benchmarks against named peers, as
ratios.

Owns: the `bench` command group (`app`), its options and their checks, the thread setting of a benchmark, and
the lines each benchmark prints. The timings themselves are `hmmscope.training.bench`.

Must not import, at module level, anything beyond typer, the standard library, `hmmscope.config`,
`hmmscope.checks` and `cli.common`: torch, numba, hmmlearn, transformers and `hmmscope.training.bench` are imported
inside the command bodies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .. import checks, safe_output
from ..checks import RUNTIME_BYTES, memory_estimate, model_params
from ..config import override, preset
from .common import ConfigOpt, DeviceOpt, ForceOpt, Preset, PrintConfigOpt, SetOpt, build_config, echo_config, user_errors

app = typer.Typer(no_args_is_help=True, help="Speed benchmarks against named peers, as ratios.")


@app.command("sample")
@user_errors
def bench_sample_cmd(
    n_seqs: Annotated[int, typer.Option(min=1, help="Sequences sampled at once.")] = 4096,
    length: Annotated[int, typer.Option(min=1, help="Tokens per sequence.")] = 256,
    paper: Annotated[bool, typer.Option(help="Also time the paper-scale dataset (131,072 episodes).")] = True,
    force: ForceOpt = False,
) -> None:
    """Sampler tokens/s vs hmmlearn's CategoricalHMM.sample on one 128-state, 16-token, rank-8 HMM."""
    checks.memory(checks.tokens_memory(n_seqs, length, "sample"), force=force)
    if paper:
        checks.memory(memory_estimate(preset("paper"), "generate"), force=force, what="the paper-scale dataset")
    from ..training.bench_inference import bench_paper_dataset, bench_sample  # lazy: numpy, torch off the CLI's start-up

    r = bench_sample(n_seqs=n_seqs, length=length)
    typer.echo(f"sample: hmmscope {r['ours_tokens_per_s']:,.0f} tokens/s ({n_seqs} x {length}), "
               f"hmmlearn {r['hmmlearn_tokens_per_s']:,.0f} tokens/s; ratio {r['ratio']:.1f}x")
    if paper:
        p = bench_paper_dataset()
        typer.echo(f"paper dataset: {p['episodes']:,.0f} episodes ({p['tokens']:,.0f} tokens) in {p['total_s']:.1f} s "
                   f"(mixture {p['mixture_s']:.1f} s, episodes {p['episodes_s']:.1f} s)")


def _bench_threads(threads: int | None) -> None:
    """Set torch's (and numba's, when installed) thread count for a benchmark; None keeps the default."""
    if threads is None:
        return
    import torch  # lazy: torch off the CLI's start-up

    torch.set_num_threads(threads)
    try:
        import numba  # lazy: numba (optional, ~0.5 s) off the CLI's start-up
    except ImportError:
        return
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


ThreadsOpt = Annotated[int | None, typer.Option(min=1, help="Threads for torch (and numba); default: torch's.")]


@app.command("filter")
@user_errors
def bench_filter_cmd(
    n_seqs: Annotated[int, typer.Option(min=1, help="Sequences filtered at once.")] = 4096,
    length: Annotated[int, typer.Option(min=1, help="Tokens per sequence.")] = 256,
    peer_length: Annotated[int, typer.Option(min=1, help="Tokens in hmmlearn's one sequence.")] = 20000,
    threads: ThreadsOpt = None,
    force: ForceOpt = False,
) -> None:
    """Filter tokens/s on one 128-state, 16-token HMM: dense vs hmmlearn, low-rank vs dense, each vs its GEMM limit."""
    checks.memory(checks.tokens_memory(n_seqs, length, "filter"), force=force)
    from ..training.bench_inference import bench_filter  # lazy: numpy, torch off the CLI's start-up

    _bench_threads(threads)
    r = bench_filter(n_seqs=n_seqs, length=length, peer_length=peer_length)
    S, V, d = r["n_states"], r["n_tokens"], r["rank"]
    typer.echo(f"filter, {n_seqs} x {length} tokens, {S} states, {V} tokens, {r['threads']} torch threads "
               f"(hmmlearn: one sequence, single-threaded); best of {r['rounds']} interleaved rounds")
    typer.echo(f"  dense   hmmscope.predictive float32  {r['dense_f32_tokens_per_s']:>12,.0f} tokens/s   <- headline")
    typer.echo(f"  dense   hmmscope.predictive float64  {r['dense_f64_tokens_per_s']:>12,.0f} tokens/s   "
               f"(float32 - float64: max |diff| {r['f32_vs_f64_max_abs']:.1e})")
    typer.echo(f"  dense   hmmlearn score, log          {r['hmmlearn_log_tokens_per_s']:>12,.0f} tokens/s   "
               f"dense float32 / this = {r['ratio_log']:.1f}x")
    typer.echo(f"  dense   hmmlearn score, scaling      {r['hmmlearn_scaling_tokens_per_s']:>12,.0f} tokens/s   "
               f"dense float32 / this = {r['ratio_scaling']:.1f}x")
    typer.echo(f"  rank {d}  hmmscope.predictive float32  {r['lowrank_f32_tokens_per_s']:>12,.0f} tokens/s   "
               f"low-rank / dense = {r['ratio_lowrank_dense']:.2f}x (max |diff| vs dense float64 "
               f"{r['lowrank_vs_dense_max_abs']:.1e})")
    typer.echo(f"  limit   fp32 GEMM ({min(n_seqs, 1024)}, {S}) x ({S}, {S}), measured now: "
               f"{r['gemm_dense_flops'] / 1e9:.1f} GFLOP/s; dense at 2 S^2 FLOPs/token: "
               f"{r['dense_flops'] / 1e9:.1f} GFLOP/s = {100 * r['dense_frac_gemm']:.0f}% "
               f"(counting the (S, S + V) product it runs: {100 * r['dense_frac_gemm_step']:.0f}% of that GEMM)")
    typer.echo(f"  limit   fp32 GEMM ({n_seqs}, {d}) x ({d}, {V * d + V}), measured now: "
               f"{r['gemm_lowrank_flops'] / 1e9:.1f} GFLOP/s; low-rank at 2 d (V d + V) FLOPs/token: "
               f"{r['lowrank_flops'] / 1e9:.1f} GFLOP/s = {100 * r['lowrank_frac_gemm']:.0f}%")


@app.command("oracle")
@user_errors
def bench_oracle_cmd(
    n_tasks: Annotated[str, typer.Option(help="Comma-separated task counts.")] = "512,2048,8192",
    n_episodes: Annotated[int, typer.Option(min=1, help="Held-out episodes timed per task count.")] = 16,
    dtype: Annotated[str, typer.Option(help="float32 or float64 (evaluate and train use float64).")] = "float64",
    threads: ThreadsOpt = None,
    device: Annotated[str, typer.Option(help="cpu (the numba kernel) or cuda / cuda:N (the torch path).")] = "cpu",
    chunk_tasks: Annotated[str, typer.Option(help="On CUDA: comma-separated tasks per chunk to time, "
                                                  "'auto' for the oracle's own choice.")] = "auto",
    force: ForceOpt = False,
) -> None:
    """Mixture-oracle cost vs n_tasks at the paper's shape (128 states, 16 tokens, rank 8, 358 tokens)."""
    from ..training.bench_inference import bench_oracle  # lazy: numpy, torch off the CLI's start-up
    from ..training.train import resolve_device  # lazy: numpy, torch off the CLI's start-up

    dev = resolve_device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {device!r}")
    try:
        chunks = [None if x.strip() == "auto" else int(x) for x in chunk_tasks.split(",")]
    except ValueError:
        raise ValueError(f"--chunk-tasks must be 'auto' or comma-separated integers, got {chunk_tasks!r}") from None
    if any(c is not None and c < 1 for c in chunks):
        raise ValueError(f"--chunk-tasks must be positive, got {chunk_tasks!r}")
    if dev.type == "cpu" and chunks != [None]:
        raise ValueError("--chunk-tasks applies to --device cuda (the CPU kernel chooses its own chunks)")

    if dtype not in ("float32", "float64"):
        raise ValueError(f"--dtype must be float32 or float64, got {dtype!r}")
    try:
        counts = [int(x) for x in n_tasks.split(",")]
    except ValueError:
        raise ValueError(f"--n-tasks must be comma-separated integers, got {n_tasks!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--n-tasks must be positive, got {n_tasks!r}")
    paper = preset("paper")
    for n in sorted(set(counts)):  # the task counts run one after another: each must fit
        checks.memory(memory_estimate(override(paper, {"hmm.n_tasks": n}), "bench-oracle", n_episodes=n_episodes),
                      device=str(dev), force=force, what=f"the mixture oracle at n_tasks {n}")
    _bench_threads(threads)
    r = bench_oracle(tuple(counts), n_episodes=n_episodes, dtype=dtype, device=str(dev), chunks=tuple(chunks))
    if dev.type == "cuda":
        typer.echo(f"mixture oracle ({r['path']}, {r['dtype']}), {n_episodes} episodes x 358 tokens")
        for row in r["rows"]:
            full = ("measured on the 1024 episodes" if row["measured_full"]
                    else f"1024 episodes, extrapolated: {row['full_s']:.2f} s")
            typer.echo(f"  n_tasks {row['n_tasks']:>5}, chunk {row['chunk_tasks']:>5}"
                       f"{' (auto)' if row['auto_chunk'] else ''}: {row['seconds']:8.3f} s wall, "
                       f"{row['ns_per_task_token']:.3f} ns per (task, episode, token), peak {row['peak_gib']:.1f} GiB; "
                       f"{full}; max |cuda - cpu| {row['max_abs_vs_cpu']:.1e} on 2 episodes")
        return
    typer.echo(f"mixture oracle ({r['path']}, {r['dtype']}, {r['threads']} threads), {n_episodes} episodes x 358 tokens")
    for row in r["rows"]:
        peer = (f"; torch path (CUDA's) {row['torch_path_s_per_episode']:.2f} s/episode = "
                f"{row['torch_path_ratio']:.1f}x slower" if "torch_path_ratio" in row else "")
        typer.echo(f"  n_tasks {row['n_tasks']:>5}: {row['seconds']:8.2f} s wall ({row['cpu_seconds']:.2f} s CPU; "
                   f"tables {row['tables_s']:.2f} s), {row['ns_per_task_token']:6.1f} ns per (task, episode, token) "
                   f"past the tables; 1024 episodes, {'measured' if n_episodes == 1024 else 'extrapolated'}: "
                   f"{row['extrapolated_full_s']:6.0f} s wall, {row['extrapolated_full_cpu_s']:6.0f} s CPU{peer}")


@app.command("counting")
@user_errors
def bench_counting_cmd(
    n_episodes: Annotated[int, typer.Option(min=1, help="Episodes of the paper's shape (358 tokens, V = 16).")] = 1024,
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved timing rounds (best of each).")] = 3,
    force: ForceOpt = False,
) -> None:
    """The fair counting baselines (n-gram order 3, CTW depth 3) and their fit vs the add-one bigram, same episodes."""
    # peak: the int16 episodes, the n-gram's counts and each predictor's float64 output (V = 16: 128 B per token
    # each, about 4 alive at once) beside the counting code's fixed chunk buffers (oracles/baselines.py, under 256 MiB)
    tokens = n_episodes * 358
    checks.memory({"runtime": (RUNTIME_BYTES, "host"), "counting buffers": (256 << 20, "host"),
                   f"{n_episodes} x 358 tokens": (4 * 128 * tokens, "host")}, force=force)
    from ..training.bench_inference import bench_counting  # lazy: numpy, torch off the CLI's start-up

    r = bench_counting(n_episodes=n_episodes, rounds=rounds)
    typer.echo(f"counting baselines, {n_episodes} episodes x {r['seq_len']} tokens, V = {r['n_tokens']}; "
               f"best of {rounds} interleaved rounds")
    typer.echo(f"  incontext_bigram (peer)        {r['bigram_s']:8.3f} s")
    typer.echo(f"  incontext_ngram order 3        {r['ngram_s']:8.3f} s   {r['ngram_ratio']:.2f}x the bigram")
    typer.echo(f"  incontext_ctw depth 3          {r['ctw_s']:8.3f} s   {r['ctw_ratio']:.2f}x the bigram")
    typer.echo(f"  fit_counting, full grid, k = 0..4, {r['fit_episodes']} tiny episodes: {r['fit_s']:.3f} s = "
               f"{r['fit_ratio']:.1f}x the bigram on the same 5 truncations ({r['fit_bigram_s']:.3f} s)")


@app.command("train")
@user_errors
def bench_train_cmd(
    preset_: Annotated[Preset, typer.Option("--preset", help="Model shape to time.")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    device: DeviceOpt = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 32,
    seq_len: Annotated[int, typer.Option(min=2)] = 256,
    steps: Annotated[int, typer.Option(min=1, help="Timed steps per repeat.")] = 5,
    peer: Annotated[bool, typer.Option(help="Also time HF transformers' RoFormerForCausalLM.")] = True,
    profile: Annotated[bool, typer.Option(help="One number per source of loss vs the measured GEMM rate.")] = False,
    compile_: Annotated[bool, typer.Option("--compile", help="Time torch.compile(model), its compile time and break-even steps.")]
    = False,
    variants: Annotated[str | None, typer.Option(
        help="Comma-separated training-step variants <compile>[+<attention>] to time one after another from the same "
             "weights (compile: eager, model, model-autotune, model-graphs, blocks, blocks-head; attention: auto, "
             "flash, efficient, cudnn, math), e.g. eager,blocks,blocks-head: step time, one-off (compile) time, MFU, "
             "losses vs the first.")] = None,
    json_: Annotated[Path | None, typer.Option("--json", help="With --variants: write the rows here (JSON), "
                                                              "rewritten as each variant is done.")] = None,
    threads: ThreadsOpt = None,
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Training tokens/s and MFU (vs the matmul rate measured in the same run) for a preset's model, vs HF RoFormer."""
    cfg = build_config(preset_, config, set_, {"train.device": device})
    if print_config:
        return echo_config(cfg, ("hmm", "data", "model", "train"))
    names = None
    if variants is not None:
        from ..training.bench_variants import parse_variant  # lazy: numpy, torch off the CLI's start-up

        names = [v.strip() for v in variants.split(",")]
        for v in names:
            parse_variant(v)
        if compile_ or profile:
            raise ValueError("--variants times each variant itself: leave out --compile and --profile")
    if json_ is not None:
        if names is None:
            raise ValueError("--json writes the --variants rows: give --variants")
        checks.output_file(json_, "--json", ".json")
    from ..training.bench import bench_train  # lazy: numpy, torch off the CLI's start-up
    from ..training.train import resolve_device  # lazy: numpy, torch off the CLI's start-up

    dev = resolve_device(cfg.train.device)
    need = memory_estimate(cfg, "bench-train", batch_size=batch_size, seq=seq_len)
    checks.memory(need, device=str(dev), force=force, times=2 if peer else 1)
    checks.duration(6.0 * model_params(cfg.model, cfg.hmm.n_tokens + 1) * batch_size * seq_len * steps, device=str(dev),
                    force=force, what=f"bench train's {steps:,} timed steps")  # the floor of checks.train_flops
    _bench_threads(threads)
    if names is not None:
        _bench_variants(cfg, names, batch_size, seq_len, steps, json_)
        if not peer:
            return
    r = bench_train(cfg, cfg.train.device, batch_size=batch_size, seq_len=seq_len, steps=steps, peer=peer,
                    profile=profile, compile=compile_)
    typer.echo(f"train ({r['device']}{', compiled' if r['compiled'] else ''}, {r['shape']}): "
               f"hmmscope {r['ours_tokens_per_s']:,.0f} tokens/s, {r['flops_per_token'] / 1e6:,.2f} MFLOP/token "
               f"counted (6 N + attention), {r['ours_tflops']:.3f} TFLOP/s")
    for k, rate in r["measured_rates"].items():
        tag = "  <- MFU" if k == r["mfu_denominator"] else ""
        typer.echo(f"  {k} GEMM {r['gemm_shapes'][k]} measured now: {rate / 1e12:.3f} TFLOP/s (the best of "
                   f"{', '.join(f'{s} {v / 1e12:.3f}' for s, v in r['gemm_rates'][k].items())}); "
                   f"MFU {100 * r['mfu_all'][k]:.1f}%{tag}")
    if r["cpu_bf16_native"] is False:
        typer.echo("  bf16: this CPU has no native bf16 matmul (no AVX512-BF16/AMX); not measured")
    if r["datasheet_bf16"]:
        typer.echo(f"  ({r['datasheet_what']}: {r['datasheet_bf16'] / 1e12:.0f} TFLOP/s, "
                   f"{100 * r['ours_tflops'] * 1e12 / r['datasheet_bf16']:.1f}% of it; not the MFU denominator)")
    if "profile" in r:
        p = r["profile"]
        typer.echo(f"  profile, seconds per step: step {p['step_s']:.4f} = ideal at the measured GEMM rate "
                   f"{p['ideal_s']:.4f} ({100 * p['ideal_s'] / p['step_s']:.0f}%)")
        for k in ("attention", "optimizer", "other"):
            typer.echo(f"    lost to {k:<9} {p[k + '_s']:.4f} ({100 * p[k + '_s'] / p['step_s']:.0f}% of the step)")
        typer.echo(f"    data (outside the step) {p['data_s']:.4f} ({100 * p['data_s'] / p['step_s']:.0f}% of the step)")
    if "compile_s" in r:
        typer.echo(f"  compile: {r['compile_s']:.1f} s once; step {r['eager_step_s']:.4f} s eager vs "
                   f"{r['compiled_step_s']:.4f} s compiled: pays after {r['break_even_steps']:,.0f} steps per call")
    if "ratio" in r:
        typer.echo(f"peer HF RoFormerForCausalLM: {r['hf_roformer_tokens_per_s']:,.0f} tokens/s; "
                   f"ratio {r['ratio']:.2f}x")


@app.command("headroom")
@user_errors
def bench_headroom_cmd(
    preset_: Annotated[Preset, typer.Option("--preset", help="Family and layout (hmm, data, eval sections).")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    n_episodes: Annotated[int, typer.Option(min=2, max=1 << 20, help="Unseen episodes scored.")] = 256,
    family_tasks: Annotated[int | None, typer.Option("--family-tasks", min=1, max=1 << 20,
                                                     help="M (default eval.family_tasks).")] = None,
    em: Annotated[bool, typer.Option(help="Include the EM learner in the timed headroom.")] = False,
    repeats: Annotated[int, typer.Option(min=1, max=100, help="Timed rounds (best of).")] = 2,
    threads: ThreadsOpt = None,
    force: ForceOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """`hmmscope headroom`'s cost against one mixture-oracle pass over the same M family tasks and episodes."""
    cfg = build_config(preset_, config, set_)
    if family_tasks is not None:
        cfg = override(cfg, {"eval.family_tasks": family_tasks})
    if print_config:
        return echo_config(cfg, ("hmm", "data", "eval"))
    if cfg.eval.family_tasks < 1 or cfg.eval.fit_episodes < 8:
        raise ValueError("the headroom needs eval.family_tasks >= 1 and eval.fit_episodes >= 8")
    est = memory_estimate(override(cfg, {"hmm.n_tasks": cfg.eval.family_tasks}), "bench-oracle",
                          n_episodes=max(n_episodes, cfg.eval.fit_episodes))
    checks.memory(est, force=force, what="the headroom's references")
    _bench_threads(threads)
    from ..training.bench_inference import bench_headroom  # lazy: numpy, torch off the CLI's start-up

    r = bench_headroom(cfg, n_episodes=n_episodes, em=em, repeats=repeats)
    typer.echo(f"headroom ({cfg.hmm.family}, S {cfg.hmm.n_states}, V {cfg.hmm.n_tokens}, M {r['family_tasks']}, "
               f"{n_episodes} episodes, k = 0..{r['k_max']}{', EM' if em else ''}): {r['headroom_s']:.2f} s "
               f"(references: family draw and counting fit {r['references_s']:.2f} s); peer: one mixture-oracle pass "
               f"over the same tasks and episodes {r['oracle_pass_s']:.3f} s; ratio {r['ratio']:.1f} passes")


@app.command("bayes")
@user_errors
def bench_bayes_cmd(
    preset_: Annotated[Preset, typer.Option("--preset", help="Family and layout (hmm, data, eval sections).")] = Preset.tiny,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    n_episodes: Annotated[int, typer.Option(min=2, max=1 << 16, help="Unseen episodes scored (k = n_demos).")] = 512,
    peer_tasks: Annotated[int, typer.Option(min=1, max=1 << 20, help="Tasks of the peer: family Bayes at this M.")] = 4096,
    threads: ThreadsOpt = 1,
    print_config: PrintConfigOpt = False,
) -> None:
    """The Bayes-optimal reference for fresh tasks to convergence, in CPU seconds, beside family Bayes (the mixture
    oracle over --peer-tasks family tasks) on the same episodes in the same process."""
    cfg = build_config(preset_, config, set_)
    if print_config:
        return echo_config(cfg, ("hmm", "data", "eval"))
    from ..oracles.bayes_structures import why_not  # lazy: numpy off the CLI's start-up

    reason = why_not(cfg.hmm)
    if reason:
        raise ValueError(f"no exact Bayes reference for this family: {reason}")
    _bench_threads(threads)
    from ..training.bench_inference import bench_bayes  # lazy: numpy, torch off the CLI's start-up

    r = bench_bayes(cfg, n_episodes=n_episodes, peer_tasks=peer_tasks)
    h = cfg.hmm
    typer.echo(f"bayes ({h.family}, S {h.n_states}, V {h.n_tokens}, d {h.rank}, gamma {h.gamma:g}, rho {h.rho:g}; "
               f"{r['orbits']} orbits of {r['structures']} structures; {n_episodes} episodes, k = {cfg.data.n_demos}; "
               f"{r['threads']} thread): CE {r['ce']:.4f} (Monte Carlo se {r['mc_se']:.4f}), K = {r['n_draws']} draws, "
               f"{'converged' if r['converged'] else 'NOT converged'} to {r['tol']:g} "
               f"({', '.join(f'K={k}: {c:.4f}' for k, c in r['history'])})")
    typer.echo(f"  {r['cpu_s']:.1f} s CPU ({r['wall_s']:.1f} s wall), {r['ns_per_hyp_token']:.2f} ns CPU per "
               f"(hypothesis, episode, token); peer: family Bayes at M = {r['peer_tasks']} on the same episodes "
               f"{r['peer_cpu_s']:.1f} s CPU ({r['peer_wall_s']:.1f} s wall), {r['peer_ns_per_task_token']:.2f} ns per "
               f"(task, episode, token); ratio {r['ratio_cpu']:.1f}x the peer's CPU")


def _bench_variants(cfg, names: list[str], batch_size: int, seq_len: int, steps: int, json_: Path | None) -> None:
    """`bench train --variants`: one line per variant as it is done (and the rows in --json, rewritten each time)."""
    from ..training.bench_variants import bench_variants  # lazy: numpy, torch off the CLI's start-up

    head: dict = {}

    def write() -> None:
        if json_ is not None:
            safe_output.write_text(json_, json.dumps(head, indent=1))

    def on_start(h: dict) -> None:
        head.update(h)
        typer.echo(f"train step variants ({h['device']}{', ' + h['device_name'] if h.get('device_name') else ''}, "
                   f"{h['shape']}, {h['precision']}; {steps} steps x {h['repeats']} repeats each, from the same weights); "
                   f"{h['gemm_dtype']} GEMM {h['gemm_shape']} measured now: {h['gemm_rate'] / 1e12:.3f} TFLOP/s "
                   "(the MFU denominator)")
        write()

    def on_row(row: dict) -> None:
        if row["error"]:
            typer.echo(f"  {row['variant']:<14} error: {row['error']}")
        else:
            typer.echo(f"  {row['variant']:<14} {row['step_s'] * 1e3:9.2f} ms/step  {row['tokens_per_s']:>12,.0f} tokens/s  "
                       f"MFU {100 * row['mfu']:5.1f}%  one-off {row['compile_s']:6.1f} s  loss vs {names[0]}: "
                       f"first {row['loss_first_rel']:.1e}, last {row['loss_last_rel']:.1e}")
        head["rows"] = [*head.get("rows", []), row]
        write()

    bench_variants(cfg, cfg.train.device, batch_size=batch_size, seq_len=seq_len, steps=steps, variants=names,
                   on_start=on_start, on_row=on_row)
