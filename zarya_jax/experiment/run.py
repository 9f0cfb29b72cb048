"""`run(config, workdir) -> Report`: data → train (unless `eval.ckpt`) → frontier on validation → the
chosen points on test → the fastest lossless configuration per batch size → diagnostics → report files (`zarya_jax.experiment.stages`).

Reruns are safe. Every input is checked before any compute (the whole config when it is built, the
workdir writable, the checkpoint to evaluate). A workdir whose `report.json` was made by the same
config is up to date: the rerun changes nothing and returns that report. Otherwise training resumes (a
finished training takes no step and keeps its recorded numbers) and the evaluation runs again. The
report files are written only when everything is computed, `report.json` last, so a `report.json` is
always complete.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time

from .. import overrides
from ..config import PromptFormat
from ..eval import tasks
from ..eval.evaluate import ADAPTER_MODES, EvalConfig, write_outputs
from ..files import check_writable_dir
from ..provenance import provenance
from . import stages
from .config import ExperimentConfig, comparable
from .report import write_report
from .results import Report


def current_report(config: ExperimentConfig, workdir: str) -> Report | None:
    """The workdir's report when it is complete and was made by this same config (else None)."""
    try:
        with open(os.path.join(workdir, "report.json")) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        return None
    if comparable(doc["config"]) != comparable(overrides.to_dict(config)):
        return None
    try:
        return Report.from_json(doc)
    except (KeyError, TypeError, ValueError):  # a report of another schema: made again
        return None


def check_inputs(ev: EvalConfig, workdir: str) -> None:
    """What the config alone cannot check, before any compute: the checkpoint to evaluate, the workdir."""
    if ev.ckpt and not os.path.isdir(ev.ckpt):
        raise FileNotFoundError(f"checkpoint {ev.ckpt!r} does not exist or is not a directory")
    check_writable_dir(workdir, "workdir")


def run(config: ExperimentConfig, workdir: str, *, progress: bool = True, force: bool = False) -> Report:
    """Runs the experiment into `workdir` and returns its report; a workdir whose report this config
    already made is returned as it is (`current_report`), untouched. progress: progress bars. force:
    resume training / the drafter even when the workdir holds checkpoints of another config."""
    t_start = time.perf_counter()
    if not config.eval.ckpt:  # the training's progress bar only when progress is wanted (a presentation setting)
        config = config.replace(train=dataclasses.replace(config.train,
                                                          progress_bar=bool(progress and config.train.progress_bar)))
    # Each section once, here; every stage takes the sections it reads (the trainer's as one RunConfig).
    trainer, task, ev, fc = config.trainer, config.task, config.eval, config.frontier
    check_inputs(ev, workdir)
    done = current_report(config, workdir)
    if done is not None:
        print(f"{workdir}: report.json is up to date with this config; nothing to do", file=sys.stderr)
        return done
    load = functools.partial(stages.load, data=trainer.data, verify=trainer.train.verify_checkpoints)
    model = load(ev.ckpt) if ev.ckpt else None  # a damaged checkpoint fails before any write
    os.makedirs(workdir, exist_ok=True)
    splits = stages.prepare_data(task, workdir, fmt=PromptFormat.of(trainer.data), need_val=fc.enabled)
    trained = None
    if model is None:
        trained = stages.train(trainer, splits, workdir, force=force)
        model = load(trained.ckpt)
    records = tasks.read_jsonl(splits.test, model.prompt_format)
    if any(m in ADAPTER_MODES for m in ev.modes):
        drafter = config.drafter
        model = stages.train_drafter(drafter, trainer, model, stages.drafter_data(drafter, task, splits, workdir),
                                     workdir, force=force)
    if "spec-model" in ev.modes:
        model = stages.train_draft_model(config.draft_model, trainer, config.drafter.lora, model, splits.train,
                                         workdir, force=force)
    t_frontier = time.perf_counter()
    val_records = tasks.read_jsonl(splits.val, model.prompt_format) if fc.enabled else []
    knobs, front = stages.choose_knobs(ev, fc, model, val_records, progress)
    t_test = time.perf_counter()
    results, predictions = stages.evaluate(ev, model, records, knobs, front, progress)
    t_speed = time.perf_counter()
    fastest = stages.choose_for_time(config.speed, ev, model, front, val_records, records)
    t_diag = time.perf_counter()
    diag = stages.diagnose(trainer.zarya, model, records, results, predictions)
    report = Report(
        provenance=provenance(), checkpoint=model.ckpt,
        model={"params": model.config.num_params(), **dataclasses.asdict(model.config)},
        train=trained.summary if trained else None, modes=results,
        targets=stages.targets(config.goals, results, predictions), frontier=front, diagnostics=diag,
        loss_curve=trained.loss_curve if trained else [], config=overrides.to_dict(config),
        timings={"frontier_s": t_test - t_frontier, "test_s": t_speed - t_test, "speed_s": t_diag - t_speed,
                 "diagnostics_s": time.perf_counter() - t_diag},
        wall_s=time.perf_counter() - t_start, speed=fastest)
    write_outputs(os.path.join(workdir, "eval"), results, predictions)
    if fastest is not None:
        fastest.save(os.path.join(workdir, "eval", "speed.json"))
    write_report(workdir, report)
    return report
