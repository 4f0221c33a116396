"""Two `hmmscope train --resume RUN` processes started at the same instant, round after round (tests/test_liveness.py).

    python tests/resume_racer.py URI RUN_ID ROUNDS OUT_JSON CONFIG FOLDER

The driver imports the CLI (and torch, MLflow) once, then for each round forks two child processes that block on
one pipe; closing the pipe's write end releases both at once, and each runs the real CLI,
`hmmscope train --config CONFIG --resume RUN_ID --set train.steps=<4 more than the last round> --no-evaluate
--tracking-uri URI`, its stdout and stderr in files of its own under FOLDER (the test's own temp folder: the racer
leaves nothing elsewhere). The driver waits for both and records, per round,
each child's pid, exit code and stderr; OUT_JSON gets the list of rounds. The driver opens no store itself (a
database connection must not cross a fork).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path


def child(release: int, args: list[str], out: Path) -> None:
    """In the forked child: wait for the release, run the CLI, exit with its code (never returning)."""
    code = 1
    try:
        os.read(release, 1)  # end of file when the driver closes the write end: both children go at once
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        err = os.open(out.with_suffix(".err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(err, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        from hmmscope.cli.app import main

        sys.argv = ["hmmscope", *args]
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - reported through the exit code and the err file
        print(f"racer child: {type(e).__name__}: {e}", file=sys.stderr)
        code = 3
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    uri, run_id, rounds, out_json, config, tmp = (sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]),
                                                  sys.argv[5], Path(sys.argv[6]))
    for module in ("mlflow.tracking", "hmmscope.checks", "hmmscope.cli.app", "hmmscope.jobs", "hmmscope.training.train"):
        importlib.import_module(module)  # every import before the forks: the children start alike, at once

    tmp.mkdir(exist_ok=True)
    results = []
    for r in range(rounds):
        args = ["train", "--config", config, "--resume", run_id, "--set", f"train.steps={8 + 4 * r}",
                "--no-evaluate", "--tracking-uri", uri]
        rd, wr = os.pipe()
        pids = []
        for i in range(2):
            pid = os.fork()
            if pid == 0:
                os.close(wr)
                child(rd, args, tmp / f"r{r}-{i}.out")
            pids.append(pid)
        os.close(rd)
        os.close(wr)  # the release
        got = []
        for i, pid in enumerate(pids):
            _, status = os.waitpid(pid, 0)
            err = (tmp / f"r{r}-{i}.err").read_text() if (tmp / f"r{r}-{i}.err").exists() else ""
            got.append({"pid": pid, "code": os.waitstatus_to_exitcode(status), "stderr": err})
        results.append(got)
    out_json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
