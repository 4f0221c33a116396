"""Measurements of a model against the oracles and baselines: Figure 1 and its claims (`evaluate`: the evaluation
sets and the model scored on them; `scoring`: the model's predictive and per-token metrics with CIs; `figure1_result`:
the result's tables and headline metrics; `figure1_plot`: drawn; `bayes_gap`: the Bayes reference's room; the regime
word in `regimes`; a windowed model beside eps(L) in `fixed_memory`), emergence during
training (`emergence`), the room above counting before any training (`headroom`), the demonstration-shuffle test
of Figure 2 (`shuffle`) and the layerwise probes of Figure 3 (`probes/`). Library code: it computes and writes
tables and figures; the jobs wire it into MLflow runs. It never imports training, the jobs, sweeps or the CLI.
"""
