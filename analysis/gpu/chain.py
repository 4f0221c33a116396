"""The chained long run's helpers for analysis/gpu/session.sh `chain` (README.md): where the run stands, its record,
and the check that a chained run equals an uninterrupted one.

Usage (the default MLflow store under ./mlruns):
  python analysis/gpu/chain.py state EXPERIMENT          # 'RUN_ID STEPS_DONE TARGET STATE' of the newest training
                                                         # run in EXPERIMENT, or 'none'
  python analysis/gpu/chain.py record RUN_ID DIR         # DIR/curves.csv (every metric: key, step, value),
                                                         # DIR/run.json (params, tags, status, latest metrics)
  python analysis/gpu/chain.py verify RUN_ID [EXPERIMENT] # train the run's config uninterrupted (same device), compare

STATE is 'done' (train.steps reached), 'deadline' (stopped by a deadline: resume it) or the MLflow status of a
run that neither finished nor was stopped by a deadline (KILLED, FAILED, RUNNING).
`verify` prints one line per compared quantity and 'chain: equal to an uninterrupted run (bitwise)' or exits 1.
"""

import csv
import json
import sys
import tempfile
from pathlib import Path

from hmmscope import tracking

URI = tracking.resolve_uri(None)


def _runs(experiment: str):
    c = tracking.client(URI)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return [r for r in c.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
            if "train.steps" in r.data.params]


def state(experiment: str) -> str:
    runs = _runs(experiment)
    if not runs:
        return "none"
    r = runs[0]
    target = int(r.data.params["train.steps"])
    hist = tracking.client(URI).get_metric_history(r.info.run_id, "train/wall_time_s")
    steps = max((m.step for m in hist), default=0)
    tag = r.data.tags.get("hmmscope.stopped")
    if r.info.status == "FINISHED" and (tag == "done" or (tag is None and steps >= target)):
        st = "done"
    elif r.info.status == "FINISHED" and tag == "deadline":
        st = "deadline"
        steps = int(r.data.tags.get("hmmscope.stopped_at_step", steps))
    else:
        st = r.info.status
    return f"{r.info.run_id} {steps} {target} {st}"


def record(run_id: str, out: Path) -> None:
    c = tracking.client(URI)
    r = c.get_run(run_id)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "step", "value", "timestamp_ms"])
        for key in sorted(r.data.metrics):
            for m in sorted(c.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)):
                w.writerow([key, m.step, repr(m.value), m.timestamp])
    info = {"run_id": run_id, "status": r.info.status, "start_time": r.info.start_time, "end_time": r.info.end_time,
            "params": dict(r.data.params), "tags": {k: v for k, v in r.data.tags.items()
                                                    if not k.startswith("mlflow.log-model")},
            "metrics": dict(r.data.metrics)}
    (out / "run.json").write_text(json.dumps(info, indent=1, sort_keys=True))


def verify(run_id: str, experiment: str = "chain-verify") -> int:
    import torch

    from hmmscope.pipeline.run import train
    from hmmscope.training.checkpoints import checkpoint_config, load_checkpoint, load_model

    with tempfile.TemporaryDirectory() as tmp:
        cfg = checkpoint_config(load_checkpoint(URI, run_id, tmp))
    log_every = min(50, max(1, cfg.train.steps // 100))  # train's default, as the chain's calls used
    ref = train(cfg, tracking_uri=URI, experiment=experiment, run_name="uninterrupted", progress=False,
                log_every=log_every)
    a, _ = load_model(URI, run_id)
    b, _ = load_model(URI, ref.run_id)
    same_w = all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    print(f"weights ({sum(p.numel() for p in a.state_dict().values())} values): "
          f"{'bitwise equal' if same_w else 'DIFFER'}")
    c, ok = tracking.client(URI), same_w
    for key in ("train/loss", "train/lr", "train/grad_norm", "val/loss", "val/acc", "val/test_loss", "val/test_acc"):
        h1 = [(m.step, m.value) for m in sorted(c.get_metric_history(run_id, key), key=lambda m: m.step)]
        h2 = [(m.step, m.value) for m in sorted(c.get_metric_history(ref.run_id, key), key=lambda m: m.step)]
        print(f"{key}: chained {len(h1)} values, uninterrupted {len(h2)}: {'equal' if h1 == h2 else 'DIFFER'}")
        ok = ok and h1 == h2 and len(h1) > 0
    print(f"chain: {'equal to' if ok else 'NOT equal to'} an uninterrupted run (bitwise) of "
          f"{cfg.train.steps} steps; uninterrupted run {ref.run_id} in experiment {experiment!r}")
    return 0 if ok else 1


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["state"] and len(a) == 2:
        print(state(a[1]))
    elif a[:1] == ["record"] and len(a) == 3:
        record(a[1], Path(a[2]))
    elif a[:1] == ["verify"] and len(a) in (2, 3):
        sys.exit(verify(*a[1:]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
