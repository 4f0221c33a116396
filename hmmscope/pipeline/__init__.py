"""The pipeline: one run composed once (`run`: train with the pipeline's measurements -> evaluate -> analyze -> log),
and the main job (`hmmscope run`) built on it.

`run` is what the CLI's `train`, a sweep's training trial and the main job call; a step added to every run is added
there. `steps` holds what a caller does between the steps (`Steps`), `measures` what every training run measures
beside its learning curve (`Measures`, handed to training: the references, oracle/*, the emergence curves),
`evaluation` Figure 1 of a model and `analysis` its layerwise analysis, each logged to MLflow. `job` runs the main
job's phases in order (the Theorem 1 sweep, training, Figure 1, the layerwise analysis, the training sweep and its
report) under one MLflow run "main", telling a `Phases` display as each begins, what it does meanwhile and its
one-line result as it ends; a main run interrupted (Ctrl-C, SIGTERM, a crash) is resumed by the next `run` of the
same configuration, which skips the phases whose runs finished. `kept` finds that run and says what of it is kept.
`quick` holds `run --quick`'s sizes. Above training, the measurements and the jobs (`hmmscope.jobs`); below the sweep
layer (a trial calls `run`), which the main job is handed by the CLI.
"""
