"""Layerwise claims from a record's kept per-run tables, under the current claim definitions (issue 26), without
the store: `python analysis/regime_layerwise.py --from-runs DIR ...` (that script's docstring has the command).

A record keeps, per analysis run, the tables `hmmscope analyze --out` wrote (runs/<trial>-<run id8>/: claims.csv,
probe_claims.csv, probes.csv, ...). From them, and from the sweep's spec (which rebuilds each trial's config, its
HMM mixture and its probe episodes exactly), this module makes one row per run in the report's training-frame
layout (`param:*`, `metric:claim/<name>/value|ci_lo|ci_hi`, `verdict:*`, `rule:*`), so that the report's own
pooling (report.layerwise.layerwise_section: t over seeds) judges them. Every claim is the run's logged row,
except the claims whose definition issue 26 changed, recomputed per run from what is kept (value only: the
per-episode hits that a per-run bootstrap CI needs are not kept, so these rows carry no per-run CI or verdict; the
pooled claim needs only the per-run values):

- state_before_task: the area over layers 1..L (probes.csv accuracies, probes.claims.state_before_task_values);
  state_before_task_layer0: the embedding's own row. The logged area over layers 0..L is recomputed from the same
  table as a check (it must equal the logged value).
- kback{k}_beats_token_stats: the cross-fitted best accuracy b(k) minus the token statistics' accuracy (the o_t-only
  lookup on the probe's own rows, probes.kback_baselines on the rebuilt probe episodes). b(k) = the logged
  kback{k}_beats_baseline value + the (task, o_t) baseline accuracy, recomputed by the same function; the
  recomputed baseline must match the one the run logged (its reason, 3 decimals), which checks that the probe
  episodes, positions and split were rebuilt exactly.
- kback_acc_falls_with_k: the largest adjacent difference over k of b(k) - token accuracy(k).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
from records_io import RecordError, number, read_csv
from records_io import read_trials as trials_table

NAN = float("nan")
REDEFINED = ("state_before_task", "kback_acc_falls_with_k")  # logged under the old definitions: superseded


class RunsError(RecordError):
    """Bad input to the --from-runs mode (one line)."""


KEPT = {  # a run folder's tables (records_io.read_csv: checked, one line naming the file and row): columns, keys
    "claims.csv": dict(required=("name", "value", "ci_lo", "ci_hi", "rule", "verdict"),
                       numbers=("value", "ci_lo", "ci_hi"), unique=[("name",)]),
    "probe_claims.csv": dict(required=("name", "value", "ci_lo", "ci_hi", "rule", "verdict"),
                             numbers=("value", "ci_lo", "ci_hi"), unique=[("name",)], allow_empty=True),
    "probes.csv": dict(required=("target", "layer"), numbers=("layer",)),
}


def _rows(path: Path) -> list[dict]:
    return read_csv(path, **KEPT.get(path.name, {})).rows


def read_trials(path: Path) -> dict[str, dict]:
    """run id -> its trials.csv row (records_io.read_trials: one row per run id and trial, hmm.n_tasks and every metric
    a number)."""
    t = trials_table(path, what="--trials", required=("run_id", "hmm.n_tasks"), numbers=("hmm.n_tasks", "train.seed",
                                                                                         "data.seed"))
    return {r["run_id"]: r for r in t.rows}


def run_dirs(root: Path, trials: dict[str, dict]) -> list[tuple[Path, dict]]:
    """(folder, trials.csv row) per run folder <trial name>-<run id8> under root."""
    if not root.is_dir():
        raise RunsError(f"--from-runs {str(root)!r} is not a folder")
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        id8 = d.name.rsplit("-", 1)[-1]
        match = [r for rid, r in trials.items() if rid.startswith(id8)]
        if len(match) != 1:
            raise RunsError(f"run folder {d.name!r}: {len(match)} trials of --trials have a run id starting {id8!r}")
        for f in ("claims.csv", "probe_claims.csv", "probes.csv"):
            if not (d / f).is_file():
                raise RunsError(f"run folder {d.name!r} has no {f}")
        out.append((d, match[0]))
    if not out:
        raise RunsError(f"--from-runs {str(root)!r} holds no run folder")
    return out


def _baselines(spec, trial: dict, n_episodes: int, probe_tasks: int, min_per_task: int, seed: int, ks,
               positions: int = 32, test_frac: float = 0.25) -> dict:
    """Per k: (task-baseline acc, token-statistics acc, scored rows) on the run's rebuilt probe episodes (the
    episodes, positions and split of jobs.analyze_model + probes.run_probes with these settings)."""
    from hmmscope.data.episodes import probe_episodes
    from hmmscope.data.hmm import make_mixture
    from hmmscope.measure.probes import kback_baselines, sample_positions, split_episodes

    seed_r = int(number(trial.get("train.seed", trial.get("data.seed", 0))))
    cfg = spec.trial_config({"hmm.n_tasks": int(number(trial["hmm.n_tasks"])), "seed": seed_r})
    if "data.seed" in trial and int(number(trial["data.seed"])) != cfg.data.seed:
        raise RunsError(f"trial {trial.get('trial')}: the spec gives data.seed {cfg.data.seed}, trials.csv "
                        f"{trial['data.seed']}")
    mix = make_mixture(cfg.hmm)
    n_pt = min(probe_tasks, mix.n_tasks)
    pep = probe_episodes(mix, cfg.data, n_pt, max(min_per_task, -(-n_episodes // n_pt)))
    pos = sample_positions(pep, positions, seed)
    base = kback_baselines(pep, pos, split_episodes(len(pep.task_ids), test_frac, seed), ks)
    return {k: (v[0].sum() / v[2].sum(), v[1].sum() / v[2].sum(), int(v[2].sum())) for k, v in base.items()}


def run_row(d: Path, trial: dict, spec, *, n_episodes: int, probe_tasks: int = 32, min_per_task: int = 30,
            seed: int = 0) -> tuple[dict, list[dict], dict]:
    """(training-frame row, k-back rows, state-before-task row) of one run folder (module docstring)."""
    from hmmscope.measure.probes.claims import state_before_task_values
    from hmmscope.stats import parse_rule, rule
    from hmmscope.tracking import safe_key

    row: dict = {"run_id": trial["run_id"], "trial": trial.get("trial", ""), "run_folder": d.name}
    for k, v in trial.items():
        if k and "/" not in k and k not in ("run_id", "run_name", "kind", "trial") and not k.startswith("objective"):
            row[f"param:{k}"] = int(number(v)) if math.isfinite(number(v)) and number(v).is_integer() else v
    row["metric:eval/retrieval_gap"] = number(trial.get("eval/retrieval_gap"))
    logged = {r["name"]: r for r in _rows(d / "claims.csv") + _rows(d / "probe_claims.csv")}
    for name, r in logged.items():
        key = safe_key(name)
        for c in ("value", "ci_lo", "ci_hi"):
            row[f"metric:claim/{key}/{c}"] = number(r[c])
        row[f"verdict:{key}"], row[f"rule:{key}"] = r["verdict"], r["rule"]

    def put(name: str, value: float, rule_: str) -> None:
        parse_rule(rule_)
        row.update({f"metric:claim/{name}/value": float(value), f"metric:claim/{name}/ci_lo": NAN,
                    f"metric:claim/{name}/ci_hi": NAN, f"verdict:{name}": "", f"rule:{name}": rule_})

    # state before task, from the per-layer accuracies
    by: dict = {}
    for r in _rows(d / "probes.csv"):
        by.setdefault(r["target"], []).append(r)
    sb_row: dict = {"run_folder": d.name, "n_tasks": int(number(trial["hmm.n_tasks"])), "seed": trial.get("train.seed")}
    if "task" in by and "state" in by and "state_before_task" in logged:
        lay = [int(r["layer"]) for r in by["task"]]
        acc = {t: np.array([number(r["acc"]) for r in by[t]]) for t in ("task", "state")}
        ch = {t: number(by[t][0]["chance"]) for t in ("task", "state")}
        # the old statistic (the area over every layer, 0 included) is the new area over the same layers shifted
        # off 0: recomputed as a check that the table and the logged claim agree
        old = state_before_task_values([x + 1 for x in lay], acc["task"], acc["state"], ch["task"], ch["state"])
        if abs(float(old["area"]) - number(logged["state_before_task"]["value"])) > 1e-9:
            raise RunsError(f"{d.name}: probes.csv gives the logged area {float(old['area']):.6g}, not the logged "
                            f"{logged['state_before_task']['value']}: the table and the claims disagree")
        new = state_before_task_values(lay, acc["task"], acc["state"], ch["task"], ch["state"])
        req = rule(">", 0, ("task_beats_control", "state_beats_control"))
        put("state_before_task", float(new["area"]), req)
        put("state_before_task_layer0", float(new["layer0"]), req)
        sb_row.update({"area_layers_0_to_L_logged": float(old["area"]), "area_layers_1_to_L": float(new["area"]),
                       "area_state": float(new["area_state"]), "area_task": float(new["area_task"]),
                       "layer0": float(new["layer0"]), "layer0_state": float(new["layer0_state"]),
                       "layer0_task": float(new["layer0_task"])})
    # k-back probes beside the token statistics
    ks = sorted(int(m.group(1)) for n in logged if (m := re.fullmatch(r"kback(\d+)_beats_baseline", n)))
    krows = []
    if ks:
        base = _baselines(spec, trial, n_episodes, probe_tasks, min_per_task, seed, ks)
        exc = {}
        for k in ks:
            r = logged[f"kback{k}_beats_baseline"]
            got = re.search(r"vs baseline ([0-9.]+)", r["reason"])
            task_acc, tok_acc, n_rows = base[k]
            if got is None or abs(float(got.group(1)) - task_acc) > 5e-4 + 1e-12:
                raise RunsError(f"{d.name}: kback{k}: the rebuilt probe episodes give a (task, o_t) baseline of "
                                f"{task_acc:.4f}, the run logged {got.group(1) if got else 'none'}: not the same "
                                "episodes (check --n-episodes and the spec)")
            b = number(r["value"]) + task_acc
            exc[k] = b - tok_acc
            put(f"kback{k}_beats_token_stats", exc[k], rule(">", 0))
            krows.append({"run_folder": d.name, "n_tasks": int(number(trial["hmm.n_tasks"])), "seed": trial.get("train.seed"),
                          "k": k, "best_acc": b, "task_token_baseline_acc": task_acc,
                          "task_token_baseline_logged": float(got.group(1)), "token_stats_acc": tok_acc,
                          "excess_over_token_stats": exc[k], "scored_rows": n_rows})
        if len(ks) >= 2:
            put("kback_acc_falls_with_k", float(np.max(np.diff([exc[k] for k in ks]))), rule("<", 0))
    return row, krows, sb_row


def token_recurrence(spec, n_tasks: int, ks=range(6), *, tasks=None, stationary: bool = False) -> np.ndarray:
    """Exact P(o_(t+1) = o_(t-k)) for k in ks, averaged over the tasks (default all) of the spec's mixture with
    n_tasks tasks (seed 0's config: hmm.seed is shared by the seeds): in the test segment (the state distribution
    of each position from the test's start distribution, pairs inside the segment), or at stationarity."""
    from hmmscope.data.hmm import make_mixture

    cfg = spec.trial_config({"hmm.n_tasks": n_tasks, "seed": 0})
    if cfg.data.test_start != "initial":
        raise RunsError("token_recurrence: only test_start = 'initial' is implemented")
    mix = make_mixture(cfg.hmm)
    idx = range(mix.n_tasks) if tasks is None else tasks
    ks = list(ks)
    L, out = cfg.data.l_test, np.zeros(len(ks))
    for i in idx:
        h = mix.task(int(i))
        T, O = h.transition, h.emission
        Tp = [np.linalg.matrix_power(T, k + 1) for k in ks]
        if stationary:
            p = h.stationary
            out += [np.einsum("s,sv,st,tv->", p, O, M, O) for M in Tp]
            continue
        ps = [h.initial]
        for _ in range(L - 1):
            ps.append(ps[-1] @ T)
        for j, (k, M) in enumerate(zip(ks, Tp)):
            out[j] += np.mean([np.einsum("s,sv,st,tv->", ps[t - k], O, M, O) for t in range(k, L - 1)])
    return out / len(idx)
