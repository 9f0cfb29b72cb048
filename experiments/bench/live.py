"""The live cache: a decoding pass's cost against the cache's allocation, and a whole decode against its live rows.

    python -m experiments.bench live                       # W=4, batch 4, 1,024 live rows, 8× allocated; 1,024 + 8,192 decode
    python -m experiments.bench live --factors 2,4,8 --new 0   # the passes only

Side by side in one process for each `--cache-blocks` value (`ModelConfig.cache_block`: 256 reads only the live
blocks, 0 the whole allocation): one cached pass against `--live` committed rows in a cache allocated for them and
in one `--factors` times larger, and an AR decode of `--new` tokens after `--prompt` beside the mean pass cost its
live contexts require. The measurement: `zarya_jax.bench.live`.
"""
from __future__ import annotations

import argparse

from zarya_jax.bench import live

from .harness import check_positive, csv_ints

D = live.LiveSettings()


def add_arguments(p: argparse.ArgumentParser) -> None:
    for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffw", "vocab", "batch", "window", "live",
                 "repeats", "decode_batch", "prompt", "decode_points", "decode_layers", "seed"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(D, name))
    p.add_argument("--new", type=int, default=D.new, help="tokens of the whole decode (0: no decode)")
    p.add_argument("--factors", type=csv_ints, default=list(D.factors), help="allocations, × the live rows")
    p.add_argument("--cache-blocks", default=",".join(map(str, D.cache_blocks)),
                   help="ModelConfig.cache_block values to compare (0: the whole allocation read densely)")


def settings(args) -> live.LiveSettings:
    check_positive(args, ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffw", "vocab", "batch", "window",
                          "live", "repeats", "decode_batch", "prompt", "decode_points", "decode_layers"))
    try:
        blocks = tuple(int(b) for b in args.cache_blocks.split(",") if b.strip())
    except ValueError:
        blocks = ()
    if not blocks or any(b < 0 for b in blocks):
        raise ValueError(f"--cache-blocks={args.cache_blocks!r}: expected comma-separated integers ≥ 0, e.g. 256,0")
    if args.new < 0:
        raise ValueError(f"--new={args.new}: expected an integer ≥ 0")
    if args.heads % args.kv_heads:
        raise ValueError(f"--heads={args.heads} is not a multiple of --kv-heads={args.kv_heads}")
    return live.LiveSettings(**{k: getattr(args, k) for k in (
        "layers", "hidden", "heads", "kv_heads", "head_dim", "ffw", "vocab", "batch", "window", "live", "repeats",
        "decode_batch", "prompt", "new", "decode_points", "decode_layers", "seed")},
        factors=tuple(args.factors), cache_blocks=blocks)


def run(args) -> tuple[dict, str]:
    return live.run(settings(args))
