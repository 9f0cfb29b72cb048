"""Which stages an experiment runs, in order, each bound to the sections it reads: `plan(config, workdir)`.

A `Stage` is a name and a step, `step(made) -> dict`: called with what the earlier stages made (`Made`), it
returns the fields it makes. `plan` is the one place where the config's sections meet the stages, so what
each stage reads is one line here, and which stages a config runs is a list that can be printed
(`describe`) before anything is computed. `zarya_jax.experiment.run` runs the plan, timing each stage.

    load         (eval.ckpt given)      -> model
    data         task                   -> splits
    train        (no eval.ckpt) trainer -> trained, model
    records      data                   -> records, val_records   rendered as the model was trained
    drafter      (a spec-lora mode)     drafter, trainer, task -> model with Uno's LoRA drafter
    draft_model  (spec-model)           draft_model, trainer, drafter.lora -> model with a draft model
    frontier     eval, frontier         -> knobs, frontier        chosen on validation
    test         eval                   -> results, predictions   the test split at the chosen knobs
    speed        speed, eval            -> speed                  the fastest lossless configuration per batch size
    diagnostics  zarya                  -> diagnostics
    targets      goals                  -> targets
"""
from __future__ import annotations

import dataclasses
import os
from functools import partial
from typing import Callable

from ..config import PromptFormat
from ..eval import tasks
from ..eval.evaluate import ADAPTER_MODES
from ..eval.results import ModeResult, Prediction
from ..eval.speed import SpeedChoice
from ..inference import Inference
from . import stages
from .config import ExperimentConfig
from .results import Frontier, Target
from .stages import Splits, Trained


@dataclasses.dataclass(frozen=True)
class Made:
    """What the stages have made so far; each field is made by the stage named beside it."""

    model: Inference | None = None          # load or train; drafter and draft_model add to it
    splits: Splits | None = None            # data
    trained: Trained | None = None          # train
    records: list[dict] = ()                # records: the test split
    val_records: list[dict] = ()            # records: the validation split (when the frontier is on)
    knobs: dict[str, dict] | None = None    # frontier
    frontier: Frontier | None = None        # frontier (None when off)
    results: list[ModeResult] = ()          # test
    predictions: list[Prediction] = ()      # test
    speed: SpeedChoice | None = None        # speed (None when off)
    diagnostics: dict | None = None         # diagnostics
    targets: list[Target] = ()              # targets


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    step: Callable[[Made], dict]


def plan(config: ExperimentConfig, workdir: str, *, progress: bool = True, force: bool = False) -> list[Stage]:
    """The stages `config` runs into `workdir`, in order. A given checkpoint (`eval.ckpt`) is loaded first,
    before anything is written, so a damaged one fails the run at once. progress: progress bars. force:
    resume training / the drafter / the draft model from checkpoints of another config."""
    trainer, ev = config.trainer, config.eval
    load = partial(stages.load, data=trainer.data, verify=trainer.train.verify_checkpoints)
    out = [Stage("load", partial(_load, load, ev.ckpt))] if ev.ckpt else []
    out.append(Stage("data", partial(_data, config.task, PromptFormat.of(trainer.data), workdir,
                                     config.frontier.enabled)))
    if not ev.ckpt:
        out.append(Stage("train", partial(_train, trainer, load, workdir, force)))
    out.append(Stage("records", partial(_records, config.frontier.enabled)))
    if any(m in ADAPTER_MODES for m in ev.modes):
        out.append(Stage("drafter", partial(_drafter, config.drafter, trainer, config.task, workdir, force)))
    if "spec-model" in ev.modes:
        out.append(Stage("draft_model", partial(_draft_model, config.draft_model, trainer, config.drafter.lora,
                                                workdir, force)))
    return out + [Stage("frontier", partial(_frontier, ev, config.frontier, progress)),
                  Stage("test", partial(_test, ev, progress)),
                  Stage("speed", partial(_speed, config.speed, ev)),
                  Stage("diagnostics", partial(_diagnostics, trainer.zarya)),
                  Stage("targets", partial(_targets, config.goals))]


def describe(planned: list[Stage]) -> str:
    """The plan in one line: `load → data → records → frontier → …`."""
    return " → ".join(s.name for s in planned)


def _load(load, ckpt: str, made: Made) -> dict:
    return {"model": load(ckpt)}


def _data(task, fmt: PromptFormat, workdir: str, need_val: bool, made: Made) -> dict:
    os.makedirs(workdir, exist_ok=True)
    return {"splits": stages.prepare_data(task, workdir, fmt=fmt, need_val=need_val)}


def _train(trainer, load, workdir: str, force: bool, made: Made) -> dict:
    trained = stages.train(trainer, made.splits, workdir, force=force)
    return {"trained": trained, "model": load(trained.ckpt)}


def _records(need_val: bool, made: Made) -> dict:
    fmt = made.model.prompt_format
    return {"records": tasks.read_jsonl(made.splits.test, fmt),
            "val_records": tasks.read_jsonl(made.splits.val, fmt) if need_val else []}


def _drafter(drafter, trainer, task, workdir: str, force: bool, made: Made) -> dict:
    train_file = stages.drafter_data(drafter, task, made.splits, workdir)
    return {"model": stages.train_drafter(drafter, trainer, made.model, train_file, workdir, force=force)}


def _draft_model(draft_model, trainer, lora, workdir: str, force: bool, made: Made) -> dict:
    return {"model": stages.train_draft_model(draft_model, trainer, lora, made.model, made.splits.train, workdir,
                                              force=force)}


def _frontier(ev, fc, progress: bool, made: Made) -> dict:
    knobs, front = stages.choose_knobs(ev, fc, made.model, made.val_records, progress)
    return {"knobs": knobs, "frontier": front}


def _test(ev, progress: bool, made: Made) -> dict:
    results, predictions = stages.evaluate(ev, made.model, made.records, made.knobs, made.frontier, progress)
    return {"results": results, "predictions": predictions}


def _speed(sc, ev, made: Made) -> dict:
    return {"speed": stages.choose_for_time(sc, ev, made.model, made.frontier, made.val_records, made.records)}


def _diagnostics(zarya, made: Made) -> dict:
    return {"diagnostics": stages.diagnose(zarya, made.model, made.records, made.results, made.predictions)}


def _targets(goals, made: Made) -> dict:
    return {"targets": stages.targets(goals, made.results, made.predictions)}
