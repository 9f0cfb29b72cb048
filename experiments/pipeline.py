"""The research pipeline the quickstart and sweeps share: data → train → frontier on validation →
evaluate the chosen points on test → diagnose → report.

1. Data: the embedded task's train / validation / test splits (disjoint), or your own files.
2. Train (unless `eval.ckpt`): Zarya's hybrid objective, or the AR-only baseline (`train.objective=ar`).
3. Frontier (`zarya_jax.eval.frontier`, unless `frontier.enabled=false`): every decoding mode over a grid
   of its knobs on the validation split; per mode the knobs are chosen there, never on test.
4. Test: each mode at its chosen knobs (else `eval.knobs`), at the evaluation batch and at batch 1.
5. Diagnose (`zarya_jax.eval.diagnose`): teacher-forced accuracy of the AR and MDM heads by offset within
   a slot, and where each mode's outputs first go wrong; one sentence per mode that loses accuracy.
6. Report: `report.json` (every number, the frontier, the config and the code's provenance),
   `report.md`, `report.png` (the frontier against tokens per forward and tokens/s, the loss curve).

Its configuration is one typed tree, `PipelineConfig`: the trainer's sections (`model`, `zarya`,
`optim`, `data`, `mesh`, `train`, see `zarya_jax.train.config`) plus `task` (the embedded task
generator, or your own files), `drafter` (Uno's LoRA drafter, trained only for `spec-lora`), `eval`
(modes, budget, batch, answer extraction and per-mode decoding knobs
`eval.knobs.<mode>.<GenerationConfig field>`) and `frontier` (the grid and the choice rule).
`default_config()` holds the quickstart's defaults, tuned for a 2-core CPU; `--set` on the quickstart
and every key of a sweep file are dotted keys of this tree, typed and checked by `zarya_jax.overrides`.

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

from zarya_jax import checkpoint, overrides
from zarya_jax import lora as lora_lib
from zarya_jax.config import ModelConfig, PromptFormat, ZaryaConfig
from zarya_jax.data.pipeline import DataConfig
from zarya_jax.data.tokenizer import load_tokenizer
from zarya_jax.eval import diagnose, frontier, tasks
from zarya_jax.eval.evaluate import (MODE_LABELS, EvalConfig, Knobs, ModeKnobs, evaluate, prompt_format_for,
                                     summary_markdown, write_outputs)
from zarya_jax.eval.frontier import FrontierConfig
from zarya_jax.files import atomic_write, atomic_write_json, check_writable_dir
from zarya_jax.provenance import provenance
from zarya_jax.train.config import RunConfig, TrainConfig
from zarya_jax.train import drafter as drafter_run
from zarya_jax.train.loop import train
from zarya_jax.train.metrics import read_metrics
from zarya_jax.train.optim import OptimConfig
from zarya_jax.train.preemption import Interrupted

from .plots import frontier_plot

DEFAULT_MODES = ("ar", "mdm", "slotted", "spec-self")


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """The embedded arithmetic task (`zarya_jax.eval.tasks`), or your own `train_file` + `test_file` (and
    `val_file`; without it the last `num_val` records of `train_file` are held out for validation)."""

    difficulty: int = 1
    num_train: int = 50000
    num_test: int = 200
    num_val: int = 100
    seed: int = 0
    train_file: str = ""
    test_file: str = ""
    val_file: str = ""

    def __post_init__(self):
        tasks.task_config(self.difficulty)
        for name in ("num_train", "num_test", "num_val"):
            value = getattr(self, name)
            if not 0 <= value <= tasks.MAX_PROBLEMS:
                raise ValueError(f"task.{name}={value}: expected 0 … {tasks.MAX_PROBLEMS}")


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
class PipelineConfig(RunConfig):
    """The trainer's sections plus the task, the drafter, the evaluation and the frontier."""

    task: TaskSection = TaskSection()
    drafter: DrafterSection = DrafterSection()
    eval: EvalConfig = EvalConfig()
    frontier: FrontierConfig = FrontierConfig()


