"""The local servers behind `hmmscope ui`: the MLflow UI and optuna-dashboard as children that die with their
parent, free ports, health checks and clean-up (`servers`), and optuna-dashboard behind the MLflow UI's guard
against a foreign Host or a cross-origin write (`dashboard_guard`). Above sweep and tracking; only the CLI imports it.
"""
