"""The losses and one decode pass at Qwen3's vocabulary (V = 151,936 + the mask row) on this machine.

    python -m experiments.bench.vocab [--batch 4] [--length 256] [--hidden 64] [--repeats 3] [--out FILE.json]

A one-layer model of width `--hidden` with Qwen3's vocabulary, so the [B, L, V] logits dominate: the median
wall time and the compiled program's temporary buffers of the Zarya loss with its gradient, Uno's drafter loss
with its gradient, and AR decoding of 16 tokens. The measurement: `zarya_jax.bench.vocab`.
"""
from __future__ import annotations

import argparse
import json

from zarya_jax.bench.vocab import measure
from zarya_jax.files import atomic_write


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.bench.vocab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the result as JSON here")
    args = p.parse_args(argv)
    for name in ("batch", "length", "hidden", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}={getattr(args, name)}: expected ≥ 1")
    result = measure(args.batch, args.length, args.hidden, args.repeats)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        atomic_write(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
