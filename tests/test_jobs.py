"""The jobs' output folders (hmmscope.jobs; the pipeline's evaluation and analysis): every command's figures as PNG +
PDF under out/<run>/, the same files logged to MLflow, and no two commands writing the same path (a real tiny training
run in a sqlite store). The main job's tests: tests/test_pipeline.py."""

import subprocess
import sys

import pytest
import torch

from hmmscope import tracking
from hmmscope.config import Config, TheoryConfig, override
from hmmscope.jobs import theory_job
from hmmscope.pipeline.analysis import analyze_run
from hmmscope.pipeline.evaluation import evaluate_run
from hmmscope.pipeline.run import train
from hmmscope.safe_output import new_folder, run_folder
from hmmscope.training import checkpoints

torch.set_num_threads(1)

SMALL = {
    "hmm.n_tasks": 4, "hmm.n_states": 8, "hmm.n_tokens": 4, "hmm.rank": 2,
    "data.n_demos": 2, "data.l_demo": 6, "data.l_test": 6, "data.n_train": 64, "data.n_eval": 16,
    "model.n_layers": 2, "model.n_heads": 2, "model.d_model": 16, "model.d_mlp": 32, "model.max_len": 64,
    "train.steps": 4, "train.batch_size": 8, "train.warmup": 1, "train.eval_every": 4, "train.ckpt_every": 4,
    "train.device": "cpu",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jobs")
    uri = f"sqlite:///{tmp}/mlflow.db"
    res = train(override(Config(), SMALL), tracking_uri=uri, experiment="j", run_name="my run/1", progress=False)
    return uri, res.run_id, tmp, res


def _artifacts(uri, run_id, path):
    return {f.path.split("/")[-1] for f in tracking.client(uri).list_artifacts(run_id, path)}


def test_evaluate_and_analyze_write_png_and_pdf_under_the_run_folder(run):
    uri, rid, tmp, _ = run
    out = tmp / "out"
    ev = evaluate_run(uri, rid, out=out)
    folder = out / f"my_run_1-{rid[:8]}"  # the run's name made file-safe, then its id
    assert folder == run_folder(out, "my run/1", rid)
    assert {p.name for p in ev.files} >= {"figure1.png", "figure1.pdf", "figure1.json", "figure1_by_k.csv"}
    assert all(p.parent == folder / "evaluation" and p.stat().st_size > 0 for p in ev.files)
    assert (folder / "evaluation" / "figure1.pdf").read_bytes()[:5] == b"%PDF-"
    assert {"eval/seen/test_acc", "eval/unseen/test_acc", "eval/retrieval_gap", "baseline/unseen/incontext_hmm/ce",
            "baseline/seen/mixture_oracle/ce_k0"} <= set(ev)  # still the metrics dict
    assert [c.name for c in ev.claims] == ["retrieval_gap", "icl_gain", "inference_beyond_counting"]
    logged = tracking.client(uri).get_run(rid).data
    nums, verdicts, rules = tracking.read_claims(uri, tracking.client(uri).get_run(rid))  # its claims.json
    assert rules == {"retrieval_gap": "> 0", "icl_gain": "> 0", "inference_beyond_counting": "< 0; requires icl_gain"}
    assert verdicts == {c.name: c.verdict for c in ev.claims}
    assert nums["claim/retrieval_gap/value"] == ev.claims[0].value and logged.metrics["claims/n"] == 3
    assert logged.tags["hmmscope.regime"] == ev.regime and ev["eval/figure1_s"] > 0
    assert {"figure1_paired.csv", "figure1_gains.csv"} <= {p.name for p in ev.files}
    assert logged.metrics["eval/retrieval_gap"] == ev["eval/retrieval_gap"] and "eval/test_acc" not in logged.metrics
    an = analyze_run(uri, rid, n_episodes=16, ks=(1, 2), n_perms=1, out=out, probe_tasks=4, min_per_task=4)
    names = {p.name for p in an.files}
    assert names >= {"figure2_shuffle.png", "figure2_shuffle.pdf", "figure3_probes.png", "figure3_probes.pdf"}
    assert all(p.parent == folder / "analysis" for p in an.files)
    assert not {str(p) for p in ev.files} & {str(p) for p in an.files}  # two commands, no shared path
    assert all(p.exists() for p in ev.files)  # analyze left evaluate's files alone
    # the same files, logged to MLflow
    assert {"figure1.png", "figure1.pdf"} <= _artifacts(uri, rid, "evaluation")
    assert {"figure2_shuffle.pdf", "figure3_probes.pdf"} <= _artifacts(uri, an.run_id, "analysis")
    # without `out` nothing is kept on disk (sweep trials), only logged
    assert evaluate_run(uri, rid).files == []


_HOLDER = """
import sys
from hmmscope import tracking
with tracking.start_run(sys.argv[1], "j", "", resume=sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_figures_off_keeps_every_table_and_metric_and_a_resume_or_evaluate_may_draw_them(tmp_path):
    """train.figures = false (a sweep of many trials): no emergence, Figure 1 or analysis (Figures 2, 3) images, the
    same tables, metrics and claims; a run-time key, so a resume may turn it back on; `evaluate RUN` and `analyze RUN`
    draw theirs, asked for by name."""
    from hmmscope.pipeline.analysis import analyze_model
    from hmmscope.pipeline.evaluation import evaluate_model

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = override(Config(), {**SMALL, "train.figures": False})
    res = train(cfg, tracking_uri=uri, experiment="j", run_name="nofig", progress=False)
    run = tracking.Run(uri, res.run_id)
    assert res.extra["emergence"] and "emergence/curves.json" in {a.path for a in tracking.client(uri).list_artifacts(
        res.run_id, "emergence")} and not _artifacts(uri, res.run_id, "figures")
    ev = evaluate_model(res.model, res.config, res.steps, run, out=tmp_path / "out")
    names = {p.name for p in ev.files}
    assert {"figure1_by_k.csv", "figure1.json"} <= names and not {n for n in names if n.endswith((".png", ".pdf"))}
    assert [c.name for c in ev.claims] == ["retrieval_gap", "icl_gain", "inference_beyond_counting"]
    assert not {n for n in _artifacts(uri, res.run_id, "evaluation") if n.endswith((".png", ".pdf"))}
    assert {"figure1.png", "figure1.pdf"} <= {p.name for p in evaluate_run(uri, res.run_id, out=tmp_path / "o2").files}
    small = {"n_episodes": 16, "ks": (1, 2), "n_perms": 1, "probe_tasks": 4, "min_per_task": 4}
    an = analyze_model(res.model, res.config, res.steps, run, uri=uri, out=tmp_path / "out", **small)
    assert {"analysis.json"} <= {p.name for p in an.files} and not [p for p in an.files if p.suffix in (".png", ".pdf")]
    assert an.claims and {"figure3_probes.png", "figure2_shuffle.pdf"} <= {
        p.name for p in analyze_run(uri, res.run_id, out=tmp_path / "o2", **small).files}
    more = override(cfg, {"train.steps": 6, "train.figures": True})  # a run-time key: the resume is taken
    res2 = train(more, tracking_uri=uri, experiment="j", resume=res.run_id, progress=False)
    assert res2.steps == 6 and res2.config.train.figures and {"emergence.png", "emergence.pdf"} <= _artifacts(
        uri, res.run_id, "figures")


def test_evaluate_refuses_a_run_another_process_writes(run):
    """One writer per run: `evaluate RUN` writes the run's Figure 1 metrics, so while another process writes it (a
    `train --resume` under way) it is refused before it writes anything. Before, both wrote into the run."""
    uri, rid, _, _ = run
    c = tracking.client(uri)
    before = len(c.get_metric_history(rid, "eval/seen/test_acc"))
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, uri, rid], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(tracking.RunHeld, match=f"still running in process {holder.pid} on "):
            evaluate_run(uri, rid)
        assert len(c.get_metric_history(rid, "eval/seen/test_acc")) == before
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=60)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
    assert holder.returncode == 0 and c.get_run(rid).info.status == "FINISHED"
    assert len(evaluate_run(uri, rid)) > 0  # free again once its writer ended
    assert len(c.get_metric_history(rid, "eval/seen/test_acc")) > before


def test_theory_jobs_never_share_a_folder(tmp_path):
    th = TheoryConfig(gammas=(0.5, 0.9), ranks=(2,), n_states=(4,), n_tokens=4, lengths=(1, 2, 3), n_histories=20,
                      burn_in=5, gamma_m=0)
    a = new_folder(tmp_path / "out", "theory")
    theory_job(th, a, uri=None, experiment="x")
    assert {p.name for p in a.iterdir()} == {"theory.png", "theory.pdf", "theory.json"}
    b = new_folder(tmp_path / "out", "theory")  # a second `hmmscope theory`: its own folder (a suffix in the same second)
    assert b != a and b.parent == a.parent == tmp_path / "out" and not b.exists()
    # the main job's theory figure lives in its own run's folder, never in a `hmmscope theory` folder
    main = run_folder(tmp_path / "out", "main", "f" * 32) / "theory"
    assert main.parent.name == "main-ffffffff" and main.parent not in (a, b)


def test_a_theory_runs_description_opens_with_its_answer(tmp_path):
    """Before: "Theory (Theorem 1): dirichlet HMMs, gamma 0.5, 0.9, ..." only (what ran, not what it found)."""
    th = TheoryConfig(gammas=(0.5, 0.9), ranks=(2,), n_states=(4,), n_tokens=4, lengths=(1, 2, 3), n_histories=20,
                      burn_in=5, gamma_m=0)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    res, rid = theory_job(th, new_folder(tmp_path / "out", "theory"), uri=uri, experiment="x")
    note = tracking.get_run(uri, rid).data.tags["mlflow.note.content"]
    answer = res.answer()
    assert note.startswith(f"{answer} — Theory (Theorem 1): "), note
    c = next(c for c in res.claims() if answer.startswith(f"{c.name}: "))  # a claim, its value and CI, its verdict
    assert answer.endswith(f": {c.verdict}") and "[" in answer and c.name.startswith("decay rate"), answer


def test_analyze_rejects_bad_probe_jobs_before_any_run(run):
    uri, rid, _, _ = run
    c = tracking.client(uri)
    n = len(c.search_runs([e.experiment_id for e in c.search_experiments()]))
    lines: list[str] = []
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="probe_jobs must be an integer >= 1"):
            analyze_run(uri, rid, n_episodes=16, ks=(1,), probe_jobs=bad, progress=lines.append)
    assert len(c.search_runs([e.experiment_id for e in c.search_experiments()])) == n and lines == []


# ---------------------------------------------------------------- the model in memory


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


def test_train_hands_back_the_model_of_its_last_checkpoint(run):
    uri, rid, _, res = run
    saved, cfg = checkpoints.load_model(uri, rid)
    assert res.config == cfg == override(Config(), SMALL) and res.steps == 4
    assert _same_state(res.model, saved) and not res.model.training
    again = train(override(Config(), SMALL), tracking_uri=uri, resume=rid, progress=False)  # finished: nothing to train
    assert again.run_id == rid and again.steps == 4 and _same_state(again.model, saved) and again.config == cfg


def test_analysis_run_lives_as_long_as_its_work_and_a_crash_leaves_it_failed(run, monkeypatch):
    """The analysis run opens when the work starts: its MLflow duration is the work's own (it used to open
    after the work: 1.9 s against 39.7 s); a crash in the probes leaves it FAILED with the shuffle test's
    metrics, logged as soon as that phase ended."""
    from hmmscope.pipeline import analysis

    uri, rid, tmp, _ = run
    an = analyze_run(uri, rid, n_episodes=16, ks=(1,), n_perms=1, probe_tasks=4, min_per_task=4)
    c = tracking.client(uri)
    got = c.get_run(an.run_id)
    info, m = got.info, got.data.metrics
    # no wall-clock ratio (a loaded machine makes any ratio flaky): the run's interval must hold the phases the
    # work timed itself, and the shuffle phase's metric, logged the moment that phase ended, lies inside it
    phases_ms = 1000 * (m["analysis/shuffle_s"] + m["analysis/probes_s"])
    assert info.end_time - info.start_time >= phases_ms - 2, (info.end_time - info.start_time, phases_ms)
    (first,) = [h for h in c.get_metric_history(an.run_id, "analysis/shuffle_s")][:1]
    assert info.start_time <= first.timestamp <= info.end_time
    assert first.timestamp - info.start_time >= 1000 * m["analysis/shuffle_s"] - 2  # opened before the shuffle began

    def boom(*a, **k):
        raise RuntimeError("probe fit crashed")

    monkeypatch.setattr(analysis, "run_probes", boom)
    with pytest.raises(RuntimeError, match="probe fit crashed"):
        analyze_run(uri, rid, n_episodes=16, ks=(1,), n_perms=1, probe_tasks=4, min_per_task=4)
    (failed,) = [r for r in tracking.search_runs(uri, "j", parent_id=rid) if r.info.status == "FAILED"]
    assert "shuffle/layer0/norm_change" in failed.data.metrics and "analysis/shuffle_s" in failed.data.metrics
    assert failed.data.tags["hmmscope.failure_reason"] == "RuntimeError: probe fit crashed"
