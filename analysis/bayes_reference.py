"""The Bayes-optimal reference (SCIENCE.md 10) for the cells of the inference-ablations record, from the configs alone.

    python analysis/bayes_reference.py --out analysis/results/inference-ablations-cpu/bayes [--seeds 0,1,2]

For each family cell of the record (sweeps/inference-ablations-*.toml: gamma 0.6 / 0.8 / 0.95 at d = 4, d = 2 / 3 at
gamma 0.8) and seed, the same 512 unseen episodes every run of that cell and seed was scored on (episodes.
unseen_episodes with data.seed = seed: nothing is retrained, nothing read from a store) are scored by
- the Bayes reference (oracles/bayes.py) at k = 0, 1, 2, converged to eval.bayes_tol (its Monte Carlo error and K);
- best counting (fitted on the same 256 fit-task episodes as the runs) and the task oracle: they re-derive the
  record's runs.csv columns best_counting_ce and task_oracle_ce, which checks that these are the runs' episodes;
- at gamma 0.8, d = 4, the windowed Bayes reference at the context cells' receptive fields R = 5, 9, 13 on the same
  scored test tokens (Bayes given only the R positions before each token), with the TV of it and of full Bayes to the
  task oracle at test positions j >= R (the memory/* positions).
The emergence curves' unseen episodes are the first 128 of the same 512: bayes.csv also carries the first 128's
means (the curves' model - best counting becomes model - Bayes by adding best counting - Bayes there).

Writes bayes.csv (cell, seed, k: CEs, Monte Carlo se, K), windowed.csv (seed, R), per_episode-*.npz (per-episode CEs;
`--windows no` then `--windows only` computes the two parts in turn)
and RUN.md's numbers come from them (analysis/inference_ablations.py --from-record reads bayes.csv and windowed.csv).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

CELLS = {"g0.8-d4": (0.8, 4), "g0.6-d4": (0.6, 4), "g0.95-d4": (0.95, 4), "g0.8-d2": (0.8, 2), "g0.8-d3": (0.8, 3)}
FIXED = {"hmm.n_tasks": 0, "hmm.n_states": 4, "hmm.n_tokens": 8, "hmm.rho": 0.05, "data.n_demos": 2,
         "data.l_demo": 12, "data.l_test": 16, "data.n_train": 512000, "data.n_eval": 512, "eval.family_tasks": 4096,
         "eval.fit_episodes": 256}
WINDOWS = (3, 5, 7)  # model.window of the context cells; 2 layers: R = 2 (w - 1) + 1
EMERGENCE = 128  # train.emergence_episodes of the record's specs


def _ce(pred: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    return (-torch.log(pred.gather(-1, y[..., None])[..., 0])).mean(1).numpy()


def _tv(p: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean over episodes of the mean over positions of TV(ref, p)."""
    return float((0.5 * (p - ref).abs().sum(-1)).mean(1).mean())


