"""The CLI end to end: --help everywhere, small real runs into a temporary MLflow store, bad input."""

import json
import re
from pathlib import Path

import browser
import numpy as np
import ptys
import pytest
from typer.testing import CliRunner

from hmmscope import tracking
from hmmscope.cli import app
from hmmscope.data.episodes import load_episodes
from hmmscope.measure.figure1_result import BASELINES
from hmmscope.sweep.spec import TRAIN_OBJECTIVES, VS_OBJECTIVE

runner = CliRunner()
STAMP, STAMP_RE = "2026-11-27 21:50:03 ", r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "  # progress lines off a terminal: the time first

COMMANDS = [[], ["theory"], ["generate"], ["train"], ["evaluate"], ["run"], ["bench"], ["bench", "sample"],
            ["bench", "filter"], ["bench", "train"]]


def _runs(uri):
    c = tracking.client(uri)
    return c.search_runs([e.experiment_id for e in c.search_experiments()])


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "root")
def test_help(cmd):
    r = runner.invoke(app, [*cmd, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage" in r.output


SMALL_THEORY = ["theory", "--gammas", "0.5,0.9", "--n-states", "6", "--ranks", "2", "--lengths", "1,2,3,4",
                "--n-histories", "100", "--set", "theory.n_tokens=6", "--set", "theory.burn_in=20",
                "--set", "theory.gamma_m=0"]


def test_theory_end_to_end(project):
    r = runner.invoke(app, [*SMALL_THEORY, "--json", "res.json"])
    assert r.exit_code == 0, r.output
    res = json.loads((project / "res.json").read_text())
    assert [s["params"]["gamma"] for s in res["settings"]] == [0.5, 0.9]
    # S <= V with an injective revealing map: gamma(O) is exactly the knob
    assert all(s["gamma_O"]["exact"] and abs(s["gamma_O"]["value"] - s["params"]["gamma"]) < 1e-7
               for s in res["settings"])
    (folder,) = (project / "out").glob("theory-*")  # each `hmmscope theory` gets its own out/theory-<UTC time>/
    assert (folder / "theory.png").stat().st_size > 1000 and (folder / "theory.pdf").exists()
    assert f"figures: {Path('out') / folder.name / 'theory.png'}" in r.output
    runs = {r.info.run_name: r for r in _runs(tracking.default_tracking_uri())}
    parent = runs["theory"]
    children = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in runs.values())
    assert {c.data.params["hmm.gamma"] for c in children} == {"0.5", "0.9"}
    assert all({"theory/gamma_O", "theory/gamma_eff", "theory/dobrushin", "theory/eps"} <= set(c.data.metrics)
               for c in children)
    fits = {s["params"]["gamma"]: s["rate_fit"]["rate"] for s in res["settings"]}
    for c in children:  # a rate is logged exactly when the fit had enough points above the floor
        assert ("theory/rate" in c.data.metrics) == (fits[float(c.data.params["hmm.gamma"])] is not None)
    assert "decay rate >= g^4, g = gamma_eff" in r.output  # a verdict line per setting is printed
    # where to look, at once; off a terminal, a plain line per HMM draw as it begins and per setting as it ends,
    # instead of a bar (before: a setting's minutes said nothing)
    assert r.stdout.splitlines()[0] == f"theory run {parent.info.run_id} started; browse: hmmscope ui --run {parent.info.run_id}"
    said = [x[len(STAMP):] for x in r.stderr.splitlines() if x[len(STAMP):].startswith("theory: ")]
    d = res["config"]["draws"]
    assert ["draw" if ": HMM draw " in x else x.split(", ")[0] for x in said] == [
        *["draw"] * d, "theory: 1/2 settings", *["draw"] * d, "theory: 2/2 settings"], said
    assert said[0].startswith("theory: setting 1/2 (S=") and said[0].endswith(f"gamma=0.5): HMM draw 1/{d}")
    assert all(re.match(STAMP_RE, x) for x in r.stderr.splitlines() if "theory: " in x), r.stderr  # when, in a log


@pytest.mark.parametrize("args, needle", [
    (["--gammas", "0,0.5"], "theory.gammas must lie in (0, 1]"),
    (["--gammas", "1.5"], "theory.gammas must lie in (0, 1]"),
    (["--ranks", "9", "--n-states", "6"], "theory.ranks must lie in [1, n_states=6]"),
    (["--lengths", "-1,2"], "theory.lengths must be >= 1"),
    (["--set", "theory.family=gaussian"], "theory.family must be one of"),
    (["--set", "theory.bogus=1"], "unknown config key 'theory.bogus'"),
    (["--gammas", "a,b"], "expected comma-separated numbers"),
])
def test_theory_bad_input_exits_2_and_writes_nothing(project, args, needle):
    r = runner.invoke(app, ["theory", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1
    assert not (project / "mlruns").exists() and not (project / "out").exists()


def test_unknown_family_option_exits_2(project):
    r = runner.invoke(app, ["theory", "--family", "gaussian"])
    assert r.exit_code == 2 and not (project / "mlruns").exists()


def test_generate_writes_dataset(project):
    r = runner.invoke(app, ["generate", "eps.npz", "--n", "20", "--set", "hmm.n_tasks=3"])
    assert r.exit_code == 0, r.output
    ep = load_episodes(project / "eps.npz")
    assert ep.tokens.shape[0] == 20 and set(np.unique(ep.task_ids)) <= {0, 1, 2}
    assert ep.meta["dataset_hash"] in r.output
    r2 = runner.invoke(app, ["generate", "eps2.npz", "--n", "20", "--set", "hmm.n_tasks=3"])
    assert r2.exit_code == 0 and np.array_equal(load_episodes(project / "eps2.npz").tokens, ep.tokens)


@pytest.mark.parametrize("args", [["--set", "hmm.gamma=0"], ["--set", "hmm.rank=99"], ["--n", "-3"],
                                  ["--set", "data.l_test=-1"]])
def test_generate_bad_input(project, args):
    r = runner.invoke(app, ["generate", "bad.npz", *args])
    assert r.exit_code == 2, r.output
    assert not (project / "bad.npz").exists()


TINY_TRAIN = ["--set", "hmm.n_tasks=4", "--set", "model.n_layers=1", "--set", "model.d_model=32",
              "--set", "model.n_heads=2", "--set", "model.d_mlp=64", "--set", "train.steps=6",
              "--set", "train.eval_every=3", "--set", "train.ckpt_every=3", "--set", "train.warmup=2",
              "--set", "data.n_train=64", "--set", "data.n_eval=16", "--set", "data.n_demos=2",
              "--set", "data.l_demo=8", "--set", "data.l_test=8", "--device", "cpu"]


def test_train_prints_its_run_at_once(project):
    """A real `hmmscope train` prints its run id and where to browse it as its first line, while the run is still
    RUNNING (before training ends: here 100000 steps, stopped by SIGTERM once the line is read)."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    exe = Path(sys.executable).parent / "hmmscope"
    env = {**os.environ, "HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([str(exe), "train", *TINY_TRAIN, "--set", "train.steps=100000", "--set",
                          "train.ckpt_every=100000", "--set", "train.eval_every=100000", "--no-evaluate"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline, first = time.monotonic() + 300, ""
        while not first and time.monotonic() < deadline and p.poll() is None:
            if select.select([p.stdout], [], [], 1.0)[0]:
                first = p.stdout.readline().strip()
        uri = tracking.default_tracking_uri()
        (run,) = _runs(uri)
        assert run.info.status == "RUNNING", (first, run.info.status)  # printed before the end of training
        assert first == f"run {run.info.run_id} started; browse: hmmscope ui --run {run.info.run_id}"
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
        p.communicate(timeout=60)
    assert _runs(tracking.default_tracking_uri())[0].info.status == "KILLED"


def test_the_headline_reads_figure_1s_keys_and_skips_what_is_absent():
    """One line: the model's test CE beside the task oracle, the mixture oracle, the family's Bayes predictor and
    the best counting baseline, model - best counting with its CI, and the regime word (the evaluation's keys and
    tag); a key not logged (an older evaluation, training on fresh tasks) is left out, not printed as nan."""
    from hmmscope.cli.jobs import headline

    m = {"eval/unseen/test_ce": 1.2345, "eval/unseen/oracle_task_test_ce": 1.1, "eval/seen/oracle_mix_test_ce": 1.15,
         "baseline/unseen/family_bayes/ce": 1.12, "baseline/unseen/best_counting/ce": 1.3,
         "eval/unseen/vs_best_counting": -0.0655, "eval/unseen/vs_best_counting_lo": -0.08,
         "eval/unseen/vs_best_counting_hi": -0.051}
    m["eval/unseen/oracle_mix_test_ce"] = 1.6  # one task set in one line: the mixture oracle scored on unseen tasks
    assert headline(m, {"hmmscope.regime": "inference beyond counting"}) == (
        "result (unseen tasks, test CE, nats/token): model 1.2345; task oracle 1.1000, mixture oracle (training tasks) "
        "1.6000, family Bayes 1.1200, best counting 1.3000; model - best counting -0.0655 [95% CI -0.0800, -0.0510]; "
        "regime: inference beyond counting")
    fresh = {k: v for k, v in m.items() if k not in ("eval/unseen/oracle_mix_test_ce", "eval/unseen/vs_best_counting_lo",
                                                      "eval/unseen/vs_best_counting_hi")}
    assert headline(fresh, {}) == ("result (unseen tasks, test CE, nats/token): model 1.2345; task oracle 1.1000, "
                                   "family Bayes 1.1200, best counting 1.3000; model - best counting -0.0655")
    assert headline({"eval/seen/test_ce": 2.0}) == "result (seen tasks, test CE, nats/token): model 2.0000"
    assert headline({"val/loss": 1.0}) is None
    # a degenerate reference (SCIENCE.md 9) is shown as such; with no paired difference logged against it, the
    # regime line leaves the difference out instead of failing on the missing key
    from hmmscope.cli.jobs import regime_line

    bad = {k: v for k, v in m.items() if not k.startswith("eval/unseen/vs_best_counting")}
    bad.update({"baseline/unseen/best_counting/degenerate": 1.0, "baseline/unseen/family_bayes/degenerate": 1.0})
    assert headline(bad, {}) == (
        "result (unseen tasks, test CE, nats/token): model 1.2345; task oracle 1.1000, mixture oracle (training tasks) "
        "1.6000, family Bayes 1.1200 (DEGENERATE, not used), best counting 1.3000 (DEGENERATE, not used)")
    assert regime_line(bad) == (
        "regime: undetermined; unseen tasks: model CE 1.234; best counting 1.300 (DEGENERATE, not used); "
        "family Bayes 1.120 (DEGENERATE, not used); task oracle 1.100 nats/token")
    assert "model - best counting -0.066 [-0.080, -0.051]" in regime_line(m)


def test_train_then_evaluate(project):
    r = Ran(project, "train", *TINY_TRAIN, merged=True)  # a real process, stdout and stderr to one file, in order
    assert r.exit_code == 0, r.output
    uri = tracking.default_tracking_uri()
    (run,) = _runs(uri)
    # the run's id as soon as the run opens, before the data and the references are built (before: after them,
    # 8.5 s quiet on tiny, minutes at the paper's scale): the setup line comes after it
    lines = r.stdout.splitlines()
    assert lines[0] == f"run {run.info.run_id} started; browse: hmmscope ui --run {run.info.run_id}", lines[:3]
    assert re.fullmatch(STAMP_RE + r"train: setting up: data, oracles, model \.\.\.", lines[1]), lines[:3]
    # the end: the headline, then the claims one short line each (before: 3 wrapped claims and a second `regime:`
    # line repeating the headline's numbers; the headline put the seen-task mixture oracle in an unseen-task line)
    end = lines[next(i for i, ln in enumerate(lines) if ln.startswith("result (")):]
    assert len(end) <= 9 and not [ln for ln in end if ln.startswith("regime:")], end
    assert end[1].startswith("Figure 1's claims") and all(ln.startswith("  [") and "statistic:" not in ln and
                                                          len(ln) < 160 for ln in end[2:5]), end
    assert "(seen tasks)" not in end[0] and "mixture oracle (training tasks) " in end[0]
    assert run.info.status == "FINISHED"
    (out,) = tracking.client(uri).get_run(run.info.run_id).outputs.model_outputs  # the trained model, logged
    assert out.step == 6 and tracking.client(uri).get_logged_model(out.model_id).params["model.d_model"] == "32"
    assert {"eval/seen/test_acc", "eval/seen/oracle_mix_test_acc", "eval/seen/excess_ce", "eval/seen/kl_mix",
            "eval/unseen/excess_ce_task", "eval/retrieval_gap", "baseline/seen/incontext_bigram/ce"} <= set(run.data.metrics)
    assert run.data.params["model.d_model"] == "32"
    figs = sorted((project / "out").glob("*/evaluation/figure1.p*"))  # out/<run name>-<id8>/evaluation/
    assert [p.suffix for p in figs] == [".pdf", ".png"] and figs[0].parent.parent.name.endswith(run.info.run_id[:8])
    assert "figures: out/" in r.output and "figure1.png" in r.output
    # one headline line, not a 75-row table (that is in the run, or behind --verbose); a train run says its kind
    m = run.data.metrics
    (head,) = [ln for ln in r.stdout.splitlines() if ln.startswith("result (")]
    assert head.startswith(f"result (unseen tasks, test CE, nats/token): model {m['eval/unseen/test_ce']:.4f}; "
                           f"task oracle {m['eval/unseen/oracle_task_test_ce']:.4f}")
    assert "eval/seen/kl_mix" not in r.stdout and (f"every metric, and each claim's statistic and reason: hmmscope runs "
                                                  f"show {run.info.run_id[:8]}") in r.stdout
    assert run.data.tags["hmmscope.kind"] == "train"
    r2 = runner.invoke(app, ["evaluate", run.info.run_id[:8]])  # a unique prefix of the id will do
    assert r2.exit_code == 0, r2.output
    assert "eval/seen/test_acc" in r2.output and "figure1.pdf" in r2.output


@pytest.mark.parametrize("sets, needle", [
    (["--set", "model.bogus=1"], "unknown config key 'model.bogus'"),
    (["--set", "train.steps=ten"], "train.steps"),
    (["--set", "model.n_heads=3"], "must divide"),
    (["--set", "model.window=-1"], "model.window"),
    (["--set", "model.pos_enc=alibi"], "model.pos_enc must be one of"),
    (["--device", "tpu"], "device"),
])
def test_train_bad_config_exits_2_without_a_run(project, sets, needle):
    r = runner.invoke(app, ["train", *sets])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert not (project / "mlruns").exists()


def test_evaluate_without_a_store_creates_none(project):
    r = runner.invoke(app, ["evaluate", "0123456789abcdef"])
    assert r.exit_code == 2 and "no MLflow store at" in r.output, r.output
    assert not (project / "mlruns").exists()


def test_analyze_end_to_end_and_bad_input(project):
    assert runner.invoke(app, ["train", *TINY_TRAIN, "--set", "data.n_eval=24", "--no-evaluate"]).exit_code == 0
    uri = tracking.default_tracking_uri()
    (train_run,) = _runs(uri)
    rid = train_run.info.run_id
    r = runner.invoke(app, ["analyze", rid, "--ks", "1,2", "--n-perms", "2"])
    assert r.exit_code == 0, r.output
    runs = {x.info.run_name: x for x in _runs(uri)}
    an = runs["analysis"]
    assert an.data.tags["mlflow.parentRunId"] == rid and an.info.status == "FINISHED"
    assert {"shuffle/layer0/norm_change", "probe/kback1/layer0/acc", "probe/task/layer1/acc",
            "probe/kback1/token_acc"} <= set(an.data.metrics)  # the k-back probes' token statistics (issue 26)
    # claims: ONE table (claims.json) plus headline counts, not a metric triple and two tags per claim
    assert not any(k.startswith(("claim/", "verdict/", "rule/")) for k in (*an.data.metrics, *an.data.tags))
    nums, verdicts, _ = tracking.read_claims(uri, an)
    assert verdicts and an.data.metrics["claims/n"] == len(verdicts)
    assert sum(an.data.metrics[f"claims/{v.replace(' ', '_')}"] for v in set(verdicts.values())) == len(verdicts)
    assert an.data.tags["hmmscope.claims"].startswith(f"{len(verdicts)} claims: ")
    assert nums and {k.split("/")[1] for k in nums} <= set(verdicts)  # numbers of claims the table names
    assert "upper layers change less" in r.output
    assert "figure2_shuffle.png" in r.output and "figure3_probes.pdf" in r.output
    assert len(list((project / "out").glob(f"*-{rid[:8]}/analysis/figure*.p*"))) == 4
    # progress: one line per phase on stderr, with the seconds since the start; stdout keeps only the summary
    lines = r.stderr.splitlines()
    assert all(re.fullmatch(STAMP_RE + r"analyze: .+, \d+ s", x) for x in lines), r.stderr  # the time first, off a tty
    lines = [x[len(STAMP):] for x in lines]
    assert [x.split(" (")[0].rsplit(", ", 1)[0] for x in lines] == [
        "analyze: checkpoint loaded",
        f"analyze: analysis run {an.info.run_id} started; browse: hmmscope ui --run {an.info.run_id}", "analyze: mixture",
        "analyze: shuffle test done", "analyze: probe episodes drawn",
        "analyze: probes: belief targets: 120 episodes x 8 positions x 16 states", "analyze: probes: layer 1/2 done",
        "analyze: probes: layer 2/2 done", "analyze: probes: statistics done", "analyze: probes done",
        "analyze: tables and figures written", "analyze: logged to MLflow"], r.stderr
    assert f"analyze: logged to MLflow (analysis run {an.info.run_id}), " in r.stderr
    assert "analyze:" not in r.stdout
    ckpt = next(project.rglob("last.pt"))
    r = runner.invoke(app, ["analyze", str(ckpt), "--ks", "1", "--n-perms", "1", "--n-episodes", "16",
                            "--probe-jobs", "2"])
    assert r.exit_code == 0, r.output  # a checkpoint file works too (standalone analysis run)
    assert "analyze: probes: layer 2/2 done (layer 1: fits" in r.stderr and "in one of 2 processes" in r.stderr
    n_runs = len(_runs(uri))
    with tracking.start_run(uri, "hmmscope", "no-checkpoint") as bare:
        pass
    for args, needle in [(["0123456789abcdef"], "unknown MLflow run id"),
                         ([bare.run_id], "has no checkpoint"),
                         ([rid, "--ks", "0"], "k must lie in"),
                         ([rid, "--ks", "99"], "k must lie in"),
                         ([rid, "--ks", "x"], "comma-separated"),
                         ([rid, "--probe-jobs", "0"], "--probe-jobs: expected an integer >= 1 or 'auto', got '0'"),
                         ([rid, "--probe-jobs", "-1"], "--probe-jobs: expected an integer >= 1 or 'auto'"),
                         ([rid, "--probe-jobs", "x"], "--probe-jobs: expected an integer >= 1 or 'auto'"),
                         ([str(project / "missing.pt")], "checkpoint not found")]:
        r = runner.invoke(app, ["analyze", *args])
        assert r.exit_code == 2 and needle in r.output, (args, r.output)
        assert r.stdout == "" and len(r.stderr.splitlines()) == 1, (args, r.output)  # one line: no progress
    assert len(_runs(uri)) == n_runs + 1  # only the bare run: bad input created no analysis run


SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


class Ran:
    """A real `hmmscope` process run to its end in `cwd`, its stdout and stderr written to files (no terminal: what a
    log file, nohup or Slurm gets): exit_code, stdout, stderr, output (both), as CliRunner's result has them."""

    def __init__(self, cwd: Path, *args: str, timeout: float = 1800, merged: bool = False):
        import os
        import subprocess
        import sys

        exe = Path(sys.executable).parent / "hmmscope"
        env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "HMMSCOPE_THREADS": "1",
               "OMP_NUM_THREADS": "1"}
        out, err = cwd / "cli.out", cwd / "cli.err"
        with out.open("w") as fo, err.open("w") as fe:  # merged: stderr into the same file, in the order written
            self.exit_code = subprocess.run([str(exe), *args], cwd=cwd, env=env, stdout=fo,
                                            stderr=subprocess.STDOUT if merged else fe,
                                            stdin=subprocess.DEVNULL, timeout=timeout).returncode
        self.stdout, self.stderr = out.read_text(), err.read_text()
        self.output = self.stdout + self.stderr


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke sweep run once with 2 workers in a fresh folder, as a real process writing to files: (folder, its
    result). Its trials draw no images (train.figures, a run-time key: the sweep is the same); no test here reads
    them, and the main job's test runs this spec with them."""
    d = tmp_path_factory.mktemp("smoke")
    yield d, Ran(d, "sweep", "run", str(SWEEPS / "smoke.toml"), "--workers", "2", "--set", "train.figures=false")


def _answer_lines(md: str) -> list[str]:
    """The bold sentences that open a report's Answer: one per swept key (sweep.compare.answers)."""
    paras = md.split("## Answer\n\n", 1)[1].split("\n\n")
    return [p.strip("*") for p in paras[:next(i for i, p in enumerate(paras) if not p.startswith("**"))]]


def test_smoke_sweep_two_workers_then_report(smoke, monkeypatch):
    store, r = smoke
    monkeypatch.chdir(store)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert r.exit_code == 0, r.output
    # it ends with the answer: the report's first sentence, then the report's HTML (before: `report: hmmscope report
    # smoke`, no answer); off a terminal (here a file)
    *_, browse, said, html = r.stdout.splitlines()
    assert browse == "browse: hmmscope ui --sweep smoke" and html == "report: out/smoke/report.html", r.stdout
    md = (store / "out" / "smoke" / "report.md").read_text()
    bold = _answer_lines(md)  # a sentence per swept key (issue 46.1): pos_enc, then gamma
    assert said == f"sweep smoke: {'; '.join(bold)}" and said.startswith(
        "sweep smoke: model.pos_enc: rope - absolute = ") and " nats/token, one seed (2 blocks as the units): " \
        in said and "; hmm.gamma: 0.9 - 0.5 = " in said, said
    assert (store / "out" / "smoke" / "report.html").exists()
    assert r.stdout.splitlines()[0] == "sweep smoke: browse: hmmscope ui --sweep smoke"  # where to look, at once
    # its RoPE - absolute CI is a t over 2 blocks: one line says so, before the last three (before: nothing said it)
    parent = tracking.sweep_parent(tracking.default_tracking_uri(), "smoke")  # its UI description: the answer first
    assert parent.data.tags["mlflow.note.content"].startswith(f"{'; '.join(bold)} — Sweep 'smoke': 4 train trials")
    warning = r.stdout.splitlines()[-4]
    assert warning.startswith("warning: ") and "with 1 degree of freedom (2 seeds, or 2 blocks): t = 12.7, " in warning
    assert "smoke: 4 complete, 0 failed, 0 pruned of 4" in r.output
    # progress (stderr is no terminal here: plain lines when the counts change), ending with every trial finished
    assert "sweep smoke: 4/4 finished: 4 done, 0 failed, 0 running; ETA 0:00:00" in r.stderr
    assert "HighsMipSolverData" not in r.output and "INFO" not in r.output
    r = runner.invoke(app, ["sweep", "run", str(SWEEPS / "smoke.toml"), "--workers", "2"])
    assert r.exit_code == 0 and "already complete" in r.output
    r = runner.invoke(app, ["sweep", "status", "smoke"])
    assert r.exit_code == 0 and r.output.count("COMPLETE") == 4
    r = Ran(store, "sweep", "list")  # plain columns, as runs list and sweep status print them (before: boxes)
    assert r.exit_code == 0 and not set("│┃━─┏╇┡") & set(r.stdout), r.stdout
    assert r.stdout.splitlines()[1].split()[:4] == ["study", "kind", "trials", "complete"], r.stdout
    assert r.stdout.splitlines()[3].split()[:4] == ["smoke", "train", "4", "4"] and r.stdout.endswith("1 study\n")
    trials = [x for x in _runs(tracking.default_tracking_uri()) if x.data.tags.get("hmmscope.kind") == "sweep-train"]
    assert len(trials) == 4
    for t in trials:  # the objectives a spec may name (checked at spec validation) are what a trial logs
        logged = {k for k in t.data.metrics if k.split("/")[0] in ("val", "eval", "oracle")}
        # a degenerate reference (SCIENCE.md 9: CE above ln V or a negative in-context gain) is flagged and never used:
        # no excess or kl_mix against a degenerate mixture reference, no paired difference with a degenerate baseline
        bad = {k.split("/")[2] for k in t.data.metrics if k.startswith("baseline/unseen/") and k.endswith("/degenerate")}
        unused = {"eval/unseen/kl_mix", "eval/unseen/excess_ce"} if "mixture_oracle" in bad else set()
        assert {k for k in logged if not VS_OBJECTIVE.fullmatch(k)} == TRAIN_OBJECTIVES - unused
        vs = {k for k in logged if VS_OBJECTIVE.fullmatch(k)}  # model - baseline per k, paired (pattern)
        # the Bayes reference (SCIENCE.md 10) is not computed here: smoke's family (S = 8, d = 4) is beyond its orbit
        # enumeration (oracles.bayes.why_not), so it is absent, never a guess
        assert "baseline/unseen/bayes/ce" not in t.data.metrics
        assert {f"eval/unseen/vs/{b}/k{k}{s}" for b in BASELINES if b not in bad | {"bayes"} for k in range(3)
                for s in ("", "_lo", "_hi")} <= vs <= {f"eval/unseen/vs/{b}/k{k}{s}" for b in BASELINES
                                                       for k in range(3) for s in ("", "_lo", "_hi")}
    r = runner.invoke(app, ["report", "smoke"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == warning, r.stdout  # the report's summary says it too
    md = (store / "out" / "smoke" / "report.md").read_text()
    assert "| trials complete / failed / pruned / running | 4 / 0 / 0 / 0 |" in md
    assert "Positional encoding" in md and (store / "out" / "smoke" / "report.html").exists()
    assert (store / "out" / "smoke" / "trials.csv").exists() and "trials: out/smoke/trials.csv" in r.output


def test_results_outside_the_ui_runs_list_show_compare_and_sweep_trials(smoke, monkeypatch):
    """`runs list/show/compare` print plain tables (no box characters); `api.sweep_trials` is the sweep as a
    DataFrame: one row per trial with its params, objective, run id and metrics; unknown names: exit 2."""
    from hmmscope import api

    store, r = smoke
    assert r.exit_code == 0, r.output
    monkeypatch.chdir(store)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    df = api.sweep_trials("smoke")
    assert list(df["number"]) == [0, 1, 2, 3] and set(df["state"]) == {"COMPLETE"}
    assert sorted(zip(df["params.model.pos_enc"], df["params.hmm.gamma"], strict=True)) == [
        ("absolute", "0.5"), ("absolute", "0.9"), ("rope", "0.5"), ("rope", "0.9")]  # strings, as MLflow has them
    assert (df["objective"] == df["metrics.eval/seen/excess_ce"]).all()  # the objective is that metric
    assert not [c for c in df.columns if "Objective/" in c]  # logged once (before: also as Objective/<key>)
    assert not [c for c in df.columns if c.startswith(("metric:", "param:"))]  # mlflow.search_runs' prefixes
    assert list(df["run_name"]) == [f"{p}-g{g}-s0" for p, g in zip(df["params.model.pos_enc"], df["params.hmm.gamma"],
                                                                   strict=True)]
    runs = api.runs("hmmscope-sweeps")
    assert set(df["run_id"]) <= set(runs["run_id"]) and len(runs) == 5  # the 4 trials and their parent
    # metrics.*, params.* and tags.* columns as mlflow.search_runs has them
    trials = runs[runs["run_id"].isin(df["run_id"])].set_index("run_id")
    assert (trials.loc[df["run_id"], "metrics.eval/seen/excess_ce"].to_numpy() == df["objective"].to_numpy()).all()
    assert set(trials["params.model.pos_enc"]) == {"rope", "absolute"} and set(trials["tags.hmmscope.kind"]) == {"sweep-train"}
    out = runner.invoke(app, ["runs", "list", "--experiment", "hmmscope-sweeps"])
    assert out.exit_code == 0 and out.stdout.splitlines()[0].split()[:3] == ["run_id", "run_name", "experiment"]
    assert all(n in out.stdout for n in df["run_name"]) and "5 of 5 run(s)" in out.stdout
    assert not set("│┃━─┏") & set(out.stdout)  # plain: no box drawing
    # MLflow's search syntax passed through; the metric ordered by (and any asked for) shown as a column
    out = runner.invoke(app, ["runs", "list", "--filter", "params.`model.pos_enc` = 'rope'", "--order-by",
                              "metrics.`eval/seen/excess_ce` DESC", "-m", "eval/seen/test_acc"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].split()[-2:] == ["metrics.eval/seen/test_acc", "metrics.eval/seen/excess_ce"]
    rope = df[df["params.model.pos_enc"] == "rope"].sort_values("objective", ascending=False)
    assert [ln.split()[0] for ln in lines[2:-1]] == list(rope["run_id"]) and lines[-1] == "2 of 2 run(s)"
    # a sweep's runs, its swept params as columns (before: no param columns, no --sweep); any param asked for
    out = runner.invoke(app, ["runs", "list", "--sweep", "smoke", "-p", "train.seed"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].split()[-3:] == ["params.hmm.gamma", "params.model.pos_enc", "params.train.seed"], lines[0]
    rows = {ln.split()[0]: ln.split() for ln in lines[2:-1]}
    assert set(rows) == {*df["run_id"], tracking.sweep_parent(tracking.default_tracking_uri(), "smoke").info.run_id}
    for rid, g, pe in zip(df["run_id"], df["params.hmm.gamma"], df["params.model.pos_enc"], strict=True):
        assert rows[rid][-3:] == [g, pe, "0"], rows[rid]
    assert lines[-1] == "5 of 5 run(s)"
    out = runner.invoke(app, ["runs", "list", "--sweep", "smok"])
    assert out.exit_code == 2 and out.stderr.startswith("error: no sweep 'smok' in ") and \
        out.stderr.rstrip().endswith("did you mean smoke?") and out.stderr.count("\n") == 1, out.output
    out = runner.invoke(app, ["runs", "list", "--filter", "metrics.x <<< 1"])
    assert out.exit_code == 2 and out.output.startswith("error: search 'metrics.x <<< 1': ") and \
        out.output.count("\n") == 1, out.output
    a, b = df["run_id"][0], df["run_id"][1]
    out = runner.invoke(app, ["runs", "show", a[:8]])  # the short id a report prints is taken
    assert out.exit_code == 0 and f"run_name    {df['run_name'][0]}" in out.stdout and f"run_id      {a}" in out.stdout
    assert "eval/seen/excess_ce" in out.stdout and "\nparams:" in out.stdout
    out = runner.invoke(app, ["runs", "compare", a[:8], b[:8]])
    rows = {ln.split()[0]: ln.split()[1:] for ln in out.stdout.splitlines()[2:-1]}
    assert out.exit_code == 0 and "params.train.seed" not in rows  # equal: not shown
    assert rows["params.hmm.gamma"] == [str(x) for x in df["params.hmm.gamma"][:2]] or \
        rows["params.model.pos_enc"] == list(df["params.model.pos_enc"][:2])
    out = runner.invoke(app, ["runs", "compare", a, b, "--keys", "eval/seen/*_ce"])
    keys = [ln.split()[0] for ln in out.stdout.splitlines()[2:-1]]
    assert out.exit_code == 0 and keys and all(k.startswith("metrics.eval/seen/") and k.endswith("_ce") for k in keys)
    assert out.stdout.splitlines()[-1].endswith("matching 'eval/seen/*_ce'")
    for args in (["runs", "show", "nope"], ["runs", "compare", a], ["runs", "list", "--experiment", "nope"]):
        out = runner.invoke(app, args)
        assert out.exit_code == 2 and out.output.startswith("error: ") and out.output.count("\n") == 1, out.output
    with pytest.raises(ValueError, match="no sweep study 'nope'"):
        api.sweep_trials("nope")


@pytest.mark.skipif(browser.chromium() is None, reason=browser.NO_CHROMIUM)
def test_the_printed_ui_command_lands_on_the_sweeps_answer_then_its_trials_in_a_real_browser(smoke):
    """The line the sweep printed (`hmmscope ui --sweep smoke`), run for real, prints two URLs, each loaded in
    headless chromium. First the answer: the parent run's comparison/objective.png, shown as an image (before:
    5-7 clicks from any printed URL). Then the trials: the runs table of the 4 trials by name (not MLflow 3's
    GenAI overview), sorted by the objective, whose visible column headers are the objective and the swept
    params (before: all 201 metric and param columns hidden). MLflow 3.17 reads no columns from a URL; the
    trials URL names the sweep's shared view (viewStateShareKey), which holds them.
    A trial's Model metrics tab opens on its loss curves (the Loss section, first; before they sat below ~30
    baseline/ and eval/ sections), and `ui --run` opens that tab. Screenshots: out/test-artifacts/ui-sweep-smoke-answer.png,
    ui-sweep-smoke-trials.png, ui-sweep-smoke-trial-metrics.png."""
    store, r = smoke
    assert r.exit_code == 0, r.output
    cmd = next(ln for ln in r.stdout.splitlines() if ln.startswith("browse: ")).split("browse: ", 1)[1].split()
    assert cmd[:2] == ["hmmscope", "ui"]
    uri = f"sqlite:///{store}/mlruns/mlflow.db"
    trial_runs = [x for x in _runs(uri) if x.data.tags.get("hmmscope.kind") == "sweep-train"]
    names = sorted(x.info.run_name for x in trial_runs)
    assert names == ["absolute-g0.5-s0", "absolute-g0.9-s0", "rope-g0.5-s0", "rope-g0.9-s0"]
    with browser.serve_ui(store, *cmd[2:], lines=True) as printed:
        assert len(printed) == 2 and printed[0].startswith("MLflow UI: ") and printed[1].startswith("trials: ")
        answer = printed[0].split("MLflow UI: ", 1)[1].split("  (Ctrl-C", 1)[0]
        trials = printed[1].split("trials: ", 1)[1]
        assert "/artifacts/comparison/objective.png?workflowType=machine_learning" in answer
        assert "workflowType=machine_learning" in trials and "viewStateShareKey=hmmscope-sweep-smoke" in trials
        shown = browser.render(answer, browser.ARTIFACTS, "ui-sweep-smoke-answer")
        dom = (browser.ARTIFACTS / "ui-sweep-smoke-answer.html").read_text()
        text = browser.render(trials, browser.ARTIFACTS, "ui-sweep-smoke-trials")
        # a trial's page as `hmmscope ui --run ID` prints it (tracking.target_url): its Model metrics tab (before: its
        # Overview), the loss curves first (MLflow orders sections by name)
        one = trial_runs[0].info
        url = tracking.target_url(uri, answer.split("/#/", 1)[0], run_id=one.run_id[:8])
        assert url.endswith(f"/runs/{one.run_id}/model-metrics?workflowType=machine_learning"), url
        charts = browser.render(url, browser.ARTIFACTS, "ui-sweep-smoke-trial-metrics")
    sections = re.findall(r"(\S+) \((\d+)\) Add chart", charts)  # each section's header: name (charts) Add chart
    assert sections[0] == ("Loss", "2") and not [x for x in sections if x[0].startswith("Objective")], sections[:5]
    assert "sweep-smoke" in shown and "comparison/objective.png" in shown, shown[:2000]
    # the artifact viewer shows the PNG itself (an <img> of the artifact, fetched as a blob)
    assert re.search(r'<img[^>]+alt="comparison/objective\.png"[^>]+src="blob:', dom), "no objective.png image shown"
    assert "Run Name" in text and "4 matching runs" in text, text[:2000]
    assert all(n in text for n in names), text[:2000]
    assert "Sort: eval/seen/excess_ce" in text, text[:2000]  # the objective, logged once (no Objective/ copy)
    heads = text.split("Run Name", 1)[1].split("Hide run", 1)[0]  # the header row, before the first run
    for col in ("eval/seen/excess_ce", "hmm.gamma", "model.pos_enc"):  # visible columns
        assert col in heads, (col, heads)
    # each as wide as its header (before: 100 px cut the objective's to 'Objective/eval/s'): the rendered widths
    dom = (browser.ARTIFACTS / "ui-sweep-smoke-trials.html").read_text()
    for col, chars in (("metrics.`eval/seen/excess_ce`", 19), ("params.`model.pos_enc`", 13)):
        (w,) = set(re.findall(rf'role="columnheader"[^>]*col-id="{re.escape(col)}"[^>]*width: (\d+)px', dom))
        assert int(w) >= 7.5 * chars + 40, (col, w)
    assert "sweep-smoke" not in text.split("Run Name", 1)[1]  # the trials, flat; not the parent folding them


def test_bundled_specs_run_by_name(project):
    """`hmmscope sweep run smoke` finds sweeps/smoke.toml (the project's own when the working folder has none);
    an unknown name is one error line naming it."""
    r = runner.invoke(app, ["sweep", "run", "smoke", "--print-config"])
    assert r.exit_code == 0, r.output
    assert r.output == runner.invoke(app, ["sweep", "run", str(SWEEPS / "smoke.toml"), "--print-config"]).output
    r = runner.invoke(app, ["sweep", "run", "no-such-spec"])
    assert r.exit_code == 2 and "no-such-spec" in r.output and r.output.count("\n") == 1, r.output


def test_bad_sweep_spec_exits_2_without_study_or_run(project):
    spec = project / "bad.toml"
    spec.write_text('[sweep]\nname = "bad"\n[space]\n"hmm.gamma" = {grid = []}\n')
    r = runner.invoke(app, ["sweep", "run", str(spec)])
    assert r.exit_code == 2 and "bad.toml" in r.output and "hmm.gamma" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (project / "mlruns").exists()
    r = runner.invoke(app, ["report", "no-such-sweep"])
    assert r.exit_code == 2 and "no MLflow store" in r.output  # nothing tracked here: no store is created
    assert not (project / "mlruns").exists() and not (project / "out").exists()


def test_main_job_quick_interrupted_then_resumed(project):
    """`hmmscope run --quick` (the README's first main job), shrunk further, as real processes writing to files (no
    terminal): Ctrl-C once training has begun keeps the theory run and prints what is kept and the command that
    resumes it (before: `error: interrupted` only, and `run` started over); that command skips the theory and runs
    the rest: training + Figure 1, the analysis, the smoke-quick sweep (one worker) and its report, each phase's one-line
    result on stdout as it ends, one short line per claim, the answer last."""
    import os
    import shlex
    import signal
    import subprocess
    import sys
    import time

    small = ["--quick", "--set", "train.steps=20", "--set", "train.eval_every=10", "--set", "train.ckpt_every=10",
             "--set", "theory.gammas=[0.5, 0.9]", "--set", "theory.n_histories=100"]
    exe = Path(sys.executable).parent / "hmmscope"
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "HMMSCOPE_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    with (project / "1.out").open("w") as fo, (project / "1.err").open("w") as fe:
        p = subprocess.Popen([str(exe), "run", *small], cwd=project, env=env, stdout=fo, stderr=fe,
                             stdin=subprocess.DEVNULL)
        try:
            deadline = time.time() + 600
            while "[2/5] training ..." not in (project / "1.err").read_text():  # the theory phase has ended
                assert p.poll() is None and time.time() < deadline, (project / "1.err").read_text()
                time.sleep(0.2)
            p.send_signal(signal.SIGINT)
            assert p.wait(timeout=300) == 130
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    out1, err1 = (project / "1.out").read_text(), (project / "1.err").read_text()
    main_id = re.fullmatch(r"main run ([0-9a-f]{32}) started; browse: hmmscope ui --run \1", out1.splitlines()[0])[1]
    assert out1.splitlines()[1].startswith("[1/5] theory sweep (Theorem 1): 2 settings x 2 HMM draws in "), out1
    assert "theory: 2/2 settings, " in err1 and "theory: setting 1/2 (S=16 d=4 rho=0.02 gamma=0.5): HMM draw 1/2" in err1
    kept = err1.split("interrupted; kept:\n", 1)[1].splitlines()
    assert kept[0] == f"  main run {main_id}: KILLED" and kept[1].startswith("  theory: finished (run ")
    assert kept[-3].startswith("  sweep smoke-quick: not finished") and kept[-2].startswith("resume (the finished ")
    assert kept[-1] == "error: interrupted"
    again = shlex.split(kept[-2].split(": ", 1)[1])
    assert again == ["hmmscope", "run", *small, "--resume"]
    r = Ran(project, *again[1:])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == f"main run {main_id} resumed; browse: hmmscope ui --run {main_id}"
    assert lines[1].startswith("[1/5] theory sweep (Theorem 1): finished before (run ")
    assert re.match(r"\[2/5\] training: 20 steps in .*; val loss \d\.\d{4} \(run [0-9a-f]{8}\)$", lines[2]), lines[2]
    assert lines[3].startswith("[3/5] Figure 1: 3 claims: ") and lines[4].startswith("[4/5] layerwise analysis")
    (sweep_done,) = [ln for ln in lines if ln.startswith("[5/5] training sweep 'smoke-quick' and its report: ")]
    assert "sweep smoke-quick: 4 complete, 0 failed, 0 pruned of 4, and its report, in " in sweep_done
    assert "analyze: shuffle test done" in r.stderr and "train: setting up: drawing the data: " in r.stderr
    # off a terminal: no box characters, one short line per claim (the full text once, where it is), each number once
    assert not set("│┃━─┏╇┡└") & set(r.stdout), r.stdout
    claims = [ln for ln in lines if ln.startswith("  [")]
    assert len(claims) > 20 and max(map(len, claims)) < 200 and not any("statistic:" in c for c in claims)
    assert "  (each claim's statistic and reason: hmmscope runs show " in r.stdout
    (regime,) = [ln for ln in lines if ln.startswith("regime: ")]
    assert "model - best counting" not in regime and "Figure 1 took" not in regime
    assert "constrained_layout" not in r.stderr and "Warning" not in r.stderr, r.stderr  # figures laid out
    runs = _runs(tracking.default_tracking_uri())
    (main,) = [x for x in runs if x.info.run_name == "main"]
    kids = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == main_id]
    assert main.info.status == "FINISHED" and {x.info.run_name.split("-")[0] for x in kids} == {"theory", "train"}
    assert [x.info.run_id for x in kids if x.info.run_name == "theory"] == [main.data.tags["hmmscope.theory_run"]]
    (tr,) = [x for x in kids if x.info.run_id == main.data.tags["hmmscope.train_run"]]  # (a killed one may be kept)
    assert tr.info.status == "FINISHED" and tr.info.run_name.startswith("train-")
    # the last lines open the results: hmmscope ui on the main run, then on the sweep, then the sweep's answer (the
    # report's first sentence) and its report's HTML
    folder = project / "out" / f"main-{main_id[:8]}"  # everything the main job wrote, in its own folder
    bold = _answer_lines((folder / "smoke-quick" / "report.md").read_text())
    assert bold[0].startswith("model.pos_enc: rope - absolute = ") and bold[1].startswith("hmm.gamma: 0.9 - 0.5 = ")
    assert lines[-4:] == [f"browse: hmmscope ui --run {main_id}", "browse: hmmscope ui --sweep smoke-quick",
                          f"sweep smoke-quick: {'; '.join(bold)}", f"report: out/{folder.name}/smoke-quick/report.html"]
    assert "mlflow ui" not in r.output and r.stdout.count("hmmscope ui --run") == 2
    note = main.data.tags["mlflow.note.content"]  # the main run links the sweep's answer and its parent run
    assert f"runs/{main.data.tags['hmmscope.sweep_run']}/artifacts/comparison/objective.png?workflowType=" in note
    said = "; ".join(bold)  # the answer first, cut (never the links) where the description's 500 characters end
    assert note.startswith(said if len(said) < 200 else said[:100]) and " — sweep 'smoke-quick': its answer " in note
    assert all(x.data.tags.get("hmmscope.kind") for x in runs), [x.info.run_name for x in runs]  # every run its kind
    assert (folder / "smoke-quick" / "report.html").exists() and (folder / "theory" / "theory.png").exists()
    assert len(list(folder.glob("train-*/evaluation/figure1.p*"))) == 2 and f"out/{folder.name}" in r.output
    assert len(list(folder.glob("train-*/analysis/figure3_probes.p*"))) == 2


def test_the_run_phases_on_a_terminal_and_off_one(monkeypatch):
    """A phase on a terminal: a spinner with its step (stopped before its result line and before a bar of the
    phase's own), the result on stdout; off one: a time-stamped line per start and step on stderr."""
    import io

    from rich.console import Console

    from hmmscope.cli import run as R

    screen, out = io.StringIO(), []
    monkeypatch.setattr(R, "console", lambda stderr=False: Console(file=screen, force_terminal=True, width=100))
    d = R.PhaseDisplay(tty=True, out=out.append)
    d.start(1, "training")
    d.step("train: setting up: drawing the data")
    assert d._status is not None
    d.step(None)  # training's own bar takes the terminal
    assert d._status is None
    d.done("20 steps in 3 s")
    d.skip(2, "Figure 1", "finished before (run abc)")
    assert out == ["[2/5] training: 20 steps in 3 s", "[3/5] Figure 1: finished before (run abc)"]
    assert "[2/5] training: train: setting up: drawing the data" in screen.getvalue()
    said: list[str] = []
    d = R.PhaseDisplay(tty=False, echo=said.append, out=out.append)
    d.start(0, "theory sweep (Theorem 1)")
    d.step("theory: setting 1/4 (S=128): HMM draw 1/5")
    d.done("4 settings")
    assert said == ["[1/5] theory sweep (Theorem 1) ...", "theory: setting 1/4 (S=128): HMM draw 1/5"]
    assert out[-1] == "[1/5] theory sweep (Theorem 1): 4 settings"
    cmd = R.again_command("tiny", None, ["train.steps=5"], "cpu", Path("o"), 3, None, "e x", True)
    assert cmd == "hmmscope run --quick --set train.steps=5 --device cpu --out o --workers 3 --experiment 'e x' --resume"


@pytest.mark.parametrize("args, needle", [
    (["sweep", "run", "x.toml", "--workers", "0"], "Invalid value for '--workers'"),
    (["train", "--no-such-option"], "No such option: --no-such-option"),
    (["generate"], "Missing argument 'out'"),
    (["nosuchcommand"], "No such command 'nosuchcommand'"),
    (["theory", "--family", "gaussian"], "'--family'"),
    (["ui", "--port", "70000"], "'--port'"),
    (["generate", "x.npz", "--n", "abc"], "Invalid value for '--n'"),
])
def test_option_errors_are_one_line(project, args, needle):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and needle in line and "--help" in line, line
    assert r.stdout == "" and not (project / "mlruns").exists()


@pytest.mark.parametrize("name", ["smok", "smok.toml"])
def test_sweep_run_of_an_unknown_spec_names_the_bundled_ones_and_the_closest(project, name):
    """Before: `sweep run smok` said only "sweep spec not found: smok"."""
    r = runner.invoke(app, ["sweep", "run", name])
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: sweep spec not found: {name}; did you mean smoke? (no such file here, nor a bundled "
                           "spec: ") and "rope-vs-absolute, " in line and "theory-gamma)" in line, line
    assert r.stdout == "" and not (project / "mlruns").exists()


def test_report_of_an_unknown_sweep_names_the_closest(project):
    """Before: `report ux6-gama` said only "unknown sweep 'ux6-gama': no sweep study 'ux6-gama' (looked in ...)"."""
    from hmmscope.sweep import create_study
    from hmmscope.sweep.spec import parse_spec

    text = ('[sweep]\nname = "ux6-gamma"\nkind = "theory"\n[fixed]\n"theory.ranks" = [2]\n"theory.rhos" = [0.05]\n'
            '"theory.n_states" = [8]\n[space]\n"theory.gammas" = {grid = [0.5]}\n')
    spec = parse_spec(text, project / "ux6.toml")
    create_study(spec, f"sqlite:///{project}/mlruns/optuna.db", f"sqlite:///{project}/mlruns/mlflow.db")
    r = runner.invoke(app, ["report", "ux6-gama"])
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: unknown sweep 'ux6-gama': ") and line.endswith("; did you mean ux6-gamma?"), line
    assert not (project / "out").exists()
    r = runner.invoke(app, ["report", "zzzzzz-nothing-alike"])
    assert r.exit_code == 2 and "did you mean" not in r.stderr


def test_no_arguments_shows_the_help(project):
    r = runner.invoke(app, ["sweep"])
    assert "Usage" in r.output and "run" in r.output


def test_diverged_training_is_one_line_naming_its_failed_run(project):
    r = runner.invoke(app, ["train", *TINY_TRAIN, "--set", "train.lr=1e6", "--set", "train.min_lr=1e6",
                            "--set", "train.warmup=0", "--set", "train.grad_clip=1e30", "--no-evaluate"])
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    (run,) = _runs(tracking.default_tracking_uri())
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: training diverged: non-finite") and f"run {run.info.run_id} ended FAILED" in line
    assert run.info.status == "FAILED" and run.data.tags["hmmscope.failure_reason"].startswith("DivergedError")


# ---------------------------------------------------------------- a conventional, quiet CLI


def _all_commands():
    """Every command path of the CLI, the root group included (walked from Click's tree)."""
    import typer.main

    out, todo = [], [([], typer.main.get_command(app))]
    while todo:
        path, cmd = todo.pop()
        out.append((path, cmd))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            todo.append(([*path, name], sub))
    return out


def _flat(text: str) -> str:
    """Rendered help without the box and the line wrapping."""
    return " ".join(text.replace("│", " ").split())


def test_version():
    from importlib.metadata import version

    import hmmscope

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"hmmscope {hmmscope.__version__}" == f"hmmscope {version('hmmscope')}"


def test_shell_completion_is_on():
    r = runner.invoke(app, ["--help"])
    assert "--install-completion" in r.output and "--show-completion" in r.output


@pytest.mark.parametrize("path", [p for p, _ in _all_commands()], ids=lambda p: " ".join(p) or "root")
def test_help_renders_every_bracket_and_word(path):
    """Rich markup must not eat `[hmm]`: every [word] of an option's help is in the rendered help."""
    import re

    cmd = dict((tuple(p), c) for p, c in _all_commands())[tuple(path)]
    r = runner.invoke(app, [*path, "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    shown = _flat(r.output)
    for p in cmd.params:
        for word in re.findall(r"\[[a-z_.]+\]", (getattr(p, "help", None) or "").replace("\\[", "[")):
            assert word in shown, (path, p.name, word)
    if any(p.name == "config" for p in cmd.params):
        assert "TOML file with [hmm], [data], ... tables" in shown


@pytest.mark.parametrize("path", [["ui"], ["sweep", "status"]])
def test_storage_help_describes_the_default_the_command_has(path):
    r = runner.invoke(app, [*path, "--help"], terminal_width=200)
    shown = _flat(r.output)
    assert "spec" not in shown.split("--storage", 1)[1].split("--", 1)[0]  # these commands read no spec
    assert "default: ./mlruns/optuna.db" in shown


@pytest.mark.parametrize("cmd, sections", [
    (["generate", "x.npz", "--set", "hmm.gamma=0.5"], ["hmm", "data"]),
    (["theory", "--gammas", "0.4", "--set", "theory.n_tokens=6"], ["theory"]),
    (["train", "--set", "hmm.gamma=0.5", "--device", "cpu"], ["hmm", "data", "model", "train", "eval"]),
    (["run", "--preset", "paper", "--set", "hmm.gamma=0.5"], ["hmm", "data", "model", "train", "theory", "eval"]),
    (["bench", "train", "--set", "hmm.gamma=0.5"], ["hmm", "data", "model", "train"]),
    (["sweep", "run", str(SWEEPS / "smoke.toml")], ["hmm", "data", "model", "train", "eval"]),
    (["headroom", "--set", "hmm.gamma=0.5"], ["hmm", "data", "eval"]),
], ids=["generate", "theory", "train", "run", "bench-train", "sweep-run", "headroom"])
def test_print_config_prints_the_resolved_config_and_exits(project, cmd, sections):
    import tomllib

    from hmmscope.config import load_toml, preset, to_dict

    r = runner.invoke(app, [*cmd, "--print-config"])
    assert r.exit_code == 0, r.output
    data = tomllib.loads(r.stdout)
    assert list(data) == sections
    if cmd[0] == "theory":
        assert data["theory"]["gammas"] == [0.4] and data["theory"]["n_tokens"] == 6
    elif cmd[0] == "sweep":
        assert data["hmm"]["n_tasks"] == 8 and data["data"]["n_train"] == 512  # smoke.toml's [fixed]
        assert r.stdout.startswith("# sweep smoke (train)")
    else:
        assert data["hmm"]["gamma"] == 0.5
        (project / "c.toml").write_text(r.stdout)  # --config reads it back to the same config
        base = preset("paper" if "paper" in cmd else "tiny")
        got = to_dict(load_toml(project / "c.toml", base))
        assert {k: got[k] for k in sections} == data
    assert sorted(p.name for p in project.iterdir() if p.name != "c.toml") == []  # no run, study, file or folder


def _spec_examples():
    import re
    import shlex

    out = []
    for path in sorted(SWEEPS.glob("*.toml")):
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#"):
                out += [(path.name, shlex.split(cmd)[1:]) for cmd in re.findall(r"`(hmmscope [^`]*)`", line)]
    return out


def test_spec_comments_have_examples():
    assert any(name == "smoke.toml" for name, _ in _spec_examples())


@pytest.mark.parametrize("name, args", _spec_examples(), ids=lambda x: x if isinstance(x, str) else None)
def test_spec_comment_examples_work(monkeypatch, name, args):
    """Each example command in sweeps/*.toml's comments parses (--help) and, in its dry form (--print-config),
    reads its files, from the repository root."""
    import typer.main

    monkeypatch.chdir(SWEEPS.parent)
    r = runner.invoke(app, [*args, "--help"])
    assert r.exit_code == 0 and "Usage" in r.output, (name, args, r.output)
    cmd = typer.main.get_command(app)
    ctx_args = list(args)
    while hasattr(cmd, "commands") and ctx_args and ctx_args[0] in cmd.commands:
        cmd = cmd.commands[ctx_args.pop(0)]
    assert any(p.name == "print_config" for p in cmd.params), f"{name}: `{' '.join(args)}` has no dry form"
    r = runner.invoke(app, [*args, "--print-config"])
    assert r.exit_code == 0, (name, args, r.output)


def test_sweep_progress_lines_and_eta():
    from hmmscope.cli import SweepProgress

    now, lines = [0.0], []
    bar = SweepProgress("s", 10, tty=False, echo=lines.append, clock=lambda: now[0])
    now[0] = 10.0
    bar({"complete": 2, "pruned": 0, "failed": 0, "running": 2}, 10)  # resumed: 2 done before we started
    bar({"complete": 2, "pruned": 0, "failed": 0, "running": 2}, 10)  # no change, no line
    now[0] = 110.0
    bar({"complete": 3, "pruned": 0, "failed": 1, "running": 2}, 10)  # 2 finished in 100 s, 6 left: 300 s
    now[0] = 200.0
    bar({"complete": 8, "pruned": 1, "failed": 1, "running": 0}, 10)
    assert lines == ["sweep s: 2/10 finished: 2 done, 0 failed, 2 running; ETA ?",
                     "sweep s: 4/10 finished: 3 done, 1 failed, 2 running; ETA 0:05:00",
                     "sweep s: 10/10 finished: 9 done, 1 failed, 0 running; ETA 0:00:00"]


def _pty_run(args, cwd, timeout=600):
    """Run `hmmscope ARGS` with stderr on a pseudo-terminal (stdout a pipe); returns (stdout, stderr text)."""
    import os
    import pty
    import subprocess
    import sys
    import time

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    exe = Path(sys.executable).parent / "hmmscope"
    proc = subprocess.Popen([str(exe), *args], cwd=cwd, env={**env, "COLUMNS": "120"}, stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(slave)
    try:
        err = ptys.read_to_end(master, proc, time.time() + timeout, "hmmscope did not finish")
        out = proc.stdout.read().decode()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, 9)
            proc.wait()
        os.close(master)
        proc.stdout.close()
    return proc.returncode, out, err.decode(errors="replace")


def test_train_shows_a_spinner_before_its_bar_on_a_terminal(project):
    rc, out, err = _pty_run(["train", "--set", "train.steps=4", "--set", "train.eval_every=4", "--set",
                             "data.n_train=64", "--set", "data.n_eval=16", "--no-evaluate", "--device", "cpu"], project)
    assert rc == 0, err
    assert "setting up: " in err and "step " in err  # its text: each piece of the setup as it begins
    assert err.index("setting up") < err.index("step ")  # the spinner, then training's own bar
    assert "Creating initial MLflow database tables" not in err and " INFO " not in err  # a new store, quietly
    assert "run " in out


def test_sweep_plan_counts_the_seeds_an_effect_needs(tmp_path):
    """Issue 45.2: `hmmscope sweep plan SPEC --effect DELTA` answers "how many seeds for this sweep" before running it:
    from --sd, or from the seeds of a sweep of this design already in the storage (--from; by default the spec's own
    study), each swept key's contrast and steps with the seeds that decide +-DELTA with 80% power (statsmodels'
    TTestPower, the report's seeds_needed). Bad input is one line, exit 2, nothing written."""
    import optuna

    from hmmscope.stats import t_mean
    from hmmscope.sweep.effects import seeds_needed
    from hmmscope.sweep.spec import load_spec
    from hmmscope.sweep.study import store_spec

    spec_path = tmp_path / "plan.toml"
    spec_path.write_text('[sweep]\nname = "plan"\nobjective = "eval/seen/excess_ce"\nseeds = [0, 1, 2]\n[space]\n'
                         '"hmm.gamma" = {grid = [0.5, 0.9]}\n')
    r = runner.invoke(app, ["sweep", "plan", str(spec_path), "--effect", "0.01", "--sd", "0.006"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        "sweep plan: 2 cells x 3 seeds = 6 trials; each seed adds 2",
        "to decide an effect of ±0.01 nats/token on eval/seen/excess_ce with 80% power (its 95% CI over seeds on one "
        "side of 0):", f"  seed-to-seed SD 0.006 nats/token (given): {seeds_needed(0.006, 0.01)} seeds "
        f"({2 * seeds_needed(0.006, 0.01)} trials)"]
    storage = f"sqlite:///{tmp_path}/optuna.db"
    r = runner.invoke(app, ["sweep", "plan", str(spec_path), "--effect", "0.01", "--storage", storage])
    assert r.exit_code == 2 and "no seed-to-seed SD to plan from" in r.output and not (tmp_path / "optuna.db").exists()
    study = optuna.create_study(study_name="pilot", storage=storage)  # a pilot of this design: 3 seeds
    diffs = {0: 0.004, 1: 0.012, 2: -0.003}
    for g in (0.5, 0.9):
        for s, d in diffs.items():
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE, value=0.3 + 0.01 * s + d * (g == 0.9), params={"hmm.gamma": g},
                distributions={"hmm.gamma": optuna.distributions.CategoricalDistribution([0.5, 0.9])},
                user_attrs={"seed": s}))
    store_spec(study, load_spec(spec_path))
    r = runner.invoke(app, ["sweep", "plan", str(spec_path), "--effect", "0.01", "--storage", storage, "--from", "pilot"])
    assert r.exit_code == 0, r.output
    sd = t_mean(list(diffs.values()), unit="seed").se * 3 ** 0.5
    n = seeds_needed(sd, 0.01)
    assert r.output.splitlines()[2:] == ["  seed-to-seed SDs from sweep pilot (3 seeds, 6 trials):",
                                         f"  hmm.gamma: 0.9 - 0.5: SD {sd:.3g} nats/token, effect ±0.01: {n} seeds "
                                         f"({2 * n} trials)"]
    for args, msg in ((["--effect", "0"], "--effect must be a number > 0"),
                      (["--effect", "0.01", "--sd", "nan"], "--sd must be a number > 0"),
                      (["--effect", "0.01", "--from", "nope"], "no sweep study 'nope'")):
        r = runner.invoke(app, ["sweep", "plan", str(spec_path), *args, "--storage", storage])
        assert r.exit_code == 2 and r.output.startswith("error: ") and msg in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1


def test_the_run_summary_is_one_short_line_per_claim_and_says_each_number_once(capsys):
    """Before: on a terminal ~30 claims of 300+ characters each, a 19-column box table, and model - best counting
    printed in its claim and again in the regime line. Now the short form (name, estimate [CI], verdict, its rule) unless
    --verbose, and each number once."""
    from types import SimpleNamespace

    from hmmscope.cli.run import summary
    from hmmscope.config import Config
    from hmmscope.stats import Claim

    def claim(name, value, lo, hi):
        return Claim(name, "paired t over episodes", value, lo, hi, "supported", "the CI lies below 0 (a long reason)",
                     "< 0")

    m = {"eval/seen/test_acc": 0.41, "eval/seen/oracle_mix_test_acc": 0.61, "eval/seen/oracle_task_test_acc": 0.62,
         "eval/seen/excess_ce": 0.477, "eval/seen/kl_mix": 0.4745, "eval/unseen/test_acc": 0.19,
         "eval/unseen/oracle_task_test_acc": 0.612, "eval/unseen/test_ce": 2.144, "baseline/unseen/best_counting/ce":
         1.677, "eval/unseen/vs_best_counting": -0.4662, "eval/unseen/vs_best_counting_lo": -0.5602,
         "eval/unseen/vs_best_counting_hi": -0.3721, "eval/figure1_s": 12.3}
    ev = SimpleNamespace(**{"claims": [claim("inference_beyond_counting", -0.4662, -0.5602, -0.3721)],
                            "regime": "inference beyond counting"})
    metrics = type("EV", (dict,), {})(m)
    metrics.claims, metrics.regime = ev.claims, ev.regime
    res = SimpleNamespace(eval_metrics=metrics, train_id="a" * 32, theory_id="b" * 32, theory=None, parent_id="c" * 32,
                          theory_claims=[claim("rate ~ gamma^k", 1.73, 1.23, 2.22)], folder=Path("out/main-cccccccc"),
                          analysis=SimpleNamespace(run_id="d" * 32, claims=[claim("task_beats_control", 0.61, 0.51, 0.67)]),
                          sweep=SimpleNamespace(study_name="smoke"),
                          report=SimpleNamespace(answer="RoPE - absolute: 0.0019 [-0.066, 0.070]", files={"html": "r.html"}))
    uri = "sqlite:////nowhere/mlruns/mlflow.db"
    summary(res, Config(), uri)
    short = capsys.readouterr().out
    claims = [ln for ln in short.splitlines() if ln.startswith("  [")]
    assert len(claims) == 3 and not any("statistic" in c or "reason" in c for c in claims), short
    assert short.count("-0.466") == 1 and short.count("-0.560") == 1, short  # the claim's, not the regime line's too
    assert "Figure 1 took" not in short and short.count("hmmscope runs show aaaaaaaa  (or run --verbose)") == 1
    summary(res, Config(), uri, verbose=True)
    full = capsys.readouterr().out
    assert sum("statistic: paired t over episodes; reason: the CI lies below 0" in ln for ln in full.splitlines()) == 3