def default_config() -> PipelineConfig:
    """The quickstart defaults, tuned for a 2-core CPU (see the README for measured results): a 0.82M
    Qwen3 on the byte-level task, 2500 steps of batch 32 with the slot curriculum 2 → 4 → 8 and λ = 0.3
    (more weight on the AR rows, which also verify every parallel mode's tokens)."""
    return PipelineConfig(
        model=ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                          num_kv_heads=2, head_dim=32, max_position_embeddings=512, mask_token_id=259,
                          eos_token_id=258, pad_token_id=256),
        zarya=ZaryaConfig(slotted_training=True, slot_size_set=(2, 4, 8), slot_step_borders=(0.1, 0.4, 1.0),
                          diffusion_loss_proportion=0.3),
        optim=OptimConfig(lr=2e-3, warmup_steps=100, schedule="cosine", min_lr_ratio=0.05, weight_decay=0.01),
        data=DataConfig(tokenizer="byte", max_length=88, batch_size=32, pack=False, seed=0),
        train=TrainConfig(steps=2500, log_every=25, eval_every=0, save_every=500, keep=1, keep_best=0,
                          async_checkpointing=False),
        eval=EvalConfig(modes=DEFAULT_MODES, max_new_tokens=32, batch_size=25, limit=0, answer="final",
                        answer_regex="", seed=0, ckpt="", batch1_examples=40,
                        knobs=ModeKnobs(mdm=Knobs(steps=8, alpha0=0.5),
                                        slotted=Knobs(slot_size=8, serial_num_blocks=4, slot_threshold=0.9,
                                                      token_threshold=0.9, ar_infill=True, ar_first_token=True),
                                        spec_self=Knobs(draft_length=8), spec_lora=Knobs(draft_length=8))),
        frontier=FrontierConfig())


def run_config(config: PipelineConfig, train_file: str, eval_file: str) -> RunConfig:
    """The trainer's `RunConfig` with the data files filled in (`eval_file`, the validation split, is
    the trainer's eval set only when the run evaluates during training)."""
    data = dataclasses.replace(config.data, train=(train_file,), eval=(eval_file,) if config.train.eval_every else ())
    return config.run_config().replace(data=data)


def prepare_data(config: PipelineConfig, workdir: str) -> dict[str, str]:
    """{'train', 'val', 'test'} file paths: the task's splits (generated deterministically), or the
    user's files, with the validation split held out from the end of the train file when the frontier
    needs one and no `task.val_file` is given; 'val' is None when there is none."""
    task = config.task
    if task.train_file or task.test_file:
        if not (task.train_file and task.test_file):
            raise ValueError("task.train_file and task.test_file must be given together")
        for path in (task.train_file, task.test_file, task.val_file):
            if path and not os.path.isfile(path):
                raise FileNotFoundError(f"data file {path!r} does not exist")
        if task.val_file or not task.num_val or not config.frontier.enabled:
            return {"train": task.train_file, "val": task.val_file or None, "test": task.test_file}
        records = tasks.read_jsonl(task.train_file, PromptFormat.of(config.data))
        if len(records) <= task.num_val:
            raise ValueError(f"task.train_file {task.train_file!r} has {len(records)} records: too few to hold out "
                             f"task.num_val={task.num_val} for validation (give task.val_file, or lower task.num_val)")
        out = os.path.join(workdir, "data")
        paths = {"train": os.path.join(out, "train.jsonl"), "val": os.path.join(out, "val.jsonl"),
                 "test": task.test_file}
        tasks.write_jsonl(paths["val"], records[-task.num_val:])
        tasks.write_jsonl(paths["train"], records[:-task.num_val])
        return paths
    paths = tasks.write_splits(os.path.join(workdir, "data"), task.num_train, task.num_test, task.seed,
                               task.difficulty, task.num_val)
    return {"val": None, **paths}


