"""The jobs outside the training pipeline, wired to MLflow: the headroom above counting (trains nothing) and a theory
sweep (Theorem 1), as the CLI and the sweep trials launch them.

Library modules compute (measure/headroom.py, theory/); this module wires their results into MLflow runs through
`tracking` (the only module that talks to MLflow) and files under an output folder. The training pipeline (train,
Figure 1, the layerwise analysis) is `hmmscope.pipeline`'s. Dependencies run one way: the sweep layer (sweep/,
report/) and the CLI call these jobs; this module imports neither.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import tracking
from .config import Config
from .safe_output import write_with
from .theory.theorem1 import plot_theory, run_theory

# ---------------------------------------------------------------- headroom (SCIENCE.md 9)

HEADROOM_SECTIONS = ("hmm", "data", "eval")


def headroom_job(cfg: Config, uri: str, experiment: str, *, parent: str | None = None, run_name: str = "headroom",
                 tags: dict[str, Any] | None = None, note: str | None = None, device: str = "cpu",
                 n_episodes: int | None = None):
    """`headroom.headroom` (trains nothing) as one MLflow run: params hmm/data/eval, metrics headroom/*
    (HeadroomResult.metrics), the counting fit's choices as metrics counting/* and tags hmmscope.counting.* (outputs,
    never params), the result as headroom.json. n_episodes defaults to data.n_eval (a sweep trial's). Returns
    (result, run_id); the run opens when the work starts."""
    from .measure.headroom import headroom  # lazy: torch (~1 s) off `hmmscope theory`, which imports this module

    n = n_episodes or cfg.data.n_eval
    with tracking.start_run(uri, experiment, run_name, parent=parent,
                            params=tracking.config_params(cfg, HEADROOM_SECTIONS),
                            tags={"hmmscope.kind": "headroom", **(tags or {})},
                            note=note or f"Headroom above counting ({cfg.hmm.family}, S {cfg.hmm.n_states}, V "
                                         f"{cfg.hmm.n_tokens}, gamma {cfg.hmm.gamma:g}): running",
                            config=cfg) as run:
        res = headroom(cfg, n_episodes=n, device=device)
        run.log_metrics({**res.metrics(), **res.fitted["metrics"]})
        run.set_tags(res.fitted["tags"])
        run.log_dict(json.dumps(res.to_dict(), indent=2), "headroom.json")
        run.set_tags({"mlflow.note.content": tracking.note_line(note or res.line())})
    return res, run.run_id


# ---------------------------------------------------------------- theory


def theory_note(cfg: dict) -> str:
    """A theory run's one-line description."""
    def vals(k: str) -> str:
        return ", ".join(f"{v:g}" for v in cfg[k])

    return (f"Theory (Theorem 1): {cfg['family']} HMMs, gamma {vals('gammas')}, rank {vals('ranks')}, rho "
            f"{vals('rhos')}, {vals('n_states')} states, {cfg['n_tokens']} tokens; eps(L) over "
            f"{cfg['n_histories']} histories, seed {cfg['seed']}")


def log_theory(result, uri: str, experiment: str, out_files: list[Path], parent: str | None = None, *,
               run_name: str = "theory", tags: dict[str, Any] | None = None, note: str | None = None,
               run: tracking.Run | None = None) -> str:
    """One parent run for the sweep (params: the theory.* keys only), a child run per setting; returns the
    parent's run id. Claims go to each run as the table claims.json. `run`: the parent, already open (theory_job
    opens it when the work starts); else it is created here."""
    cfg = result.config
    params = {f"theory.{k}": v for k, v in cfg.items()}
    if run is not None:
        run.log_params(params)
        run.log_dict(tracking.config_toml({"theory": cfg}), "config.toml")
        run.set_tags({"mlflow.note.content": tracking.note_line(f"{result.answer()} — {note or theory_note(cfg)}")})
    opened = contextlib.nullcontext(run) if run is not None else tracking.start_run(
        uri, experiment, run_name, parent=parent, params=params, tags={"hmmscope.kind": "theory", **(tags or {})},
        note=f"{result.answer()} — {note or theory_note(cfg)}", config={"theory": cfg}, system_metrics=True)
    with opened as run:
        for s in result.settings:
            p, f = s.params, s.rate_fit
            params = {"hmm.family": p["family"], "hmm.n_states": p["n_states"], "hmm.n_tokens": cfg["n_tokens"],
                      "hmm.rank": p["rank"], "hmm.gamma": p["gamma"], "hmm.alpha": cfg["alpha"], "hmm.rho": p["rho"],
                      "hmm.seed": cfg["seed"], "theory.n_histories": cfg["n_histories"],
                      "theory.burn_in": cfg["burn_in"], "theory.floor": cfg["floor"], "theory.gamma_m": cfg["gamma_m"]}
            name = f"g{p['gamma']:g}-d{p['rank']}-rho{p['rho']:g}-S{p['n_states']}"  # what varies most first
            with tracking.start_run(uri, experiment, name, parent=run, params=params,
                                    tags={"hmmscope.kind": "theory-setting"},
                                    note=f"Theory setting {name}: eps(L) at L = {', '.join(map(str, s.lengths))}; "
                                         f"fitted decay rate {f.rate:.4g}") as child:
                m = {"theory/dobrushin": s.dobrushin, "theory/mixing_rate": s.mixing_rate, "theory/rate": f.rate,
                     "theory/rate_lo": f.rate_ci[0], "theory/rate_hi": f.rate_ci[1],
                     "theory/log_intercept": f.intercept, "theory/fit_points": f.n_used}
                for key, o in (("gamma_O", s.gamma_O), ("gamma_eff", s.gamma_eff), ("gamma_m", s.gamma_m)):
                    if o is not None:
                        m.update({f"theory/{key}": o["value"], f"theory/{key}_lower": o["lower"],
                                  f"theory/{key}_upper": o["upper"], f"theory/{key}_exact": float(o["exact"])})
                child.log_metrics(m)
                for step, dm in s.draw_metrics():  # per HMM draw at step = draw index; the rate CI's MC/between split
                    child.log_metrics(dm, step=step)
                for L, e, se in zip(s.lengths, s.eps, s.stderr):
                    child.log_metrics({"theory/eps": e, "theory/eps_stderr": se}, step=int(L))
                child.log_claims(s.verdicts)
        for fit in result.exponent_fits:
            scope = re.sub(r"\s+", "-", fit.scope.replace("=", ""))  # "S=128 rho=0.02" -> "S128-rho0.02"
            key = f"theory/exponent{'' if fit.y_name == 'rate' else '_excess'}/{fit.x_name}/{scope}"
            run.log_metrics({key: fit.k, f"{key}_lo": fit.k_ci[0], f"{key}_hi": fit.k_ci[1]})
        run.log_claims(result.verdicts)
        run.log_dict("\n".join(result.summary_lines()) + "\n", "theory_summary.txt")
        for f in out_files:
            run.log_artifact(f)
        return run.run_id


def theory_job(th, out: Path, *, uri: str | None, experiment: str, parent: str | None = None,
               progress: Callable[[int, int, str], Any] | None = None, run_name: str = "theory",
               tags: dict[str, Any] | None = None, note: str | None = None,
               on_start: Callable[[str], Any] | None = None, detail: Callable[[str], Any] | None = None):
    """Run the sweep, write theory.png / theory.pdf / theory.json under `out` (the folder itself: callers give
    each job its own, see `new_folder`), log to MLflow if `uri` (a run `run_name` with extra `tags` and the
    one-line `note`; see log_theory; `on_start(run id)` as soon as it is open). `progress` and `detail`: run_theory's
    (a setting done; an HMM draw begun). Returns (result, run_id)."""
    def work():
        result = run_theory(th, progress=progress, detail=detail)
        res_json = out / "theory.json"
        figs = plot_theory(result, out / "theory.png")
        write_with(res_json, lambda p: p.write_text(json.dumps(result.to_dict(), indent=2)))
        return result, [*figs, res_json]

    if not uri:
        return work()[0], None
    # the parent run opens when the work starts (its duration is the work's; a crash leaves it FAILED)
    with tracking.start_run(uri, experiment, run_name, parent=parent, tags={"hmmscope.kind": "theory", **(tags or {})},
                            note="Theory (Theorem 1): running", system_metrics=True) as run:
        if on_start is not None:
            on_start(run.run_id)
        result, files = work()
        log_theory(result, uri, experiment, files, run=run, note=note)
    return result, run.run_id
