"""The research pipeline the quickstart and sweeps share: data → train → evaluate every mode → report.

Its configuration is one typed tree, `PipelineConfig`: the trainer's sections (`model`, `zarya`,
`optim`, `data`, `mesh`, `train`, see `zarya_jax.train.config`) plus `task` (the embedded task
generator, or your own files), `drafter` (Uno's LoRA drafter, trained only for `spec-lora`),
`train_init` (the embedding init scale) and `eval` (modes, budget, batch, answer extraction and per-mode
decoding knobs `eval.knobs.<mode>.<GenerationConfig field>`). `default_config()` holds the quickstart's
defaults, tuned for a 2-core CPU; `--set` on the quickstart and every key of a sweep file are dotted
keys of this tree, typed and checked by `zarya_jax.overrides`.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable

from zarya_jax import checkpoint, overrides
from zarya_jax import lora as lora_lib
from zarya_jax.config import ModelConfig, ZaryaConfig
from zarya_jax.data.pipeline import DataConfig
from zarya_jax.data.tokenizer import load_tokenizer
from zarya_jax.eval import tasks
from zarya_jax.eval.evaluate import MODE_LABELS, EvalConfig, Knobs, ModeKnobs, evaluate, summary_markdown, write_outputs
from zarya_jax.files import atomic_write, atomic_write_json
from zarya_jax.model import init_params
from zarya_jax.train.config import RunConfig, TrainConfig
from zarya_jax.train import drafter as drafter_run
from zarya_jax.train.loop import train
from zarya_jax.train.metrics import read_metrics
from zarya_jax.train.optim import OptimConfig

from .plots import report_plot

DEFAULT_MODES = ("ar", "mdm", "slotted", "spec-self")


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """The embedded arithmetic task (`zarya_jax.eval.tasks`), or your own `train_file` + `test_file`."""

    difficulty: int = 1
    num_train: int = 50000
    num_test: int = 200
    seed: int = 0
    train_file: str = ""
    test_file: str = ""


@dataclasses.dataclass(frozen=True)
class DrafterSection:
    """Uno's LoRA drafter, trained on the frozen checkpoint only when `eval.modes` has spec-lora."""

    steps: int = 300
    rank: int = 16
    alpha: float = 32.0
    lr: float = 2e-3
    batch_size: int = 16
    block_sizes: tuple[int, ...] = (2, 4, 8)


@dataclasses.dataclass(frozen=True)
class TrainInit:
    """`embed_std`: the random init's embedding scale (Hugging Face's Qwen3 `initializer_range` 0.02;
    0 keeps the library's unit-variance embedding)."""

    embed_std: float = 0.02


@dataclasses.dataclass(frozen=True)
class PipelineConfig(RunConfig):
    """The trainer's sections plus the task, the drafter, the init and the evaluation."""

    task: TaskSection = TaskSection()
    drafter: DrafterSection = DrafterSection()
    train_init: TrainInit = TrainInit()
    eval: EvalConfig = EvalConfig()


def command(body: Callable[[], int], errors: tuple[type[Exception], ...], resume_hint: str = "") -> int:
    """Runs a command's body and returns its exit status: an expected input error prints one `error:`
    line (status 2), a signal that stopped training one `interrupted:` line (status 130)."""
    try:
        return body()
    except errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"interrupted: {e}{resume_hint}", file=sys.stderr)
        return 130


def default_config() -> PipelineConfig:
    """The quickstart defaults, tuned for a 2-core CPU (see the README for measured results)."""
    return PipelineConfig(
        model=ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                          num_kv_heads=2, head_dim=32, max_position_embeddings=512, mask_token_id=259,
                          eos_token_id=258, pad_token_id=256),
        zarya=ZaryaConfig(slotted_training=True, slot_size_set=(2, 4, 8), slot_step_borders=(0.1, 0.4, 1.0)),
        optim=OptimConfig(lr=2e-3, warmup_steps=100, schedule="cosine", min_lr_ratio=0.05, weight_decay=0.01),
        data=DataConfig(tokenizer="byte", max_length=88, batch_size=32, pack=False, seed=0),
        train=TrainConfig(steps=600, log_every=25, eval_every=0, save_every=200, keep=1, keep_best=0,
                          async_checkpointing=False),
        eval=EvalConfig(modes=DEFAULT_MODES, max_new_tokens=32, batch_size=25, limit=0, answer="final",
                        answer_regex="", seed=0, ckpt="",
                        knobs=ModeKnobs(mdm=Knobs(steps=0, alpha0=0.25),
                                        slotted=Knobs(slot_size=4, serial_num_blocks=1, slot_threshold=0.9,
                                                      token_threshold=0.9),
                                        spec_self=Knobs(draft_length=8), spec_lora=Knobs(draft_length=8))))