def loss_curve(train_dir: str) -> list[tuple[int, float]]:
    try:
        rows = read_metrics(train_dir)
    except FileNotFoundError:
        return []
    return [(int(r["step"]), float(r["loss"])) for r in rows if "loss" in r and "step" in r]


class TrainingInterrupted(Interrupted):
    """Training was stopped by a signal after saving a checkpoint (not a failure of the run)."""


def train_model(config: PipelineConfig, train_file: str, eval_file: str, workdir: str, hooks=(),
                force: bool = False) -> dict:
    """Trains (resuming if `workdir/train` holds a checkpoint of the same run, or any with `force`) and
    returns the summary. The run's tracker name (`train.tracker_run`) defaults to the workdir's name."""
    run = run_config(config, train_file, eval_file)
    if not run.train.tracker_run:
        run = run.replace(train=dataclasses.replace(run.train, tracker_run=os.path.basename(os.path.abspath(workdir))))
    summary = train(run, os.path.join(workdir, "train"), hooks=hooks, force=force)
    if summary["status"] != "completed":
        # A signal (SIGTERM/SIGINT) stopped training after a checkpoint: stop everything (a sweep
        # must not carry on with its next run), and let a rerun resume.
        raise TrainingInterrupted(f"training stopped by signal {summary.get('signal')} at step {summary['step']}; "
                                  "rerun the same command to resume", summary.get("signal"))
    return summary


def train_lora_drafter(config: PipelineConfig, ckpt: str, train_file: str, workdir: str, progress: bool = True,
                       fmt: PromptFormat = PromptFormat(), force: bool = False):
    """Trains Uno's gated-LoRA drafter on the frozen checkpoint (SPEC §7), its data rendered with `fmt`;
    returns (lora_params, LoraConfig)."""
    d = config.drafter
    cfg = drafter_run.load_config("tiny", {**{f"data.{k}": v for k, v in dataclasses.asdict(fmt).items()},
        "lora.rank": d.rank, "lora.alpha": d.alpha, "drafter.block_sizes": d.block_sizes, "data.train": [train_file],
        "data.max_length": config.data.max_length, "data.batch_size": d.batch_size, "train.steps": d.steps,
        "optim.lr": d.lr, "optim.warmup_steps": 20, "train.save_every": 0, "train.eval_every": 0,
        "train.progress_bar": progress, "train.async_checkpointing": False,
        "train.verify_checkpoints": config.train.verify_checkpoints})
    out = os.path.join(workdir, "drafter")
    summary = drafter_run.train_drafter(cfg, ckpt, out, force=force)
    if summary["status"] != "completed":
        raise TrainingInterrupted(f"drafter training stopped by signal {summary.get('signal')}; rerun to resume",
                                  summary.get("signal"))
    return lora_lib.load(os.path.join(out, "adapter"), verify=config.train.verify_checkpoints)


def choose_knobs(config: PipelineConfig, params, model_config, tokenizer, val_records, lora_params, lora_cfg,
                 progress: bool, fmt: PromptFormat = PromptFormat()) -> tuple[dict[str, dict], dict | None]:
    """Per mode, the decoding knobs to report on test: chosen on the validation frontier (returned as
    {'points', 'chosen'}), or `eval.knobs` when the frontier is off."""
    ev, fc = config.eval, config.frontier
    fixed = {m: k for m, k in ev.knobs.as_dict().items() if m in ev.modes}
    if not fc.enabled:
        return fixed, None
    points = frontier.grid_points(fc, ev.modes, ev.max_new_tokens)
    bar = _bar("frontier (validation)", len(points)) if progress else None
    rows = frontier.sweep(params, model_config, tokenizer, val_records, points, max_new_tokens=ev.max_new_tokens,
                          batch_size=ev.batch_size, method=ev.answer, pattern=ev.answer_regex or None,
                          seed=ev.seed, lora_params=lora_params, lora=lora_cfg,
                          progress=(lambda i, n: bar.update(1)) if bar else None, prompt_format=fmt)
    if bar:
        bar.close()
    chosen = frontier.choose(rows, fc.tolerance)
    return {m: chosen[m]["knobs"] for m in ev.modes}, {"points": rows, "chosen": chosen,
                                                          "validation_examples": len(val_records)}


