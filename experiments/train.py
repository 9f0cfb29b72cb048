"""Train (or resume) a Zarya model.

    python -m experiments.train --config PRESET_OR_FILE [--set key=value ...] --workdir DIR
                                [--init-from CKPT] [--force]

PRESET_OR_FILE: a name in experiments/configs/ (tiny, small, 100m, qwen3-0.6b) or a YAML/JSON file with
sections model / zarya / optim / data / mesh / train. Every knob below can be overridden with --set
(values are YAML: numbers, true/false, lists like [2,4,8] or comma strings 2,4,8).
A workdir with checkpoints is resumed from its latest checkpoint (same config required unless --force).
"""
from __future__ import annotations

import argparse
import json
import sys


def _knob_table() -> str:
    from zarya_jax.run_config import knobs

    lines = ["knobs (--set KEY=VALUE; default in brackets):"]
    for key, tname, default in knobs():
        lines.append(f"  {key:34s} {tname:18s} [{default}]")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.train", description=__doc__,
                                epilog=_knob_table(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="preset name (experiments/configs/) or YAML/JSON file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a knob, e.g. --set optim.lr=1e-3 (repeatable)")
    p.add_argument("--workdir", required=True, help="run directory: checkpoints, metrics.jsonl, tb/, final/")
    p.add_argument("--init-from", default=None, help="converted checkpoint to start from (train.init_from)")
    p.add_argument("--force", action="store_true", help="resume even if the workdir holds a different config")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from zarya_jax import run_config as rc
    from zarya_jax.config import ConfigError
    from zarya_jax.data import DataError

    overrides = list(args.overrides)
    if args.init_from:
        overrides.append(f"train.init_from={args.init_from}")
    try:
        run = rc.load(args.config, overrides)
        from zarya_jax.trainer import NonFiniteError, train
        summary = train(run, args.workdir, force=args.force)
    except (ConfigError, DataError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    print(json.dumps({k: v for k, v in summary.items() if k != "state"}, indent=2, default=str))
    if summary["status"] == "interrupted":
        return 128 + summary["signal"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