def run_config(config: PipelineConfig, train_file: str, test_file: str) -> RunConfig:
    """The trainer's `RunConfig` with the data files filled in (the test split is the eval set only
    when the run evaluates during training)."""
    data = dataclasses.replace(config.data, train=(train_file,), eval=(test_file,) if config.train.eval_every else ())
    return config.run_config().replace(data=data)


def prepare_data(config: PipelineConfig, workdir: str) -> tuple[str, str]:
    """The task's train/test files (generated deterministically), or the user's files if given."""
    task = config.task
    if task.train_file or task.test_file:
        if not (task.train_file and task.test_file):
            raise ValueError("task.train_file and task.test_file must be given together")
        for path in (task.train_file, task.test_file):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"data file {path!r} does not exist")
        return task.train_file, task.test_file
    return tasks.write_splits(os.path.join(workdir, "data"), task.num_train, task.num_test, task.seed,
                              task.difficulty)


def loss_curve(train_dir: str) -> list[tuple[int, float]]:
    try:
        rows = read_metrics(train_dir)
    except FileNotFoundError:
        return []
    return [(int(r["step"]), float(r["loss"])) for r in rows if "loss" in r and "step" in r]


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by a signal after saving a checkpoint (not a failure of the run)."""


def small_init(model_config: ModelConfig, embed_std: float):
    """Random init with the embedding scaled to std `embed_std` (Hugging Face's Qwen3
    `initializer_range` 0.02): the library's unit-variance embedding, tied to the head, starts from
    logits so large that the first ~50 steps only shrink them, a real cost on a CPU budget."""

    def init(key):
        params = init_params(model_config, key)
        return {**params, "embed": params["embed"] * embed_std}

    return init if embed_std > 0 else None


def train_model(config: PipelineConfig, train_file: str, test_file: str, workdir: str, hooks=()) -> dict:
    """Trains (resuming if `workdir/train` holds a checkpoint of the same run) and returns the summary."""
    run = run_config(config, train_file, test_file)
    t0 = time.perf_counter()
    summary = train(run, os.path.join(workdir, "train"), init_params=small_init(run.model, config.train_init.embed_std),
                    hooks=hooks)
    summary["wall_s"] = time.perf_counter() - t0
    if summary["status"] != "completed":
        # A signal (SIGTERM/SIGINT) stopped training after a checkpoint: stop everything (a sweep
        # must not carry on with its next run), and let a rerun resume.
        raise TrainingInterrupted(f"training stopped by signal {summary.get('signal')} at step {summary['step']}; "
                                  "rerun the same command to resume")
    return summary


def train_lora_drafter(config: PipelineConfig, ckpt: str, train_file: str, workdir: str, progress: bool = True):
    """Trains Uno's gated-LoRA drafter on the frozen checkpoint (SPEC §7); returns (lora_params, LoraConfig)."""
    d = config.drafter
    cfg = drafter_run.load_config("tiny", {
        "lora.rank": d.rank, "lora.alpha": d.alpha, "drafter.block_sizes": d.block_sizes, "data.train": [train_file],
        "data.max_length": config.data.max_length, "data.batch_size": d.batch_size, "train.steps": d.steps,
        "optim.lr": d.lr, "optim.warmup_steps": 20, "train.save_every": 0, "train.eval_every": 0,
        "train.progress_bar": progress, "train.async_checkpointing": False})
    out = os.path.join(workdir, "drafter")
    summary = drafter_run.train_drafter(cfg, ckpt, out)
    if summary["status"] != "completed":
        raise TrainingInterrupted(f"drafter training stopped by signal {summary.get('signal')}; rerun to resume")
    return lora_lib.load(os.path.join(out, "adapter"))


