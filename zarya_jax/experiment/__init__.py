"""An experiment as a library object: a typed config of sections, typed stages and results, one `run`.

    from zarya_jax.experiment import SMOKE, default_config, run
    from zarya_jax import overrides

    config = overrides.apply(default_config(), {**SMOKE, "task.seed": 1})
    report = run(config, "runs/notebook")          # a Report
    report.mode("slotted").tokens_per_forward

Modules: `config` (ExperimentConfig and its sections, the defaults, the smoke size), `stages` (the
stages, each a function of its section), `results` (ModeResult, FrontierPoint, Frontier, Target,
TrainSummary, Report), `run` (run, current_report), `report` (the Markdown and PNG writers), `sweep`
(the sweep engine), `plots`. The command lines are `python -m experiments.quickstart` and
`python -m experiments.sweep`; docs/experiments.md is the manual.
"""
from .config import (DEFAULT_MODES, SMOKE, UNO_DEFAULTS, UNO_MODES, DrafterSection, ExperimentConfig, GoalsSection,
                     TaskSection, comparable, default_config)
from .results import Frontier, FrontierPoint, ModeResult, Report, Target, TrainSummary
from .run import current_report, run
from .stages import Splits, Trained, TrainingInterrupted, calibrate_steps

__all__ = ["DEFAULT_MODES", "SMOKE", "UNO_DEFAULTS", "UNO_MODES", "DrafterSection", "ExperimentConfig", "Frontier",
           "FrontierPoint",
           "GoalsSection", "ModeResult", "Report", "Splits", "TaskSection", "Target", "Trained", "TrainSummary",
           "TrainingInterrupted", "calibrate_steps", "comparable", "current_report", "default_config", "run"]
