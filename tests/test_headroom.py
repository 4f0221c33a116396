"""hmmscope.measure.headroom and `hmmscope headroom`: the room above counting before any training (SCIENCE.md 9)."""

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hmmscope.cli import app
from hmmscope.config import Config, override
from hmmscope.data.episodes import family_tasks, fit_episodes, truncate_demos, unseen_episodes
from hmmscope.measure.headroom import headroom
from hmmscope.oracles.inference import mixture_oracle

torch.set_num_threads(1)
runner = CliRunner()
SMALL = {"hmm.n_states": 4, "hmm.n_tokens": 4, "hmm.rank": 2, "data.n_demos": 2, "data.l_demo": 6, "data.l_test": 8,
         "eval.family_tasks": 64, "eval.fit_episodes": 16}


def _cfg(**kw) -> Config:
    return override(Config(), {**SMALL, **kw})


def test_headroom_is_best_counting_minus_family_bayes_on_the_same_tokens():
    """Known answer by recomputation: the room at each k is the per-episode CE of the fitted best counting baseline
    minus family Bayes' over the first M family tasks, on the test tokens Figure 1 scores, averaged over the unseen
    episodes; family Bayes at M/4 and M/2 is the oracle over the first M/4 and M/2 of the same tasks."""
    from hmmscope.oracles.baselines import fit_counting

    cfg = _cfg()
    res = headroom(cfg, n_episodes=24, em=False)
    umix, uep = unseen_episodes(cfg.hmm, cfg.data, 24)
    fam = family_tasks(cfg.hmm, cfg.data, 64)
    fit = fit_counting(fit_episodes(cfg.hmm, cfg.data, 16)[1], range(3))
    assert res.counting == fit.describe()
    for k in range(3):
        e = truncate_demos(uep, k)
        cols = np.flatnonzero(e.test_mask & (np.arange(e.seq_len) >= 1))
        y = torch.as_tensor(e.tokens[:, cols].astype(np.int64))[..., None]

        def ce(p, cols=cols, y=y):
            return (-torch.log(p[:, cols].double().gather(-1, y)[..., 0])).mean(1).numpy()

        anon = e.subset(np.arange(len(e)))
        anon.task_ids = np.full(len(e), -1)
        best = ce(fit.predict(e, k)["best_counting"])
        for m in (16, 32, 64):
            fb = ce(mixture_oracle(fam.subset(np.arange(m)), anon, dtype=torch.float64)[0])
            row = next(r for r in res.rows if r["k"] == k and r["predictor"] == "family_bayes" and r["M"] == m)
            assert row["ce"] == pytest.approx(fb.mean(), rel=1e-9)
        r = res.at(k)
        d = best - fb
        assert r["room"] == pytest.approx(d.mean(), rel=1e-9)
        assert r["room_hi"] - r["room"] == pytest.approx(1.96 * d.std(ddof=1) / math.sqrt(24), rel=1e-9)
        assert r["best"] == fit.by_k[k]["best_counting"]
    oracle = [r for r in res.rows if r["predictor"] == "task_oracle"]
    assert {r["k"] for r in oracle} == {0, 1, 2}
    m = res.metrics()
    assert m["headroom/room"] == res.at(2)["room"] and "headroom/family_bayes_M32/ce/k2" in m
    assert "room above counting at k_max = 2" in res.line()


def test_headroom_cli_prints_the_line_and_writes_json(tmp_path):
    out = tmp_path / "h.json"
    args = ["headroom", "--n-episodes", "16", "--no-em", "--json", str(out)] + [a for k, v in SMALL.items()
                                                                               for a in ("--set", f"{k}={v}")]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("room above counting at k_max = 2: ") and "nats/token" in last
    d = json.loads(out.read_text())
    assert d["line"] == last and {x["k"] for x in d["room"]} == {0, 1, 2} and d["meta"]["family_tasks"] == 64


@pytest.mark.parametrize("args, msg", [
    (["--family-tasks", "0"], "must be >= 1"),
    (["--set", "eval.fit_episodes=0"], "fit_episodes must be >= 8"),
    (["--n-episodes", "1"], "--n-episodes"),
    (["--set", "eval.nope=1"], "unknown config key"),
    (["--json", "x.txt"], ".json"),
])
def test_headroom_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, args, msg):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["headroom", *args])
    assert r.exit_code == 2 and msg in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert list(tmp_path.iterdir()) == []