def run_pipeline(config: PipelineConfig, workdir: str, progress: bool = True) -> dict:
    """Data → train (unless eval.ckpt) → evaluate every mode → report files. Returns the report dict."""
    t_start = time.perf_counter()
    ev = config.eval
    ckpt = ev.ckpt
    if ckpt and not os.path.exists(ckpt):
        raise FileNotFoundError(f"checkpoint {ckpt!r} does not exist")
    os.makedirs(workdir, exist_ok=True)
    train_file, test_file = prepare_data(config, workdir)
    train_summary = None
    if not ckpt:
        config = config.replace(train=dataclasses.replace(config.train,
                                                          progress_bar=bool(progress and config.train.progress_bar)))
        train_summary = train_model(config, train_file, test_file, workdir)
        ckpt = train_summary["final_params"]
    params, model_config = checkpoint.load(ckpt)
    tokenizer = load_tokenizer(checkpoint.tokenizer_dir(ckpt) or config.data.tokenizer)
    records = tasks.read_jsonl(test_file)
    if ev.limit:
        records = records[: ev.limit]
    lora_params = lora_cfg = None
    if "spec-lora" in ev.modes:
        lora_params, lora_cfg = train_lora_drafter(config, ckpt, train_file, workdir, progress)
    summary, predictions = evaluate(params, model_config, tokenizer, records, list(ev.modes),
                                    max_new_tokens=ev.max_new_tokens, batch_size=ev.batch_size,
                                    knobs=ev.knobs.as_dict(), method=ev.answer, pattern=ev.answer_regex or None,
                                    seed=ev.seed, progress=progress, lora_params=lora_params, lora=lora_cfg)
    write_outputs(os.path.join(workdir, "eval"), summary, predictions)
    report = {
        "checkpoint": os.path.abspath(ckpt),
        "model": {"params": model_config.num_params(), **dataclasses.asdict(model_config)},
        "train": None if train_summary is None else {
            k: train_summary.get(k) for k in ("status", "step", "loss", "eval_loss", "tokens_per_s", "mfu", "wall_s")},
        "modes": summary,
        "targets": targets(summary),
        "loss_curve": loss_curve(os.path.join(workdir, "train")) if train_summary else [],
        "config": overrides.to_dict(config),
        "wall_s": time.perf_counter() - t_start,
    }
    write_report(workdir, report)
    return report


def targets(summary: list[dict]) -> list[dict]:
    """The quickstart's goals, each with the measured value and whether it is met."""
    by = {r["mode"]: r for r in summary}
    out = []
    ar = by.get("ar")
    if ar:
        out.append({"target": "AR exact match ≥ 90%", "value": ar["accuracy"], "met": ar["accuracy"] >= 0.9})
    for mode in ("slotted", "spec-self"):
        r = by.get(mode)
        if r and ar:
            out.append({"target": f"{MODE_LABELS[mode]}: ≥ 2.5 tokens per forward",
                        "value": r["tokens_per_forward"], "met": r["tokens_per_forward"] >= 2.5})
            out.append({"target": f"{MODE_LABELS[mode]}: accuracy within 2 points of AR",
                        "value": r["accuracy"] - ar["accuracy"], "met": abs(r["accuracy"] - ar["accuracy"]) <= 0.02})
    for mode in ("spec-self", "spec-lora"):
        r = by.get(mode)
        if r and ar:
            out.append({"target": f"{MODE_LABELS[mode]}: accuracy identical to AR (lossless)",
                        "value": r["accuracy"] - ar["accuracy"], "met": r["accuracy"] == ar["accuracy"]})
            out.append({"target": f"{MODE_LABELS[mode]}: wall-clock speed-up over AR",
                        "value": r["speedup_vs_ar"], "met": bool(r["speedup_vs_ar"] and r["speedup_vs_ar"] > 1)})
    return out


def report_markdown(report: dict) -> str:
    lines = ["# Zarya quickstart report", ""]
    m = report["model"]
    lines.append(f"Model: {m['params'] / 1e6:.2f}M parameters ({m['num_layers']} layers, hidden {m['hidden_size']}), "
                 f"checkpoint `{report['checkpoint']}`.")
    if report["train"]:
        t = report["train"]
        tps = f"{t['tokens_per_s']:.0f}" if t.get("tokens_per_s") else "–"
        lines.append(f"Training: {t['step']} steps, final loss {t['loss']:.4f}, {t['wall_s']:.0f} s, "
                     f"{tps} tokens/s.")
    modes = report["modes"]
    lines += ["", f"Held-out examples: {modes[0]['examples'] if modes else 0}, batch size "
              f"{modes[0]['batch_size'] if modes else '–'}, greedy decoding.", "", summary_markdown(modes)]
    if report["targets"]:
        lines += ["| target | measured | met |", "|---|---|---|"]
        for t in report["targets"]:
            v = t["value"]
            v = "–" if v is None else f"{v:.3g}"
            lines.append(f"| {t['target']} | {v} | {'yes' if t['met'] else 'no'} |")
    lines += ["", f"Total wall time: {report['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


def write_report(workdir: str, report: dict) -> None:
    atomic_write_json(os.path.join(workdir, "report.json"), report, default=str)
    atomic_write(os.path.join(workdir, "report.md"), report_markdown(report))
    report_plot(report["modes"], report["loss_curve"], os.path.join(workdir, "report.png"), "Zarya quickstart")
