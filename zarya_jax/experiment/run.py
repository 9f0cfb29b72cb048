"""`run(config, workdir) -> Report`: the config's stages (`zarya_jax.experiment.plan`: data → train, unless
`eval.ckpt` → frontier on validation → the chosen points on test → the fastest lossless configuration per
batch size → diagnostics → targets), then the report files.

Reruns are safe. Every input is checked before any compute (the whole config when it is built, the
workdir writable, the checkpoint to evaluate). A workdir whose `report.json` was made by the same
config is up to date: the rerun changes nothing and returns that report. Otherwise training resumes (a
finished training takes no step and keeps its recorded numbers) and the evaluation runs again. The
report files are written only when everything is computed, `report.json` last, so a `report.json` is
always complete.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from .. import overrides
from ..eval.evaluate import EvalConfig, write_outputs
from ..files import check_writable_dir
from ..provenance import provenance
from .config import ExperimentConfig, comparable
from .plan import Made, describe, plan
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
    resume training / the drafter even when the workdir holds checkpoints of another config. The stages
    and what each reads: `zarya_jax.experiment.plan`; `report.timings` holds each stage's seconds."""
    t_start = time.perf_counter()
    if not config.eval.ckpt:  # the training's progress bar only when progress is wanted (a presentation setting)
        config = config.replace(train=dataclasses.replace(config.train,
                                                          progress_bar=bool(progress and config.train.progress_bar)))
    check_inputs(config.eval, workdir)
    done = current_report(config, workdir)
    if done is not None:
        print(f"{workdir}: report.json is up to date with this config; nothing to do", file=sys.stderr)
        return done
    stages = plan(config, workdir, progress=progress, force=force)
    if progress:
        print(f"{workdir}: {describe(stages)}", file=sys.stderr)
    made, timings = Made(), {}
    for stage in stages:
        t = time.perf_counter()
        made = dataclasses.replace(made, **stage.step(made))
        timings[f"{stage.name}_s"] = time.perf_counter() - t
    return finish(made, overrides.to_dict(config), workdir, timings, time.perf_counter() - t_start)


def finish(made: Made, config: dict, workdir: str, timings: dict, wall_s: float) -> Report:
    """The report of what the stages made, written into `workdir`: the predictions and results under
    `eval/`, the speed choice, and the report files (`report.json` last)."""
    model, trained = made.model, made.trained
    report = Report(
        provenance=provenance(), checkpoint=model.ckpt,
        model={"params": model.config.num_params(), **dataclasses.asdict(model.config)},
        train=trained.summary if trained else None, modes=list(made.results), targets=list(made.targets),
        frontier=made.frontier, diagnostics=made.diagnostics, loss_curve=trained.loss_curve if trained else [],
        config=config, timings=timings, wall_s=wall_s, speed=made.speed)
    write_outputs(os.path.join(workdir, "eval"), made.results, made.predictions)
    if made.speed is not None:
        made.speed.save(os.path.join(workdir, "eval", "speed.json"))
    write_report(workdir, report)
    return report
