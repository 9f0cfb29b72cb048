"""Forward pass: the jitted JAX forward vs Hugging Face transformers' PyTorch Qwen3, same weights.

    python -m experiments.bench forward [--batch-sizes 1,4 --seq 512 --layers 4 --hidden 512 --rounds 3]

The HF model is built from a seed (random weights) and its weights copied into the JAX params. Each side is
timed in a process of its own while the other is idle (`python -m zarya_jax.bench.forward --side jax|hf`,
launched by this command), alternating JAX, HF, JAX, HF … for `--rounds`; each child warms up and times
`--repeats` calls per batch size, and the table reports the median over every timed call of every round (the
minimum is in the JSON). The JAX child also checks its logits against HF's. The HF baseline is HF at its
best: every attention implementation in `--hf-attention` (eager, sdpa) with every PyTorch thread count in
`--hf-threads` (default: as many as XLA uses, and 1), the fastest. The HF side stays on the CPU. The
measurement: `zarya_jax.bench.forward`.
"""
from __future__ import annotations

import argparse

from zarya_jax.bench import forward

from .harness import add_baseline_arguments, baseline_settings, check_heads, check_positive, csv_ints


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffw", type=int, default=None, help="MLP width (default 3 × hidden)")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch-sizes", type=csv_ints, default=[4], help="comma-separated, e.g. 1,4,16,64")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per batch size in each child process")
    add_baseline_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")


def settings(args) -> forward.ForwardSettings:
    check_positive(args, ("layers", "hidden", "heads", "kv_heads", "vocab", "seq", "repeats", "rounds"))
    check_heads(args.hidden, args.heads, args.kv_heads)
    return forward.ForwardSettings(layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                                   ffw=args.ffw, vocab=args.vocab, seq=args.seq, batch_sizes=tuple(args.batch_sizes),
                                   repeats=args.repeats, seed=args.seed, **baseline_settings(args))


def run(args) -> tuple[dict, str]:
    return forward.run(settings(args))
