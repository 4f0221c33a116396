"""A racer process for tests/test_sweep_protocol.py: races other racers through `TrialStore`.

    python tests/sweep_racer.py URL INDEX FOLDER

Phases, each started when the file FOLDER/go<phase> appears (the test makes it once every racer is
ready: FOLDER/ready<phase>-<INDEX>); each phase's result goes to FOLDER/out<phase>-<INDEX> as JSON.
0. open the storage and load the three studies (the test creates them while the racers start).
1. study "claim": claim WAITING trials until none is left -> the trial ids claimed.
2. study "stale": fail the stale trials and retry them (`fail_stale`) -> the trial ids this racer failed.
3. study "finish": racer 0 is the worker, finishing every RUNNING trial COMPLETE with value = its id; the
   others fail them as stale -> the ids racer 0 finished, or those the others failed.
"""

import json
import os
import sys
import time
from pathlib import Path


def phase(folder: Path, i: int, n: int) -> None:
    (folder / f"ready{n}-{i}").touch()
    while not (folder / f"go{n}").exists():
        time.sleep(0.002)


def main() -> None:
    url, i, folder = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    import optuna
    from optuna.trial import TrialState

    from hmmscope.sweep import TrialStore, open_storage, quiet_optuna

    quiet_optuna()

    class Spec:  # the heartbeat settings open_storage takes from a sweep spec
        heartbeat_interval, grace_period = 1, 1

    got: list[int] = []

    def out(n: int) -> None:
        part = folder / f".out{n}-{i}.part"
        part.write_text(json.dumps(got))
        os.replace(part, folder / f"out{n}-{i}")  # whole when it appears (the test reads it at once)
        got.clear()

    phase(folder, i, 0)
    storage = open_storage(url, Spec, create=False)
    stores = {name: TrialStore.of(optuna.load_study(study_name=name, storage=storage), url, grace_period=1)
              for name in ("claim", "stale", "finish")}
    out(0)
    phase(folder, i, 1)
    while (tid := stores["claim"].claim()) is not None:
        got.append(tid)
    out(1)
    phase(folder, i, 2)
    got.extend(stores["stale"].fail_stale(max_retry=5, log=lambda m: None))
    out(2)
    phase(folder, i, 3)
    store = stores["finish"]
    if i == 0:
        for t in store.storage.get_all_trials(store.study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            if store.finish(t._trial_id, TrialState.COMPLETE, float(t._trial_id)):
                got.append(t._trial_id)
    else:
        got.extend(store.fail_stale(max_retry=5, log=lambda m: None))
    out(3)


if __name__ == "__main__":
    main()
