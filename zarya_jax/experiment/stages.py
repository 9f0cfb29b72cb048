"""The experiment's stages, each a function of its own section(s) returning a typed value:

    prepare_data(task, …)                -> Splits      the task's train / validation / test files
    load(ckpt, data, verify)             -> Inference   a checkpoint, rendered as it was trained
    train(trainer, splits, …)            -> Trained     the trainer's sections: a checkpoint and its summary
    drafter_data(drafter, task, …)       -> str         the drafter's training file (shifted or the task's)
    train_drafter(drafter, trainer, …)   -> Inference   Uno's LoRA drafter on the frozen checkpoint (spec-lora[-fused])
    train_draft_model(draft_model, trainer, lora, …) -> Inference   an independent draft model for it (spec-model)
    choose_knobs(eval, frontier, …)      -> (knobs, Frontier | None)   per mode, on the validation split
    evaluate(eval, …)                    -> [ModeResult], [Prediction]   the test split at the chosen knobs
    choose_for_time(speed, eval, …)      -> SpeedChoice | None   per batch size, the fastest lossless configuration
    diagnose(zarya, …)                   -> dict        why a mode loses accuracy
    targets(goals, …)                    -> [Target]    the goals, measured

`trainer` is the experiment's trainer sections as one `RunConfig` (`ExperimentConfig.trainer`): the
drafter and the draft model train with its data, mesh and train settings, under their own steps, batch,
objective and optimizer. `zarya_jax.experiment.plan` binds each to its sections; `zarya_jax.experiment.run`
runs them.
"""
from __future__ import annotations

import dataclasses
import os
import sys

from ..config import LoraConfig, PromptFormat
from ..data.pipeline import DataConfig
from ..eval import diagnose as diagnose_lib
from ..eval import evaluate as evaluate_lib
from ..eval import frontier as frontier_lib
from ..eval import speed as speed_lib
from ..eval import tasks
from ..eval.evaluate import MODE_LABELS, SPEC_MODES, EvalConfig
from ..eval.frontier import FrontierConfig
from ..eval.results import ModeResult, Prediction
from ..inference import Inference, load_for_inference
from ..train import draft_model as draft_model_run
from ..train import drafter as drafter_run
from ..train.config import RunConfig
from ..train.loop import train as train_loop
from ..train.metrics import read_metrics
from ..train.preemption import Interrupted
from .config import DraftModelRun, DrafterRun, GoalsSection, TaskDrafterRun, TaskSection
from .results import Frontier, Target, TrainSummary


class TrainingInterrupted(Interrupted):
    """Training was stopped by a signal after saving a checkpoint (not a failure of the run)."""


@dataclasses.dataclass(frozen=True)
class Splits:
    """The data files: `val` is None when there is no validation split."""

    train: str
    val: str | None
    test: str


@dataclasses.dataclass(frozen=True)
class Trained:
    """A finished training: its exported checkpoint, its summary and its loss curve [(step, loss)]."""

    ckpt: str
    summary: TrainSummary
    loss_curve: list


def prepare_data(task: TaskSection, workdir: str, *, fmt: PromptFormat = PromptFormat(),
                 need_val: bool = True) -> Splits:
    """The task's splits (generated deterministically into `workdir/data`), or the user's files, with
    the validation split held out from the end of the train file (records read with `fmt`) when one is
    needed and no `task.val_file` is given."""
    if task.train_file:
        for path in (task.train_file, task.test_file, task.val_file):
            if path and not os.path.isfile(path):
                raise FileNotFoundError(f"data file {path!r} does not exist")
        if task.val_file or not task.num_val or not need_val:
            return Splits(task.train_file, task.val_file or None, task.test_file)
        records = tasks.read_jsonl(task.train_file, fmt)
        if len(records) <= task.num_val:
            raise ValueError(f"task.train_file {task.train_file!r} has {len(records)} records: too few to hold out "
                             f"task.num_val={task.num_val} for validation (give task.val_file, or lower task.num_val)")
        out = os.path.join(workdir, "data")
        splits = Splits(os.path.join(out, "train.jsonl"), os.path.join(out, "val.jsonl"), task.test_file)
        tasks.write_jsonl(splits.val, records[-task.num_val:])
        tasks.write_jsonl(splits.train, records[:-task.num_val])
        return splits
    paths = tasks.write_splits(os.path.join(workdir, "data"), task.num_train, task.num_test, task.seed,
                               task.difficulty, task.num_val, task.name)
    return Splits(paths["train"], paths.get("val"), paths["test"])


