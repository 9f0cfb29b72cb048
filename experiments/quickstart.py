"""The main job: train a tiny Zarya on the embedded arithmetic task, then compare every decoding mode.

    python -m experiments.quickstart                       # 600 steps: ~12 CPU-minutes on 2 cores
    python -m experiments.quickstart --steps 6000          # a longer run
    python -m experiments.quickstart --minutes 20          # pick the step count for a time budget
    python -m experiments.quickstart --ckpt runs/quickstart/train/final   # evaluate an existing checkpoint
    python -m experiments.quickstart --smoke               # seconds: the pipeline end to end, tiny

Steps: (1) write the task's train/test JSONL (`experiments/tasks.py`, byte tokenizer); (2) train with
slotted training and the slot-size curriculum (SPEC §2) through `zarya_jax.trainer.train`, with a
progress bar, saving Orbax checkpoints; (3) evaluate the held-out split in AR, mode A, mode B and
lossless speculative decoding with the self drafter (SPEC §5–§7); (4) print one table (exact match,
tokens per forward, tokens/s, speed-up over AR) and write `report.json`, `report.md` and
`report.png` (accuracy vs tokens per forward, loss curve) to `--workdir`.

The run configuration is one nested dict (`default_run_config()`): the trainer's sections `model`,
`zarya`, `optim`, `data`, `mesh`, `train`, plus `task` (the generator) and `eval` (modes, knobs).
`--set section.key=value` overrides any entry; sweeps (`experiments/sweep.py`) use the same keys.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import shutil
import sys
import time

from . import tasks
from .evaluate import MODE_LABELS, atomic_write, evaluate, parse_modes, summary_markdown, write_outputs

DEFAULT_MODES = ["ar", "mdm", "slotted", "spec-self"]


def default_run_config() -> dict:
    """The quickstart defaults, tuned for a 2-core CPU (see the README for measured results)."""
    from zarya_jax.config import ModelConfig, ZaryaConfig
    from zarya_jax.data import DataConfig
    from zarya_jax.optim import OptimConfig
    from zarya_jax.run_config import TrainConfig
    from zarya_jax.sharding import MeshConfig

    model = ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                        num_kv_heads=2, head_dim=32, max_position_embeddings=512, mask_token_id=259,
                        eos_token_id=258, pad_token_id=256)
    zarya = ZaryaConfig(slotted_training=True, slot_size_set=(2, 4, 8), slot_step_borders=(0.1, 0.4, 1.0))
    optim = OptimConfig(lr=2e-3, warmup_steps=100, schedule="cosine", min_lr_ratio=0.05, weight_decay=0.01)
    data = DataConfig(tokenizer="byte", max_length=88, batch_size=32, pack=False, seed=0)
    train = TrainConfig(steps=600, log_every=25, eval_every=0, save_every=200, keep=1, keep_best=0,
                        async_checkpointing=False)
    return {
        "task": {"difficulty": 1, "num_train": 50000, "num_test": 200, "seed": 0, "train_file": "", "test_file": ""},
        "model": dataclasses.asdict(model),
        "zarya": dataclasses.asdict(zarya),
        "optim": dataclasses.asdict(optim),
        "data": dataclasses.asdict(data),
        "mesh": dataclasses.asdict(MeshConfig()),
        "train": dataclasses.asdict(train),
        # Uno's LoRA drafter, trained on the frozen checkpoint only when eval.modes has spec-lora.
        "drafter": {"steps": 300, "rank": 16, "alpha": 32.0, "lr": 2e-3, "batch_size": 16,
                    "block_sizes": [2, 4, 8]},
        "train_init": {"embed_std": 0.02},
        "eval": {"modes": list(DEFAULT_MODES), "max_new_tokens": 32, "batch_size": 25, "limit": 0,
                 "answer": "final", "answer_regex": "", "seed": 0, "ckpt": "",
                 "knobs": {"mdm": {"steps": 0, "alpha0": 0.25},
                           "slotted": {"slot_size": 4, "serial_num_blocks": 1, "slot_threshold": 0.9,
                                       "token_threshold": 0.9},
                           "spec-self": {"draft_length": 8},
                           "spec-lora": {"draft_length": 8}}},
    }


def smoke_overrides() -> dict:
    """Seconds instead of minutes: a tiny model, a handful of steps and examples, one slot size."""
    return {"task.num_train": 64, "task.num_test": 4, "model.hidden_size": 32, "model.intermediate_size": 64,
            "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1, "model.head_dim": 16,
            "zarya.slot_size_set": [4], "zarya.slot_step_borders": [1.0], "data.batch_size": 8,
            "optim.warmup_steps": 2, "train.steps": 4, "train.log_every": 1,
            "train.save_every": 0, "eval.batch_size": 4, "eval.max_new_tokens": 8,
            "eval.knobs.slotted.slot_size": 4, "eval.knobs.spec-self.draft_length": 4}


def _section(config: dict, name: str) -> dict:
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in config[name].items()}


def build_run_config(config: dict, train_file: str, test_file: str):
    """The trainer's `RunConfig` from the nested dict (data files filled in)."""
    from zarya_jax import run_config as rc

    raw = {name: _section(config, name) for name in ("model", "zarya", "optim", "data", "mesh", "train")}
    raw["data"]["train"] = (train_file,)
    raw["data"]["eval"] = (test_file,) if config["train"]["eval_every"] else ()
    return rc.build(raw)


