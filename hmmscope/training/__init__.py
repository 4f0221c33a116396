"""Training: the loop, resume and the trained model (`train`), what it builds before its first step (`setup`), the
learning-rate schedule (`schedule`), precision and compilation on the device (`device`), its learning curve (`learning_curve`:
val/*, and a mixture oracle on the same targets), what a run records about itself (`record`), checkpoints as a run's
artifacts (`checkpoints`), a wall-clock deadline that stops in time to write the last one (`deadline`), progress on a
terminal or in plain lines (`progress`), and the speed benchmarks against named peers (`bench`: the training step and
the shared timing helpers; `bench_inference`: sampling, filtering, the oracles, counting, headroom, Bayes;
`bench_variants`: the training-step variants a GPU run picks from). What a run measures beside its learning curve is
its caller's `monitor.Monitor` (the pipeline's references, oracle/* and emergence curves): the training loop never
imports `measure/` (only `bench_inference` does, to time the measurements). Above the data, oracles and model; below
the jobs, the pipeline, sweeps and the CLI.
"""
