"""Moved to `hmmscope.sweep.studies` (sweep list / export / delete); this name stays until the CLI imports from there."""

from .sweep.studies import StudyRuns, csv_text, delete_study, export_rows, list_studies, study_runs, write_csv

__all__ = ["StudyRuns", "csv_text", "delete_study", "export_rows", "list_studies", "study_runs", "write_csv"]