def prepare_data(config: dict, workdir: str) -> tuple[str, str]:
    """The task's train/test files (generated deterministically), or the user's files if given."""
    task = config["task"]
    if task["train_file"] or task["test_file"]:
        if not (task["train_file"] and task["test_file"]):
            raise ValueError("task.train_file and task.test_file must be given together")
        for path in (task["train_file"], task["test_file"]):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"data file {path!r} does not exist")
        return task["train_file"], task["test_file"]
    return tasks.write_splits(os.path.join(workdir, "data"), task["num_train"], task["num_test"], task["seed"],
                              task["difficulty"])


def loss_curve(train_dir: str) -> list[tuple[int, float]]:
    from zarya_jax.metrics_log import read_metrics

    try:
        rows = read_metrics(train_dir)
    except FileNotFoundError:
        return []
    return [(int(r["step"]), float(r["loss"])) for r in rows if "loss" in r and "step" in r]


def calibrate_steps(config: dict, train_file: str, test_file: str, workdir: str, minutes: float) -> int:
    """Steps that fit `minutes` of training: times a short throwaway run (compile excluded) and
    divides. The curriculum and LR schedule need the total up front, hence the measurement."""
    from zarya_jax import trainer

    probe = copy.deepcopy(config)
    probe["train"].update(steps=12, save_every=0, export_final=False, progress_bar=False, log_every=0)
    probe["zarya"]["slot_size_set"] = [config["zarya"]["slot_size_set"][-1]]
    probe["zarya"]["slot_step_borders"] = [1.0]
    times = []

    def tick(info):
        times.append(time.perf_counter())

    scratch = os.path.join(workdir, "calibration")
    shutil.rmtree(scratch, ignore_errors=True)
    trainer.train(build_run_config(probe, train_file, test_file), scratch, callbacks=[tick])
    shutil.rmtree(scratch, ignore_errors=True)
    per_step = (times[-1] - times[3]) / (len(times) - 4)
    return max(1, int(minutes * 60 / per_step))


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by a signal after saving a checkpoint (not a failure of the run)."""


def _small_init(model_config, config: dict):
    """Random init with the embedding scaled to std `train_init.embed_std` (Hugging Face's Qwen3
    `initializer_range` 0.02): the library's unit-variance embedding, tied to the head, starts from
    logits so large that the first ~50 steps only shrink them, a real cost on a CPU budget."""
    from zarya_jax.model import init_params

    std = float(config["train_init"]["embed_std"])

    def init(key):
        params = init_params(model_config, key)
        return {**params, "embed": params["embed"] * std}

    return init if std > 0 else None


def train_model(config: dict, train_file: str, test_file: str, workdir: str) -> dict:
    """Trains (resuming if `workdir/train` holds a checkpoint of the same run) and returns the summary."""
    from zarya_jax import trainer

    run = build_run_config(config, train_file, test_file)
    t0 = time.perf_counter()
    summary = trainer.train(run, os.path.join(workdir, "train"), init_params=_small_init(run.model, config))
    summary["wall_s"] = time.perf_counter() - t0
    if summary["status"] != "completed":
        # A signal (SIGTERM/SIGINT) stopped training after a checkpoint: stop everything (a sweep
        # must not carry on with its next run), and let a rerun resume.
        raise TrainingInterrupted(f"training stopped by signal {summary.get('signal')} at step {summary['step']}; "
                                  "rerun the same command to resume")
    return summary


def train_lora_drafter(config: dict, ckpt: str, train_file: str, workdir: str, progress: bool = True):
    """Trains Uno's gated-LoRA drafter on the frozen checkpoint (SPEC §7) via experiments.train_drafter;
    returns (lora_params, LoraConfig)."""
    from zarya_jax import lora as lora_lib

    from . import train_drafter

    d = config["drafter"]
    out = os.path.join(workdir, "drafter")
    argv = ["--base", ckpt, "--workdir", out, "--config", "tiny", "--lora-rank", str(d["rank"]),
            "--lora-alpha", str(d["alpha"]), "--block-sizes", ",".join(str(s) for s in d["block_sizes"]),
            "--set", f"data.train={train_file}", "--set", f"data.max_length={config['data']['max_length']}",
            "--set", f"data.batch_size={d['batch_size']}", "--set", f"train.steps={d['steps']}",
            "--set", f"optim.lr={d['lr']}", "--set", "optim.warmup_steps=20", "--set", "train.save_every=0",
            "--set", "train.eval_every=0", "--set", f"train.progress_bar={str(progress).lower()}",
            "--set", "train.async_checkpointing=false"]
    if train_drafter.main(argv) != 0:
        raise RuntimeError(f"LoRA drafter training failed (workdir {out})")
    return lora_lib.load(os.path.join(out, "adapter"))


def run_pipeline(config: dict, workdir: str, progress: bool = True) -> dict:
    """Data → train (unless eval.ckpt) → evaluate every mode → report files. Returns the report dict."""
    from zarya_jax import checkpoint
    from zarya_jax.tokenizer import load_tokenizer

    t_start = time.perf_counter()
    modes = parse_modes(",".join(config["eval"]["modes"]))
    ckpt = config["eval"]["ckpt"]
    if ckpt and not os.path.exists(ckpt):
        raise FileNotFoundError(f"checkpoint {ckpt!r} does not exist")
    os.makedirs(workdir, exist_ok=True)
    train_file, test_file = prepare_data(config, workdir)
    train_summary = None
    if not ckpt:
        config["train"]["progress_bar"] = bool(progress and config["train"].get("progress_bar", True))
        train_summary = train_model(config, train_file, test_file, workdir)
        ckpt = train_summary["final_params"]
    params, model_config = checkpoint.load(ckpt)
    tokenizer = load_tokenizer(checkpoint.tokenizer_dir(ckpt) or config["data"]["tokenizer"])
    records = tasks.read_jsonl(test_file)
    if config["eval"]["limit"]:
        records = records[: config["eval"]["limit"]]
    ev = config["eval"]
    lora_params = lora_cfg = None
    if "spec-lora" in modes:
        lora_params, lora_cfg = train_lora_drafter(config, ckpt, train_file, workdir, progress)
    summary, predictions = evaluate(params, model_config, tokenizer, records, modes,
                                    max_new_tokens=ev["max_new_tokens"], batch_size=ev["batch_size"],
                                    knobs=ev["knobs"], method=ev["answer"], pattern=ev["answer_regex"] or None,
                                    seed=ev["seed"], progress=progress, lora_params=lora_params, lora=lora_cfg)
    eval_dir = os.path.join(workdir, "eval")
    write_outputs(eval_dir, summary, predictions)
    curve = loss_curve(os.path.join(workdir, "train")) if train_summary else []
    report = {
        "checkpoint": os.path.abspath(ckpt),
        "model": {"params": model_config.num_params(), **dataclasses.asdict(model_config)},
        "train": None if train_summary is None else {
            k: train_summary.get(k) for k in ("status", "step", "loss", "eval_loss", "tokens_per_s", "mfu", "wall_s")},
        "modes": summary,
        "targets": targets(summary),
        "loss_curve": curve,
        "config": config,
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
    from .plots import report_plot

    atomic_write(os.path.join(workdir, "report.json"), json.dumps(report, indent=2, default=str))
    atomic_write(os.path.join(workdir, "report.md"), report_markdown(report))
    report_plot(report["modes"], report["loss_curve"], os.path.join(workdir, "report.png"),
                "Zarya quickstart")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.quickstart", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="runs/quickstart", help="where data, checkpoints and reports go")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 600)")
    p.add_argument("--minutes", type=float, default=None,
                   help="training time budget: measure this machine's step time, then choose --steps")
    p.add_argument("--ckpt", default=None, help="evaluate this checkpoint; skip training")
    p.add_argument("--modes", default=None, help=f"decoding modes (default {','.join(DEFAULT_MODES)})")
    p.add_argument("--difficulty", type=int, default=None, choices=sorted(tasks.DIFFICULTY))
    p.add_argument("--smoke", action="store_true", help="a seconds-long run of the whole pipeline (tests)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any run-config entry, e.g. optim.lr=1e-3 or eval.knobs.slotted.slot_size=8")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def config_from_args(args) -> dict:
    from .sweep import apply_overrides, parse_sets

    config = default_run_config()
    overrides = dict(smoke_overrides()) if args.smoke else {}
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"--steps={args.steps}: expected ≥ 1")
        overrides["train.steps"] = args.steps
    if args.difficulty is not None:
        overrides["task.difficulty"] = args.difficulty
    if args.modes:
        overrides["eval.modes"] = parse_modes(args.modes)
    if args.ckpt:
        overrides["eval.ckpt"] = args.ckpt
    overrides.update(parse_sets(args.set))
    return apply_overrides(config, overrides)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        if args.minutes is not None:
            if args.minutes <= 0:
                raise ValueError(f"--minutes={args.minutes}: expected > 0")
            if args.steps is not None:
                raise ValueError("give --steps or --minutes, not both")
            train_file, test_file = prepare_data(config, args.workdir)
            config["train"]["steps"] = calibrate_steps(config, train_file, test_file, args.workdir, args.minutes)
            print(f"--minutes {args.minutes}: {config['train']['steps']} steps fit on this machine", flush=True)
        report = run_pipeline(config, args.workdir, progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return 130
    print(report_markdown(report))
    print(f"wrote {args.workdir}/report.json, report.md, report.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
