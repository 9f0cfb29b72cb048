"""The device check: measured beside predicted on the chip in hand, in minutes.

    python -m experiments.bench check                  # one GPU or TPU chip; ≤ 8 minutes (--budget-s)
    python -m experiments.bench check --smoke          # the same code on a CPU with the tiny preset

Per preset (`--presets`, random weights): the pass-cost curve measured beside the compiler's prediction for this
chip, AR decode against the HBM roofline, and a two-pass and a fused self-speculative cycle's cost in AR steps,
measured and predicted; then, for each quickstart workdir present (`--workdirs`, trained on any host and
copied over), the race of AR and the frontier's chosen points, measured beside both predictions (from the
measured curve, and from the compiler's with the workdir's acceptance). What each number is:
`zarya_jax.bench.check`; where the results go: docs/results.md, with the machine and versions named.
"""
from __future__ import annotations

import argparse
import dataclasses

from zarya_jax.bench import check

from .harness import csv_ints, names

C = check.CheckSettings()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smoke", action="store_true", help="a seconds-long CPU run with the tiny preset (the test)")
    p.add_argument("--presets", default=",".join(C.presets), help="comma-separated model presets")
    p.add_argument("--batches", type=csv_ints, default=list(C.batches), help="batch sizes of the curve and decode")
    p.add_argument("--windows", type=csv_ints, default=list(C.windows), help="window sizes of a pass")
    p.add_argument("--context", type=int, default=C.context, help="committed cache rows (and the decode's prompt)")
    p.add_argument("--new-tokens", type=int, default=C.new_tokens, help="new tokens per decoded row")
    p.add_argument("--workdirs", default=",".join(C.workdirs), help="quickstart workdirs to race (absent ones skipped)")
    p.add_argument("--race-batches", type=csv_ints, default=list(C.race_batches), help="batch sizes of the race")
    p.add_argument("--predict-target", default="", help="predict for this target (default: the local device)")
    p.add_argument("--repeats", type=int, default=C.repeats)
    p.add_argument("--budget-s", type=float, default=C.budget_s, help="parts past this many seconds are skipped")


def run(args) -> tuple[dict, str]:
    s = check.CheckSettings(presets=names(args.presets), batches=tuple(args.batches), windows=tuple(args.windows),
                            context=args.context, new_tokens=args.new_tokens, workdirs=names(args.workdirs),
                            race_batches=tuple(args.race_batches), predict_target=args.predict_target,
                            repeats=args.repeats, budget_s=args.budget_s)
    if args.smoke:
        s = dataclasses.replace(s, **check.SMOKE)
    return check.run(s)
