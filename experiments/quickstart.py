"""The main job: train a tiny Zarya on the embedded arithmetic task, then compare every decoding mode.

    python -m experiments.quickstart                       # 2500 steps: about 10 minutes on 2 CPU cores
    python -m experiments.quickstart --objective ar        # the AR-only baseline, same model and budget
    python -m experiments.quickstart --steps 6000          # a longer run
    python -m experiments.quickstart --minutes 20          # pick the step count for a time budget
    python -m experiments.quickstart --ckpt runs/quickstart/train/final   # evaluate an existing checkpoint
    python -m experiments.quickstart --smoke               # seconds: the pipeline end to end, tiny

Steps (`experiments.pipeline`): (1) write the task's train / validation / test JSONL
(`zarya_jax.eval.tasks`, byte tokenizer); (2) train with slotted training and the slot-size curriculum
(SPEC §2) through `zarya_jax.train.loop.train`, with a progress bar, saving Orbax checkpoints; (3) sweep
every decoding mode's knobs on the validation split and choose each mode's point there (the frontier);
(4) evaluate the test split at the chosen points, at the evaluation batch and at batch 1; (5) diagnose
each head and each mode's errors; (6) print the table and write `report.json`, `report.md` and
`report.png` (the frontier, the loss curve) to `--workdir`.

The run configuration is one typed tree (`experiments.pipeline.PipelineConfig`): the trainer's sections
`model`, `zarya`, `optim`, `data`, `mesh`, `train`, plus `task` (the generator), `drafter`, `eval`
(modes, knobs) and `frontier` (the grid). `--set section.key=value` overrides any entry; sweeps
(`experiments.sweep`) use the same keys.

Rerunning the same command is safe: an up-to-date workdir is left as it is (its report is printed), an
interrupted one resumes, and one trained with another config is refused unless `--force`. Checkpoints
are verified against their checksums (`--no-verify` skips that). Exit status: 0 done, 2 bad input (one
`error:` line, nothing written), 3 training diverged, 130 interrupted (rerun to resume).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from zarya_jax import overrides
from zarya_jax.data.tokenizer import load_tokenizer, model_vocab
from zarya_jax.eval import tasks
from zarya_jax.eval.evaluate import parse_modes
from zarya_jax.train.hooks import OnStep, StepEvent

from . import cli, pipeline

SMOKE = {"task.num_train": 64, "task.num_test": 4, "task.num_val": 4, "model.hidden_size": 32,
         "model.intermediate_size": 64, "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1,
         "model.head_dim": 16, "zarya.slot_size_set": [4], "zarya.slot_step_borders": [1.0], "data.batch_size": 8,
         "optim.warmup_steps": 2, "train.steps": 4, "train.log_every": 1,
         "train.save_every": 0, "eval.batch_size": 4, "eval.max_new_tokens": 8, "eval.batch1_examples": 2,
         "eval.knobs.slotted.slot_size": 4, "eval.knobs.slotted.serial_num_blocks": 2,
         "eval.knobs.spec-self.draft_length": 4, "frontier.slotted_slot_size": [4],
         "frontier.slotted_serial_num_blocks": [0], "frontier.slotted_slot_threshold": [0.9],
         "frontier.slotted_token_threshold": [0.5, 0.9], "frontier.slotted_corrections": ["refusion", "both"],
         "frontier.mdm_steps": [0, 2], "frontier.mdm_alpha0": [0.5], "frontier.draft_lengths": [4]}
"""--smoke: seconds instead of minutes: a tiny model, a handful of steps and examples, one slot size."""


def calibrate_steps(config: pipeline.PipelineConfig, train_file: str, workdir: str, minutes: float) -> int:
    """Steps that fit `minutes` of training: times a short throwaway run (compile excluded) and
    divides. The curriculum and LR schedule need the total up front, hence the measurement."""
    probe = overrides.apply(config, {
        "train.steps": 12, "train.save_every": 0, "train.export_final": False, "train.progress_bar": False,
        "train.log_every": 0, "train.eval_every": 0, "zarya.slot_size_set": [config.zarya.slot_size_set[-1]],
        "zarya.slot_step_borders": [1.0]})
    times: list[float] = []

    def tick(event: StepEvent) -> None:
        times.append(time.perf_counter())

    scratch = os.path.join(workdir, "calibration")
    shutil.rmtree(scratch, ignore_errors=True)
    pipeline.train(pipeline.run_config(probe, train_file, ""), scratch, hooks=[OnStep(tick)])
    shutil.rmtree(scratch, ignore_errors=True)
    per_step = (times[-1] - times[3]) / (len(times) - 4)
    return max(1, int(minutes * 60 / per_step))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.quickstart", description=__doc__,
                                epilog=overrides.help_table(overrides.keys(pipeline.PipelineConfig,
                                                                           defaults=pipeline.default_config())),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="runs/quickstart", help="where data, checkpoints and reports go")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 2500)")
    p.add_argument("--objective", choices=("zarya", "ar"), default=None,
                   help="zarya (default, the hybrid loss) or ar (the AR-only baseline: plain next-token loss)")
    p.add_argument("--minutes", type=float, default=None,
                   help="training time budget: measure this machine's step time, then choose --steps")
    p.add_argument("--ckpt", default=None, help="evaluate this checkpoint; skip training")
    p.add_argument("--modes", default=None, help=f"decoding modes (default {','.join(pipeline.DEFAULT_MODES)})")
    p.add_argument("--difficulty", type=int, default=None, choices=sorted(tasks.DIFFICULTY))
    p.add_argument("--smoke", action="store_true", help="a seconds-long run of the whole pipeline (tests)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any run-config entry (list below), e.g. optim.lr=1e-3 or "
                        "eval.knobs.slotted.slot_size=8")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--force", action="store_true",
                   help="resume training even if the workdir holds checkpoints of another config")
    p.add_argument("--no-verify", action="store_true",
                   help="read checkpoints without checking their checksums (train.verify_checkpoints=false)")
    return p


def config_from_args(args) -> pipeline.PipelineConfig:
    """The defaults, then --smoke, then the flags, then --set (later wins)."""
    flags = dict(SMOKE) if args.smoke else {}
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"--steps={args.steps}: expected ≥ 1")
        flags["train.steps"] = args.steps
    if args.difficulty is not None:
        flags["task.difficulty"] = args.difficulty
    if args.objective:
        flags["train.objective"] = args.objective
    if args.modes:
        flags["eval.modes"] = parse_modes(args.modes)
    if args.ckpt:
        flags["eval.ckpt"] = args.ckpt
    if args.no_verify:
        flags["train.verify_checkpoints"] = False
    config = overrides.apply(pipeline.default_config(), {**flags, **overrides.parse_all(args.set)})
    if config.data.tokenizer != "byte":  # another vocabulary: the model's vocab and special ids follow it
        config = config.replace(model=model_vocab(config.model, load_tokenizer(config.data.tokenizer)))
    return config


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _run(args))


def _run(args) -> int:
    config = config_from_args(args)
    if args.minutes is not None:
        if args.minutes <= 0:
            raise ValueError(f"--minutes={args.minutes}: expected > 0")
        if args.steps is not None:
            raise ValueError("give --steps or --minutes, not both")
        steps = calibrate_steps(config, pipeline.prepare_data(config, args.workdir)["train"], args.workdir,
                                args.minutes)
        config = overrides.apply(config, {"train.steps": steps})
        print(f"--minutes {args.minutes}: {steps} steps fit on this machine", flush=True)
    report = pipeline.run_pipeline(config, args.workdir, progress=not args.no_progress, force=args.force)
    print(pipeline.report_markdown(report))
    print(f"wrote {args.workdir}/report.json, report.md, report.png")
    return 0

if __name__ == "__main__":
    sys.exit(main())
