"""Training: the loop, resume and the trained model (`train`), what it builds before its first step (`setup`), the
learning-rate schedule (`schedule`), precision and compilation on the device (`device`), its learning curve (`learning_curve`:
val/*, and a mixture oracle on the same targets), what a run records about itself (`record`), checkpoints as a run's
artifacts (`checkpoints`), a wall-clock deadline that stops in time to write the last one (`deadline`), progress on a
terminal or in plain lines (`progress`), and the speed benchmarks against named peers with the training-step variants
a GPU run picks from (`bench`, `bench_variants`). What a run measures beside its learning curve is its caller's
`monitor.Monitor` (the pipeline's references, oracle/* and emergence curves): training never imports `measure/`.
Above the data, oracles and model; below the jobs, the pipeline, sweeps and the CLI.
"""
