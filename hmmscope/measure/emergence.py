"""Emergence curves: in-context learning on seen and unseen tasks during training (SCIENCE.md 8, 9).

Owns the pre-sampled evaluation episodes of the curves with their reference predictions (``prepare``, once
per run, resumed runs included), the model's curve values at one evaluation step (``Emergence.curve``), the
references' constants (``Emergence.references``), the few headline series logged as MLflow metrics
(``headline``), the per-k table (``curves_table``) and the figure (``plot_emergence``). The scoring itself is
evaluate.py's (``eval_set``, ``score_by_k``): one implementation of Figure 1's test-segment CE and accuracy.
Must not import MLflow, tracking or train (train imports it).

Episodes. Seen tasks: the first ``train.emergence_episodes`` of the held-out split "eval" (Figure 1's seen
episodes are all data.n_eval of them); unseen tasks: the first as many of Figure 1's unseen episodes
(episodes.unseen_episodes(hmm, data, data.n_eval)). So at the last step the curves equal Figure 1 on that
subset. A subset keeps evaluation cheap (its cost is (k_max + 1) forward passes per episode and task set);
its size is the config key, documented as what the curves average over. With fresh training tasks
(hmm.n_tasks = 0) there are no seen tasks: only the unseen curves exist.

References: task_oracle, mixture_oracle (with a training mixture), family_bayes (eval.family_tasks tasks of the
family; 0 = off), bayes (the Bayes-optimal reference for fresh tasks where the family allows it: eval.bayes; computed
once on Figure 1's unseen episodes, the curves read their first ones), the add-one unigram and bigram, and the fitted
counting baselines with best_counting (eval.fit_episodes fit-task episodes; 0 = off). Computed once; constants over
steps.

In-context gain (SCIENCE.md 9): CE(k = 0) - CE(k = k_max) on exactly the same test tokens (positions 1..l_test - 1),
so the task oracle's gain is 0 (evaluate.py's module docstring). The per-k CE values keep every scored token (as
Figure 1's by-k rows).

What is logged. The curve of one evaluation step is a flat dict (``curve``), kept in order in the training run's
history (it travels in the checkpoint, so a resumed run draws its whole history):
- ``emergence/<tasks>/ce/k<k>``, ``emergence/<tasks>/acc/k<k>``: the model at every k (<tasks> = seen | unseen);
- ``emergence/<tasks>/icl_gain``: the model's gain on the same tokens;
- ``emergence/unseen/vs_best_counting``: the model's CE minus best_counting's at k_max, unseen tasks;
- ``emergence/unseen/vs_bayes``: the Bayes gap, the model's CE minus the Bayes reference's (SCIENCE.md 10) at k_max,
  unseen tasks, where the reference is computed (evaluate.py's ``bayes``);
- ``emergence/<tasks>/ref/<name>/ce/k<k>`` and ``.../ref/<name>/icl_gain``: the references (constants);
  ``.../ref/<name>/degenerate`` = 1 for a degenerate reference (regimes.degenerate: drawn labelled so).
Only a few headline series become MLflow metrics (``headline``: icl_gain, ce at k_max, vs_best_counting and
vs_bayes), so
a run's metric page opens on the training curves, not on ~70 emergence charts; the full curves are the table
artifact ``emergence/curves.json`` (``curves_table``: one row per step, task set, predictor and k) and the figure
figures/emergence.{png,pdf}.

Cost. The references (family-Bayes and fitted counting included) are computed once per run; each evaluation of
the curves costs the model's (k_max + 1) forward passes per curve episode and task set, beside val/*'s evaluation.
A training run logs what its evaluations cost: train/eval_s (the curves, val/* and the references' precompute)
and train/eval_fraction (training/train.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import Config
from ..data.episodes import Episodes, unseen_episodes
from ..data.hmm import Mixture
from .bayes_gap import computed_on
from .evaluate import eval_set, score_by_k

REFERENCES = ("task_oracle", "mixture_oracle", "family_bayes", "bayes", "incontext_unigram", "incontext_bigram",
              "incontext_ngram", "incontext_ctw", "best_counting")
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


def _gain(by_k: dict, ks: list[int]) -> float:
    """CE(k = 0) - CE(k = k_max) on the same tokens, from {k: {"ce_same": ...}}."""
    return by_k[min(ks)]["ce_same"] - by_k[max(ks)]["ce_same"]


@dataclass
class Emergence:
    """The curves' evaluation sets (evaluate.EvalSet per task set) and the references' constants."""

    sets: list = field(default_factory=list)  # evaluate.EvalSet, seen (if any) then unseen
    references: dict[str, float] = field(default_factory=dict)
    n_episodes: int = 0

    @property
    def ks(self) -> list[int]:
        return self.sets[0].ks

    def curve(self, model, *, device="cpu", batch_size: int = 64) -> dict[str, float]:
        """The model's curve values now (module docstring): only its forward passes are computed."""
        out: dict[str, float] = {}
        for es in self.sets:
            by_k = score_by_k(model, es, device=device, batch_size=batch_size)
            for k, m in by_k.items():
                out[key(es.tasks, "ce", k)] = m["ce"]
                out[key(es.tasks, "acc", k)] = m["acc"]
            out[key(es.tasks, "icl_gain")] = _gain(by_k, es.ks)
            if es.tasks == "unseen" and "vs_best_counting" in by_k[max(es.ks)]:
                out[key("unseen", "vs_best_counting")] = by_k[max(es.ks)]["vs_best_counting"]
            if es.tasks == "unseen" and "vs_bayes" in by_k[max(es.ks)]:
                out[key("unseen", "vs_bayes")] = by_k[max(es.ks)]["vs_bayes"]
        return out

    metrics = curve  # an alias of curve, its older name

    def headline(self, curve: dict[str, float]) -> dict[str, float]:
        """The few series logged as MLflow metrics at each evaluation (module docstring): per task set the model's
        icl_gain and its CE at k_max (emergence/<tasks>/ce_kmax), and emergence/unseen/vs_best_counting."""
        out = {}
        for es in self.sets:
            km = max(es.ks)
            out[key(es.tasks, "icl_gain")] = curve[key(es.tasks, "icl_gain")]
            out[key(es.tasks, "ce_kmax")] = curve[key(es.tasks, "ce", km)]
        for name in ("vs_best_counting", "vs_bayes"):
            if key("unseen", name) in curve:
                out[key("unseen", name)] = curve[key("unseen", name)]
        return out


