"""`run(config, workdir) -> Report`: data → train (unless `eval.ckpt`) → frontier on validation → the
chosen points on test → diagnostics → report files (`zarya_jax.experiment.stages`).

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
from ..config import PromptFormat
from ..eval import tasks
from ..eval.evaluate import ADAPTER_MODES, write_outputs
from ..files import check_writable_dir
from ..inference import load_for_inference
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
    except (KeyError, TypeError):  # a report of another schema: made again
        return None


def check_inputs(config: ExperimentConfig, workdir: str) -> None:
    """What the config alone cannot check, before any compute: the checkpoint to evaluate, the workdir."""
    if config.eval.ckpt and not os.path.isdir(config.eval.ckpt):
        raise FileNotFoundError(f"checkpoint {config.eval.ckpt!r} does not exist or is not a directory")
    check_writable_dir(workdir, "workdir")


def run(config: ExperimentConfig, workdir: str, *, progress: bool = True, force: bool = False) -> Report:
    """Runs the experiment into `workdir` and returns its report; a workdir whose report this config
    already made is returned as it is (`current_report`), untouched. progress: progress bars. force:
    resume training / the drafter even when the workdir holds checkpoints of another config."""
    t_start = time.perf_counter()
    ev = config.eval
    check_inputs(config, workdir)
    done = current_report(config, workdir)
    if done is not None:
        print(f"{workdir}: report.json is up to date with this config; nothing to do", file=sys.stderr)
        return done

    def load(ckpt: str):
        # Rendered as the checkpoint was trained; the record fields are those of this run's data files.
        return load_for_inference(
            ckpt, verify=config.train.verify_checkpoints, default_tokenizer=config.data.tokenizer,
            format_overrides={"prompt_key": config.data.prompt_key, "answer_key": config.data.answer_key},
            default_format=PromptFormat.of(config.data))

    model = load(ev.ckpt) if ev.ckpt else None  # a damaged checkpoint fails before any write
    os.makedirs(workdir, exist_ok=True)
    splits = stages.prepare_data(config.task, workdir, fmt=PromptFormat.of(config.data),
                                 need_val=config.frontier.enabled)
    trained = None
    if model is None:
        config = config.replace(train=dataclasses.replace(config.train,
                                                          progress_bar=bool(progress and config.train.progress_bar)))
        trained = stages.train(config, splits, workdir, force=force)
        model = load(trained.ckpt)
    records = tasks.read_jsonl(splits.test, model.prompt_format)
    if ev.limit:
        records = records[: ev.limit]
    if any(m in ADAPTER_MODES for m in ev.modes):
        model = stages.train_drafter(config, model, stages.drafter_data(config, splits, workdir), workdir, force=force)
    if "spec-model" in ev.modes:
        model = stages.train_draft_model(config, model, splits.train, workdir, force=force)
    t_frontier = time.perf_counter()
    val_records = tasks.read_jsonl(splits.val, model.prompt_format) if config.frontier.enabled else []
    knobs, front = stages.choose_knobs(ev, config.frontier, model, val_records, progress)
    t_test = time.perf_counter()
    results, predictions = stages.evaluate(ev, model, records, knobs, front, progress)
    t_diag = time.perf_counter()
    diag = stages.diagnose(config.zarya, model, records, results, predictions)
    report = Report(
        provenance=provenance(), checkpoint=model.ckpt,
        model={"params": model.config.num_params(), **dataclasses.asdict(model.config)},
        train=trained.summary if trained else None, modes=results,
        targets=stages.targets(config.goals, results, predictions), frontier=front, diagnostics=diag,
        loss_curve=trained.loss_curve if trained else [], config=overrides.to_dict(config),
        timings={"frontier_s": t_test - t_frontier, "test_s": t_diag - t_test,
                 "diagnostics_s": time.perf_counter() - t_diag},
        wall_s=time.perf_counter() - t_start)
    write_outputs(os.path.join(workdir, "eval"), [r.to_json() for r in results], predictions)
    write_report(workdir, report)
    return report
