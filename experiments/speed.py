"""Choose an experiment's decoding configuration for time on this device (`zarya_jax.experiment.calibrate`).

    python -m experiments.speed runs/quickstart                      # batch sizes of the run's speed section
    python -m experiments.speed runs/quickstart_ar --set batches=[1,8,64] --set confirm=8
    python -m experiments.speed runs/quickstart --out speed-h200.json
    python -m experiments.speed runs/quickstart --points chosen   # the frontier's chosen point per mode only
    python -m experiments.generate --ckpt runs/quickstart/train/final --lora runs/quickstart/drafter/adapter \\
        --mode auto --speed runs/quickstart/eval/speed-gpu.json --prompt "…"

An experiment's frontier (accuracy and tokens per forward per knob point) is the checkpoint's; the time a
point takes is the device's. This command takes a finished experiment's workdir (its report, checkpoint,
drafter and splits, e.g. trained on a CPU host) and, on the device it runs on, measures the pass-cost
curve, races AR and the lossless points predicted fastest on the validation prompts per batch size, and
times each choice against AR on test (docs/decoding.md#knobs-chosen-for-time). Nothing is trained and
no accuracy is measured again; the lossless modes decode AR's tokens, so the choice changes speed only.

`--set FIELD=VALUE` sets a field of the `speed` section (default: the experiment's own; list below),
e.g. `batches=[1,8,64]`, `confirm=8` (how many predicted-fastest points race AR), `examples`, `repeats`,
`margin=0.1` (a candidate replaces AR only if at least 1.1× AR's tokens/s in every round).
Every (batch, window) of the pass-cost curve and every timed candidate at every batch size is a program
to compile: seconds each on a CPU, 4–17 s each for the quickstart's model on an H200, so the default
(every lossless frontier point priced, 3 per batch size timed) compiles dozens of programs.
`--points chosen` takes only the point the frontier chose for each lossless mode (AR, spec-self,
spec-lora, the fused modes: each timed). Compiles and timed decodes are shown on stderr.
The choice is written to `--out` (default `WORKDIR/eval/speed-<platform>.json`, e.g. speed-gpu.json;
written whole, atomically), the format `experiments.generate --mode auto --speed` reads; the choice per
batch size and every timed candidate are printed as Markdown tables. `--ckpt`: the checkpoint's
directory, when the workdir's recorded path no longer exists and it is not the workdir's `train/final`.
Exit status: 0 done, 2 bad input (one `error:` line, nothing written).
"""
from __future__ import annotations

import argparse
import os

import jax

from zarya_jax import overrides
from zarya_jax.eval import speed as speed_lib
from zarya_jax.experiment.calibrate import POINTS, calibrate, read_report
from zarya_jax.experiment.config import ExperimentConfig
from zarya_jax.files import check_writable_file

from . import cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.speed", description=__doc__,
                                epilog=overrides.help_table(overrides.keys(speed_lib.SpeedConfig)),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workdir", help="a finished experiment's workdir (its report.json, checkpoint, drafter, data)")
    cli.add_set_flag(p, "batches=[1,8,64]")
    p.add_argument("--out", default=None, help="where the choice is written (default WORKDIR/eval/speed-<platform>.json)")
    p.add_argument("--ckpt", default=None, help="the checkpoint's directory, when the workdir no longer records it")
    p.add_argument("--points", choices=POINTS, default="frontier",
                   help="frontier: every lossless frontier point is a candidate, the confirm predicted fastest timed; "
                   "chosen: the frontier's chosen point per mode, every one timed (fewer programs to compile)")
    p.add_argument("--no-progress", action="store_true", help="no compile and decode progress on stderr")
    p.add_argument("--no-verify", action="store_true", help="read the checkpoint and adapter without their checksums")
    return p


def main(argv=None) -> int:
    args = cli.parse_args(build_parser(), argv)
    return cli.run(lambda: _run(args))


def _run(args) -> int:
    report = read_report(args.workdir)
    base = overrides.build(ExperimentConfig, report.config).speed
    sc = overrides.apply(base, cli.set_overrides(args))
    out = args.out or os.path.join(args.workdir, "eval", f"speed-{jax.devices()[0].platform}.json")
    check_writable_file(out, "--out")
    choice = calibrate(args.workdir, sc, points=args.points, ckpt=args.ckpt, verify=not args.no_verify,
                       progress=not args.no_progress, report=report)
    choice.save(out)
    print(f"# {choice.device}: the fastest lossless configuration per batch size (test, side by side with AR)")
    print(speed_lib.markdown(choice))
    print(f"\n# every timed candidate (validation)\n{speed_lib.candidates_markdown(choice)}")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    cli.main(main)
