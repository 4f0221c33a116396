"""The main job (`hmmscope run`): the whole pipeline in one command, each phase said as it goes and resumable.

`job` runs the phases in order (the Theorem 1 sweep, training, Figure 1, the layerwise analysis, the training sweep
and its report) under one MLflow run "main", telling a `Phases` display as each begins, what it does meanwhile and
its one-line result as it ends; a main run interrupted (Ctrl-C, SIGTERM, a crash) is resumed by the next `run` of
the same configuration, which skips the phases whose runs finished. `kept` finds that run and says what of it is
kept (the resume plan, and the lines printed on an interrupt). `quick` holds `run --quick`'s sizes: every phase at
a size that runs in about a minute on one idle core. Above the jobs (`hmmscope.jobs`) and the training; the sweep
itself is handed in by the CLI, as before.
"""
