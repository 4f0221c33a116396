"""The `hmmscope` command line (Typer), one module per command group. Only this package parses user input.

| module | commands |
| --- | --- |
| `app` | the root app, one-line errors, `--version`, the command order, `main` |
| `common` | shared option types, `user_errors` / `fail`, `build_config`, output helpers, `Spinner` |
| `theory` | `generate`, `theory` |
| `jobs` | `train`, `evaluate`, `analyze` |
| `run` | `run` (the main job: phases shown as they go, resumable, `--quick`) |
| `sweep` | `sweep run / worker / status / list / export / delete`, `SweepProgress` |
| `runs` | `runs gc` |
| `report` | `report` |
| `ui` | `ui` (the servers themselves: `hmmscope.ui.servers`) |
| `bench` | `bench sample / filter / oracle / train` |

Each command module is a thin layer: it parses, checks, calls the library, prints. None imports torch, mlflow,
optuna, sklearn or scipy at module level (they are imported inside the command bodies), so `hmmscope --help`
stays fast; none imports `app` (only `app` imports them), so there is no import cycle.

Bad input: exit code 2 and one line `error: ...` on stderr, nothing written. Every command checks its
names, paths, stores and sizes (hmmscope.checks) before it creates a run, a study, a folder or a file;
option errors Click finds (a bad value, a missing argument) get the same one line. A training that
diverges exits 1 with one line naming its FAILED run; Ctrl-C or SIGTERM exits 130 (the run ends KILLED).

Output: results on stdout; errors, progress bars and spinners on stderr, the bars and spinners on a terminal
only (a sweep prints plain progress lines elsewhere). No third-party chatter: MLflow's table-creation INFO
lines are silenced here, `hmmscope ui` sends its servers' output to a log file (shown if a server fails).
`--print-config` prints the resolved config as TOML (what `--config` reads) and exits.
"""

from .app import OneLineErrors, app, main
from .common import Spinner, build_config, config_toml, fail, parse_sets, user_errors
from .sweep import SweepProgress

__all__ = ["OneLineErrors", "Spinner", "SweepProgress", "app", "build_config", "config_toml", "fail", "main",
           "parse_sets", "user_errors"]
