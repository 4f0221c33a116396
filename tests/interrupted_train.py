"""Training runs interrupted at chosen points by real signals (tests/test_train.py, issue 47 item 1).

    python tests/interrupted_train.py URI CONFIG_JSON FOLDER SCENARIO [SCENARIO ...]

The driver imports torch, MLflow and hmmscope once, then for each scenario in turn forks a child that trains a new
run (`train(..., log_every=1)` on the overrides in CONFIG_JSON) and pauses at the scenario's point; there it writes
FOLDER/<scenario>.paused (JSON: its pid and run id; written aside, then renamed) and sleeps, for the test to signal it.
The driver waits for the child and writes FOLDER/<scenario>.done (its exit code), then goes on to the next. It opens
no store itself (a database connection must not cross a fork).

Scenarios (the pause, in the child):
- `sigterm40`, `two_sigterms`: at the start of step 41 (40 steps trained and queued for the store, none written since
  the checkpoint at 30); the test sends one SIGTERM, or two 0.05 s apart.
- `timed37`: just after the timed write that brought steps up to 37 to the store (METRICS_WRITE_S = 0 here, so every
  logged step is written at once); the test sends SIGKILL.
- `ckpt60`: while the step-60 checkpoint is written (its temp file written, not yet renamed onto last.pt; the steps
  up to 60 were written just before it); the test sends SIGKILL.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _paused(folder: Path, scenario: str, run_id: str) -> None:
    tmp = folder / f".{scenario}.paused.tmp"
    tmp.write_text(json.dumps({"pid": os.getpid(), "run_id": run_id}))
    os.replace(tmp, folder / f"{scenario}.paused")
    time.sleep(600)  # the test signals us here
    raise SystemExit(f"{scenario}: not signalled within 600 s")


def child(uri: str, overrides: dict, folder: Path, scenario: str) -> None:
    """In the forked child: train, pausing at the scenario's point; exit with a code (never returning)."""
    code = 1
    try:
        import torch

        from hmmscope import tracking
        from hmmscope.config import Config, override
        from hmmscope.pipeline.run import train
        from hmmscope.training import train as train_module

        torch.set_num_threads(1)
        rid: list[str] = []
        if scenario in ("sigterm40", "two_sigterms"):
            real_lr = train_module.lr_at

            def lr_at(step, t):
                if step == 40:
                    _paused(folder, scenario, rid[0])
                return real_lr(step, t)

            train_module.lr_at = lr_at
        elif scenario == "timed37":
            train_module.METRICS_WRITE_S = 0.0
            real_log = tracking.Run.log_metric_steps

            def log_metric_steps(self, rows):
                real_log(self, rows)
                if any(step == 37 and "train/loss" in m for m, step in rows):
                    _paused(folder, scenario, rid[0])

            tracking.Run.log_metric_steps = log_metric_steps
        elif scenario == "ckpt60":
            real_save = torch.save

            def save(obj, f, *a, **kw):
                real_save(obj, f, *a, **kw)
                if isinstance(obj, dict) and obj.get("step") == 60:
                    f.flush()
                    _paused(folder, scenario, rid[0])

            torch.save = save
        else:
            raise SystemExit(f"unknown scenario {scenario!r}")
        train(override(Config(), overrides), tracking_uri=uri, experiment="interrupted", run_name=scenario,
              progress=False, log_every=1, on_start=rid.append)
        code = 0
    except KeyboardInterrupt:
        code = 130
    except BaseException as e:  # noqa: BLE001 - reported through the exit code and stderr
        print(f"interrupted_train child {scenario}: {type(e).__name__}: {e}", file=sys.stderr)
        code = 3
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    uri, overrides, folder, scenarios = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    import importlib

    for module in ("torch", "mlflow.tracking", "hmmscope.tracking", "hmmscope.pipeline.run"):
        importlib.import_module(module)  # every import before the forks
    for scenario in scenarios:
        pid = os.fork()
        if pid == 0:
            child(uri, overrides, folder, scenario)
        _, status = os.waitpid(pid, 0)
        tmp = folder / f".{scenario}.done.tmp"
        tmp.write_text(json.dumps({"code": os.waitstatus_to_exitcode(status)}))
        os.replace(tmp, folder / f"{scenario}.done")


if __name__ == "__main__":
    main()
