"""How every experiment command ends: one place for exit statuses and error lines.

    0    done
    2    bad input: one line `error: …` on stderr naming the value and what was expected, nothing written.
         Every input error of the library is a ValueError (ConfigError, DataError, CheckpointError,
         ShapeError, OutputPathError, SweepError, …); an OSError (unreadable file, full disk) counts too.
    3    the run diverged (`DivergenceError`: a non-finite or exploding step, a loss spike, a vanished
         gradient); the diverged step was not saved.
    130  stopped by a signal after saving a checkpoint (`KeyboardInterrupt`); rerun to resume.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from zarya_jax import overrides
from zarya_jax.train.divergence import DivergenceError

INPUT_ERRORS = (ValueError, OSError)


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def run(body: Callable[[], int], resume_hint: str = "") -> int:
    """`body()`'s exit status, or the status of the error that ended it (the table above)."""
    try:
        return body()
    except DivergenceError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 3
    except INPUT_ERRORS as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"interrupted: {one_line(e)}{resume_hint}", file=sys.stderr)
        return 130


def add_set_flag(p: argparse.ArgumentParser, example: str = "optim.lr=1e-3") -> None:
    """`--set KEY=VALUE` (repeatable): a dotted key of the command's config tree (listed in its `--help`),
    the one override flag every command takes; `set_overrides` reads it."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a knob, e.g. --set {example} (repeatable; the list is below)")


def set_overrides(args, flags: dict | None = None) -> dict:
    """{dotted key: value}: the command's own `flags` (already in dotted keys) under the `--set` items
    (parsed, typed later against the tree by `zarya_jax.overrides.apply`); `--set` wins."""
    return {**(flags or {}), **overrides.parse_all(args.overrides)}


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """The flags every training command shares: `--set`, `--force`, `--no-verify`."""
    add_set_flag(p)
    p.add_argument("--force", action="store_true", help="resume even if the workdir holds a different config")
    p.add_argument("--no-verify", action="store_true",
                   help="read checkpoints without checking their checksums (train.verify_checkpoints=false)")


def run_overrides(args) -> list[str]:
    """The `--set` overrides of `add_run_flags`, with `--no-verify` as its knob."""
    return list(args.overrides) + (["train.verify_checkpoints=false"] if args.no_verify else [])


def run_status(summary: dict) -> int:
    """A training run's exit status: 0, or 128 + the signal that stopped it (it saved a checkpoint)."""
    return 128 + summary["signal"] if summary["status"] == "interrupted" else 0