def load(ckpt: str, data: DataConfig, verify: bool = True) -> Inference:
    """A checkpoint for decoding, rendered as it was trained (its recorded tokenizer and prompt format; the
    `data` section's as the fallback), reading the record fields this run's data files use."""
    return load_for_inference(ckpt, verify=verify, default_tokenizer=data.tokenizer,
                              format_overrides={"prompt_key": data.prompt_key, "answer_key": data.answer_key},
                              default_format=PromptFormat.of(data))


def run_config(trainer: RunConfig, splits: Splits) -> RunConfig:
    """The trainer's `RunConfig` with the data files filled in (the validation split is the trainer's
    eval set only when the run evaluates during training)."""
    data = dataclasses.replace(trainer.data, train=(splits.train,),
                               eval=(splits.val,) if trainer.train.eval_every else ())
    return trainer.replace(data=data)


def loss_curve(train_dir: str) -> list[tuple[int, float]]:
    try:
        rows = read_metrics(train_dir)
    except FileNotFoundError:
        return []
    return [(int(r["step"]), float(r["loss"])) for r in rows if "loss" in r and "step" in r]


def _completed(summary: dict, what: str) -> dict:
    """The loop's summary of a run that completed; `TrainingInterrupted` when a signal stopped it (a sweep
    must not carry on; a rerun resumes)."""
    if summary["status"] != "completed":
        at = f" at step {summary['step']}" if "step" in summary else ""
        raise TrainingInterrupted(f"{what} stopped by signal {summary.get('signal')}{at}; rerun the same command "
                                  "to resume", summary.get("signal"))
    return summary


def train(trainer: RunConfig, splits: Splits, workdir: str, *, hooks=(), force: bool = False) -> Trained:
    """Trains the trainer's sections into `workdir/train` (resuming a checkpoint of the same run, or any
    with `force`). The run's tracker name (`train.tracker_run`) defaults to the workdir's."""
    run = run_config(trainer, splits)
    if not run.train.tracker_run:
        run = run.replace(train=dataclasses.replace(run.train, tracker_run=os.path.basename(os.path.abspath(workdir))))
    train_dir = os.path.join(workdir, "train")
    summary = _completed(train_loop(run, train_dir, hooks=hooks, force=force), "training")
    return Trained(summary["final_params"], TrainSummary.of(summary), loss_curve(train_dir))


def side_run(trainer: RunConfig, base: Inference, train_file: str, **train) -> dict:
    """The trainer sections of a run trained beside the base checkpoint (the drafter, the draft model,
    `train.config.SideRunConfig`; its own section brings its steps, batch and optimizer): the trainer's model
    runtime, mesh, data and train settings, on `train_file`, with the base checkpoint's tokenizer and prompt
    format (it must read the ids the base reads), no evaluation or intermediate checkpoints, and the `train`
    fields given."""
    data = dataclasses.replace(trainer.data, train=(train_file,), eval=(), tokenizer=base.tokenizer_spec,
                               **dataclasses.asdict(base.prompt_format))
    run = dataclasses.replace(trainer.train, eval_every=0, save_every=0, init_from="", async_checkpointing=False,
                              **train)
    return {"model": trainer.model, "data": data, "mesh": trainer.mesh, "train": run}


def drafter_config(drafter: DrafterRun, trainer: RunConfig, base: Inference,
                   train_file: str) -> drafter_run.DrafterRunConfig:
    """The drafter's run: its `drafter` section (adapter, objective, DCD, optimizer, steps, batch) beside the
    base checkpoint (`side_run`), as `experiments.train_drafter` runs it."""
    return drafter_run.DrafterRunConfig(**side_run(trainer, base, train_file, export_final=False), drafter=drafter)


