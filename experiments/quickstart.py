"""The main job: train a tiny Zarya on the embedded arithmetic task, then compare every decoding mode.

    python -m experiments.quickstart                       # 7000 steps of batch 8: under 15 minutes on 2 CPU cores
    python -m experiments.quickstart --objective ar        # Uno's setting: a plain AR model + its LoRA drafter (runs/quickstart_ar)
    python -m experiments.quickstart --steps 6000          # a longer run
    python -m experiments.quickstart --minutes 20          # pick the step count for a time budget
    python -m experiments.quickstart --ckpt runs/quickstart/train/final   # evaluate an existing checkpoint
    python -m experiments.quickstart --smoke               # seconds: the pipeline end to end, tiny
    python -m experiments.quickstart --task long --workdir runs/quickstart_long   # worked solutions, 123–271 tokens

The pipeline is `zarya_jax.experiment.run` (docs/experiments.md): (1) write the task's train /
validation / test JSONL (`zarya_jax.eval.tasks`, byte tokenizer); (2) train with slotted training and
the slot-size curriculum (docs/algorithms.md §2), saving Orbax checkpoints; (3) sweep every decoding mode's knobs on
the validation split and choose each mode's point there (the frontier); (4) evaluate the test split at
the chosen points, at the evaluation batch and at batch 1; (5) diagnose each head and each mode's
errors; (6) print the table and write `report.json`, `report.md` and `report.png` (the frontier, the
loss curve) to `--workdir`.

The run configuration is one typed tree (`zarya_jax.experiment.ExperimentConfig`): the trainer's
sections `model`, `zarya`, `optim`, `data`, `mesh`, `train`, plus `task` (the generator), `drafter` and
`draft_model` (each composed of its own sections, e.g. `drafter.lora.rank`, `drafter.optim.lr`,
`draft_model.objective.loss`), `eval` (modes, knobs), `frontier` (the grid) and `goals` (the report's
targets). `--set section.key=value` overrides any entry; sweeps (`experiments.sweep`) use the same keys.

Rerunning the same command is safe: an up-to-date workdir is left as it is (its report is printed), an
interrupted one resumes, and one trained with another config is refused unless `--force`. Checkpoints
are verified against their checksums (`--no-verify` skips that). Exit status: 0 done, 2 bad input (one
`error:` line, nothing written), 3 training diverged, 128 + signal when interrupted (130 Ctrl-C, 143
SIGTERM; rerun to resume). One run per workdir: a second one is refused while the first runs.
"""
from __future__ import annotations

import argparse
import math

from zarya_jax import experiment, overrides
from zarya_jax.data.tokenizer import load_tokenizer, model_vocab
from zarya_jax.eval import tasks
from zarya_jax.eval.evaluate import parse_modes
from zarya_jax.experiment.config import LONG_TASK
from zarya_jax.experiment.report import report_markdown
from zarya_jax.lock import workdir_lock

from . import cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.quickstart", description=__doc__,
                                epilog=overrides.help_table(overrides.keys(experiment.ExperimentConfig,
                                                                           defaults=experiment.default_config())),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=None, help="where data, checkpoints and reports go (default "
                   "runs/quickstart; runs/quickstart_ar with --objective ar, so both settings run side by side)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 7000; 1500 with --objective ar)")
    p.add_argument("--objective", choices=("zarya", "ar"), default=None,
                   help="zarya (default, the hybrid loss) or ar (the AR-only baseline: plain next-token loss)")
    p.add_argument("--minutes", type=float, default=None,
                   help="training time budget: measure this machine's step time, then choose --steps")
    p.add_argument("--ckpt", default=None, help="evaluate this checkpoint; skip training")
    p.add_argument("--modes", default=None, help=f"decoding modes (default {','.join(experiment.DEFAULT_MODES)}; with "
                   f"--objective ar {','.join(experiment.UNO_MODES)})")
    p.add_argument("--task", default=None, choices=sorted(tasks.TASKS),
                   help="arith (default: terse answers, ~22 tokens) or long (worked solutions of 123–271 tokens, "
                   f"for speed-up against answer length; sets {', '.join(f'{k}={v}' for k, v in LONG_TASK.items())})")
    p.add_argument("--difficulty", type=int, default=None, choices=sorted(tasks.DIFFICULTY),
                   help="the task's difficulty preset (the long task has 1 only)")
    p.add_argument("--smoke", action="store_true", help="a seconds-long run of the whole pipeline (tests)")
    cli.add_set_flag(p, "eval.knobs.slotted.slot_size=8")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--force", action="store_true",
                   help="resume training even if the workdir holds checkpoints of another config")
    p.add_argument("--no-verify", action="store_true",
                   help="read checkpoints without checking their checksums (train.verify_checkpoints=false)")
    return p


def config_from_args(args) -> experiment.ExperimentConfig:
    """The defaults, then --smoke, then the flags, then --set (later wins)."""
    # Uno's setting (`--objective ar`): the frozen AR model and its LoRA drafter; --smoke shrinks either
    flags = dict(experiment.UNO_DEFAULTS) if args.objective == "ar" else {}
    flags.update(LONG_TASK if args.task == "long" else {})  # before --smoke, which shrinks the budget too
    flags.update(experiment.SMOKE if args.smoke else {})
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
    config = overrides.apply(experiment.default_config(), cli.set_overrides(args, flags))
    if config.data.tokenizer != "byte":  # another vocabulary: the model's vocab and special ids follow it
        config = config.replace(model=model_vocab(config.model, load_tokenizer(config.data.tokenizer)))
    return config


def main(argv=None) -> int:
    args = cli.parse_args(build_parser(), argv)
    return cli.run(lambda: _run(args))


def _run(args) -> int:
    if args.minutes is not None and not (args.minutes > 0 and math.isfinite(args.minutes)):
        raise ValueError(f"--minutes={args.minutes}: expected a finite number of minutes > 0")
    if args.minutes is not None and args.steps is not None:
        raise ValueError("give --steps or --minutes, not both")
    config = config_from_args(args)
    if args.workdir is None:
        args.workdir = "runs/quickstart_ar" if args.objective == "ar" else "runs/quickstart"
    t, ev = config.task, config.eval
    cli.check_workdir(args.workdir, {"eval.ckpt": ev.ckpt, "task.train_file": t.train_file,
                                     "task.test_file": t.test_file, "task.val_file": t.val_file}, WRITES)
    with workdir_lock(args.workdir, "experiments.quickstart"):
        return _locked_run(args, config)


# What the pipeline writes into --workdir besides train/ (which --ckpt, e.g. WORKDIR/train/final, skips).
WRITES = ("data", "eval", "drafter", "drafter_data", "calibration", "report.json", "report.md", "report.png")


def _locked_run(args, config) -> int:
    if args.minutes is not None:
        steps = experiment.calibrate_steps(config.trainer, config.task, args.workdir, args.minutes,
                                           need_val=config.frontier.enabled)
        config = overrides.apply(config, {"train.steps": steps})
        print(f"--minutes {args.minutes}: {steps} steps fit on this machine", flush=True)
    kept = experiment.current_report(config, args.workdir) is not None
    report = experiment.run(config, args.workdir, progress=not args.no_progress, force=args.force)
    print(report_markdown(report))
    print(f"kept {args.workdir}/report.json, report.md, report.png (up to date with this config)" if kept
          else f"wrote {args.workdir}/report.json, report.md, report.png")
    return 0


if __name__ == "__main__":
    cli.main(main)
