"""The one command's plan (analysis/gpu/paper_once.py): when each phase must end, and the training variant and step
count from the bench rows (pure arithmetic and the printed formula); and what is checked before any phase: the flags'
ranges (`flag_problem`) and the device (`device_problem`). Tests: tests/test_gpu_session.py."""

from __future__ import annotations

import json
import subprocess
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


# the flags' ranges (paper_once.py's `run`), checked before any phase: (flag, lowest, highest or None, lowest allowed)
SECONDS_FLAGS = ("setup_s", "bench_s", "train_fixed_s", "train_grace_s", "train_post_s", "fig1_s", "analyze_s",
                 "analyze_min_s", "pack_s", "min_phase_s")  # seconds, >= 0
COUNT_FLAGS = ("bench_steps", "target_steps", "max_steps", "quantum", "eval_points", "fig1_episodes",
               "analyze_episodes", "probe_tasks", "min_per_task")  # counts, >= 1
LIMIT_MARGIN_S = 5.0  # nothing runs past --limit minus this


def flag_problem(args) -> str | None:
    """Why the `run` flags cannot make a session (one line naming the flag), or None. Every float is finite (argparse
    takes `nan` and `inf`); --limit is over LIMIT_MARGIN_S and --deadline in (0, --limit - LIMIT_MARGIN_S]; every
    phase cap in seconds >= 0, --train-ratio > 0; every count >= 1 (--quantum 0 divided by zero after the bench;
    --steps -3 ran every phase); --family-tasks >= 0; --probe-jobs a positive integer."""
    import math

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    for name, v in sorted(vars(args).items()):
        if isinstance(v, float) and not math.isfinite(v):
            return f"{flag(name)} {v}: give a finite number"
    if args.limit <= LIMIT_MARGIN_S:
        return f"--limit {args.limit:g}: give the device call's timeout in seconds, over {LIMIT_MARGIN_S:g}"
    if not 0 < args.deadline <= args.limit - LIMIT_MARGIN_S:
        return (f"--deadline {args.deadline:g}: give seconds in (0, {args.limit - LIMIT_MARGIN_S:g}] (--limit "
                f"{args.limit:g} less {LIMIT_MARGIN_S:g} s: nothing runs past it)")
    for name in SECONDS_FLAGS:
        if getattr(args, name) < 0:
            return f"{flag(name)} {getattr(args, name):g}: give seconds >= 0"
    if args.train_ratio <= 0:
        return f"--train-ratio {args.train_ratio:g}: give a ratio > 0"
    for name in (*COUNT_FLAGS, "steps"):
        v = getattr(args, name)
        if v is not None and v < 1:
            return f"{flag(name)} {v}: give a count >= 1"
    if args.family_tasks is not None and args.family_tasks < 0:
        return f"--family-tasks {args.family_tasks}: give a count >= 0"
    if args.probe_jobs is not None and not (str(args.probe_jobs).isascii() and str(args.probe_jobs).isdigit()
                                            and int(args.probe_jobs) >= 1):
        return f"--probe-jobs {args.probe_jobs!r}: give a count >= 1"
    return None


def device_problem(device: str, python: str) -> str | None:
    """Why `device` cannot run the phases (one line), or None: a CUDA device asked for where `python` (the bench's)
    sees none (its torch says so; without torch, `nvidia-smi -L` lists no GPU). Other devices: None."""
    if not device.startswith("cuda"):
        return None
    index = device.partition(":")[2] or "0"
    probe = ("import sys, torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; print(n); "
             f"sys.exit(0 if n > {int(index) if index.isdigit() else 0} else 3)")
    try:
        r = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
        if r.returncode in (0, 3):
            return None if r.returncode == 0 else (f"--device {device}: CUDA is not available here ({python}'s torch "
                                                   f"sees {r.stdout.strip() or 0} CUDA device(s)); give --dry for the "
                                                   "CPU rehearsal")
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
        if smi.returncode == 0 and "GPU" in smi.stdout:
            return None
    except (OSError, subprocess.SubprocessError):
        pass
    return f"--device {device}: no CUDA device here (no torch that sees one, no GPU from nvidia-smi -L); give --dry " \
           "for the CPU rehearsal"