def cell(name: str, seed: int, say, windows: bool = True, ks=(0, 1, 2)) -> tuple[list[dict], list[dict], dict]:
    from hmmscope.config import override, preset
    from hmmscope.data.episodes import truncate_demos, unseen_episodes
    from hmmscope.measure.evaluate import references
    from hmmscope.measure.fixed_memory import receptive_field
    from hmmscope.oracles.bayes import bayes_oracle, windowed_bayes
    from hmmscope.oracles.inference import task_oracle

    gamma, rank = CELLS[name]
    cfg = override(preset("tiny"), {**FIXED, "hmm.gamma": gamma, "hmm.rank": rank, "data.seed": seed,
                                    "train.seed": seed})
    umix, ep = unseen_episodes(cfg.hmm, cfg.data, cfg.data.n_eval)
    _, counting = references(cfg.hmm, cfg.data, cfg.eval)
    rows, wrows, arrays = [], [], {}
    for k in ks:
        e = truncate_demos(ep, k)
        cols = np.flatnonzero(e.test_mask & (np.arange(e.seq_len) >= 1))
        y = torch.as_tensor(np.asarray(e.tokens)[:, cols].astype(np.int64))
        t0 = time.process_time()
        b = bayes_oracle(cfg.hmm, e, tol=cfg.eval.bayes_tol, seed=seed)
        cpu = time.process_time() - t0
        ce = {"bayes": _ce(b.pred[:, cols], y),
              "best_counting": _ce(counting.predict(e, k)["best_counting"][:, cols].double(), y),
              "task_oracle": _ce(task_oracle(umix, e, dtype=torch.float64)[:, cols], y)}
        for n, v in ce.items():
            arrays[f"{name}/s{seed}/k{k}/{n}"] = v.astype(np.float32)
        rows.append({"cell": name, "gamma": gamma, "rank": rank, "seed": seed, "k": k, "n_episodes": len(ep),
                     "bayes_ce": float(ce["bayes"].mean()), "bayes_mc_se": b.mc_se, "bayes_draws": b.n_draws,
                     "bayes_converged": b.converged, "bayes_cpu_s": cpu,
                     "best_counting_ce": float(ce["best_counting"].mean()),
                     "task_oracle_ce": float(ce["task_oracle"].mean()),
                     "bayes_ce_first128": float(ce["bayes"][:EMERGENCE].mean()),
                     "best_counting_ce_first128": float(ce["best_counting"][:EMERGENCE].mean()),
                     "history": " ".join(f"K={kk}:{c:.4f}" for kk, c in b.history)})
        say(f"{name} seed {seed} k {k}: bayes {rows[-1]['bayes_ce']:.4f} (se {b.mc_se:.4f}, K {b.n_draws}, "
            f"{cpu:.0f} s CPU); best counting {rows[-1]['best_counting_ce']:.4f}; task oracle "
            f"{rows[-1]['task_oracle_ce']:.4f}")
        if name != "g0.8-d4" or k != cfg.data.n_demos or not windows:
            continue
        task = task_oracle(umix, e, dtype=torch.float64)
        for w in WINDOWS:
            R = receptive_field(2, w)
            t0 = time.process_time()
            wpred, wres = windowed_bayes(cfg.hmm, e, R, cols, tol=cfg.eval.bayes_tol, seed=seed)
            cpu = time.process_time() - t0
            wce = _ce(torch.as_tensor(wpred), y)
            arrays[f"{name}/s{seed}/R{R}/wbayes"] = wce.astype(np.float32)
            far = np.flatnonzero(e.position[cols] >= R)  # memory/*'s positions: test positions j >= R
            ref = task[:, cols[far]]
            wrows.append({"seed": seed, "window": w, "R": R, "wbayes_ce": float(wce.mean()),
                          "wbayes_mc_se": wres.mc_se, "wbayes_draws": wres.n_draws,
                          "wbayes_converged": wres.converged, "bayes_ce": float(ce["bayes"].mean()),
                          "window_forced": float((wce - ce["bayes"]).mean()),
                          "wbayes_tv": _tv(torch.as_tensor(wpred[:, far]), ref),
                          "bayes_tv": _tv(b.pred[:, cols[far]], ref), "n_positions": len(far),
                          "cpu_s": cpu})
            say(f"  window {w} (R = {R}): windowed Bayes {wrows[-1]['wbayes_ce']:.4f} (se {wres.mc_se:.4f}, K "
                f"{wres.n_draws}, {cpu:.0f} s CPU); forced by the window {wrows[-1]['window_forced']:+.4f}")
    return rows, wrows, arrays


def _kept(path: Path, key: tuple) -> list[dict]:
    import csv

    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _merged(old: list[dict], new: list[dict], key: tuple) -> list[dict]:
    """old's rows less those this run recomputed (same key), then this run's, in the cells' order."""
    mine = {tuple(str(r[k]) for k in key) for r in new}
    return [r for r in old if tuple(str(r[k]) for k in key) not in mine] + new


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--ks", default="0,1,2", help="the numbers of demonstrations kept (Figure 1's k)")
    ap.add_argument("--windows", choices=("yes", "no", "only"), default="yes",
                    help="the windowed references (g0.8-d4, k = 2): with the rest, not at all, or only them")
    args = ap.parse_args(argv)
    from hmmscope.safe_output import write_csv, write_npz

    seeds = [int(s) for s in args.seeds.split(",")]
    cells = args.cells.split(",")
    unknown = [c for c in cells if c not in CELLS]
    if unknown:
        print(f"error: unknown cell(s) {unknown}; known: {', '.join(CELLS)}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, wrows, arrays = [], [], {}
    stem = "windowed" if args.windows == "only" else "bayes"
    kept = {"bayes": _kept(args.out / "bayes.csv", ("cell", "seed", "k")),
            "windowed": _kept(args.out / "windowed.csv", ("seed", "R"))}  # earlier runs' rows, replaced by this one's
    for name in cells:
        for seed in seeds:
            if args.windows == "only" and name != "g0.8-d4":
                continue
            r, w, a = cell(name, seed, lambda m: print(m, flush=True), windows=args.windows != "no",
                           ks=(2,) if args.windows == "only" else tuple(int(k) for k in args.ks.split(",")))
            rows += r
            wrows += w
            arrays.update(a)
            if args.windows != "only":  # as it goes: a long run keeps what it finished
                write_csv(args.out / "bayes.csv", _merged(kept["bayes"], rows, ("cell", "seed", "k")))
            if wrows:
                write_csv(args.out / "windowed.csv", _merged(kept["windowed"], wrows, ("seed", "R")))
            old = dict(np.load(args.out / f"per_episode-{stem}.npz")) if (args.out / f"per_episode-{stem}.npz").exists() \
                else {}
            write_npz(args.out / f"per_episode-{stem}.npz", {**old, **arrays})
    print(f"wrote {args.out}/bayes.csv, windowed.csv, per_episode.npz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
