"""`calibrate(workdir, speed) -> SpeedChoice`: an experiment's knobs chosen for time again, on the device
in use.

What a frontier point buys (its accuracy, its tokens per forward) belongs to the checkpoint; what it
costs in time belongs to the device (`zarya_jax.eval.speed`). A run trained and evaluated on one machine
is calibrated here for the device that will decode it: the workdir's `report.json` gives the validation
frontier and the experiment's config, its checkpoint and drafter give the model, its validation and
test splits the prompts. Nothing is trained, and no accuracy is measured again: the pass-cost curve is
measured on this device, AR and the lossless points predicted fastest race on validation, and each
choice races AR on test (`speed.choose`, `speed.time_on_test`).
"""
from __future__ import annotations

import dataclasses
import json
import os

from .. import overrides
from ..config import PromptFormat
from ..eval import speed as speed_lib
from ..eval import tasks
from ..eval.evaluate import ADAPTER_MODES
from ..inference import Inference
from . import stages
from .config import ExperimentConfig
from .results import Report


def read_report(workdir: str) -> Report:
    """The workdir's report; ValueError naming the file when it is missing or not a report."""
    path = os.path.join(workdir, "report.json")
    try:
        with open(path) as f:
            return Report.from_json(json.load(f))
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror}); calibrate a workdir that an experiment "
                         "finished (python -m experiments.quickstart --workdir DIR)") from None
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{path}: not an experiment's report ({e})") from None


def checkpoint_of(workdir: str, report: Report, ckpt: str | None = None) -> str:
    """The checkpoint the report evaluated: `ckpt` when given; else the recorded path, or the workdir's
    own `train/final` when the workdir has moved since (the recorded path no longer exists)."""
    if ckpt:
        found = ckpt
    elif os.path.isdir(report.checkpoint):
        found = report.checkpoint
    else:
        found = os.path.join(workdir, "train", "final")
    if not os.path.isdir(found):
        raise FileNotFoundError(f"checkpoint {found!r} (of {workdir}/report.json) does not exist: give the "
                                "checkpoint's directory (--ckpt)")
    return found


def model_of(workdir: str, config: ExperimentConfig, ckpt: str, verify: bool = True) -> Inference:
    """The experiment's model as its evaluation decoded it: the checkpoint, with the workdir's drafter
    adapter when a mode needs one."""
    model = stages.load(ckpt, config.trainer.data, verify=verify)
    if any(m in ADAPTER_MODES for m in config.eval.modes):
        model = model.with_adapter(os.path.join(workdir, "drafter", "adapter"), verify=verify)
    return model


POINTS = ("frontier", "chosen")


def calibrate(workdir: str, speed: speed_lib.SpeedConfig | None = None, *, points: str = "frontier",
              ckpt: str | None = None, verify: bool = True, progress: bool = False,
              report: Report | None = None) -> speed_lib.SpeedChoice:
    """Per batch size of `speed` (default: the experiment's `speed` section), the fastest lossless
    configuration on this device among AR and the workdir's lossless frontier points, timed against AR
    on test (module doc). points: "frontier" (every lossless point of the validation frontier, the
    `speed.confirm` predicted fastest timed) or "chosen" (the point the frontier chose per mode, every one
    timed: a handful of programs to compile, where a device compiles slowly). `ckpt`: the checkpoint's
    directory when the workdir no longer records it. progress: compiles and timed decodes on stderr.
    report: the workdir's report when the caller has read it already (`read_report`)."""
    if points not in POINTS:
        raise ValueError(f"points={points!r}: expected one of {POINTS}")
    report = report or read_report(workdir)
    if report.frontier is None:
        raise ValueError(f"{workdir}/report.json has no validation frontier (frontier.enabled=false): there are "
                         "no points to choose among")
    config = overrides.build(ExperimentConfig, report.config)
    sc = speed or config.speed
    candidates = report.frontier.points
    if points == "chosen":
        candidates = list(report.frontier.chosen.values())
        sc = dataclasses.replace(sc, confirm=max(sc.confirm, len(candidates)))
    model = model_of(workdir, config, checkpoint_of(workdir, report, ckpt), verify)
    splits = stages.prepare_data(config.task, workdir, fmt=PromptFormat.of(config.trainer.data), need_val=True)
    val, test = (tasks.read_jsonl(path, model.prompt_format) for path in (splits.val, splits.test))
    choice = speed_lib.choose(model, candidates, val, config.eval, sc, progress)
    return speed_lib.time_on_test(model, choice, test, config.eval, sc, progress)