def _bar(desc: str, total: int):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="pt", leave=False, file=sys.stderr)


# Settings that change how a run is shown or checked, not what it computes.
_PRESENTATION = {"train": ("progress_bar", "verify_checkpoints")}


def comparable(config_dict: dict) -> dict:
    """A config as JSON (`overrides.to_dict`), without the settings that do not change the results."""
    out = json.loads(json.dumps(config_dict))
    for section, names in _PRESENTATION.items():
        for name in names:
            out.get(section, {}).pop(name, None)
    return out


def current_report(config: PipelineConfig, workdir: str) -> dict | None:
    """The workdir's report when it is complete and was made by this same config (else None)."""
    path = os.path.join(workdir, "report.json")
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or not isinstance(report.get("config"), dict):
        return None
    return report if comparable(report["config"]) == comparable(overrides.to_dict(config)) else None


def check_inputs(config: PipelineConfig, workdir: str) -> None:
    """What the config alone cannot check, before any compute: the checkpoint to evaluate, the
    validation split the frontier needs, the workdir."""
    if config.eval.ckpt and not os.path.isdir(config.eval.ckpt):
        raise FileNotFoundError(f"checkpoint {config.eval.ckpt!r} does not exist or is not a directory")
    if config.frontier.enabled and not (config.task.num_val or config.task.val_file):
        raise ValueError("the frontier chooses decoding knobs on a validation split: set task.num_val ≥ 1 (or "
                         "task.val_file), or frontier.enabled=false to use eval.knobs")
    check_writable_dir(workdir, "workdir")


