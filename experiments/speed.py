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

**Predicted for a target** (`--target`; no chip needed, `zarya_jax.bench.predict`): each lossless mode's
speed-up over AR on the target at a preset's real shape, from the target compiler's cost model (the TPU
compiler through libtpu, XLA:GPU through the CUDA plugin) and the acceptance the workdir's frontier measured,
or a per-draft acceptance rate `--alpha` (then the workdir may be left out), or per answer budget the
tokens per forward a `bench length` table measured (`--length-table`, beside its measured speed-ups);
nothing is timed:

    python -m experiments.speed runs/quickstart --target tpu:v5e:4x4 --preset qwen3-1.7b --batches 1,64 \
        --prompt 1024 --new 8192
    python -m experiments.speed --alpha 0.8 --target gpu:h100 --preset qwen3-1.7b
    python -m experiments.speed --target tpu:v5e:4x4 --length-table runs/bench/length.json --prompt 128

The curve, every priced candidate and the knobs predicted fastest per batch are printed, labelled as the
cost model's; `--out` (default `WORKDIR/eval/predicted-<target>.json` with a workdir) gets them as JSON.
Exit status: 0 done, 2 bad input (one `error:` line, nothing written).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import jax

from zarya_jax import overrides
from zarya_jax.bench import predict
from zarya_jax.eval import speed as speed_lib
from zarya_jax.experiment.calibrate import POINTS, calibrate, read_report
from zarya_jax.experiment.config import ExperimentConfig
from zarya_jax.files import atomic_write_json, check_writable_file

from . import cli
from .bench.harness import mesh_config, names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.speed", description=__doc__,
                                epilog=overrides.help_table(overrides.keys(speed_lib.SpeedConfig)),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workdir", nargs="?", default=None,
                   help="a finished experiment's workdir (its report.json, checkpoint, drafter, data); with --target "
                   "and --alpha it may be left out")
    cli.add_set_flag(p, "batches=[1,8,64]")
    p.add_argument("--out", default=None, help="where the choice is written (default WORKDIR/eval/speed-<platform>.json)")
    p.add_argument("--ckpt", default=None, help="the checkpoint's directory, when the workdir no longer records it")
    p.add_argument("--points", choices=POINTS, default="frontier",
                   help="frontier: every lossless frontier point is a candidate, the confirm predicted fastest timed; "
                   "chosen: the frontier's chosen point per mode, every one timed (fewer programs to compile)")
    p.add_argument("--no-progress", action="store_true", help="no compile and decode progress on stderr")
    p.add_argument("--no-verify", action="store_true", help="read the checkpoint and adapter without their checksums")
    t = p.add_argument_group("predicted for a target (nothing timed)")
    t.add_argument("--target", default=None, help="tpu:GENERATION:SHAPE or gpu:MODEL[xN] (zarya_jax.target)")
    t.add_argument("--preset", default="qwen3-1.7b", help="the model preset whose real shape is costed")
    t.add_argument("--batches", default="1,64", help="comma-separated batch sizes")
    t.add_argument("--prompt", type=int, default=1024, help="prompt tokens per row")
    t.add_argument("--new", type=int, default=8192, help="new tokens per row")
    t.add_argument("--mesh", default="", help="data,fsdp,tensor sizes (one may be -1); default the batch over every chip")
    t.add_argument("--alpha", type=float, default=None,
                   help="a per-draft acceptance rate in [0, 1) instead of the workdir's measured acceptance")
    t.add_argument("--draft-lengths", default="2,4,8", help="with --alpha: the draft lengths priced per mode")
    t.add_argument("--length-table", default=None,
                   help="a `bench length` result (length.json): predict per answer budget, beside what it measured")
    return p


def main(argv=None) -> int:
    args = cli.parse_args(build_parser(), argv)
    return cli.run(lambda: _run(args))


def _run(args) -> int:
    if args.target is not None:
        return _predicted(args)
    if args.workdir is None or args.alpha is not None:
        raise ValueError("a workdir is needed to time this device's choice (and --alpha only predicts, with --target)")
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


def _predicted(args) -> int:
    batches, lengths = (_integers(flag, text) for flag, text in (("--batches", args.batches),
                                                                 ("--draft-lengths", args.draft_lengths)))
    s = predict.PredictSettings(target=args.target, preset=args.preset, batches=batches, prompt=args.prompt,
                                new=args.new, mesh=mesh_config(args.mesh))
    s.check()
    if args.length_table is not None:
        return _by_length(args, s)
    if args.alpha is not None:
        points, acceptance = predict.alpha_points(args.alpha, lengths), f"a given rate α = {args.alpha:g} per draft"
    elif args.workdir is None:
        raise ValueError("--target needs a workdir (its measured acceptance) or --alpha")
    else:
        points = predict.workdir_points(read_report(args.workdir), chosen=args.points == "chosen")
        acceptance = f"tokens per forward measured on {args.workdir}'s validation frontier"
    out = args.out or (args.workdir and os.path.join(args.workdir, "eval",
                                                     f"predicted-{args.target.replace(':', '-')}.json"))
    if out:
        check_writable_file(out, "--out")
    log = None if args.no_progress else _stderr
    results, md = predict.run(s, points, acceptance, log=log)
    print(md)
    if out:
        atomic_write_json(out, results)
        print(f"\nwrote {out}")
    return 0


def _by_length(args, s) -> int:
    try:
        with open(args.length_table) as f:
            table = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"--length-table {args.length_table!r}: cannot read it as JSON ({e})") from None
    predict.length_points(table)  # a malformed table is refused before anything compiles
    if args.out:
        check_writable_file(args.out, "--out")
    results, md = predict.by_length(s, table, log=None if args.no_progress else _stderr)
    print(md)
    if args.out:
        atomic_write_json(args.out, results)
        print(f"\nwrote {args.out}")
    return 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _integers(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in names(text))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r}: expected comma-separated positive integers")
    return values


if __name__ == "__main__":
    cli.main(main)
