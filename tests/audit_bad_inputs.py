"""Audit: try many distinct bad inputs on the real `hmmscope` CLI and classify each outcome.

Not a test (pytest does not collect it): a script run by hand, before and after a change, e.g.

    .venv/bin/python tests/audit_bad_inputs.py --json /tmp/audit.json
    # the same cases against another checkout of the package (e.g. main, unpacked with git archive):
    PYTHONPATH=/tmp/hmmscope-main .venv/bin/python tests/audit_bad_inputs.py --json /tmp/audit-main.json

Each case runs `hmmscope ARGS` as a real process (own session, 16 GiB address-space limit, a
timeout) in a prepared project folder: a tiny training run with a checkpoint, a run whose
checkpoint does not fit its model, a run without a checkpoint, a sweep study, config files, a
directory, a regular file. Outcome classes (one per case, first that applies):

- wrongly accepted: exit code 0;
- traceback: "Traceback (most recent call last)" in the output;
- leaked writes: a new or changed file or directory under the project (or a named path outside
  it), a new or changed MLflow run, a new Optuna study or trial, or a RUNNING run left behind;
- hang: still running at the timeout (killed);
- other: a non-zero exit that is not exit code 2 with exactly one `error: ...` line on stderr;
- clean: exit code 2, one `error: ...` line on stderr, no traceback, nothing written.

Signal cases ("sigterm") start a long training, send SIGTERM once its run exists, and are clean
when no run is left RUNNING and there is no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from conftest import TINY_TOML as TINY  # tests/ is the script's folder, first on sys.path

BIN = Path(sys.executable).parent / "hmmscope"
UNWRITABLE = "/proc/1"  # a directory nobody (root included) can create entries in

TINY_TOML = TINY + """[theory]
gammas = [0.5]
n_states = [6]
ranks = [2]
rhos = [0.02]
n_tokens = 6
n_histories = 50
lengths = [1, 2, 4]
burn_in = 10
gamma_m = 0
"""  # the tests' tiny config (conftest.TINY_TOML) with a [theory] table

SPEC = """
[sweep]
name = "{name}"
kind = "{kind}"
objective = "{objective}"
sampler = "grid"
seeds = {seeds}
experiment = "audit-sweeps"
{extra}
[fixed]
"hmm.n_tasks" = 4
"hmm.n_states" = 8
"hmm.n_tokens" = 4
"hmm.rank" = 2
"data.n_demos" = 2
"data.l_demo" = 8
"data.l_test" = 8
"data.n_train" = 48
"data.n_eval" = 16
"model.n_layers" = 1
"model.n_heads" = 2
"model.d_model" = 32
"model.d_mlp" = 64
"model.max_len" = 64
"train.steps" = 4
"train.batch_size" = 8
"train.warmup" = 0
"train.eval_every" = 2
"train.ckpt_every" = 4
"train.device" = "cpu"
{fixed}
[space]
"hmm.gamma" = {{grid = [0.5]}}
"""


def spec(name="audit", kind="train", objective="eval/seen/excess_ce", seeds="[0]", extra="", fixed="") -> str:
    return SPEC.format(name=name, kind=kind, objective=objective, seeds=seeds, extra=extra, fixed=fixed)


@dataclass
class Case:
    name: str
    klass: str
    args: list[str]
    files: dict[str, str] = field(default_factory=dict)  # written into the project before the case
    fresh: bool = False  # run in a new empty folder (read-only commands must not create a store)
    env: dict[str, str] = field(default_factory=dict)
    outside: list[str] = field(default_factory=list)  # paths outside the project that must not appear
    timeout: float = 90.0
    kind: str = "plain"  # plain | sigterm
    setup: Callable[[Path], None] | None = None  # special files, links, mounts: made before the snapshot
    teardown: Callable[[Path], None] | None = None


# ---------------------------------------------------------------- the prepared project


def prepare(root: Path) -> dict[str, str]:
    """A project folder with runs, a study and files; returns substitutions for the case arguments."""
    import torch

    from hmmscope import tracking
    from hmmscope.config import load_toml
    from hmmscope.pipeline.run import train
    from hmmscope.sweep import create_study
    from hmmscope.sweep.spec import parse_spec

    torch.set_num_threads(1)
    proj = root / "proj"
    proj.mkdir()
    (proj / "tiny.toml").write_text(TINY_TOML)
    (proj / "cfgdir").mkdir()
    (proj / "dir.npz").mkdir()
    (proj / "dir.json").mkdir()
    (proj / "dir.pt").mkdir()
    (proj / "afile").write_text("a regular file\n")
    (proj / "garbage.bin").write_bytes(bytes(range(256)) * 8)
    (proj / "garbage.pt").write_bytes(bytes(range(256)) * 8)
    uri = f"sqlite:///{proj}/mlruns/mlflow.db"
    cfg = load_toml(proj / "tiny.toml")
    res = train(cfg, tracking_uri=uri, experiment="hmmscope", run_name="good", progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = tracking.Run(uri, res.run_id).download("checkpoints/last.pt", tmp)
        ck = torch.load(path, weights_only=True)
    torch.save(ck, proj / "good.pt")
    bad_w = {**ck, "config": {**ck["config"], "model.d_model": 64, "model.d_mlp": 128}}
    torch.save(bad_w, proj / "wrong_weights.pt")
    torch.save({**ck, "config": {**ck["config"], "model.bogus": 1}}, proj / "bad_config.pt")
    torch.save({**ck, "vocab_size": 3}, proj / "wrong_vocab.pt")
    torch.save({k: v for k, v in ck.items() if k != "model"}, proj / "no_model.pt")
    torch.save({**ck, "config": "not a dict"}, proj / "config_not_dict.pt")
    torch.save({**ck, "config": {**ck["config"], "model.n_layers": 3}}, proj / "missing_layers.pt")
    torch.save([1, 2, 3], proj / "a_list.pt")
    torch.save({**ck, "step": -5}, proj / "negstep.pt")
    nan_model = {k: (v.clone().fill_(float("nan")) if v.is_floating_point() else v) for k, v in ck["model"].items()}
    torch.save({**ck, "model": nan_model}, proj / "nan.pt")
    with tracking.start_run(uri, "hmmscope", "bad-ckpt") as run:
        run.log_artifact(proj / "wrong_weights.pt", "tmpdir")
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(proj / "wrong_weights.pt", Path(tmp) / "last.pt")
            run.log_artifact(Path(tmp) / "last.pt", "checkpoints")
    bad_ckpt_run = run.run_id
    with tracking.start_run(uri, "hmmscope", "bare") as bare:
        pass
    with tracking.start_run(uri, "hmmscope", "deleted") as gone:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(proj / "good.pt", Path(tmp) / "last.pt")
            gone.log_artifact(Path(tmp) / "last.pt", "checkpoints")
    tracking.client(uri).delete_run(gone.run_id)
    import json as json_

    from hmmscope.tracking.liveness import LEASE_TAG, identity
    c = tracking.client(uri)  # a run held by this (audit) process: alive for every case, its lease fresh
    held = c.create_run(tracking.experiment_id(uri, "hmmscope"), run_name="held", tags={LEASE_TAG: json_.dumps(
        {**identity(), "beat": time.time() + 86400, "interval": 30})}).info.run_id
    storage = f"sqlite:///{proj}/mlruns/optuna.db"
    sp = parse_spec(spec(name="known"), proj / "known.toml")
    (proj / "known.toml").write_text(sp.text)
    cwd = os.getcwd()
    os.chdir(proj)
    try:
        create_study(sp, storage, uri)
    finally:
        os.chdir(cwd)
    bad = proj / "corrupt" / "studies.db"  # a malformed page under an intact header and schema
    bad.parent.mkdir()
    with sqlite3.connect(bad) as con:
        con.execute("create table studies (x text)")
        con.execute("create table experiments (x text)")
        con.executemany("insert into studies values (?)", [("x" * 500,)] * 200)
    raw = bytearray(bad.read_bytes())
    raw[4096 * 3: 4096 * 3 + 200] = b"\xff" * 200
    bad.write_bytes(bytes(raw))
    return {"DELETED_RUN": gone.run_id, "HELD_RUN": held, "CORRUPT": str(bad),
            "RUN": res.run_id, "BADCKPT_RUN": bad_ckpt_run, "BARE_RUN": bare.run_id, "STORAGE": storage,
            "URI": uri, "PROJ": str(proj)}


# ---------------------------------------------------------------- the cases


def cases() -> list[Case]:
    C: list[Case] = []

    def add(klass, name, args, **kw):
        C.append(Case(name, klass, args, **kw))

    T = ["--config", "tiny.toml"]
    # 1. config values: non-finite, out of range, wrong type, unknown key, malformed --set
    for s in ["train.lr=inf", "train.lr=nan", "train.weight_decay=-1", "train.weight_decay=inf", "hmm.gamma=nan",
              "train.beta1=1.5", "train.beta2=-0.1", "train.beta2=1.0", "model.dropout=inf", "train.grad_clip=inf",
              "hmm.alpha=inf", "hmm.rho=nan", "train.min_lr=-1", "data.n_demos=-1", "train.warmup=-5",
              "model.max_len=8", "model.bogus=1", "train.steps=1.5", "noequals", "=3", "train.lr=1e400"]:
        add("config value", f"train --set {s}", ["train", *T, "--set", s])
    add("config value", "generate hmm.n_tokens=1", ["generate", "x.npz", *T, "--set", "hmm.n_tokens=1"])
    add("config value", "theory floor nan", ["theory", *T, "--set", "theory.floor=nan", "--no-track"])
    add("config value", "theory --gammas nan", ["theory", *T, "--gammas", "nan", "--no-track"])
    add("config value", "theory --gammas inf", ["theory", *T, "--gammas", "inf", "--no-track"])
    add("config value", "theory alpha inf", ["theory", *T, "--set", "theory.alpha=inf", "--no-track"])
    add("config value", "toml gamma string", ["train", "--config", "badval.toml"],
        files={"badval.toml": '[hmm]\ngamma = "high"\n'})
    add("config value", "toml lr inf", ["train", "--config", "inf.toml"], files={"inf.toml": "[train]\nlr = inf\n"})
    # 2. seeds outside numpy's range
    for s in ["train.seed=-1", "train.seed=18446744073709551616", "hmm.seed=9223372036854775807",
              "data.seed=4294967296"]:
        add("seed", f"train --set {s}", ["train", *T, "--set", s])
    add("seed", "generate data.seed=-5", ["generate", "x.npz", *T, "--set", "data.seed=-5"])
    add("seed", "theory seed 1e20", ["theory", *T, "--set", "theory.seed=99999999999999999999", "--no-track"])
    add("seed", "analyze --seed -1", ["analyze", "{RUN}", "--seed", "-1"])
    add("seed", "analyze --seed 2^32", ["analyze", "{RUN}", "--seed", "4294967296"])
    add("seed", "spec seeds 2^40", ["sweep", "run", "s.toml"], files={"s.toml": spec(name="s1", seeds="[1099511627776]")})
    add("seed", "spec sampler_seed 2^40", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s2", extra="sampler_seed = 1099511627776")})
    # 3. sizes that cannot fit in memory
    for s in ["hmm.n_tasks=1000000000", "hmm.n_tokens=1000000000", "hmm.n_states=100000000"]:
        add("size vs memory", f"generate --set {s}", ["generate", "x.npz", *T, "--set", s])
    add("size vs memory", "generate --n 1e9", ["generate", "x.npz", *T, "--n", "1000000000"])
    for s in [["model.d_model=1000000", "model.n_heads=1000"], ["data.n_train=100000000000"],
              ["train.batch_size=100000000"], ["model.max_len=10000000"], ["model.n_layers=100000"],
              ["model.d_mlp=100000000"], ["data.l_test=1000000", "model.max_len=1000100"]]:
        add("size vs memory", f"train --set {' '.join(s)}", ["train", *T, *[a for x in s for a in ("--set", x)]])
    add("size vs memory", "theory --n-states 100000", ["theory", *T, "--n-states", "100000", "--ranks", "2", "--no-track"])
    add("size vs memory", "theory --n-histories 1e9", ["theory", *T, "--n-histories", "1000000000", "--no-track"])
    add("size vs memory", "theory --lengths 1,1e9", ["theory", *T, "--lengths", "1,1000000000", "--no-track"])
    add("size vs memory", "bench train --batch-size 1e8", ["bench", "train", *T, "--batch-size", "100000000",
                                                           "--no-peer"])
    add("size vs memory", "bench filter --length 1e9", ["bench", "filter", "--length", "1000000000"])
    add("size vs memory", "evaluate --n-episodes 1e9", ["evaluate", "{RUN}", "--n-episodes", "1000000000"])
    add("size vs memory", "analyze --n-episodes 1e9", ["analyze", "{RUN}", "--n-episodes", "1000000000"])
    add("size vs memory", "analyze --min-per-task 1e8", ["analyze", "{RUN}", "--min-per-task", "100000000"])
    add("size vs memory", "analyze --n-perms 1e9", ["analyze", "{RUN}", "--n-perms", "1000000000"])
    add("size vs memory", "bench oracle --n-tasks 1e8", ["bench", "oracle", "--n-tasks", "100000000"])
    add("size vs memory", "bench oracle --n-episodes 1e9", ["bench", "oracle", "--n-tasks", "4", "--n-episodes",
                                                            "1000000000"])
    add("size vs time", "bench train --steps 10**15", ["bench", "train", *T, "--steps", "1000000000000000", "--no-peer"])
    add("size vs time", "train --set train.steps=10**15", ["train", *T, "--set", "train.steps=1000000000000000"])
    add("size vs time", "run --set train.steps=10**15", ["run", *T, "--set", "train.steps=1000000000000000",
                                                         "--out", "runout"])
    add("size vs time", "train --resume RUN --set train.steps=10**15", ["train", *T, "--resume", "{RUN}", "--set",
                                                                        "train.steps=1000000000000000"])
    add("size vs memory", "run huge d_mlp", ["run", *T, "--set", "model.d_mlp=100000000", "--out", "runout"])
    add("size vs memory", "spec fixed n_tasks 1e9", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s3", fixed='"data.n_train" = 100000000000')})
    # 4. a directory where a file is expected
    add("directory as file", "train --config DIR", ["train", "--config", "cfgdir"])
    add("directory as file", "theory --config DIR", ["theory", "--config", "cfgdir", "--no-track"])
    add("directory as file", "generate --config DIR", ["generate", "x.npz", "--config", "cfgdir"])
    add("directory as file", "sweep run DIR", ["sweep", "run", "cfgdir"])
    add("directory as file", "analyze DIR.pt", ["analyze", "dir.pt"])
    add("directory as file", "spec config = DIR", ["sweep", "run", "s.toml"],
        files={"s.toml": '[sweep]\nname = "s4"\nconfig = "cfgdir"\n[space]\n"hmm.gamma" = {grid = [0.5]}\n'})
    add("directory as file", "generate DIR.npz", ["generate", "dir.npz", *T])
    add("directory as file", "theory --json DIR.json", ["theory", *T, "--json", "dir.json", "--no-track"])
    # 5. missing or unreadable input files
    add("input file", "train --config missing", ["train", "--config", "missing.toml"])
    add("input file", "sweep run missing", ["sweep", "run", "missing.toml"])
    add("input file", "train --config binary", ["train", "--config", "garbage.bin"])
    add("input file", "sweep run binary", ["sweep", "run", "garbage.bin"])
    add("input file", "spec config missing", ["sweep", "run", "s.toml"],
        files={"s.toml": '[sweep]\nname = "s5"\nconfig = "nope.toml"\n[space]\n"hmm.gamma" = {grid = [0.5]}\n'})
    add("input file", "analyze missing.pt", ["analyze", "missing.pt"])
    add("input file", "analyze garbage.pt", ["analyze", "garbage.pt"])
    add("input file", "spec invalid toml", ["sweep", "run", "s.toml"], files={"s.toml": "[sweep\nname="})
    # 6. output under a regular file, or a regular file where a folder is expected
    add("output under file", "generate afile/x.npz", ["generate", "afile/x.npz", *T])
    add("output under file", "theory --out afile/sub", ["theory", *T, "--out", "afile/sub", "--no-track"])
    add("output under file", "theory --out afile (tracked)", ["theory", *T, "--out", "afile"])
    add("output under file", "theory --json afile/x.json", ["theory", *T, "--json", "afile/x.json"])
    add("output under file", "run --out afile", ["run", *T, "--out", "afile"])
    add("output under file", "report --out afile", ["report", "known", "--out", "afile"])
    add("output under file", "report --out afile/sub", ["report", "known", "--out", "afile/sub"])
    add("output under file", "tracking uri under a file", ["train", *T, "--tracking-uri", "sqlite:///{PROJ}/afile/m.db"])
    add("output under file", "storage under a file", ["sweep", "run", "known.toml", "--storage",
                                                      "sqlite:///{PROJ}/afile/o.db"])
    # 7. unwritable outputs
    add("unwritable output", "generate unwritable", ["generate", f"{UNWRITABLE}/x.npz", *T])
    add("unwritable output", "theory --out unwritable", ["theory", *T, "--out", f"{UNWRITABLE}/th", "--no-track"])
    add("unwritable output", "theory --json unwritable", ["theory", *T, "--json", f"{UNWRITABLE}/x.json"])
    add("unwritable output", "run --out unwritable", ["run", *T, "--out", f"{UNWRITABLE}/out"])
    add("unwritable output", "report --out unwritable", ["report", "known", "--out", f"{UNWRITABLE}/rep"])
    add("unwritable output", "tracking uri unwritable", ["train", *T, "--tracking-uri", f"sqlite:///{UNWRITABLE}/m.db"])
    add("unwritable output", "storage unwritable", ["sweep", "run", "known.toml", "--storage",
                                                    f"sqlite:///{UNWRITABLE}/o.db"])
    # 8. tracking URI: bogus scheme, unreachable server, database down, driver missing, file store
    for u in ["bogus://x", "http://127.0.0.1:9", "postgresql://u:p@127.0.0.1:9/db", "mysql://u:p@127.0.0.1:9/db",
              "file:///tmp/hmmscope-audit-filestore", "relative/store", "sqlite:///{PROJ}/cfgdir"]:
        add("tracking uri", f"train --tracking-uri {u}", ["train", *T, "--tracking-uri", u])
    add("tracking uri", "evaluate over unreachable server", ["evaluate", "{RUN}", "--tracking-uri", "http://127.0.0.1:9"])
    add("tracking uri", "report over unreachable server", ["report", "known", "--tracking-uri", "http://127.0.0.1:9"])
    add("tracking uri", "theory bogus uri", ["theory", *T, "--tracking-uri", "bogus://x"])
    add("tracking uri", "env MLFLOW_TRACKING_URI bogus", ["train", *T], env={"MLFLOW_TRACKING_URI": "bogus://y"})
    add("tracking uri", "sweep run unreachable", ["sweep", "run", "known.toml", "--tracking-uri", "http://127.0.0.1:9"])
    # 9. Optuna storage
    for u in ["bogus://x", "postgresql://u:p@127.0.0.1:9/db", "mysql://u:p@127.0.0.1:9/db", "not a url"]:
        add("storage", f"sweep run --storage {u}", ["sweep", "run", "known.toml", "--storage", u])
    add("storage", "sweep status bogus storage", ["sweep", "status", "known", "--storage", "bogus://x"])
    add("storage", "sweep worker db down", ["sweep", "worker", "known", "--storage", "postgresql://u:p@127.0.0.1:9/db"])
    add("storage", "sweep status missing sqlite", ["sweep", "status", "known", "--storage",
                                                   "sqlite:///{PROJ}/nowhere/optuna.db"])
    add("storage", "spec storage bogus", ["sweep", "run", "s.toml"], files={"s.toml": spec(name="s6", extra='storage = "bogus://z"')})
    # 10. unknown study, sweep or run; read-only commands in a fresh folder
    add("unknown name", "sweep worker unknown study", ["sweep", "worker", "nosuch", "--storage", "{STORAGE}"])
    add("unknown name", "sweep status unknown study", ["sweep", "status", "nosuch"])
    add("unknown name", "sweep status in fresh dir", ["sweep", "status", "nosuch"], fresh=True)
    add("unknown name", "report unknown sweep", ["report", "nosuch"])
    add("unknown name", "report in fresh dir", ["report", "nosuch"], fresh=True)
    add("unknown name", "evaluate unknown run", ["evaluate", "0123456789abcdef0123456789abcdef"])
    add("unknown name", "evaluate in fresh dir", ["evaluate", "0123456789abcdef0123456789abcdef"], fresh=True)
    add("unknown name", "analyze unknown run", ["analyze", "0123456789abcdef0123456789abcdef"])
    add("unknown name", "analyze in fresh dir", ["analyze", "0123456789abcdef"], fresh=True)
    add("unknown name", "train --resume unknown", ["train", *T, "--resume", "0123456789abcdef0123456789abcdef"])
    add("unknown name", "evaluate run without checkpoint", ["evaluate", "{BARE_RUN}"])
    add("unknown name", "sweep worker unknown in fresh dir", ["sweep", "worker", "nosuch", "--storage",
                                                              "sqlite:///{PROJ}/fresh-w/optuna.db"])
    # 11. names that would escape the project or are not safe
    add("unsafe name", "report ../../../../tmp/x", ["report", "../../../../tmp/hmmscope-audit-escape"],
        outside=["/tmp/hmmscope-audit-escape"])
    add("unsafe name", "spec name ../escape", ["sweep", "run", "s.toml"], files={"s.toml": spec(name="../escape")})
    add("unsafe name", "spec name a/b", ["sweep", "run", "s.toml"], files={"s.toml": spec(name="a/b")})
    add("unsafe name", "spec name 300 chars", ["sweep", "run", "s.toml"], files={"s.toml": spec(name="x" * 300)})
    add("unsafe name", "train --run-name ../x", ["train", *T, "--run-name", "../x"])
    add("unsafe name", "train --run-name empty", ["train", *T, "--run-name", ""])
    add("unsafe name", "sweep status ../x", ["sweep", "status", "../x"])
    add("unsafe name", "report name with ;", ["report", "a b;rm -rf"])
    add("unsafe name", "train --experiment empty", ["train", *T, "--experiment", ""])
    add("unsafe name", "sweep worker /abs", ["sweep", "worker", "/etc/passwd", "--storage", "{STORAGE}"])
    # 12. checkpoints whose config or weights do not fit the model
    for f in ["wrong_weights.pt", "bad_config.pt", "wrong_vocab.pt", "no_model.pt", "config_not_dict.pt",
              "missing_layers.pt", "a_list.pt"]:
        add("checkpoint", f"analyze {f}", ["analyze", f])
    add("checkpoint", "evaluate run with misfit checkpoint", ["evaluate", "{BADCKPT_RUN}"])
    add("checkpoint", "train --resume misfit checkpoint", ["train", *T, "--resume", "{BADCKPT_RUN}"])
    add("checkpoint", "train --resume changed config", ["train", *T, "--resume", "{RUN}", "--set", "model.d_model=64"])
    # 13. sweep spec semantics
    add("spec", "objective not logged", ["sweep", "run", "s.toml"], files={"s.toml": spec(name="s7", objective="eval/nope")})
    add("spec", "theory objective in train sweep", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s8", objective="theory/rate")})
    add("spec", "train objective in theory sweep", ["sweep", "run", "s.toml"],
        files={"s.toml": '[sweep]\nname = "s9"\nkind = "theory"\nobjective = "eval/seen/excess_ce"\n[fixed]\n'
                         '"theory.n_states" = [6]\n"theory.rhos" = [0.02]\n"theory.ranks" = [2]\n'
                         '[space]\n"theory.gammas" = {grid = [0.5]}\n'})
    add("spec", "unknown space key", ["sweep", "run", "s.toml"],
        files={"s.toml": '[sweep]\nname = "s10"\n[space]\n"hmm.nope" = {grid = [1]}\n'})
    add("spec", "existing study, other spec", ["sweep", "run", "s.toml"], files={"s.toml": spec(name="known", seeds="[0, 1]")})
    add("spec", "objective empty", ["sweep", "run", "s.toml"], files={"s.toml": spec(name="s11", objective="")})
    # 14. option usage errors (Click): one line, not a usage box
    add("option", "sweep run --workers 0", ["sweep", "run", "known.toml", "--workers", "0"])
    add("option", "train --bogus", ["train", "--bogus"])
    add("option", "generate missing argument", ["generate"])
    add("option", "theory --family gaussian", ["theory", "--family", "gaussian"])
    add("option", "ui --port 70000", ["ui", "--port", "70000"])
    add("option", "no such command", ["nosuchcommand"])
    add("option", "train --preset huge", ["train", "--preset", "huge"])
    add("option", "generate --n abc", ["generate", "x.npz", "--n", "abc"])
    add("option", "evaluate --n-episodes 0", ["evaluate", "{RUN}", "--n-episodes", "0"])
    add("option", "generate x.txt", ["generate", "x.txt", *T])
    add("option", "theory --json x.txt", ["theory", *T, "--json", "x.txt", "--no-track"])
    add("option", "analyze --ks 0", ["analyze", "{RUN}", "--ks", "0"])
    add("option", "analyze --n-perms 0", ["analyze", "{RUN}", "--n-perms", "0"])
    add("option", "bench train --seq-len 1", ["bench", "train", "--seq-len", "1"])
    add("option", "theory --ranks a", ["theory", "--ranks", "a", "--no-track"])
    add("option", "analyze --ks 1.5", ["analyze", "{RUN}", "--ks", "1.5"])
    # 15. devices
    add("device", "train --device tpu", ["train", *T, "--device", "tpu"])
    add("device", "train --device cuda:7", ["train", *T, "--device", "cuda:7"])
    add("device", "evaluate --device cuda", ["evaluate", "{RUN}", "--device", "cuda"])
    add("device", "analyze --device bogus", ["analyze", "{RUN}", "--device", "bogus"])
    add("device", "bench train --device cuda", ["bench", "train", *T, "--device", "cuda", "--no-peer"])
    # 17. issue 22: argv, links, special files, sizes, stores, deleted and live runs, specs, full disks
    def fifo(name):
        return lambda proj: os.mkfifo(proj / name)

    def unlink(*names):
        return lambda proj: [(proj / n).unlink(missing_ok=True) for n in names]

    outside = tempfile.mkdtemp(prefix="hmmscope-audit-outside-")

    def link_out(proj):
        (proj / "out").mkdir(exist_ok=True)
        (proj / "out" / "known").symlink_to(outside, target_is_directory=True)

    def tmpfs(proj):
        (proj / "tiny").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(proj / "tiny")], check=True)

    def untmpfs(proj):
        subprocess.run(["umount", str(proj / "tiny")], check=False)
        (proj / "tiny").rmdir()

    add("argv", "ui on a store path with a quote", ["ui", "--tracking-uri", "sqlite:///{PROJ}/it's/m.db"])
    add("argv", "ui on a store path with ' --flag' and a quote",
        ["ui", "--tracking-uri", "sqlite:///{PROJ}/a' --disable-security-middleware/m.db"])
    add("link", "report into out/<sweep> linked outside", ["report", "known"], setup=link_out,
        teardown=unlink("out/known"), outside=[])
    add("link", "sweep export onto a FIFO", ["sweep", "export", "known", "p.csv"], setup=fifo("p.csv"),
        teardown=unlink("p.csv"))
    add("special file", "--config FIFO", ["train", "--config", "f.toml"], setup=fifo("f.toml"),
        teardown=unlink("f.toml"))
    add("special file", "--config /dev/zero", ["train", "--config", "/dev/zero"])
    add("special file", "--config /dev/stdin", ["train", "--config", "/dev/stdin"])
    add("special file", "spec FIFO", ["sweep", "run", "f.toml"], setup=fifo("f.toml"), teardown=unlink("f.toml"))
    add("special file", "checkpoint FIFO", ["analyze", "f.pt"], setup=fifo("f.pt"), teardown=unlink("f.pt"))
    add("special file", "generate onto a FIFO", ["generate", "f.npz", *T], setup=fifo("f.npz"), teardown=unlink("f.npz"))
    add("size", "--set model.window=1e20 (int)", ["train", *T, "--set", "model.window=100000000000000000000"])
    add("size", "--set model.window beyond max_len", ["train", *T, "--set", "model.window=65"])
    add("size", "--set train.steps=2**70", ["train", *T, "--set", "train.steps=1180591620717411303424"])
    add("size", "sweep run --workers 100000", ["sweep", "run", "known.toml", "--workers", "100000"])
    add("size", "analyze --probe-jobs 4096", ["analyze", "{RUN}", "--probe-jobs", "4096"])
    add("size", "config nested 3000 deep", ["train", "--config", "d.toml"], files={"d.toml": "x = " + "[" * 3000 + "]" * 3000})
    add("size", "config 2 MB", ["train", "--config", "b.toml"], files={"b.toml": "# pad\n" * 350_000})
    add("size", "spec n_trials 1e8", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s30", extra='sampler = "random"\nn_trials = 100000000').replace(
            '"hmm.gamma" = {grid = [0.5]}', '"hmm.gamma" = {low = 0.3, high = 0.9}')})
    add("store", "optuna storage with a malformed page", ["sweep", "status", "known", "--storage", "sqlite:///{CORRUPT}"])
    add("store", "report on a malformed storage", ["report", "other", "--storage", "sqlite:///{CORRUPT}"])
    add("store", "tracking store with a malformed page", ["train", *T, "--tracking-uri", "sqlite:///{CORRUPT}"])
    add("deleted run", "evaluate a deleted run", ["evaluate", "{DELETED_RUN}"])
    add("deleted run", "analyze a deleted run", ["analyze", "{DELETED_RUN}"])
    add("deleted run", "resume a deleted run", ["train", *T, "--resume", "{DELETED_RUN}"])
    add("live run", "resume a run its owner still holds", ["train", *T, "--resume", "{HELD_RUN}"])
    add("spec", "random range with invalid interior values", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s31", extra='sampler = "random"\nn_trials = 4').replace(
            '"hmm.gamma" = {grid = [0.5]}', '"model.n_heads" = {low = 1, high = 8}')})
    add("spec", "grid 1 and 1.0", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s32").replace('{grid = [0.5]}', '{grid = [1, 1.0]}')})
    add("spec", "experiment with a tab", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s33").replace('experiment = ', 'experiment = "a\\tb"\n# ', 1)})
    add("spec", "heartbeat_interval int64", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s34", extra="heartbeat_interval = 9223372036854775807")})
    if os.geteuid() == 0:
        add("full disk", "generate onto a 16 KiB tmpfs", ["generate", "tiny/x.npz", *T, "--set", "data.n_train=20000"],
            setup=tmpfs, teardown=untmpfs)
    # 18. issue 30: stores that block or lie, read-only commands, links, the small classes of its item 9
    def zero_store(proj):
        (proj / "zero").mkdir(exist_ok=True)
        (proj / "zero" / "mlflow.db").touch()

    def copy_store(name, edit=None):
        def make(proj):
            import shutil as sh

            sh.copy(proj / "mlruns" / "mlflow.db", proj / name)
            if edit is not None:
                edit(proj / name)
        return make

    def truncate(p):
        p.write_bytes(p.read_bytes()[: 100 * 1024])

    def alembic_tmp(p):
        with sqlite3.connect(p) as c:
            c.execute("create table _alembic_tmp_endpoints (x integer)")

    def artifacts_out(proj):
        (proj / "ls").mkdir()
        (proj / "ls" / "artifacts").symlink_to(outside, target_is_directory=True)

    def planted_report_link(proj):
        (proj / "out" / "known").mkdir(parents=True, exist_ok=True)
        (proj / "out" / "known" / "report.md").symlink_to(Path(outside) / "r.md")

    def rm_tree(*names):
        return lambda proj: [shutil.rmtree(proj / n, ignore_errors=True) if (proj / n).is_dir() and not
                             (proj / n).is_symlink() else (proj / n).unlink(missing_ok=True) for n in names]

    z = "sqlite:///{PROJ}/zero/mlflow.db"
    for cmd in (["runs", "list"], ["runs", "show", "{RUN}"], ["runs", "compare", "{RUN}", "{BARE_RUN}"], ["runs", "gc"]):
        add("read-only", f"{' '.join(cmd[:2])} on a 0-byte store", [*cmd, "--tracking-uri", z], setup=zero_store,
            teardown=rm_tree("zero"))
    add("read-only", "runs list on a truncated store", ["runs", "list", "--tracking-uri", "sqlite:///{PROJ}/t.db"],
        setup=copy_store("t.db", truncate), teardown=unlink("t.db"))
    add("read-only", "runs list on a .pt file", ["runs", "list", "--tracking-uri", "sqlite:///{PROJ}/good.pt"])
    add("read-only", "runs list on optuna.db", ["runs", "list", "--tracking-uri", "{STORAGE}"])
    add("read-only", "runs list on databricks", ["runs", "list"], env={"MLFLOW_TRACKING_URI": "databricks"})
    add("read-only", "runs show on a half-created store", ["runs", "show", "{RUN}", "--tracking-uri", "sqlite:///{PROJ}/h.db"],
        setup=copy_store("h.db", alembic_tmp), teardown=unlink("h.db"))
    add("hang", "train onto a FIFO store", ["train", *T, "--tracking-uri", "sqlite:///{PROJ}/f.db"], setup=fifo("f.db"),
        teardown=unlink("f.db"), timeout=60)
    add("hang", "runs list on a FIFO store", ["runs", "list", "--tracking-uri", "sqlite:///{PROJ}/f.db"],
        setup=fifo("f.db"), teardown=unlink("f.db"), timeout=60)
    add("hang", "sweep status on a FIFO journal", ["sweep", "status", "known", "--storage", "f.log"], setup=fifo("f.log"),
        teardown=unlink("f.log"), timeout=60)
    add("hang", "sweep status journal:///FIFO", ["sweep", "status", "known", "--storage", "journal:///{PROJ}/f.log"],
        setup=fifo("f.log"), teardown=unlink("f.log"), timeout=60)
    add("hang", "sweep status journal:///dev/null", ["sweep", "status", "known", "--storage", "journal:///dev/null"],
        timeout=60)
    add("hang", "runs list on a refused port", ["runs", "list", "--tracking-uri", "http://127.0.0.1:9"], timeout=60)
    add("hang", "runs gc on a refused port", ["runs", "gc", "--tracking-uri", "http://127.0.0.1:9"], timeout=60)
    add("link", "mlruns/artifacts linked outside", ["train", *T, "--tracking-uri", "sqlite:///{PROJ}/ls/mlflow.db"],
        setup=artifacts_out, teardown=rm_tree("ls"))
    add("link", "report with a planted report.md link", ["report", "known"], setup=planted_report_link,
        teardown=rm_tree("out"))
    add("environment", "HMMSCOPE_THREADS=0", ["train", *T], env={"HMMSCOPE_THREADS": "0"})
    add("environment", "HMMSCOPE_THREADS=-1", ["runs", "list"], env={"HMMSCOPE_THREADS": "-1"})
    add("environment", "HMMSCOPE_THREADS=two", ["train", *T], env={"HMMSCOPE_THREADS": "two"})
    add("environment", "PYTHONWARNINGS=error", ["train", *T], env={"PYTHONWARNINGS": "error"})
    add("spec", "a key both fixed and swept", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s40", fixed='"hmm.gamma" = 0.3')})
    add("spec", "train.seed swept beside seeds", ["sweep", "run", "s.toml"],
        files={"s.toml": spec(name="s41", seeds="[0, 1]").replace('"hmm.gamma" = {grid = [0.5]}',
                                                                  '"train.seed" = {grid = [3, 4]}')})
    add("spec", "data.seed fixed beside seeds", ["sweep", "run", "s.toml"], files={"s.toml": spec(name="s42",
                                                                                  fixed='"data.seed" = 7')})
    add("option", "analyze --probe-tasks 100000 on 4 tasks", ["analyze", "{RUN}", "--probe-tasks", "100000"])
    add("option", "analyze --ks 1,1", ["analyze", "{RUN}", "--ks", "1,1"])
    add("option", "train --out ''", ["train", *T, "--out", ""])
    add("option", "report --out ''", ["report", "known", "--out", ""])
    add("option", "runs gc --experiment nosuch", ["runs", "gc", "--experiment", "nosuch"])
    add("option", "sweep worker --gpu 0 without a GPU", ["sweep", "worker", "known", "--storage", "{STORAGE}", "--gpu", "0"])
    add("config value", "hmm.gamma=1e-320", ["train", *T, "--set", "hmm.gamma=1e-320"])
    add("checkpoint", "analyze a checkpoint with step -5", ["analyze", "negstep.pt"])
    add("checkpoint", "analyze NaN weights", ["analyze", "nan.pt"])
    add("storage", "a password with @ is masked whole", ["sweep", "run", "known.toml", "--storage",
                                                         "postgresql://u:p@ss@127.0.0.1:9/db"])
    # 16. signals: a timed-out training must not leave a RUNNING run
    add("signal", "train SIGTERM", ["train", "--config", "long.toml"], kind="sigterm",
        files={"long.toml": TINY_TOML.replace("steps = 4", "steps = 1000000")})
    return C


# ---------------------------------------------------------------- running and classifying


def _snapshot(proj: Path) -> dict:
    files = {}
    for p in proj.rglob("*"):
        rel = str(p.relative_to(proj))
        if p.is_dir():
            files[rel] = "dir"
        elif p.suffix in (".db", ".db-journal", ".db-wal", ".db-shm") or p.name.endswith(".lock"):
            # read-only commands may open a database; its rows are compared below (an empty one: its size)
            files[rel] = "db" if not p.is_file() or p.stat().st_size else ("db", 0)
        else:
            st = p.lstat()  # a planted link: itself, not its (maybe missing) target
            files[rel] = (st.st_size, st.st_mtime_ns)
    runs, studies, trials = {}, set(), 0
    for db in proj.rglob("mlflow.db"):
        if not db.is_file() or db.stat().st_size == 0:
            continue
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            runs.update({f"{db}:{r}": (s, ls) for r, s, ls in c.execute("select run_uuid, status, lifecycle_stage from runs")})
    for db in proj.rglob("optuna.db"):
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            studies |= {f"{db}:{n}" for (n,) in c.execute("select study_name from studies")}
            trials += c.execute("select count(*) from trials").fetchone()[0]
    return {"files": files, "runs": runs, "studies": studies, "trials": trials}


def _diff(a: dict, b: dict) -> list[str]:
    out = []
    for k in sorted(b["files"].keys() - a["files"].keys()):
        out.append(f"new {k}")
    for k in sorted(a["files"].keys() & b["files"].keys()):
        if a["files"][k] != b["files"][k]:
            out.append(f"changed {k}")
    for k in sorted(b["runs"].keys() - a["runs"].keys()):
        out.append(f"new run {k.rsplit(':', 1)[1]} {b['runs'][k][0]}")
    for k in sorted(a["runs"].keys() & b["runs"].keys()):
        if a["runs"][k] != b["runs"][k]:
            out.append(f"run {k.rsplit(':', 1)[1]} {a['runs'][k][0]} -> {b['runs'][k][0]}")
    for k in sorted(b["studies"] - a["studies"]):
        out.append(f"new study {k.rsplit(':', 1)[1]}")
    if b["trials"] != a["trials"]:
        out.append(f"trials {a['trials']} -> {b['trials']}")
    return out


def _limit():
    os.setsid()
    lim = 16 << 30
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))


def run_case(case: Case, proj: Path, subs: dict[str, str], i: int) -> dict:
    for name, text in case.files.items():
        (proj / name).write_text(text)
    if case.setup is not None:
        case.setup(proj)
    cwd = proj
    if case.fresh:
        cwd = proj / f"fresh-{i}"
        cwd.mkdir()
    args = [a.format(**subs) if "{" in a else a for a in case.args]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update({"HMMSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200", **case.env})
    before = _snapshot(proj)
    t0 = time.time()
    proc = subprocess.Popen([str(BIN), *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_limit)
    hang = False
    if case.kind == "sigterm":
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            snap = _snapshot(proj)
            if any(v[0] == "RUNNING" for k, v in snap["runs"].items() if k not in before["runs"]):
                time.sleep(2.0)
                break
            time.sleep(0.5)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # what `timeout` does
    try:
        out, err = proc.communicate(timeout=case.timeout)
    except subprocess.TimeoutExpired:
        hang = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    secs = time.time() - t0
    after = _snapshot(proj)
    leaks = _diff(before, after)
    if case.fresh and cwd.exists() and not any(cwd.iterdir()):
        leaks = [x for x in leaks if x != f"new {cwd.name}"]
    leaks += [f"outside {p}" for p in case.outside if Path(p).exists()]
    for p in case.outside:
        if Path(p).is_dir():
            shutil.rmtree(p)
    running = [k for k, v in after["runs"].items() if v[0] == "RUNNING" and before["runs"].get(k, ("",))[0] != "RUNNING"]
    if case.kind == "sigterm":  # the run it started must not stay RUNNING
        leaks = [f"RUNNING run {k.rsplit(':', 1)[1]}" for k in running]
    err_lines = [ln for ln in err.splitlines() if ln.strip()]
    tb = "Traceback (most recent call last)" in out + err
    if case.kind == "sigterm":
        klass = "traceback" if tb else "leaked writes" if leaks else "clean"
    elif proc.returncode == 0 and not hang:
        klass = "wrongly accepted"
    elif tb:
        klass = "traceback"
    elif leaks:
        klass = "leaked writes"
    elif hang:
        klass = "hang"
    elif proc.returncode == 2 and len(err_lines) == 1 and err_lines[0].startswith("error: "):
        klass = "clean"
    else:
        klass = "other"
    # undo leaks so that later cases start from the prepared state (new files / folders only)
    for x in leaks:
        if x.startswith("new ") and not x.startswith(("new run", "new study")):
            p = proj / x[4:]
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists():
                p.unlink()
    for name in case.files:
        (proj / name).unlink(missing_ok=True)
    if case.teardown is not None:
        case.teardown(proj)
    if case.fresh:
        shutil.rmtree(cwd, ignore_errors=True)
    return {"class": case.klass, "case": case.name, "args": args, "outcome": klass, "exit": proc.returncode,
            "hang": hang, "seconds": round(secs, 1), "stderr_lines": len(err_lines),
            "stderr_tail": err_lines[-1][:300] if err_lines else "", "leaks": leaks[:8]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, help="write every case's outcome here")
    ap.add_argument("--only", default="", help="run only cases whose class or name contains this (or any of a "
                    "comma-separated list)")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hmmscope-audit-"))
    try:
        t0 = time.time()
        subs = prepare(root)
        proj = Path(subs["PROJ"])
        only = a.only.split(",")  # any of these (comma-separated)
        todo = [c for c in cases() if any(o in c.klass or o in c.name for o in only)]
        print(f"prepared {proj} in {time.time() - t0:.0f} s; {len(todo)} cases", flush=True)
        results = []
        for i, c in enumerate(todo):
            r = run_case(c, proj, subs, i)
            results.append(r)
            print(f"{i + 1:3d} [{r['outcome']:>16}] {r['class']:>18} | {r['case']} ({r['seconds']} s, exit {r['exit']})"
                  f"{'  | ' + r['stderr_tail'][:150] if r['outcome'] != 'clean' else ''}"
                  f"{'  | ' + '; '.join(r['leaks'][:3]) if r['leaks'] else ''}", flush=True)
        counts = {k: sum(r["outcome"] == k for r in results)
                  for k in ("clean", "traceback", "leaked writes", "wrongly accepted", "hang", "other")}
        print(f"\ntried {len(results)}; " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        by_class: dict[str, dict[str, int]] = {}
        for r in results:
            by_class.setdefault(r["class"], {}).setdefault(r["outcome"], 0)
            by_class[r["class"]][r["outcome"]] += 1
        for k, v in by_class.items():
            print(f"  {k:>18}: " + ", ".join(f"{o} {n}" for o, n in sorted(v.items())))
        if a.json:
            a.json.write_text(json.dumps({"counts": counts, "tried": len(results), "by_class": by_class,
                                          "results": results}, indent=2))
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
