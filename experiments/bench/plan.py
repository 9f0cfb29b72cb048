"""Memory and FLOP plan per device, before booking hardware: ahead-of-time compiles, nothing runs.

    python -m experiments.bench plan --presets qwen3-0.6b,qwen3-1.7b,qwen3-4b --devices 8,64 --seq 2048 \\
        --batch-per-device 1 --attention dense,splash --modes ar,mdm,slotted,spec-self

For each device count N, in a process of its own with N virtual CPU devices, on an FSDP mesh (data 1 × fsdp N,
or `--mesh data,fsdp,tensor`): the train step (Zarya slotted loss, AdamW, fp32 master weights and moments, the
state donated) at `--seq` × (N × `--batch-per-device`) rows once per `--attention` backend, and one decode pass
per mode of `--modes`, compiled ahead of time; per device, XLA's memory analysis and FLOPs next to the model
FLOPs. What the numbers are: `zarya_jax.bench.plan`.
"""
from __future__ import annotations

import argparse

from zarya_jax.bench import plan

from .harness import csv_ints, mesh_config, names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--presets", default="qwen3-0.6b,qwen3-1.7b,qwen3-4b", help="comma-separated model presets")
    p.add_argument("--devices", type=csv_ints, default=[8, 64], help="virtual device counts (one process each)")
    p.add_argument("--mesh", default="", help="data,fsdp,tensor sizes (one may be -1); default FSDP over all devices")
    p.add_argument("--seq", type=int, default=2048, help="training sequence length; the prompt length of decoding")
    p.add_argument("--batch-per-device", type=int, default=1, help="rows per device (global batch = devices × this)")
    p.add_argument("--attention", default="dense,splash", help="attention backends to compile the train step with")
    p.add_argument("--remat", default="true", choices=("true", "false"), help="recompute each layer in the backward")
    p.add_argument("--modes", default=",".join(plan.DEFAULT_MODES),
                   help=f"decoding modes among {', '.join(plan.MODES)}, one pass each ('' to skip)")


def settings(args) -> plan.PlanSettings:
    return plan.PlanSettings(presets=names(args.presets), devices=tuple(args.devices), mesh=mesh_config(args.mesh),
                             seq=args.seq, batch_per_device=args.batch_per_device, attention=names(args.attention),
                             remat=args.remat == "true", modes=names(args.modes))


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench plan`: one worker per device count → (results, markdown)."""
    return plan.run(settings(args))
