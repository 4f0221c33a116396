"""Emergence curves: in-context learning on seen and unseen tasks during training (SCIENCE.md 8, issue 18.3).

Owns the pre-sampled evaluation episodes of the curves with their reference predictions (``prepare``, once
per run, resumed runs included), the model's curve metrics at one evaluation step (``Emergence.metrics``), the
references' constants (``Emergence.references``) and the figure (``plot_emergence``). The scoring itself is
evaluate.py's (``eval_set``, ``score_by_k``): one implementation of Figure 1's test-segment CE and accuracy.
Must not import MLflow, tracking or train (train imports it).

Episodes. Seen tasks: the first ``train.emergence_episodes`` of the held-out split "eval" (Figure 1's seen
episodes are all data.n_eval of them); unseen tasks: the first as many of Figure 1's unseen episodes
(episodes.unseen_episodes(hmm, data, data.n_eval)). So at the last step the curves equal Figure 1 on that
subset. A subset keeps evaluation cheap (its cost is (k_max + 1) forward passes per episode and task set);
its size is the config key, documented as what the curves average over.

Metric keys (MLflow histories, one key one meaning; nats per token, test segment, every k in 0..n_demos with
the last k demonstrations kept, mean over episodes of per-episode means; <tasks> = seen | unseen):
- ``emergence/<tasks>/ce/k<k>``, ``emergence/<tasks>/acc/k<k>``: the model at that evaluation step.
- ``emergence/<tasks>/icl_gain``: the model's in-context gain, ce/k0 - ce/k<n_demos>.
- ``emergence/<tasks>/ref/<name>/ce/k<k>`` and ``emergence/<tasks>/ref/<name>/icl_gain`` for the references
  task_oracle, mixture_oracle, incontext_unigram, incontext_bigram: computed once, logged as the same value at
  every evaluation step, so the plateau (the counting baselines) and the ceilings read off the model's chart.

Cost (measured at commit 064517e, 1 thread, load average ~7 on 2 shared cores, /tmp scripts quoted in the
branch report): tiny preset (512 eval episodes, 64 + 64 curve episodes, k = 0..4): the references 0.32 s CPU
once per run; one evaluation of the curves 2.05-2.21 s CPU beside 3.25-3.72 s for val/* on 512 episodes; a
training step 0.554 s CPU. Over the tiny preset's 1000 steps and 5 evaluations that makes the curves ~1.8% and
all evaluation ~4.6% of the run (computed from these measured parts: a whole tiny run did not finish within 10
minutes at that load). Measured whole (train/eval_fraction) on the task-diversity pilot's cells (4 x 64 model,
400 steps, 9 evaluations of 32 + 32 curve episodes and 128 eval episodes): 0.078 (4 tasks), 0.071 (64 tasks),
0.132 (8192 tasks: the references' mixture oracle over 8192 tasks dominates).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import Config
from .episodes import Episodes
from .hmm import Mixture

REFERENCES = ("task_oracle", "mixture_oracle", "incontext_unigram", "incontext_bigram")
TASKS = ("seen", "unseen")
PREFIX = "emergence"


def subset(ep: Episodes, n: int) -> Episodes:
    """The first n episodes of ep (same layout and meta)."""
    return Episodes(ep.tokens[:n], ep.states[:n], ep.task_ids[:n], ep.segment, ep.position, ep.n_tokens, ep.n_demos,
                    ep.l_demo, ep.l_test, dict(ep.meta))


def key(tasks: str, metric: str, k: int | None = None, ref: str | None = None) -> str:
    """emergence/<tasks>[/ref/<ref>]/<metric>[/k<k>] (module docstring)."""
    mid = f"/ref/{ref}" if ref else ""
    return f"{PREFIX}/{tasks}{mid}/{metric}" + ("" if k is None else f"/k{k}")


@dataclass
class Emergence:
    """The curves' evaluation sets (evaluate.EvalSet per task set) and the references' constants."""

    sets: list = field(default_factory=list)  # evaluate.EvalSet, seen then unseen
    references: dict[str, float] = field(default_factory=dict)
    n_episodes: int = 0

    @property
    def ks(self) -> list[int]:
        return self.sets[0].ks

    def metrics(self, model, *, device="cpu", batch_size: int = 64) -> dict[str, float]:
        """The model's curve metrics now (module docstring): only its forward passes are computed."""
        from .evaluate import score_by_k

        out: dict[str, float] = {}
        for es in self.sets:
            by_k = score_by_k(model, es, device=device, batch_size=batch_size)
            for k, m in by_k.items():
                out[key(es.tasks, "ce", k)] = m["ce"]
                out[key(es.tasks, "acc", k)] = m["acc"]
            out[key(es.tasks, "icl_gain")] = by_k[min(by_k)]["ce"] - by_k[max(by_k)]["ce"]
        return out


