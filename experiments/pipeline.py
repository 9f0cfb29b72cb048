"""The experiment pipeline under its former names: it lives in `zarya_jax.experiment` (docs/experiments.md)."""
from __future__ import annotations

from zarya_jax.experiment import (DEFAULT_MODES, DrafterSection, TaskSection, TrainingInterrupted, comparable,
                                  current_report, default_config)
from zarya_jax.experiment import ExperimentConfig as PipelineConfig
from zarya_jax.experiment import run as _run
from zarya_jax.experiment.report import report_markdown

__all__ = ["DEFAULT_MODES", "DrafterSection", "PipelineConfig", "TaskSection", "TrainingInterrupted", "comparable",
           "current_report", "default_config", "report_markdown", "run_pipeline"]


def run_pipeline(config: PipelineConfig, workdir: str, progress: bool = True, force: bool = False) -> dict:
    """`zarya_jax.experiment.run`'s report as the `report.json` document."""
    return _run(config, workdir, progress=progress, force=force).to_json()
