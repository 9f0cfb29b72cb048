"""Generation throughput: AR, mode A, mode B (tokens/s, tokens per forward), JAX vs HF, cached vs uncached.

    python -m experiments.bench generate [--batch-sizes 1,8,32 --max-new-tokens 32 --rounds 3]
    python -m experiments.bench generate --ckpt CKPT --no-hf

On a tiny random Qwen3 (built with transformers, weights copied into the JAX params) or on a
checkpoint (`--ckpt`; the HF comparison then needs `--no-hf`). Per batch size and mode: compile
time, median wall time of the timed calls, generated tokens/s and mean tokens per forward pass, and
for AR the JAX decode without a KV cache. Rows never stop at EOS, so every mode generates the same number
of tokens. The AR row is compared with Hugging Face at its best on the same CPU and weights (transformers'
greedy `generate` and HF's own cached forward loop, each in every `--hf-attention` × `--hf-threads`
configuration); each side runs in a process of its own while the other is idle (`python -m
zarya_jax.bench.generate --side jax|hf`), alternating for `--rounds`. The measurement:
`zarya_jax.bench.generate`.
"""
from __future__ import annotations

import argparse

from zarya_jax.bench import generate

from .harness import add_baseline_arguments, baseline_settings, check_heads, check_positive, csv_ints, names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-sizes", type=csv_ints, default=[1, 8, 32])
    p.add_argument("--modes", default=",".join(generate.MODES),
                   help=f"comma-separated subset of {','.join(generate.MODES)}")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=264, help="random model vocab (the mask token is vocab − 5)")
    p.add_argument("--slot-size", type=int, default=4)
    p.add_argument("--serial-num-blocks", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="mode A's T")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per configuration in each child process")
    add_baseline_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt", default=None, help="benchmark this checkpoint instead of a random model")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' PyTorch generate")
    p.add_argument("--no-verify", action="store_true", help="load --ckpt without checking its checksums")
    p.add_argument("--no-uncached", action="store_true", help="skip the cache-free AR decode")


def settings(args) -> generate.GenerateSettings:
    check_positive(args, ("max_new_tokens", "prompt_len", "layers", "hidden", "heads", "kv_heads", "vocab",
                          "slot_size", "serial_num_blocks", "repeats", "rounds"))
    check_heads(args.hidden, args.heads, args.kv_heads)
    s = generate.GenerateSettings(
        batch_sizes=tuple(args.batch_sizes), modes=names(args.modes), max_new_tokens=args.max_new_tokens,
        prompt_len=args.prompt_len, layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
        vocab=args.vocab, slot_size=args.slot_size, serial_num_blocks=args.serial_num_blocks, steps=args.steps,
        repeats=args.repeats, seed=args.seed, ckpt=args.ckpt, uncached=not args.no_uncached,
        verify=not args.no_verify, **baseline_settings(args))
    s.check()  # before anything starts: a bad mode, vocabulary or --ckpt with the HF comparison
    return s


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench generate`: argparse namespace → (results, markdown)."""
    return generate.run(settings(args))
