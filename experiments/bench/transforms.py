"""Cost of the Zarya training transforms (docs/algorithms.md §2–§3) next to the model's forward + backward pass.

Times three jitted functions on the same packed batch, side by side:
  transform   the slotted or non-slotted transform alone (draws, masks, sort, window mask)
  model       forward + backward of the loss on precomputed transform outputs
  step        the full `value_and_grad(zarya_loss)` (transform + model + loss)

    python -m experiments.bench transforms --preset tiny --batch 8 --length 256

The measurement: `zarya_jax.bench.transforms`.
"""
from __future__ import annotations

import argparse

from zarya_jax.bench import transforms
from zarya_jax.config import preset

from .harness import check_positive, names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="model preset (zarya_jax.config.PRESETS)")
    p.add_argument("--batch", type=int, default=8, help="rows per batch")
    p.add_argument("--length", type=int, default=256, help="row length L")
    p.add_argument("--slot-size", type=int, default=8, help="slot size for the slotted mode")
    p.add_argument("--modes", default=",".join(transforms.MODES),
                   help=f"comma-separated subset of {list(transforms.MODES)}")
    p.add_argument("--iters", type=int, default=20, help="timed iterations (median reported)")


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench transforms`: argparse namespace → (results, markdown)."""
    preset(args.preset)  # an unknown preset is the first error
    s = transforms.TransformSettings(preset=args.preset, batch=args.batch, length=args.length,
                                     slot_size=args.slot_size, modes=names(args.modes), iters=args.iters)
    s.check()
    check_positive(args, ("batch", "length", "slot_size", "iters"))
    rows, answer_tokens = transforms.measure(s)
    return {"args": vars(args), "results": {r["mode"]: r for r in rows}}, transforms.markdown(rows, answer_tokens, s)