def _reference_constants(sets) -> dict[str, float]:
    out: dict[str, float] = {}
    for es in sets:
        for name in REFERENCES:
            ce = {k: float(es.by_k[k].references[name]["ce"].mean(1).mean()) for k in es.ks}
            out.update({key(es.tasks, "ce", k, name): v for k, v in ce.items()})
            out[key(es.tasks, "icl_gain", ref=name)] = ce[min(ce)] - ce[max(ce)]
    return out


def prepare(cfg: Config, mix: Mixture, ep_eval: Episodes, *, device="cpu") -> Emergence | None:
    """The curves' episodes and references for a run of cfg (None when train.emergence_episodes is 0).

    mix: the training mixture; ep_eval: the run's held-out episodes (split "eval", data.n_eval of them)."""
    from .episodes import unseen_episodes
    from .evaluate import eval_set

    n = min(cfg.train.emergence_episodes, len(ep_eval))
    if n <= 0:
        return None
    umix, uep = unseen_episodes(cfg.hmm, cfg.data, cfg.data.n_eval)
    dev = device if str(device).startswith("cuda") else "cpu"
    sets = [eval_set(mix, subset(ep_eval, n), tasks="seen", other=None, learner=None, device=dev),
            eval_set(mix, subset(uep, n), tasks="unseen", task_mix=umix, other=None, learner=None, device=dev)]
    return Emergence(sets, _reference_constants(sets), n)


# ---------------------------------------------------------------- figure

_REF_STYLE = {"task_oracle": ("C2", "--", "task oracle"), "mixture_oracle": ("C3", "-", "mixture oracle"),
              "incontext_unigram": ("C7", "-.", "in-context unigram"),
              "incontext_bigram": ("C5", ":", "in-context bigram")}


def build_emergence(history: list[dict], title: str | None = None):
    """The curves figure from history = [{"step": s, <emergence key>: value, ...}, ...] (evaluation steps in
    order, references included): per task set (rows), the model's test CE at every k against the step with the
    references' CE at k_max as horizontal lines (left), and the in-context gain with the references' (right)."""
    from matplotlib.figure import Figure

    steps = np.array([h["step"] for h in history], float)
    tasks = [t for t in TASKS if any(key(t, "icl_gain") in h for h in history)]
    ks = sorted({int(k.rsplit("/k", 1)[1]) for h in history for k in h
                 if k.startswith(f"{PREFIX}/{tasks[0]}/ce/k")}) if tasks else []
    fig = Figure(figsize=(11, 3.6 * max(1, len(tasks))), layout="constrained")
    axes = fig.subplots(max(1, len(tasks)), 2, squeeze=False)
    x = np.maximum(steps, 1)  # step 0 drawn at 1 on the log axis
    for row, t in zip(axes, tasks):
        ax_ce, ax_gain = row
        cmap = ["C0" if len(ks) == 1 else (0.1, 0.3 + 0.6 * i / max(1, len(ks) - 1), 0.9) for i in range(len(ks))]
        for color, k in zip(cmap, ks):
            y = [h.get(key(t, "ce", k), np.nan) for h in history]
            ax_ce.plot(x, y, "-o", ms=3, color=color, lw=2.0 if k == ks[-1] else 1.0, label=f"model, k = {k}")
        y = [h.get(key(t, "icl_gain"), np.nan) for h in history]
        ax_gain.plot(x, y, "-o", ms=3, color="C0", lw=2.0, label="model")
        last = history[-1] if history else {}
        for name, (c, ls, label) in _REF_STYLE.items():
            v = last.get(key(t, "ce", ks[-1], name)) if ks else None
            if v is not None:
                ax_ce.axhline(v, color=c, ls=ls, lw=1.2, label=f"{label}, k = {ks[-1]}")
            g = last.get(key(t, "icl_gain", ref=name))
            if g is not None:
                ax_gain.axhline(g, color=c, ls=ls, lw=1.2, label=label)
        ax_ce.set(title=f"{t} tasks: test-segment CE", xlabel="optimizer step", ylabel="CE (nats / token)",
                  xscale="log")
        ax_gain.set(title=f"{t} tasks: in-context gain CE(k = 0) - CE(k = {ks[-1] if ks else '?'})",
                    xlabel="optimizer step", ylabel="nats / token", xscale="log")
        ax_gain.axhline(0, color="k", lw=0.5)
        for ax in row:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


def plot_emergence(history: list[dict], path, title: str | None = None):
    """build_emergence saved as PNG + PDF (figures.save); returns the paths."""
    from .figures import save

    return save(build_emergence(history, title), path)
