"""Train Uno's gated-LoRA diffusion drafter on a frozen AR checkpoint (docs/algorithms.md §7).

    python -m experiments.train_drafter --base CKPT --workdir DIR [--config PRESET_OR_FILE]
        [--set key=value ...] [--force]

e.g. --set drafter.lora.rank=128 --set drafter.lora.alpha=2048 --set drafter.lora.noise=uniform|mask
--set drafter.objective.tv_weight=1 --set drafter.objective.ce_weight=0 --set drafter.objective.kl_weight=0
--set drafter.objective.block_sizes=2,4,6,8,12,16 --set drafter.objective.block_borders=...
--set data.train=FILE.jsonl --set drafter.steps=2000 --set drafter.batch_size=16 --set drafter.optim.lr=1e-4.

The base checkpoint (`zarya_jax.checkpoint`) is loaded and frozen; only the adapter is trained, with
the run machinery of `experiments.train` (data pipeline, sharding, checkpoints every
`train.save_every`, exact resume from the latest checkpoint in DIR, metrics.jsonl / TensorBoard
logging). The model comes from the checkpoint, and so do the tokenizer (CKPT/tokenizer/; another one,
named with --set data.tokenizer=..., must have as many tokens, or --set train.allow_tokenizer_mismatch=true)
and, when CKPT is RUN/final, the base run's batch (as drafter.batch_size), data.max_length,
optim.grad_accum_steps (as drafter.optim.grad_accum_steps), model.dtype, model.remat and
model.remat_policy (from RUN/run_config.json: what fitted the base); one line says what was taken. --set
overrides any of them. The keys are the quickstart's and the sweeps' (`drafter.*`, the same section):
`drafter.steps`, `drafter.batch_size` and `drafter.optim.*` are the run's steps, batch and optimizer
(AdamW at 2e-3, cosine, no weight decay, as Uno), `drafter.lora.*` the adapter (its noise convention is
saved with it and used when sampling), `drafter.objective.*` the objective, `drafter.dcd.*` consistency
distillation. The run config (`--config`, default `tiny`) supplies data, mesh and train settings and the
model's runtime fields (not its zarya, optim, train.steps or data.batch_size: the base run's). A former
key (lora.rank, drafter.tv_weight, dcd.passes, optim.lr, train.steps, data.batch_size) is an error
naming its new one. Output: DIR/adapter/adapter.safetensors (load with `zarya_jax.lora.load`) and DIR/drafter.json.
Checkpoints (the base, the run's own) are verified against their checksums; --no-verify skips it.
Exit status: 0 done, 2 bad input (a damaged checkpoint included), 3 diverged, 128 + signal when
interrupted.
"""
from __future__ import annotations

import argparse
import json

from zarya_jax import overrides
from zarya_jax.train import config as rc
from zarya_jax.train import drafter as drafter_run
from zarya_jax.train import inherit

from . import cli


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.train_drafter", description=__doc__,
                                epilog=overrides.help_table(rc.knobs(drafter_run.DrafterRunConfig)),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="frozen AR checkpoint directory (zarya_jax.checkpoint)")
    p.add_argument("--workdir", required=True, help="run directory: checkpoints, metrics, adapter/")
    p.add_argument("--config", default="tiny",
                   help="run config preset or YAML/JSON file (model runtime, data, mesh, train)")
    cli.add_run_flags(p)
    return p


def main(argv=None) -> int:
    args = cli.parse_args(parser(), argv)
    return cli.run(lambda: _run(args))


def _run(args) -> int:
    sets = overrides.parse_all(cli.run_overrides(args))
    inherited, note = inherit.from_base(args.base, sets, drafter_run.DrafterRunConfig.base_keys(
        inherit.BASE_RUN_KEYS + inherit.BASE_RUNTIME_KEYS))
    cfg = drafter_run.load_config(args.config, {**inherited, **sets})
    if note:
        print(note, flush=True)
    cli.check_workdir(args.workdir, {"--base": args.base, "data.train": cfg.data.train, "data.eval": cfg.data.eval})
    with cli.training_lock(args.workdir, "experiments.train_drafter", cfg.train.distributed):
        summary = drafter_run.train_drafter(cfg, args.base, args.workdir, force=args.force)
    print(json.dumps(summary, indent=2, default=str))
    return cli.run_status(summary)


if __name__ == "__main__":
    cli.main(main)
