"""The headroom map (issue 27.1, SCIENCE.md 9): room above the best counting predictor on unseen tasks, per family
and episode layout, from a kind = "headroom" sweep (sweeps/headroom-map.toml), before any training.

    python analysis/headroom.py --sweep headroom-map [--out DIR]

Per cell (the swept keys but the replicate seed), at k = k_max, from each trial's `hmmscope headroom` metrics:

- the room, a lower bound (SCIENCE.md 9): CE(best counting) - CE(best legitimate learner) nats/token, the learner
  being the EM learner, or family Bayes at M where it has converged (its drop from M/2 to M below the tolerance); the
  mean over the replicate seeds (data.seed: each draws its own unseen, fit and family tasks) of each trial's paired
  mean over its unseen episodes. Its 95% CI combines the trials' own CIs (over episodes, and over the family draws
  where family Bayes sets it: se = sqrt(sum se_i^2) / n), beside the t interval over seeds; the seeds are drawn as
  dots. `set_by` counts the seeds whose room family Bayes sets (else the EM learner); `seeds_with_room` those whose
  own CI is above 0;
- family Bayes' convergence: `converged` (seeds where it converged) and `family_drop` (mean drop of its CE from M/2
  to M; family Bayes at finite M is an upper bound on the ideal learner's CE, so while it still falls the room is
  larger than it shows);
- the family-Bayes bound: CE(best counting) - CE(family Bayes at M), draw-averaged, converged or not: a lower bound
  on the room in expectation over the draw of its M tasks (the Bayes predictor minimizes the expected log loss), with
  its CI combined as the room's; empty where family Bayes is degenerate (CE above ln V, or a negative in-context gain);
- `best_counting_degenerate`: the seeds whose best counting CE at k_max is above a uniform guess (ln V); a room or
  bound measured from such a reference is not used (SCIENCE.md 9), and the reading says so;
- the reading (SCIENCE.md 9): "undetermined (best counting degenerate)" where best counting is degenerate in some
  seed, else "room" (the room's CI above 0: a legitimate learner beats counting), else "no room"
  (family Bayes converged in every seed and no learner beats counting), else "room shown by family Bayes only"
  (its bound's CI above 0, family Bayes not converged), else "undetermined";
- best counting's, the EM learner's and family Bayes' CE (at M and M/2), the task oracle's, the add-one bigram's, the
  room at k = 0, and `no_learner`: the seeds whose trial had no legitimate learner at k_max (both degenerate or
  family Bayes not converged with the EM learner degenerate: the trial FAILs, its objective unmeasurable; its
  family-Bayes bound is still read from its run).

Writes headroom_map.csv (one row per cell) and headroom_map.{png,pdf}: one panel per (family, layout), against gamma
one line per S: the room (filled markers: set by the EM learner, squares: by family Bayes) and, dashed with hollow
markers, the family-Bayes bound; a zero line and the inference-regime issue's bar of 0.2 nats/token (cells whose room
or bound has its lower CI at the bar are ringed).
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from sweepdata import fail, load_sweep, mean_ci, out_dir, parser, save, write_table

BAR = 0.2  # nats/token: the room the inference-regime record asks of its family
READINGS = ("room", "no room", "room shown by family Bayes only", "undetermined",
            "undetermined (best counting degenerate)")


def _k_max(metrics: dict) -> int:
    ks = [int(k.split("/k")[1].split("_")[0]) for k in metrics
          if k.startswith(("headroom/room/k", "headroom/family_drop/k")) and k.split("/k")[1].split("_")[0].isdigit()]
    return max(ks)


def _combined(trials: list[dict], key: str) -> tuple[float, float, float]:
    """Mean over the trials of metric `key` and a 95% CI combining their own CIs (key_lo / key_hi, normal)."""
    got = [m for m in trials if key in m and f"{key}_lo" in m and f"{key}_hi" in m]
    if not got:
        return math.nan, math.nan, math.nan
    v = [m[key] for m in got]
    se = [(m[f"{key}_hi"] - m[f"{key}_lo"]) / (2 * 1.96) for m in got]
    mean = float(np.mean(v))
    h = 1.96 * math.sqrt(sum(s * s for s in se)) / len(se)
    return mean, mean - h, mean + h


def reading(room_lo: float, bound_lo: float, converged: int, n: int, bc_degenerate: int = 0) -> str:
    """The cell's word (module docstring), from the combined CIs, the seeds where family Bayes converged and those
    whose best counting is degenerate."""
    if bc_degenerate:
        return "undetermined (best counting degenerate)"
    if room_lo > 0:
        return "room"
    if n and converged == n:
        return "no room"
    if bound_lo > 0:
        return "room shown by family Bayes only"
    return "undetermined"


def _failed_runs(sw) -> list:
    """The runs of FAIL trials (the latest of each grid point not completed): a headroom trial whose room was not
    measurable (no legitimate learner at k_max) fails, its run still holds the rest of its metrics."""
    import optuna
    from optuna.trial import TrialState

    from hmmscope import tracking

    study = optuna.load_study(study_name=sw.name, storage=sw.storage)
    done = {sw.cell(t) + (t.seed,) for t in sw.trials}
    client = tracking.client(sw.uri)
    out = {}
    for t in study.get_trials(deepcopy=False):
        rid = t.user_attrs.get("mlflow_run_id")
        if t.state != TrialState.FAIL or not rid:
            continue
        run = client.get_run(rid)
        p = dict(run.data.params)
        key = tuple(p.get(k, "") for k in sw.varied) + (p.get("data.seed", "0"),)
        if key not in done and "headroom/room" not in run.data.metrics:
            out[key] = {**run.data.metrics, "_V": float(p.get("hmm.n_tokens", "nan"))}
    return list(out.items())


def cells(sw, failed=()) -> list[dict]:
    by = defaultdict(list)
    for t in sw.trials:
        by[sw.cell(t)].append({**t.metrics, "_V": float(t.params.get("hmm.n_tokens", "nan"))})
    lost = defaultdict(list)
    for key, m in failed:
        lost[key[:-1]].append(m)  # its "_V" comes with it (_failed_runs)
    rows = []
    for cell in sorted(set(by) | set(lost), key=lambda c: [_num(v) for v in c]):
        trials, gone = by.get(cell, []), lost.get(cell, [])
        km = _k_max((trials or gone)[0])
        room = [m["headroom/room"] for m in trials]
        m_, lo, hi = _combined(trials, "headroom/room")
        tm, tlo, thi, n = mean_ci(room)
        everyone = trials + gone
        b, blo, bhi = _combined(everyone, f"headroom/family_bound/k{km}")
        conv = sum(m.get(f"headroom/family_converged/k{km}") == 1 for m in everyone)
        bc_bad = sum(m.get(f"headroom/best_counting/ce/k{km}", 0.0) > math.log(m["_V"]) + 1e-9 for m in everyone)
        fam = sum(m.get(f"headroom/set_by_family/k{km}") == 1 for m in trials)
        M = max((int(k.split("_M")[1].split("/")[0]) for m in everyone for k in m
                 if k.startswith("headroom/family_bayes_M")), default=None)

        def avg(key, ms=everyone):
            v = [m[key] for m in ms if key in m]
            return float(np.mean(v)) if v else float("nan")

        row = {**dict(zip(sw.varied, cell)), "k_max": km, "seeds": len(everyone), "room": m_, "room_lo": lo,
               "room_hi": hi, "room_t_lo": tlo, "room_t_hi": thi,
               "set_by": f"family Bayes {fam}/{len(trials)}, EM learner {len(trials) - fam}/{len(trials)}",
               "seeds_with_room": f"{sum(m['headroom/room_lo'] > 0 for m in trials)}/{len(everyone)}",
               "no_learner": f"{len(gone)}/{len(everyone)}",
               "converged": f"{conv}/{len(everyone)}", "family_drop": avg(f"headroom/family_drop/k{km}"),
               "best_counting_degenerate": f"{bc_bad}/{len(everyone)}",
               "bound": b, "bound_lo": blo, "bound_hi": bhi,
               "reading": reading(lo if math.isfinite(lo) else -math.inf, blo if math.isfinite(blo) else -math.inf,
                                  conv, len(everyone), bc_bad),
               "room_k0": avg("headroom/room/k0", trials),
               "best_counting_ce": avg(f"headroom/best_counting/ce/k{km}"),
               "em_ce": avg(f"headroom/incontext_hmm/ce/k{km}"),
               "family_bayes_ce": avg(f"headroom/family_bayes/ce/k{km}"),
               "family_bayes_half_M_ce": avg(f"headroom/family_bayes_M{M}/ce/k{km}") if M else float("nan"),
               "task_oracle_ce": avg(f"headroom/task_oracle/ce/k{km}"),
               "bigram_ce": avg(f"headroom/incontext_bigram/ce/k{km}"),
               "per_seed": " ".join(f"{v:.3f}" for v in room),
               "meets_bar": bool(math.isfinite(lo) and lo >= BAR and not bc_bad),
               "bound_meets_bar": bool(math.isfinite(blo) and blo >= BAR and not bc_bad)}
        rows.append(row)
    return rows


def _num(v):
    try:
        return (0, float(v))
    except (TypeError, ValueError):
        return (1, str(v))


def plot(sw, rows, out):
    import matplotlib.pyplot as plt

    keys = sw.varied
    x_key = "hmm.gamma" if "hmm.gamma" in keys else keys[0]
    line_key = "hmm.n_states" if "hmm.n_states" in keys and x_key != "hmm.n_states" else None
    panel_keys = [k for k in keys if k not in (x_key, line_key)]
    panels = sorted({tuple(r[k] for k in panel_keys) for r in rows}, key=lambda p: [_num(v) for v in p])
    ncol = min(4, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.4 * ncol, 3.6 * nrow), squeeze=False, sharey=True)
    for ax, p in zip(axes.flat, panels):
        sub = [r for r in rows if tuple(r[k] for k in panel_keys) == p]
        lines = sorted({r[line_key] for r in sub}, key=_num) if line_key else [None]
        for i, lv in enumerate(lines):
            pts = sorted((r for r in sub if line_key is None or r[line_key] == lv), key=lambda r: _num(r[x_key]))
            x = np.array([float(r[x_key]) for r in pts])
            dx = 0.006 * (i - (len(lines) - 1) / 2)  # lines side by side, so their bars do not hide each other
            col = f"C{i}"
            y = [r["room"] for r in pts]
            ax.plot(x + dx, y, "-", color=col, lw=1.2, label=f"{line_key.split('.')[-1]} = {lv}" if line_key else None)
            for xi, r in zip(x, pts):
                if not math.isfinite(r["room"]):
                    continue
                fam = not r["set_by"].startswith("family Bayes 0/")
                ax.errorbar(xi + dx, r["room"], yerr=[[r["room"] - r["room_lo"]], [r["room_hi"] - r["room"]]],
                            marker="s" if fam else "o", ms=4, capsize=2, color=col)
                for v in r["per_seed"].split():
                    ax.plot(xi + dx, float(v), ".", color=col, alpha=0.4, ms=3)
                if r["meets_bar"]:
                    ax.plot(xi + dx, r["room"], "o", mfc="none", mec="k", ms=10)
                if not r["best_counting_degenerate"].startswith("0/"):
                    ax.plot(xi + dx, r["room"], "x", color="k", ms=9)
            ok = [(xi, r) for xi, r in zip(x, pts) if math.isfinite(r["bound"])]
            if ok:
                bx = np.array([xi for xi, _ in ok]) + dx + 0.003
                ax.errorbar(bx, [r["bound"] for _, r in ok],
                            yerr=[[r["bound"] - r["bound_lo"] for _, r in ok], [r["bound_hi"] - r["bound"] for _, r in ok]],
                            ls="--", marker="D", ms=4, mfc="none", capsize=2, color=col, alpha=0.6, lw=0.9)
                for xi, r in ok:
                    if r["bound_meets_bar"]:
                        ax.plot(xi + dx + 0.003, r["bound"], "D", mfc="none", mec="k", ms=10)
        ax.axhline(0, color="gray", lw=0.8)
        ax.axhline(BAR, color="gray", lw=0.8, ls=":")
        ax.set_title(", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(panel_keys, p)), fontsize=9)
        ax.set_xlabel(x_key.split(".")[-1])
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("CE(best counting) - CE(learner)\nat k_max (nats / token)")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if line_key:
        axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"Headroom map ({sw.name}), unseen tasks, 95% CIs.\nSolid: the room, a lower bound (best legitimate "
                 "learner: circles the EM learner, squares family Bayes where converged); dashed, hollow diamonds: "
                 f"best counting - family Bayes at M (a lower bound in expectation). Ringed: lower CI >= {BAR} "
                 f"(dotted line); crossed: best counting degenerate (CE above ln V), not a room", fontsize=9, wrap=True)
    fig.tight_layout()
    return save(fig, out, "headroom_map")


def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    sw = load_sweep(args)
    if sw.kind != "headroom":
        fail(f"sweep {args.sweep!r} is a {sw.kind} sweep, not a headroom sweep")
    out = out_dir(args)
    rows = cells(sw, _failed_runs(sw))
    write_table(rows, out, "headroom_map")
    plot(sw, rows, out)
    ok = [r for r in rows if math.isfinite(r["room_lo"])]
    best = max(ok, key=lambda r: r["room_lo"])
    where = ", ".join(f"{k}={best[k]}" for k in sw.varied)
    print(f"largest room (by its lower CI): {best['room']:.3f} [{best['room_lo']:.3f}, {best['room_hi']:.3f}] at "
          f"{where}, set by {best['set_by']}")
    bb = max((r for r in rows if math.isfinite(r["bound_lo"])), key=lambda r: r["bound_lo"], default=None)
    if bb:
        print(f"largest family-Bayes bound (by its lower CI): {bb['bound']:.3f} [{bb['bound_lo']:.3f}, "
              f"{bb['bound_hi']:.3f}] at " + ", ".join(f"{k}={bb[k]}" for k in sw.varied)
              + f" (family Bayes converged in {bb['converged']} seeds)")
    counts = {w: sum(r["reading"] == w for r in rows) for w in READINGS}
    print("readings: " + ", ".join(f"{w}: {n}" for w, n in counts.items()) + f" (of {len(rows)} cells)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
