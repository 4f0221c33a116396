"""The one command's plan (analysis/gpu/paper_once.py): when each phase must end, and the training variant and step
count from the bench rows. Pure arithmetic and the printed formula (tests/test_gpu_session.py)."""

from __future__ import annotations

import json
from pathlib import Path

PHASES = ("setup", "bench", "train", "figure1", "analyze", "pack")


def phase_ends(deadline: float, pack_s: float, analyze_s: float, fig1_s: float, phases=PHASES) -> dict[str, float]:
    """The latest end of each late phase, in seconds after the start: pack starts by deadline - pack_s, analyze
    ends there, Figure 1 ends analyze_s before, training fig1_s before that (a phase left out takes no time)."""
    pack = deadline - (pack_s if "pack" in phases else 0)
    analyze = pack
    fig1 = analyze - (analyze_s if "analyze" in phases else 0)
    train = fig1 - (fig1_s if "figure1" in phases else 0)
    return {"train": train, "figure1": fig1, "analyze": analyze, "pack": pack, "deadline": deadline}


def plan_steps(step_s: float, window_s: float, *, fixed_s: float, compile_s: float = 0.0, ratio: float = 1.0,
               quantum: int = 256, max_steps: int | None = None) -> int:
    """Training steps that fit a window of window_s seconds: floor((window_s - fixed_s - compile_s) / (step_s x
    ratio) / quantum) x quantum, at least one quantum, at most max_steps. fixed_s: what the train phase spends besides
    steps (start, data, oracles, evaluations, checkpoint); ratio: a training step's time over the bench's."""
    fit = max(0.0, window_s - fixed_s - compile_s) / (step_s * ratio)
    if max_steps is not None:
        fit = min(fit, max_steps)
    return max(quantum, int(fit // quantum) * quantum)


def bench_rows(bench_json: Path) -> list[dict]:
    """The rows `bench train --variants --json` wrote (none if it wrote nothing, or half a file)."""
    try:
        return json.loads(bench_json.read_text()).get("rows", [])
    except (OSError, ValueError):
        return []


def make_plan(s, args, ends: dict, bench_json: Path) -> dict:
    """The step variant and the step count (paper_once's docstring, 'plan'), printed (s.say: the Session) and returned."""
    from hmmscope.training.bench_variants import choose_variant, parse_variant

    window = ends["train"] - s.now()
    rows = bench_rows(bench_json)
    best, why = choose_variant(rows, max(0.0, window - args.train_fixed_s), ratio=args.train_ratio) if rows else (None, [])
    for line in why:
        s.say(f"plan: {line}")
    if best is None:
        comp, att = parse_variant("eager")
        steps = args.steps or args.target_steps
        plan = {"variant": "eager", "compile": comp, "attention": att, "steps": steps, "measured": False,
                "formula": f"no bench rows: {'--steps' if args.steps else '--target-steps'} = {steps}, stopped by "
                           "train's own --deadline if they do not fit"}
    else:
        steps = args.steps or plan_steps(best["step_s"], window, fixed_s=args.train_fixed_s, compile_s=best["compile_s"],
                                         ratio=args.train_ratio, quantum=args.quantum, max_steps=args.max_steps)
        plan = {"variant": best["variant"], "compile": best["compile"], "attention": best["attention"], "steps": steps,
                "measured": True, "step_s": best["step_s"], "compile_s": best["compile_s"], "mfu": best["mfu"],
                "window_s": window, "fixed_s": args.train_fixed_s, "ratio": args.train_ratio, "quantum": args.quantum,
                "formula": (f"--steps {steps}" if args.steps else
                            f"floor((window {window:.0f} s - fixed {args.train_fixed_s:g} s - compile "
                            f"{best['compile_s']:.1f} s) / ({best['step_s'] * 1e3:.2f} ms x {args.train_ratio:g}) / "
                            f"{args.quantum}) x {args.quantum} = {steps}"
                            + (f" (capped at --max-steps {args.max_steps})" if args.max_steps and steps == args.max_steps
                               else ""))}
    plan["target_steps"] = args.target_steps
    plan["meets_target"] = plan["steps"] >= args.target_steps
    s.say(f"plan: {plan['variant']}, {plan['formula']}"
          + ("" if plan["meets_target"] else f"; BELOW the target {args.target_steps}: the deadline allows no more"))
    return plan