def drafter_data(drafter: TaskDrafterRun, task: TaskSection, splits: Splits, workdir: str) -> str:
    """The drafter's training file: the experiment's own, or with `drafter.task_difficulty` / `task_seed`
    the embedded task's shifted problems (written to `workdir/drafter_data/train.jsonl`, the held-out
    prompts excluded)."""
    if not drafter.shifted():
        return splits.train
    held = {r["prompt"] for path in (splits.test, splits.val) if path for r in tasks.read_jsonl(path)}
    records = tasks.generate(task.num_train, task.seed if drafter.task_seed is None else drafter.task_seed,
                             drafter.task_difficulty or task.difficulty, exclude=held, task=task.name)
    path = os.path.join(workdir, "drafter_data", "train.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tasks.write_jsonl(path, records)
    return path


def train_drafter(drafter: DrafterRun, trainer: RunConfig, base: Inference, train_file: str, workdir: str, *,
                  force: bool = False) -> Inference:
    """Trains Uno's gated-LoRA drafter on the frozen checkpoint (docs/algorithms.md §7) into `workdir/drafter`;
    returns `base` with the adapter."""
    out = os.path.join(workdir, "drafter")
    _completed(drafter_run.train_drafter(drafter_config(drafter, trainer, base, train_file), base.ckpt, out,
                                         force=force), "drafter training")
    return base.with_adapter(os.path.join(out, "adapter"), verify=trainer.train.verify_checkpoints)


def draft_model_config(draft_model: DraftModelRun, trainer: RunConfig, base: Inference,
                       train_file: str) -> draft_model_run.DraftModelRunConfig:
    """The draft model's run: its `draft_model` section (size, objective, optimizer, steps, batch) beside the
    base checkpoint (`side_run`), trained with the next-token trainer and exported, as
    `experiments.train_draft_model` runs it."""
    return draft_model_run.DraftModelRunConfig(**side_run(trainer, base, train_file, export_final=True),
                                               draft_model=draft_model)


def train_draft_model(draft_model: DraftModelRun, trainer: RunConfig, lora: LoraConfig, base: Inference,
                      train_file: str, workdir: str, *, force: bool = False) -> Inference:
    """Trains the independent draft model for the frozen checkpoint (docs/algorithms.md §7.6) into
    `workdir/draft_model`; returns `base` with it. `lora`: the drafter's adapter, what its size is relative to."""
    out = os.path.join(workdir, "draft_model")
    summary = _completed(draft_model_run.train_draft_model(
        draft_model_config(draft_model, trainer, base, train_file), base.ckpt, out, lora=lora, force=force),
        "draft model training")
    return base.with_draft_model(summary["final_params"], verify=trainer.train.verify_checkpoints)


def _bar(desc: str, total: int):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="pt", leave=False, file=sys.stderr)


def choose_knobs(ev: EvalConfig, fc: FrontierConfig, model: Inference, val_records: list[dict],
                 progress: bool = True) -> tuple[dict[str, dict], Frontier | None]:
    """Per mode, the decoding knobs to report on test: chosen on the validation frontier (returned too),
    or `eval.knobs` when the frontier is off."""
    if not fc.enabled:
        return {m: k for m, k in ev.knobs.as_dict().items() if m in ev.modes}, None
    points = frontier_lib.grid_points(fc, ev.modes, ev.max_new_tokens)
    bar = _bar("frontier (validation)", len(points)) if progress else None
    points = frontier_lib.sweep(model, val_records, points, ev,
                                progress=(lambda i, n: bar.update(1)) if bar else None)
    if bar:
        bar.close()
    chosen = frontier_lib.choose(points, fc.tolerance)
    front = Frontier(points=points, chosen=chosen, validation_examples=len(val_records))
    return {m: chosen[m].knobs for m in ev.modes}, front


def evaluate(ev: EvalConfig, model: Inference, records: list[dict], knobs: dict[str, dict],
             front: Frontier | None = None, progress: bool = True) -> tuple[list[ModeResult], list[Prediction]]:
    """Every mode of `ev` on the test records (the first `eval.limit`) at `knobs`; each result carries its
    knobs, described (and their validation accuracy when a frontier chose them). Also returns the
    per-example predictions."""
    results, predictions = evaluate_lib.evaluate(model, records, ev, knobs=knobs, progress=progress)
    return [dataclasses.replace(
        r, point=frontier_lib.describe(r.mode, r.knobs) if r.knobs else "",
        validation_accuracy=front.chosen[r.mode].accuracy if front is not None else None) for r in results], predictions


def choose_for_time(sc: speed_lib.SpeedConfig, ev: EvalConfig, model: Inference, front: Frontier | None,
                    val_records: list[dict], records: list[dict]) -> speed_lib.SpeedChoice | None:
    """Per batch size of `speed`, the fastest lossless configuration among AR and the frontier's lossless
    points, chosen on validation and timed against AR on test (`zarya_jax.eval.speed`); None when `speed`
    is off, or without the frontier or AR to choose from."""
    if not sc.enabled or front is None or "ar" not in ev.modes:
        return None
    choice = speed_lib.choose(model, front.points, val_records, ev, sc)
    return speed_lib.time_on_test(model, choice, records, ev, sc)


