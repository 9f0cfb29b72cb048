"""Train-step throughput: tokens/s and estimated MFU per model preset, and step time vs device count.

    python -m experiments.bench train --presets tiny,100m --batch 8 --length 256 --steps 3 --scaling 1,2,4,8

The step is the real sharded train step of `zarya_jax.train.step` (Zarya slotted loss, AdamW, fp32
master weights) on synthetic prompt/answer rows; compile time is reported apart. Device scaling runs
in a child process with `--xla_force_host_platform_device_count` virtual CPU devices (on one CPU these share
the same cores: expect flat or worse, it measures sharding overhead, not speed-up). The measurement:
`zarya_jax.bench.train`.
"""
from __future__ import annotations

import argparse

from zarya_jax.bench import train

from .harness import names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--presets", default="tiny,100m", help="comma-separated model presets")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="timed steps after the compile step")
    p.add_argument("--dtype", default=None, help="compute dtype override (float32 / bfloat16)")
    p.add_argument("--scaling", default="1,2,4,8", help="device counts for the scaling table ('' to skip)")
    p.add_argument("--scaling-preset", default="tiny")
    p.add_argument("--mode", default="data", choices=("data", "fsdp", "tensor"), help="mesh axis for scaling")


def settings(args) -> train.TrainSettings:
    for name in ("batch", "length", "steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}={getattr(args, name)}: expected a positive integer")
    return train.TrainSettings(presets=names(args.presets), batch=args.batch, length=args.length, steps=args.steps,
                               dtype=args.dtype, scaling=tuple(int(c) for c in names(args.scaling)),
                               scaling_preset=args.scaling_preset, axis=args.mode)


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench train`: argparse namespace → (results, markdown)."""
    return train.run(settings(args))
