"""One command, one JSON, minutes on one accelerator: the numbers that decide how a pod hour is spent.

    python -m experiments.bench device                 # one GPU/TPU chip; ≤ 8 minutes (--budget-s)
    python -m experiments.bench device --smoke         # the same code on a CPU with the tiny preset

1. **train**: tokens/s and MFU of the real train step (`zarya_jax.train.step`: Zarya slotted loss, AdamW,
   fp32 master weights, state donated) for `--preset` (qwen3-0.6b) in bf16 at `--seq` 2048 × `--train-batch`
   rows, random weights and tokens, `--attention` (auto: cuDNN flash attention on a GPU, splash on a TPU),
   remat on, after the compile.
2. **window**: the cost of one cached forward pass against its window size W in `--windows` (1 … 64 rows) at
   batch 1 and 64, against `--context` committed cache rows: ms per pass and the ratio to W = 1.
3. **decode**: AR decode tokens/s (`--new-tokens` per row after a `--context`-token prompt, best of `--repeats`)
   at batch 1 and 64, next to the HBM roofline (`--bandwidth`, default the device table), and in the same run
   two-pass (`--draft-length` F) and fused (`--fused-k` K) self-speculation: their cost per pass against AR's.

Targets on one H200 (docs/benchmarks.md): train MFU ≥ 40 %; AR decode at batch 1 ≥ 70 % of the roofline; a W = 8
pass ≤ 1.2× a W = 1 pass at batch 1. Parts left when `--budget-s` is spent are recorded as skipped. The
measurement: `zarya_jax.bench.device`.
"""
from __future__ import annotations

import argparse

from zarya_jax.bench import device

from .harness import csv_ints

D = device.DeviceSettings()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smoke", action="store_true", help="a seconds-long CPU run with the tiny preset (the test)")
    p.add_argument("--preset", default=D.preset)
    p.add_argument("--dtype", default=D.dtype, help="compute dtype")
    p.add_argument("--attention", default=D.attention, help="train-step attention backend")
    p.add_argument("--seq", type=int, default=D.seq, help="train sequence length")
    p.add_argument("--train-batch", type=int, default=D.train_batch, help="train rows per step")
    p.add_argument("--steps", type=int, default=D.steps, help="timed train steps after the compile")
    p.add_argument("--windows", type=csv_ints, default=list(D.windows), help="window sizes of a pass")
    p.add_argument("--batches", type=csv_ints, default=list(D.batches),
                   help="batch sizes of the window and decode parts")
    p.add_argument("--context", type=int, default=D.context,
                   help="committed cache rows (window part); prompt tokens (decode)")
    p.add_argument("--new-tokens", type=int, default=D.new_tokens, help="AR tokens per row (decode part)")
    p.add_argument("--draft-length", type=int, default=D.draft_length,
                   help="F of two-pass self-speculation (decode part)")
    p.add_argument("--fused-k", type=int, default=D.fused_k, help="K of fused self-speculation (decode part)")
    p.add_argument("--repeats", type=int, default=D.repeats)
    p.add_argument("--bandwidth", type=float, default=D.bandwidth, help="memory bytes/s (default: the device table)")
    p.add_argument("--budget-s", type=float, default=D.budget_s, help="skip the parts left after this many seconds")


def settings(args) -> device.DeviceSettings:
    s = device.DeviceSettings(
        preset=args.preset, dtype=args.dtype, attention=args.attention, seq=args.seq, train_batch=args.train_batch,
        steps=args.steps, windows=tuple(args.windows), batches=tuple(args.batches), context=args.context,
        new_tokens=args.new_tokens, draft_length=args.draft_length, fused_k=args.fused_k, repeats=args.repeats,
        bandwidth=args.bandwidth, budget_s=args.budget_s)
    return device.smoke(s) if args.smoke else s


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench device`: argparse namespace → (results, markdown)."""
    return device.run(settings(args))
