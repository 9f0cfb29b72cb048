"""Train Uno's gated-LoRA diffusion drafter on a frozen AR checkpoint (SPEC §7).

    python -m experiments.train_drafter --base CKPT --workdir DIR [--config PRESET_OR_FILE]
        [--set key=value ...] [--lora-rank 128] [--lora-alpha 2048] [--noise uniform|mask]
        [--tv-weight 1] [--ce-weight 0] [--kl-weight 0] [--block-sizes 2,4,6,8,12,16]
        [--block-borders B1,...] [--force]

The base checkpoint (`zarya_jax.checkpoint`) is loaded and frozen; only the adapter is trained, with
the run machinery of `experiments.train` (data pipeline, sharding, checkpoints every
`train.save_every`, exact resume from the latest checkpoint in DIR, metrics.jsonl / TensorBoard
logging). The run config (`--config`, default `tiny`, plus `--set` overrides: data.train=FILE.jsonl,
train.steps, optim.lr, data.batch_size, …) supplies everything but the model, which comes from the
checkpoint. optim.weight_decay defaults to 0 here (as Uno); `--set` can change it.
Output: DIR/adapter/adapter.safetensors (load with `zarya_jax.lora.load`; its metadata records the
noise type) and DIR/drafter.json. Exit status: 0 done, 2 bad input, 3 non-finite loss.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.train_drafter", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="frozen AR checkpoint directory (zarya_jax.checkpoint)")
    p.add_argument("--workdir", required=True, help="run directory: checkpoints, metrics, adapter/")
    p.add_argument("--config", default="tiny", help="run config preset or YAML/JSON file (model section ignored)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a run knob (see python -m experiments.train --help), repeatable")
    p.add_argument("--lora-rank", type=int, default=128)
    p.add_argument("--lora-alpha", type=float, default=2048.0)
    p.add_argument("--noise", choices=("uniform", "mask"), default="uniform",
                   help="noise tokens of the draft rows: uniform random ids or the mask token")
    p.add_argument("--tv-weight", type=float, default=1.0)
    p.add_argument("--ce-weight", type=float, default=0.0, help="extra CE on the data's next token")
    p.add_argument("--kl-weight", type=float, default=0.0, help="extra KL(q ‖ p_AR)")
    p.add_argument("--block-sizes", default="2,4,6,8,12,16", help="draft-block curriculum")
    p.add_argument("--block-borders", default=None,
                   help="training fractions at which each block size ends (default: equal shares)")
    p.add_argument("--force", action="store_true", help="resume even if DIR holds a different config")
    return p


def _floats(text: str | None, what: str):
    if text is None:
        return None
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{what}={text!r}: expected comma-separated numbers") from None


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from zarya_jax import checkpoint as ckpt_lib
    from zarya_jax import drafter as drafter_lib
    from zarya_jax import lora as lora_lib
    from zarya_jax import run_config as rc
    from zarya_jax.config import ConfigError, LoraConfig
    from zarya_jax.data import DataError
    from zarya_jax.trainer import NonFiniteError, train

    try:
        if not os.path.isdir(args.base):
            raise FileNotFoundError(f"--base {args.base!r}: expected a checkpoint directory")
        sizes = _floats(args.block_sizes, "--block-sizes")
        if any(s != int(s) for s in sizes):
            raise ConfigError(f"--block-sizes={args.block_sizes!r}: expected integers")
        lora = LoraConfig(rank=args.lora_rank, alpha=args.lora_alpha)
        dcfg = drafter_lib.DrafterConfig(block_sizes=tuple(int(s) for s in sizes),
                                         block_borders=_floats(args.block_borders, "--block-borders"),
                                         noise=args.noise, tv_weight=args.tv_weight, ce_weight=args.ce_weight,
                                         kl_weight=args.kl_weight)
        base_config = ckpt_lib.load_config(args.base)
        if args.noise == "mask" and base_config.mask_token_id is None:
            raise ConfigError(f"--noise mask needs a mask token, but {args.base} has mask_token_id=None")
        run = rc.load(args.config, ["optim.weight_decay=0.0", "train.export_final=false", *args.overrides])
        run = run.replace(model=base_config.replace(dtype=run.model.dtype, remat=run.model.remat))
        drafter_meta = {"base": os.path.abspath(args.base), "lora": {"rank": lora.rank, "alpha": lora.alpha},
                        "drafter": {"block_sizes": list(dcfg.block_sizes), "block_borders": dcfg.block_borders,
                                    "noise": dcfg.noise, "tv_weight": dcfg.tv_weight, "ce_weight": dcfg.ce_weight,
                                    "kl_weight": dcfg.kl_weight}}
        meta_path = os.path.join(args.workdir, "drafter.json")
        if os.path.exists(meta_path) and not args.force:
            with open(meta_path) as f:
                old = json.load(f)
            if old != json.loads(json.dumps(drafter_meta)):
                raise ConfigError(f"workdir {args.workdir!r} holds a drafter run with different settings {old}; "
                                  f"refusing to resume (use --force or another --workdir)")
        base_params, _ = ckpt_lib.load(args.base)
        model_config = run.model
        objective = drafter_lib.drafter_objective(model_config, lora, dcfg)
        os.makedirs(args.workdir, exist_ok=True)
        tmp = meta_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(drafter_meta, f, indent=2)
        os.replace(tmp, meta_path)
        summary = train(run, args.workdir, force=args.force, objective=objective,
                        init_params=lambda key: lora_lib.init_lora(model_config, lora, key),
                        frozen_params=base_params, return_state=True)
    except (ConfigError, DataError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    state = summary.pop("state")
    if summary["status"] == "completed":
        summary["adapter"] = str(lora_lib.save(os.path.join(args.workdir, "adapter"), state["params"], lora,
                                               extra={"noise": dcfg.noise}))
    print(json.dumps(summary, indent=2, default=str))
    if summary["status"] == "interrupted":
        return 128 + summary["signal"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
