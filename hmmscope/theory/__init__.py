"""Theorem 1 (SCIENCE.md 4) measured: the sweep over settings with its HMM draws, per-setting checks and verdicts
(`theorem1`), the decay-rate, exponent and rank fits with draws as the unit (`fit`), and the Theorem 1 figure
(`figure`). It reads the data and oracles stages; nothing below imports it.
"""
