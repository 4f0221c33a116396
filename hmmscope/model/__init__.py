"""The model: a RoFormer-style transformer (rotary or absolute positions) with hook points on its residual stream
and `run_with_cache` for the probes (`transformer`). It imports only `config` and torch.
"""