def run_pipeline(config: PipelineConfig, workdir: str, progress: bool = True, force: bool = False) -> dict:
    """Data → train (unless eval.ckpt) → frontier on validation → chosen points on test → diagnostics →
    report files. Returns the report dict; a workdir whose report this config already made is returned
    as it is (`current_report`), untouched. force: resume training / the drafter even when the workdir
    holds checkpoints of another config."""
    t_start = time.perf_counter()
    ev = config.eval
    ckpt = ev.ckpt
    check_inputs(config, workdir)
    done = current_report(config, workdir)
    if done is not None:
        print(f"{workdir}: report.json is up to date with this config; nothing to do", file=sys.stderr)
        return done
    verify = config.train.verify_checkpoints
    loaded = checkpoint.load(ckpt, verify=verify) if ckpt else None  # a damaged checkpoint fails before any write
    os.makedirs(workdir, exist_ok=True)
    files = prepare_data(config, workdir)
    train_summary = None
    if not ckpt:
        config = config.replace(train=dataclasses.replace(config.train,
                                                          progress_bar=bool(progress and config.train.progress_bar)))
        train_summary = train_model(config, files["train"], files["val"], workdir, force=force)
        ckpt = train_summary["final_params"]
    params, model_config = loaded or checkpoint.load(ckpt, verify=verify)
    tokenizer = load_tokenizer(checkpoint.tokenizer_dir(ckpt) or config.data.tokenizer)
    # Rendered as the checkpoint was trained; the record fields are those of this run's data files.
    fmt = prompt_format_for(ckpt, {"prompt_key": config.data.prompt_key, "answer_key": config.data.answer_key},
                            PromptFormat.of(config.data))
    records = tasks.read_jsonl(files["test"], fmt)
    if ev.limit:
        records = records[: ev.limit]
    lora_params = lora_cfg = None
    if "spec-lora" in ev.modes:
        lora_params, lora_cfg = train_lora_drafter(config, ckpt, files["train"], workdir, progress, fmt, force)
    t_frontier = time.perf_counter()
    val_records = tasks.read_jsonl(files["val"], fmt) if config.frontier.enabled else []
    knobs, front = choose_knobs(config, params, model_config, tokenizer, val_records, lora_params, lora_cfg,
                                progress, fmt)
    t_test = time.perf_counter()
    summary, predictions = evaluate(params, model_config, tokenizer, records, list(ev.modes),
                                    max_new_tokens=ev.max_new_tokens, batch_size=ev.batch_size, knobs=knobs,
                                    method=ev.answer, pattern=ev.answer_regex or None, seed=ev.seed,
                                    progress=progress, lora_params=lora_params, lora=lora_cfg,
                                    batch1_examples=ev.batch1_examples, prompt_format=fmt)
    for row in summary:
        row["knobs"] = knobs.get(row["mode"], {})
        row["point"] = frontier.describe(row["mode"], row["knobs"]) if row["knobs"] else ""
    if front is not None:
        for row in summary:
            row["validation_accuracy"] = front["chosen"][row["mode"]]["accuracy"]
    t_diag = time.perf_counter()
    slot_sizes = sorted(set(config.zarya.slot_size_set) | {r["generation_config"]["slot_size"] for r in summary
                                                           if r["mode"] == "slotted"})
    diag = diagnose.analyse(params, model_config, tokenizer, records, summary, predictions, slot_sizes, fmt)
    report = {
        "provenance": provenance(),
        "checkpoint": os.path.abspath(ckpt),
        "model": {"params": model_config.num_params(), **dataclasses.asdict(model_config)},
        "train": None if train_summary is None else {
            k: train_summary.get(k) for k in ("status", "step", "loss", "eval_loss", "tokens_per_s", "mfu", "wall_s")},
        "modes": summary,
        "targets": targets(summary, predictions),
        "frontier": front,
        "diagnostics": diag,
        "loss_curve": loss_curve(os.path.join(workdir, "train")) if train_summary else [],
        "config": overrides.to_dict(config),
        "timings": {"frontier_s": t_test - t_frontier, "test_s": t_diag - t_test,
                    "diagnostics_s": time.perf_counter() - t_diag},
        "wall_s": time.perf_counter() - t_start,
    }
    write_outputs(os.path.join(workdir, "eval"), summary, predictions)
    write_report(workdir, report)
    return report


def targets(summary: list[dict], predictions: list[dict]) -> list[dict]:
    """The quickstart's goals, each with the measured value (test split) and whether it is met."""
    by = {r["mode"]: r for r in summary}
    out = []
    ar = by.get("ar")
    if ar:
        out.append({"target": "AR exact match ≥ 80% (stretch 90%)", "value": ar["accuracy"],
                    "met": ar["accuracy"] >= 0.8})
    r = by.get("slotted")
    if r and ar:
        out.append({"target": "mode B (chosen on validation): ≥ 2.0 tokens per forward",
                    "value": r["tokens_per_forward"], "met": r["tokens_per_forward"] >= 2.0})
        out.append({"target": "mode B: accuracy within 3 points of AR", "value": r["accuracy"] - ar["accuracy"],
                    "met": r["accuracy"] >= ar["accuracy"] - 0.03})
    for mode in ("spec-self", "spec-lora"):
        r = by.get(mode)
        if r and ar:
            outs = {p["index"]: p["output_ids"] for p in predictions if p["mode"] == mode}
            same = all(outs.get(p["index"]) == p["output_ids"] for p in predictions if p["mode"] == "ar")
            out.append({"target": f"{MODE_LABELS[mode]}: outputs identical to AR token for token (lossless)",
                        "value": r["accuracy"] - ar["accuracy"], "met": same and r["accuracy"] == ar["accuracy"]})
            if mode == "spec-self":
                out.append({"target": f"{MODE_LABELS[mode]}: ≥ 2.5 tokens per forward",
                            "value": r["tokens_per_forward"], "met": r["tokens_per_forward"] >= 2.5})
    return out


