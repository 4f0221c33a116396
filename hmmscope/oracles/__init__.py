"""What can be known without training: exact inference on the true HMMs (`filtering`: the
forward pass of one HMM or a batch; `inference`: the task and mixture oracles built on it; `memory`: the L-memory
predictor and eps(L); `mixture_kernel`, its compiled CPU kernel; `chunks`, its torch
path in task chunks), the observability coefficients gamma(O), gamma_eff, gamma_m (`observability`), and the
in-context learners that know no training task (`baselines`: counting, context-tree weighting and their fits;
`em_learner`: an EM-fitted HMM), and the Bayes-optimal predictor for fresh tasks (`bayes`; the family's
structures up to relabeling in `bayes_structures`, its compiled kernel `bayes_kernel`, its signed results on disk
`bayes_cache` in the user-private folders of `private_cache`). Below the model and training; it reads the data stage
only.
"""