def _reference_constants(sets) -> dict[str, float]:
    out: dict[str, float] = {}
    for es in sets:
        names = [n for n in REFERENCES if n in es.by_k[es.ks[0]].references]
        for name in names:
            ce = {k: float(es.by_k[k].references[name]["ce"].mean(1).mean()) for k in es.ks}
            same = {k: {"ce_same": float(es.by_k[k].references[name]["ce"][:, es.by_k[k].same].mean(1).mean())}
                    for k in es.ks}
            out.update({key(es.tasks, "ce", k, name): v for k, v in ce.items()})
            out[key(es.tasks, "icl_gain", ref=name)] = _gain(same, es.ks)
            if es.meta.get("degenerate", {}).get(name):  # shown as such, never a reference (SCIENCE.md 9)
                out[key(es.tasks, "degenerate", ref=name)] = 1.0
    return out


def prepare(cfg: Config, mix: Mixture | None, ep_eval: Episodes, *, device="cpu", family: Mixture | None = None,
            counting=None, bayes=None) -> Emergence | None:
    """The curves' episodes and references for a run of cfg (None when train.emergence_episodes is 0).

    mix: the training mixture (None with fresh tasks); ep_eval: the run's held-out episodes (split "eval", data.n_eval
    of them; with fresh tasks they are the unseen episodes themselves). family: the family-Bayes tasks
    (episodes.family_tasks), counting: the fitted counting baselines (baselines.fit_counting), bayes: the Bayes
    reference's settings (bayes_gap.bayes_spec); None leaves each out."""
    n = min(cfg.train.emergence_episodes, len(ep_eval))
    if n <= 0:
        return None
    umix, uep = unseen_episodes(cfg.hmm, cfg.data, cfg.data.n_eval)
    dev = device if str(device).startswith("cuda") else "cpu"
    sets = []
    if mix is not None:
        sets.append(eval_set(mix, subset(ep_eval, n), tasks="seen", counting=counting, learner=None, device=dev))
    bayes = computed_on(bayes, uep, list(range(cfg.data.n_demos + 1)))  # Figure 1's episodes: the curves read the first n
    sets.append(eval_set(mix, subset(uep, n), tasks="unseen", task_mix=umix, family=family, counting=counting,
                         learner=None, device=dev, bayes=bayes))
    return Emergence(sets, _reference_constants(sets), n)


def curves_table(history: list[dict]) -> dict[str, list]:
    """The whole history as one table (MLflow's log_table columns): step, tasks, predictor, k ("" for a gain or a
    comparison), metric (ce, acc, icl_gain, vs_best_counting, vs_bayes), value."""
    cols: dict[str, list] = {"step": [], "tasks": [], "predictor": [], "k": [], "metric": [], "value": []}
    for h in history:
        for name, v in h.items():
            if not name.startswith(PREFIX + "/"):
                continue
            parts = name.split("/")[1:]  # tasks, [ref, name], metric, [k<k>]
            tasks, rest = parts[0], parts[1:]
            pred = "model"
            if rest[0] == "ref":
                pred, rest = rest[1], rest[2:]
            k = rest[1][1:] if len(rest) > 1 and rest[1].startswith("k") else ""
            for c, x in zip(cols, (int(h["step"]), tasks, pred, k, rest[0], float(v))):
                cols[c].append(x)
    return cols


# ---------------------------------------------------------------- figure

