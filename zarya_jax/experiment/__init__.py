"""An experiment as a library object: a typed config of sections, typed stages and results, one `run`.

    from zarya_jax.experiment import SMOKE, default_config, run
    from zarya_jax import overrides

    config = overrides.apply(default_config(), {**SMOKE, "task.seed": 1})
    report = run(config, "runs/notebook")          # a Report
    report.mode("slotted").tokens_per_forward

Modules: `config` (ExperimentConfig and its composed sections: DrafterRun, DraftModelRun, …; the
defaults, the smoke size), `stages` (the stages, each a function of its own sections), `plan` (which
stages a config runs, each bound to its sections: `plan`, `describe`, `Made`), `results`
(Frontier, Target, TrainSummary, Report; ModeResult, FrontierPoint and Prediction are
`zarya_jax.eval.results`'), `run` (run, current_report), `report` (the Markdown and PNG writers), `sweep`
(the sweep engine), `calibrate` (a finished workdir's knobs chosen for time again on the device in use),
`plots`. The command lines are `python -m experiments.quickstart`, `python -m experiments.sweep` and
`python -m experiments.speed`; docs/experiments.md is the manual.
"""
from .config import (DEFAULT_MODES, SMOKE, UNO_DEFAULTS, UNO_MODES, DraftModelRun, DrafterRun, ExperimentConfig,
                     GoalsSection, TaskSection, comparable, default_config)
from .plan import Made, Stage, describe, plan
from .results import Frontier, FrontierPoint, ModeResult, Prediction, Report, Target, TrainSummary
from .run import current_report, run
from .stages import Splits, Trained, TrainingInterrupted, calibrate_steps

__all__ = ["DEFAULT_MODES", "SMOKE", "UNO_DEFAULTS", "UNO_MODES", "DraftModelRun", "DrafterRun", "ExperimentConfig",
           "Frontier", "FrontierPoint", "GoalsSection", "Made", "ModeResult", "Prediction", "Report", "Splits", "Stage", "TaskSection",
           "Target", "Trained", "TrainSummary", "TrainingInterrupted", "calibrate_steps", "comparable",
           "current_report", "default_config", "describe", "plan", "run"]
