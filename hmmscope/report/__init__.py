"""`hmmscope report`: read a sweep's runs back from MLflow and write the statistical summary (SCIENCE.md 7).

    report = build_report(uri, "my-study", Path("out/my-study"))          # storage found as below
    report = build_report(uri, "my-study", Path("out/my-study"), storage="postgresql://...")
    print("\\n".join(report.summary_lines()))

Which trials count. The Optuna study is the record of a sweep: the report counts trials by their
study states (complete / failed / pruned / running / waiting, and "retried": failed trials whose slot
was run again after their worker died or was interrupted), and exactly one MLflow run per COMPLETE
trial enters any statistic: the run the trial recorded (user attr mlflow_run_id; with its analysis run,
user attr mlflow_analysis_run_id). Other children of the parent run (the finished run of a worker killed
before it told the study, runs of interrupted or failed trials) are never read.

Finding the study. `sweep` is a study name or the sweep's MLflow parent run id. The storage is, in
order: `storage` if given; else the first of these that holds the study: `optuna.db` beside a sqlite
tracking database (the project's default layout, `mlruns/optuna.db`, which moves with the project), the
storage URL the parent run recorded (tag hmmscope.storage; unusable when its password was masked),
and `./mlruns/optuna.db`. Nothing is created while looking. The study's user attr
mlflow_parent_run_id names its parent run (one per study, see sweep/study.py). No study -> ValueError
naming where it looked.

A sweep is one parent run with one child per trial. A training trial is the training run itself
(params = flattened config, metrics eval/*, memory/*), possibly with a grandchild "analysis"
(claims read from its claims.json table as claim/<name>/value|ci_lo|ci_hi and verdicts; older runs: from
metrics and tags); a theory trial is a theory parent run whose children are the settings (theory/rate,
rate_lo, rate_hi, log_intercept, gamma_eff).

The report leads with the answer (answer.py): its first lines, in bold, say for every swept key its effect over
seeds in words, with unit, 95% CI, replicates and verdict (`sweep.compare.answers`, the implementation the analysis
records' effects.csv share: "model.pos_enc: rope - absolute = -0.006 [-0.233, +0.221] nats/token, 2 seeds: no
detectable difference (inconclusive); ...", "hmm.gamma: 0.9 - 0.5 = +0.54 [+0.30, +0.78] nats/token, 2 seeds:
excess CE (seen tasks) grows with gamma (supported)"; the best setting only for keys a user tunes, marked), then the
effects table with the family's line (Holm), the objective per setting (the sweep parent run's pivot: mean over
seeds [95% CI] with units, rope - absolute, the oracle), its figure objective.png (`sweep.compare`, re-drawn here
from the study; a study with no stored hmmscope spec has none; the pivot's picture, pivot.png, stays on the parent
run: here the table is the text), and one sentence per verdict, the objective's first (`common.verdict_sentence`,
with units, CI and seeds). A spec's [report] reference joins another sweep's matching trials as a level. The
sweep's record (counts, hashes, code versions), the method and the full tables follow; a method or power text that
a table would repeat per row is listed once below it (`common.Notes`). The Verdicts table gives each claim's
Holm-adjusted verdict beside its own, under the family's line.

The report is built once as a list of blocks (heading, paragraph, table, image, list) per section, then
rendered to Markdown (GitHub pipe tables) and HTML (escaped text, <table>, figures embedded as base64
PNG); both files, the figures (PNG + PDF), report.json and trials.csv (one row per COMPLETE trial: run
id, the params that vary, the objective, every metric) sit in `out_dir` and are logged to the parent
run under `report/`. The report also shows the per-trial table (key metrics).

Modules (one idea each): answer.py (the first section), read.py (finding the study and parent run, reading one run
per COMPLETE trial, the tables of runs), theory.py (Theorem 1 and practice-vs-theory sections), posenc.py (RoPE vs
absolute), layerwise.py (pooled layerwise claims, depth vs rank), trials.py (the per-trial table and
trials.csv), render.py (Markdown, HTML), common.py (blocks, formatting, claim sides, power notes); this
module builds the report from them.

Statistical choices (each claim is a `stats.Claim` with a 95% CI, its degrees of freedom and a verdict; every
p is printed beside its df):

- Theory: each setting's rate is the mean over its HMM draws (theory.draws) with a t interval on draws - 1
  df, the Monte Carlo SE and between-draw sd beside it (read from theory/draw/* metric histories; runs with
  one draw: the logged bootstrap CI, Monte Carlo only, said so). The exponent of rate on gamma and on
  gamma_eff (`theory.sweep_fits`: two-stage, the per-draw slope with one intercept per (S, d, rho) group,
  then a t over draws; one draw: OLS with group intercepts) per group and pooled; the rank slope of the
  intercept per (S, rho, gamma) group with >= 3 ranks. gamma_eff a constant multiple of gamma within every
  group and draw: the same regression, said so, not a second claim. A k whose CI reaches 0 makes "k <= 4"
  vacuous: no power. Verdicts are theory's: k <= 4 supported if the CI upper < 4.
- Few-cluster inference, the one method for effects across seeds (stats module docstring): seeds
  (train.seed, else data.seed, when they vary) are the unit, with G - 1 df for G seeds.
- Positional encoding: effect = RoPE - absolute, trials restricted to those two levels. The verdict row
  (posenc.py): within-(seed, block) paired differences, blocks = levels of the other swept factors,
  averaged per seed, t over seeds (stats.paired_effect); one seed: the blocks are the units. The other swept
  factors are the design's keys (`read.design_keys`: the spec's [space] keys; with no stored spec, the params that
  are config keys): never a seed, never what a run fits (SCIENCE.md 9: an older store's counting.* params). A factor
  confounded with pos_enc, or one whose pairs would leave < 2 units, is left out and listed with its
  fate; none drops out silently. Per-level effects (each level of each blocking factor) beside the
  pooled one. OLS HC3 and (>= 2 seeds per cell) a random-intercept mixed model are shown as second
  opinions and never make the verdict (with 3 seeds they covered a planted null ~73% of the time).
  Verdict for "RoPE improves <metric>": the CI of the effect in the better direction (acc: up; CE, KL:
  down; analysis claims: the direction that supports the claim) entirely above 0 -> supported ("RoPE
  better"), entirely below -> not supported ("RoPE worse"), else inconclusive ("no detectable
  difference"); a degenerate effect (the same value for every seed) -> no power.
- Layerwise claims pooled across analyzed runs: the headline estimate is the mean over seeds of each
  seed's mean over its runs with a t-based 95% CI on G - 1 df (one seed: the runs are the units, the
  between-run variance kept, which an inverse-variance fixed-effect mean would ignore); the
  inverse-variance weighted mean (SE = (ci_hi - ci_lo) / 3.92) is shown beside it. One run: its own CI.
  Pooled verdict: the runs' own rule (stats.decide) on the pooled CI; 12 identical values (a zero-width
  CI) -> no power.
- Depth vs rank: cell means of eval/seen/excess_ce (eval/excess_ce in older stores) by (n_layers, rank)
  and `excess_ce ~ n_layers * log(rank)`: fitted per seed and averaged (t over seeds) when >= 2 seeds hold a
  full design, the OLS over all trials
  (HC3 when finite) beside it; else the OLS (trials as units), each coefficient with a 95% CI and df.
- Degenerate statistics: a statistic with a zero-width CI, or whose units all take one value, has no CI:
  stats.decide says "no power" and the reason says why (never "supported").
- Power: a row whose design cannot answer says "underpowered" with the reason (fewer than 2
  replicates per cell; no finite CI; an inconclusive CI wider than the effect it tests, with the
  smallest effect the design could resolve): common.underpowered. It never changes a verdict, which is always
  stats.decide's rule applied to the CI printed beside it (claims without a rule are only the two-sided
  "RoPE improves <claim of unknown side>" rows, whose verdict is stats.decide's on either side).
- Figures: each section that draws one (theory, practice vs theory, positional encoding, layerwise claims,
  depth vs rank) writes PNG + PDF into out_dir; report.html embeds every PNG (a test counts the <img> tags
  against the figures written).
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path

from .. import tracking
from ..safe_output import check_dest, make_dir, write_text
from ..stats import Claim, holm_verdicts, jsonable
from ..sweep import spec_of_study
from ..sweep.spec import SweepSpec
from ..sweep.study import parent_note
from ..units import fmt_ci, fmt_num
from .answer import answer_section
from .common import METRIC_DIRECTION, Notes, Section, claim_side, underpowered, verdict_sentence
from .layerwise import depth_rank_section, layerwise_section
from .posenc import posenc_section
from .read import Trials, design_keys, find_parent, is_theory, read_sweep_trials, theory_settings, training_frame
from .regime import headroom_section, regime_section
from .render import render_html, render_md
from .theory import practice_section, theory_section
from .trials import trial_rows, trials_section, write_csv

__all__ = ["build_report", "Report", "Section", "report_to_dict", "render_md", "render_html", "claim_side",
           "underpowered", "METRIC_DIRECTION"]


@dataclass
class Report:
    sweep: str
    parent_id: str
    header: dict
    sections: list[Section]
    claims: list[Claim]
    files: dict[str, str] = field(default_factory=dict)  # md, html, json, trials (csv), figures (local paths)
    notes: list[str] = field(default_factory=list)
    answer: str = ""  # the answer, a sentence per swept key joined by '; ' (the report's first lines; compare.answers)
    effects: list = field(default_factory=list)  # each swept key's effect (sweep.effects.Effect), the answer's numbers

    def summary_lines(self) -> list[str]:
        h = self.header
        out = [f"sweep {self.sweep} (parent run {self.parent_id}): {h['n_complete']} complete, "
               f"{h['n_failed']} failed, {h['n_pruned']} pruned"
               + (f" ({h['n_retried']} retried)" if h.get("n_retried") else "")]  # as `sweep run` says them
        out += [f"answer: {self.answer}"] if self.answer else []
        out += [verdict_sentence(c) for c in self.claims]  # in words; the reasons are in the report
        out += [f"note: {n}" for n in self.notes]
        out += [f"{k}: {v}" for k, v in self.files.items() if k in ("md", "html", "trials")]
        figs = [v for k, v in self.files.items() if k not in ("md", "html", "json", "trials")]
        if figs:
            out.append(f"figures: {', '.join(figs)}")
        return out


def report_to_dict(report: Report) -> dict:
    """The report as plain JSON-able data (blocks included)."""
    return jsonable(report)


def _header(sweep: str, t: Trials, n_train: int, n_theory: int) -> tuple[dict, Section]:
    p = t.parent
    hashes = {k: v for k, v in {**p.data.params, **p.data.tags}.items() if "hash" in k.lower()}
    versions = sorted({r.data.tags.get("hmmscope.code_version", "unknown") for r in t.complete})
    study = p.data.tags.get("hmmscope.study") or p.info.run_name or sweep
    started = _dt.datetime.fromtimestamp(p.info.start_time / 1000, _dt.UTC) if p.info.start_time else None
    h = {"study": study, "sweep_run_name": p.info.run_name, "parent_run_id": p.info.run_id,
         "config_hash": next(iter(hashes.values()), None), "hashes": hashes,
         "n_complete": t.counts["complete"], "n_failed": t.counts["failed"], "n_pruned": t.counts["pruned"],
         "n_running": t.counts["running"], "n_waiting": t.counts["waiting"], "n_retried": t.counts["retried"],
         "n_training_trials": n_train, "n_theory_trials": n_theory,
         "code_version": p.data.tags.get("hmmscope.code_version", "unknown"), "trial_code_versions": versions,
         "sweep_started": started.isoformat(timespec="seconds") if started else None,
         "report_date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    rows = [["study", study], ["parent run id", p.info.run_id], ["config hash", h["config_hash"] or "-"],
            ["trials complete / failed / pruned / running",
             f"{h['n_complete']} / {h['n_failed']} / {h['n_pruned']} / {h['n_running']}"],
            ["trials waiting / retried (re-run after an interruption or a dead worker)",
             f"{h['n_waiting']} / {h['n_retried']}"],
            ["training / theory trials (complete)", f"{n_train} / {n_theory}"],
            ["code version (parent)", h["code_version"]],
            ["code versions (trials)", ", ".join(versions) or "-"],
            ["sweep started", h["sweep_started"] or "-"], ["report date", h["report_date"]]]
    sec = Section("Sweep record", [("table", ["field", "value"], rows)])
    if len(versions) > 1:
        sec.blocks.append(("p", f"Warning: the trials ran on {len(versions)} different code versions."))
    if not t.complete:
        sec.blocks.append(("p", "This sweep has no complete trials: there is nothing to summarize."))
    return h, sec



# every file `build_report` may write into its folder (the figures: each section's, as PNG and PDF)
OUTPUTS = ("report.md", "report.html", "report.json", "trials.csv",
           *(f"{fig}.{ext}" for fig in ("objective", "theory_rate_vs_gamma", "practice_vs_theory",
                                        "posenc_effects", "layerwise_claims", "depth_vs_rank") for ext in ("png", "pdf")))


def _spec(study, storage: str | None):
    """The SweepSpec the study stored, or None (a study hmmscope did not create: no spec stored)."""
    try:
        return spec_of_study(study.study_name, storage) if storage else None
    except Exception:
        return None


def _describe(run, sentence: str, spec) -> None:
    """The sweep parent's description: the answer, then what the sweep runs (its spec's words; a study without a
    stored spec: the description it had, less an answer put there before, tag hmmscope.answer)."""
    tags = run.get().data.tags
    had = tags.get("mlflow.note.content", "")
    base = parent_note(spec) if isinstance(spec, SweepSpec) else had.removeprefix(
        f"{tags.get('hmmscope.answer', '')} — " if tags.get("hmmscope.answer") else "")
    run.set_tags({"hmmscope.answer": sentence,
                  "mlflow.note.content": tracking.note_line(f"{sentence} — {base}" if base else sentence)})


def _write(path: Path, text: str) -> None:
    write_text(path, text)


def build_report(uri: str, sweep: str, out_dir: Path, *, log: bool = True, storage: str | None = None) -> Report:
    """Read sweep `sweep` (study name or parent run id) and write the report under `out_dir`.

    The study is looked up in `storage`, else as the module docstring says. Writes report.md, report.html
    (figures embedded), report.json, trials.csv and the figures (PNG + PDF); logs them to the parent run
    under report/ when `log` (a store that cannot be written gets a note instead). Unknown sweep ->
    ValueError before anything is written; no complete trials -> a report that says so.
    """
    uri = tracking.resolve_uri(uri)
    out_dir = Path(out_dir)
    parent, study, found_in = find_parent(uri, sweep, storage)
    for name in OUTPUTS:  # every file it may write, checked before the first (a planted link: nothing written)
        check_dest(out_dir / name)
    make_dir(out_dir)  # after the sweep is found: an unknown sweep writes nothing
    t = read_sweep_trials(uri, parent, study)
    theory_runs = [r for r in t.complete if is_theory(r)]
    train_runs = [r for r in t.complete if not is_theory(r)]
    header, head_sec = _header(sweep, t, len(train_runs), len(theory_runs))
    sections, claims, figs, notes = [head_sec], [], {}, list(t.notes)
    settings = theory_settings(theory_runs, t.children, uri)
    if theory_runs and not settings:
        notes.append("theory trials found but no settings with logged rates")
    df = training_frame(train_runs, t.children, t.analysis, uri)
    spec = _spec(study, found_in)
    design = design_keys(spec, train_runs)  # the spec's [space] keys: never a seed, never what a run fits
    steps = [("theory", lambda: theory_section(settings, out_dir, figs) if settings else (None, [])),
             ("practice vs theory", lambda: (practice_section(df, out_dir, figs), [])),
             ("positional encoding", lambda: posenc_section(df, out_dir, figs, design)),
             ("regime", lambda: regime_section(train_runs, uri)),
             ("headroom", lambda: headroom_section(train_runs)),
             ("layerwise claims", lambda: layerwise_section(df, out_dir, figs)),
             ("depth vs rank", lambda: depth_rank_section(df, out_dir, figs))]
    for title, fn in steps:
        try:
            s, c = fn()
        except Exception as e:  # one broken section must not sink the report
            s, c = Section(f"{title} (failed)", [("p", f"This section failed: {type(e).__name__}: {e}")]), []
            notes.append(f"{title}: {type(e).__name__}: {e}")
        if s is not None:
            sections.append(s)
            claims += c
    if t.complete and len(sections) == 1:
        sections.append(Section("Results", [("p", "Complete trials carry none of the metrics this report reads.")]))
    if claims:
        vnotes = Notes()
        holm, family = holm_verdicts(claims)
        sections.append(Section("Verdicts", [
            ("p", "Each verdict is its rule applied to the 95% CI beside it (stats.decide; df: the CI's degrees of "
                  "freedom, '-' for a bootstrap interval); 'no power' says the CI cannot decide (zero width, no df, "
                  "or a check that cannot fail) and the reason says why; 'underpowered' in the reason says the "
                  "design cannot answer, and why. The Holm column adjusts for the family of claims (family-wise "
                  "5%), beside the claim's own verdict. Long statistics and reasons are numbered notes below the "
                  "table."),
            ("p", f"Family of {len(claims)} claims: {family}."),
            ("table", ["claim", "statistic", "value", "95% CI", "df", "rule", "verdict", "Holm (family)", "reason"],
             [[c.name, vnotes.short(c.statistic), fmt_num(c.value), fmt_ci(c.ci_lo, c.ci_hi), fmt_num(c.df), c.rule or "-",
               c.verdict, hv, vnotes.short(c.reason, sep="; ")] for c, hv in zip(claims, holm)]),
            *vnotes.blocks()]))
    effects: list = []
    try:  # the answer first; a failure here is a note, never the report's
        answer_sec, sentence, effects = answer_section(t, study, spec, found_in, claims, out_dir, figs)
        sections.insert(0, answer_sec)
    except Exception as e:
        sentence = ""
        notes.append(f"answer: {type(e).__name__}: {e}")
    rows, varying, metrics = trial_rows(t, is_theory, uri, design)
    tsec = trials_section(t.objective, rows, varying, metrics)
    if tsec is not None:
        sections.append(tsec)
    title = f"hmmscope report: {header['study']}"
    rep = Report(header["study"], parent.info.run_id, header, sections, claims, {}, notes, sentence, effects)
    files = {"md": out_dir / "report.md", "html": out_dir / "report.html", "json": out_dir / "report.json",
             "trials": out_dir / "trials.csv"}
    write_csv(files["trials"], t.objective, rows, varying, metrics)
    _write(files["md"], render_md(title, sections))
    _write(files["html"], render_html(title, sections, out_dir))
    rep.files = {**{k: str(v) for k, v in files.items()}, **figs}
    _write(files["json"], json.dumps(report_to_dict(rep), indent=2, default=str))
    if log:
        try:
            run = tracking.existing_run(uri, parent.info.run_id)
            for p in [*files.values(), *map(Path, figs.values())]:
                run.log_artifact(p, "report")
            if sentence:  # the parent's description (the UI's) opens with the answer
                _describe(run, sentence, spec)
        except Exception as e:  # e.g. a read-only store: the files are written, say why they are not logged
            rep.notes.append(f"the report was not logged to run {parent.info.run_id}: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
    return rep