REF_STYLE = {"task_oracle": ("C2", "--", "task oracle"), "mixture_oracle": ("C3", "-", "mixture oracle"),
              "family_bayes": ("C1", "-", "family Bayes"), "bayes": ("C4", "-", "Bayes-optimal (fresh tasks)"),
              "incontext_unigram": ("C7", "-.", "add-one unigram"),
              "incontext_bigram": ("C5", ":", "add-one bigram"),
              "best_counting": ("k", "-.", "best counting (fitted)")}


def build_emergence(history: list[dict], title: str | None = None):
    """The curves figure from history = [{"step": s, <emergence key>: value, ...}, ...] (evaluation steps in
    order, references included): per task set (rows), the model's test CE at every k against the step with the
    references' CE at k_max as horizontal lines (left), and the in-context gain with the references' (right). The
    step axis is logarithmic, step 0 drawn at 1 (its tick says 0) and joined to the next evaluation by a dotted line
    (nothing was measured in between); each panel's legend sits below it in one column, over no curve and inside
    the figure however long a degenerate reference's label."""
    # lazy: matplotlib (~0.5 s) only when a figure is drawn (train.figures / no figures: never)
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D  # lazy: matplotlib, as above

    steps = np.array([h["step"] for h in history], float)
    tasks = [t for t in TASKS if any(key(t, "icl_gain") in h for h in history)]
    ks = sorted({int(k.rsplit("/k", 1)[1]) for h in history for k in h
                 if k.startswith(f"{PREFIX}/{tasks[0]}/ce/k")}) if tasks else []
    fig = Figure(figsize=(12, 5.6 * max(1, len(tasks)) + 0.4), layout="constrained")
    axes = fig.subplots(max(1, len(tasks)), 2, squeeze=False)
    x = np.maximum(steps, 1)  # step 0 drawn at 1 on the log axis (its tick says 0)
    zero = len(steps) > 1 and steps[0] == 0  # no evaluation between step 0 and the next: not drawn as a measured line

    def curve(ax, y, color, lw, label):
        y = np.asarray(y, float)
        if zero:  # step 0 apart: a dotted join to the next evaluation, the measured curve from there on
            ax.plot(x[:2], y[:2], ":", color=color, lw=lw * 0.7)
            ax.plot(x[:1], y[:1], "o", ms=3, color=color)
            ax.plot(x[1:], y[1:], "-o", ms=3, color=color, lw=lw, label=label)
        else:
            ax.plot(x, y, "-o", ms=3, color=color, lw=lw, label=label)

    for row, t in zip(axes, tasks):
        ax_ce, ax_gain = row
        cmap = ["C0" if len(ks) == 1 else (0.1, 0.3 + 0.6 * i / max(1, len(ks) - 1), 0.9) for i in range(len(ks))]
        for color, k in zip(cmap, ks):
            curve(ax_ce, [h.get(key(t, "ce", k), np.nan) for h in history], color, 2.0 if k == ks[-1] else 1.0,
                  f"model, k = {k}")
        curve(ax_gain, [h.get(key(t, "icl_gain"), np.nan) for h in history], "C0", 2.0, "model")
        last = history[-1] if history else {}
        for name, (c, ls, label) in REF_STYLE.items():
            if last.get(key(t, "degenerate", ref=name)):
                label = f"{label} (DEGENERATE: not a reference)"
            v = last.get(key(t, "ce", ks[-1], name)) if ks else None
            if v is not None:
                ax_ce.axhline(v, color=c, ls=ls, lw=1.2, label=f"{label}, k = {ks[-1]}")
            g = last.get(key(t, "icl_gain", ref=name))
            if g is not None:
                ax_gain.axhline(g, color=c, ls=ls, lw=1.2, label=label)
        ax_ce.set(title=f"{t} tasks: test-segment CE", xlabel="optimizer step", ylabel="CE (nats / token)",
                  xscale="log")
        ax_gain.set(title=f"{t} tasks: in-context gain (same tokens)", xlabel="optimizer step",
                    ylabel=f"CE(k = 0) - CE(k = {ks[-1] if ks else '?'}) (nats / token)", xscale="log")
        ax_gain.axhline(0, color="k", lw=0.5)
        for ax in row:
            if zero:
                ticks = [v for v in ax.get_xticks() if 1 < v <= x.max() * 1.01]
                ax.set_xticks([1.0, *ticks], ["0", *(f"{v:g}" for v in ticks)])
                ax.set_xlim(0.8, x.max() * 1.3)
            h, _ = ax.get_legend_handles_labels()
            if zero:
                h.append(Line2D([], [], color="gray", ls=":", label=f"step 0 to {int(steps[1])}: not evaluated between"))
            ax.legend(handles=h, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def plot_emergence(history: list[dict], path, title: str | None = None):
    """build_emergence saved as PNG + PDF (safe_output.save_figure); returns the paths."""
    from ..safe_output import save_figure  # lazy: looked up when called (tests/test_figures.py patches safe_output.save_figure)
    return save_figure(build_emergence(history, title), path)
