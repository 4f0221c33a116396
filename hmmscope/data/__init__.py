"""The data: HMMs and mixtures of low-rank HMMs with their sampler (`hmm`), in-context episodes, the task streams
beside training and dataset files (`episodes`), and the seed streams every random draw comes from (`seeds`). The
first stage of the pipeline: it imports nothing of hmmscope but `config` and `safe_output`, and every later stage
builds on it.
"""
