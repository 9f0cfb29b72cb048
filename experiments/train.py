"""Train (or resume) a Zarya model.

    python -m experiments.train --config PRESET_OR_FILE [--set key=value ...] --workdir DIR
                                [--init-from CKPT] [--force]

PRESET_OR_FILE: a name in zarya_jax/configs/ (tiny, small, 100m, qwen3-0.6b) or a YAML/JSON file with
sections model / zarya / optim / data / mesh / train. Every knob below can be overridden with --set
(values are YAML: numbers, true/false, lists like [2,4,8] or comma strings 2,4,8).
With --init-from CKPT the run reads CKPT's own tokenizer (CKPT/tokenizer/: `hf_to_jax` and every trained
final/ carry one) unless another is named: by --set data.tokenizer=..., or by the --config file when it
is not the default `byte` (what the presets say); one that is not the checkpoint's (the byte tokenizer on
a Qwen3 checkpoint) is refused unless --set train.allow_tokenizer_mismatch=true. The rule is the library's
(`zarya_jax.train.loop.train`, `zarya_jax.train.inherit`), so `train()` called from Python applies it too.
A workdir with checkpoints is resumed from its latest checkpoint (same config required unless --force).
Checkpoints are verified against their checksums when read (resume, --init-from); --no-verify skips it.
Exit status: 0 done, 2 bad input (a damaged checkpoint included), 3 diverged (non-finite or exploding
step, loss spike, vanished gradient: `train.divergence.*`), 128 + signal when interrupted.
"""
from __future__ import annotations

import argparse
import json

from zarya_jax import overrides
from zarya_jax.train import config as rc
from zarya_jax.train.loop import train

from . import cli


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.train", description=__doc__,
                                epilog=overrides.help_table(rc.knobs()), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="preset name (zarya_jax/configs/) or YAML/JSON file")
    p.add_argument("--workdir", required=True, help="run directory: checkpoints, metrics.jsonl, tb/, final/")
    p.add_argument("--init-from", default=None, help="converted checkpoint to start from (train.init_from)")
    cli.add_run_flags(p)
    return p


def main(argv=None) -> int:
    args = cli.parse_args(parser(), argv)
    return cli.run(lambda: _run(args))


def _run(args) -> int:
    init = [f"train.init_from={args.init_from}"] if args.init_from else []
    sets = overrides.parse_all(cli.run_overrides(args) + init)
    config = rc.load(args.config, sets)
    cli.check_workdir(args.workdir, {"data.train": config.data.train, "data.eval": config.data.eval,
                                     "train.init_from": config.train.init_from})
    with cli.training_lock(args.workdir, "experiments.train", config.train.distributed):
        summary = train(config, args.workdir, force=args.force, tokenizer=sets.get("data.tokenizer"))
    print(json.dumps({k: v for k, v in summary.items() if k != "state"}, indent=2, default=str))
    return cli.run_status(summary)


if __name__ == "__main__":
    cli.main(main)
