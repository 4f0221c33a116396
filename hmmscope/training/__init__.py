"""Training: the loop, resume and the trained model (`train`), checkpoints as a run's artifacts (`checkpoints`), a
wall-clock deadline that stops in time to write the last one (`deadline`), progress on a terminal or in plain lines
(`progress`), and the speed benchmarks against named peers with the training-step variants a GPU run picks from
(`bench`: the training step and the shared timing helpers; `bench_inference`: sampling, filtering, the oracles,
counting, headroom, Bayes; `bench_variants`). Above the data, oracles, model and measurements (training logs emergence
and the Figure 1 evaluation); below the jobs, sweeps and the CLI.
"""
