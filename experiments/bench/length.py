"""Speed-up against answer length: a finished quickstart's AR and lossless modes, timed side by side per
decoding budget (`zarya_jax.eval.length`).

    python -m experiments.bench --out runs/quickstart_long/bench length --workdir runs/quickstart_long
    python -m experiments.bench length --workdir runs/quickstart_long --caps 32,64,128,256,288 --examples 10 \\
        --modes spec-self,spec-self-fused --batch 1 --repeats 2

The workdir's checkpoint (and drafter, for the LoRA modes) decodes the first `--examples` prompts of its
test split (or `--split val`) at each budget of `--caps`: AR, then every lossless mode of the run
(default: those of its `eval.modes`) at the knobs the run evaluated it with (the frontier's choice, or
`eval.knobs`). Per budget and mode the table gives the mean tokens decoded per prompt, tokens per
forward, tokens/s against AR's in the same race, the speed-up, and whether the outputs equal AR's
token for token. Train a long-answer run first (`python -m experiments.quickstart --task long`): on the
terse default task answers end after about 22 tokens, whatever the budget. Nothing is trained or
scored.
"""
from __future__ import annotations

import argparse

from zarya_jax import overrides
from zarya_jax.config import PromptFormat
from zarya_jax.eval import evaluate as evaluate_lib
from zarya_jax.eval import length, tasks
from zarya_jax.experiment import stages
from zarya_jax.experiment.calibrate import checkpoint_of, model_of, read_report
from zarya_jax.experiment.config import ExperimentConfig

from .harness import csv_ints, names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True, help="a finished quickstart's workdir (report.json, checkpoint, data)")
    p.add_argument("--caps", type=csv_ints, default=list(length.CAPS), help="decoding budgets (max_new_tokens)")
    p.add_argument("--modes", default=None, help="lossless modes to race against AR (default: the run's)")
    p.add_argument("--examples", type=int, default=10, help="prompts decoded per budget and mode")
    p.add_argument("--batch", type=int, default=1, help="decoding batch size")
    p.add_argument("--repeats", type=int, default=2, help="rounds the modes take turns in (the best counts)")
    p.add_argument("--split", choices=("test", "val"), default="test")
    p.add_argument("--ckpt", default=None, help="the checkpoint, when the workdir no longer records it")
    p.add_argument("--no-verify", action="store_true", help="read the checkpoint without its checksums")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args):
    for flag in ("examples", "batch", "repeats"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag}={getattr(args, flag)}: expected ≥ 1")
    report = read_report(args.workdir)
    config = overrides.build(ExperimentConfig, report.config)
    run_knobs = {r.mode: r.knobs for r in report.modes}
    chosen = names(args.modes) if args.modes is not None else tuple(m for m in config.eval.modes if m != "ar")
    length.check_modes(dict.fromkeys(chosen))
    missing = [m for m in chosen if m not in run_knobs]
    if missing:
        raise ValueError(f"--modes: {missing} not evaluated by {args.workdir} (its modes: {list(run_knobs)})")
    model = model_of(args.workdir, config, checkpoint_of(args.workdir, report, args.ckpt), not args.no_verify)
    splits = stages.prepare_data(config.task, args.workdir, fmt=PromptFormat.of(config.trainer.data),
                                 need_val=args.split == "val")
    records = tasks.read_jsonl(getattr(splits, args.split), model.prompt_format)[:args.examples]
    ev = config.eval
    prompts = evaluate_lib.render_records(records, model.tokenizer, model.prompt_format, ev.answer,
                                          ev.answer_regex or None)[1]
    rows = length.length_table(model, prompts, {m: run_knobs[m] for m in chosen}, tuple(args.caps),
                               batch=args.batch, repeats=args.repeats, seed=ev.seed, label=not args.no_progress)
    head = (f"# speed-up against answer length: {args.workdir} (task {config.task.name}), {len(prompts)} "
            f"{args.split} prompts at batch {args.batch}, best of {args.repeats} rounds, on {model_device()}\n\n")
    return ({"workdir": args.workdir, "task": config.task.name, "split": args.split, "batch": args.batch,
             "repeats": args.repeats, "device": model_device(), "rows": [r.to_json() for r in rows]},
            head + length.markdown(rows))


def model_device() -> str:
    from zarya_jax.eval.speed import device_name
    return device_name()