def diagnose(zarya, model: Inference, records: list[dict], results: list[ModeResult],
             predictions: list[Prediction]) -> dict:
    """`zarya_jax.eval.diagnose.analyse` at the training's slot sizes (`zarya.slot_size_set`) and mode B's."""
    slot_sizes = sorted(set(zarya.slot_size_set) | {r.knob("slot_size") for r in results if r.mode == "slotted"})
    return diagnose_lib.analyse(model, records, results, predictions, slot_sizes)


def targets(goals: GoalsSection, results: list[ModeResult], predictions: list[Prediction]) -> list[Target]:
    """The goals, each with the measured value (test split) and whether it is met."""
    by = {r.mode: r for r in results}
    out = []
    ar = by.get("ar")
    if ar:
        out.append(Target(f"AR exact match ≥ {100 * goals.ar_accuracy:g}% (stretch {100 * goals.ar_accuracy_stretch:g}%)",
                          ar.accuracy, ar.accuracy >= goals.ar_accuracy))
    r = by.get("slotted")
    if r and ar:
        out.append(Target(f"mode B (chosen on validation): ≥ {goals.slotted_tokens_per_forward:.1f} tokens per forward",
                          r.tokens_per_forward, r.tokens_per_forward >= goals.slotted_tokens_per_forward))
        out.append(Target(f"mode B: accuracy within {100 * goals.slotted_accuracy_gap:g} points of AR",
                          r.accuracy - ar.accuracy, r.accuracy >= ar.accuracy - goals.slotted_accuracy_gap))
    for mode in SPEC_MODES:
        r = by.get(mode)
        if r and ar:
            outs = {p.index: p.output_ids for p in predictions if p.mode == mode}
            same = all(outs.get(p.index) == p.output_ids for p in predictions if p.mode == "ar")
            out.append(Target(f"{MODE_LABELS[mode]}: outputs identical to AR token for token (lossless)",
                              r.accuracy - ar.accuracy, same and r.accuracy == ar.accuracy))
            # the independent draft model is a baseline: held to losslessness only
            goal = {"spec-self": goals.spec_self_tokens_per_forward,
                    "spec-lora": goals.spec_lora_tokens_per_forward}.get(mode)
            if goal is not None:
                out.append(Target(f"{MODE_LABELS[mode]}: ≥ {goal:.1f} tokens per forward", r.tokens_per_forward,
                                  r.tokens_per_forward >= goal))
            two_pass = by.get(mode.removesuffix("-fused")) if mode.endswith("-fused") else None
            if two_pass:  # one pass per cycle against two: the gain in tokens per forward, same drafter
                gain = {"spec-self-fused": goals.fused_self_gain, "spec-lora-fused": goals.fused_lora_gain}[mode]
                ratio = r.tokens_per_forward / max(two_pass.tokens_per_forward, 1e-9)
                out.append(Target(f"{MODE_LABELS[mode]}: ≥ {gain:.1f}× the tokens per forward of "
                                  f"{MODE_LABELS[two_pass.mode]}", ratio, ratio >= gain))
    return out


def calibrate_steps(trainer: RunConfig, task: TaskSection, workdir: str, minutes: float, *,
                    need_val: bool = True) -> int:
    """Training steps of the trainer's sections that fit `minutes` (> 0) on this machine, on the task's
    training split (`need_val`: as `prepare_data`'s): times a short throwaway run of the model (compile
    excluded) and divides. The curriculum and LR schedule need the total up front, hence the measurement."""
    import shutil
    import time

    from .. import overrides
    from ..train.hooks import OnStep

    splits = prepare_data(task, workdir, fmt=PromptFormat.of(trainer.data), need_val=need_val)
    probe = overrides.apply(trainer, {
        "train.steps": 12, "train.save_every": 0, "train.export_final": False, "train.progress_bar": False,
        "train.log_every": 0, "train.eval_every": 0, "zarya.slot_size_set": [trainer.zarya.slot_size_set[-1]],
        "zarya.slot_step_borders": [1.0]})
    times: list[float] = []
    scratch = os.path.join(workdir, "calibration")
    shutil.rmtree(scratch, ignore_errors=True)
    train_loop(run_config(probe, Splits(splits.train, None, "")), scratch,
               hooks=[OnStep(lambda event: times.append(time.perf_counter()))])
    shutil.rmtree(scratch, ignore_errors=True)
    per_step = (times[-1] - times[3]) / (len(times) - 4)
    return max(1, int(minutes * 60 / per_step))