def _pct(x):
    return "–" if x is None else f"{100 * x:.1f}%"


def report_markdown(report: dict) -> str:
    lines = ["# Zarya quickstart report", ""]
    m = report["model"]
    prov = report.get("provenance") or {}
    commit = (prov.get("commit") or "unknown")[:12] + (" (uncommitted changes)" if prov.get("dirty") else "")
    lines.append(f"Code: commit {commit}; {prov.get('devices', '')}.")
    lines.append(f"Model: {m['params'] / 1e6:.2f}M parameters ({m['num_layers']} layers, hidden {m['hidden_size']}), "
                 f"checkpoint `{report['checkpoint']}`.")
    if report["train"]:
        t = report["train"]
        tps = f"{t['tokens_per_s']:.0f}" if t.get("tokens_per_s") else "–"
        loss = f"{t['loss']:.4f}" if t.get("loss") is not None else "–"
        wall = f"{t['wall_s']:.0f} s" if t.get("wall_s") is not None else "– s"
        lines.append(f"Training: {t['step']} steps, final loss {loss}, {wall}, {tps} tokens/s.")
    modes = report["modes"]
    front = report.get("frontier")
    tol = report["config"]["frontier"]["tolerance"]
    how = (f"knobs chosen per mode on {front['validation_examples']} validation examples (the most tokens per "
           "forward among the points that answer correctly every example AR answers correctly there"
           f"{f', but for {100 * tol:g}% of the examples' if tol else ''}; else the most accurate point)"
           if front else "knobs from eval.knobs")
    lines += ["", f"Test split: {modes[0]['examples'] if modes else 0} held-out examples, greedy decoding; {how}.",
              "", summary_markdown(modes)]
    if report["targets"]:
        lines += ["| target | measured | met |", "|---|---|---|"]
        for t in report["targets"]:
            v = t["value"]
            v = "–" if v is None else f"{v:.3g}"
            lines.append(f"| {t['target']} | {v} | {'yes' if t['met'] else 'no'} |")
    if report.get("diagnostics"):
        lines += ["", "## Diagnostics (test split)", "", diagnose.markdown(report["diagnostics"])]
    if front:
        lines += ["", "## Frontier (validation split)", "",
                  "| mode | knobs | exact match | examples lost to AR | tokens / forward | tokens / s |",
                  "|---|---|---|---|---|---|"]
        ar = next((p for p in front["points"] if p["mode"] == "ar" and "correct" in p), None)
        for r in sorted(frontier.pareto(front["points"]), key=lambda r: (list(MODE_LABELS).index(r["mode"]),
                                                                          r["tokens_per_forward"])):
            lost = frontier.losses_to(ar, r) if ar and "correct" in r else "–"
            lines.append(f"| {r['label']} | {r['point'] or '–'} | {_pct(r['accuracy'])} | {lost} | "
                         f"{r['tokens_per_forward']:.2f} | {r['tokens_per_s']:.0f} |")
        lines.append(f"\n{len(front['points'])} points in all (`report.json` → frontier.points); the table lists "
                     "those no other point of the same mode beats on both accuracy and tokens per forward. "
                     "Examples lost to AR: answered wrongly where AR answers correctly.")
    lines += ["", f"Total wall time: {report['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


def write_report(workdir: str, report: dict) -> None:
    """report.md, report.png, then report.json (each atomically): a report.json means a complete report."""
    atomic_write(os.path.join(workdir, "report.md"), report_markdown(report))
    points = report["frontier"]["points"] if report.get("frontier") else []
    frontier_plot(points, report["modes"], report["loss_curve"], os.path.join(workdir, "report.png"),
                  "Zarya quickstart")
    atomic_write_json(os.path.join(workdir, "report.json"), report, default=str)
