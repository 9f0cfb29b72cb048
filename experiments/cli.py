"""How every experiment command ends: one place for exit statuses and error lines.

    0    done
    1    a sweep finished with failed runs (each recorded in its run's error.txt; rerun to retry them)
    2    bad input: one line `error: …` on stderr naming the value and what was expected, nothing written.
         Every input error of the library is a ValueError (ConfigError, DataError, CheckpointError,
         ShapeError, OutputPathError, WorkdirLocked, SweepError, …); an OSError (unreadable file, full
         disk) counts too. So does a train step that does not fit the machine's memory
         (`train.memory.OutOfMemoryError`: the estimate refused before compiling, or XLA's out-of-memory
         error), its line naming the knobs that lower it.
    3    the run diverged (`DivergenceError`: a non-finite or exploding step, a loss spike, a vanished
         gradient); the diverged step was not saved.
    130  stopped by SIGINT (Ctrl-C)            } 128 + the signal's number; a training run saved a
    143  stopped by SIGTERM (kill, preemption) } checkpoint first: rerun the same command to resume.

Outputs are written atomically (`zarya_jax.files`), so a signal leaves either the previous file or the
complete new one. `run` makes SIGINT and SIGTERM raise (Python's default ends the process on SIGTERM,
leaving temporary files, and loses a Ctrl-C that lands in JAX's garbage-collector callback), and `main`
ends an interrupted process without the interpreter teardown that crashed it with a segmentation fault
(exit 139) while XLA's threads were still at work.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from typing import Callable

from zarya_jax import overrides
from zarya_jax.config import ConfigError, check_bounds
from zarya_jax.files import check_output
from zarya_jax.lock import host_lock_name, workdir_lock
from zarya_jax.train.divergence import DivergenceError
from zarya_jax.train.preemption import signals_interrupt

INPUT_ERRORS = (ValueError, OSError)


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def run(body: Callable[[], int], resume_hint: str = "") -> int:
    """`body()`'s exit status, or the status of the error or signal that ended it (the table above)."""
    try:
        with signals_interrupt():
            return body()
    except DivergenceError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 3
    except INPUT_ERRORS as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"interrupted: {one_line(e)}{resume_hint}", file=sys.stderr)
        return 128 + getattr(e, "signum", signal.SIGINT)


def main(command: Callable[[], int]) -> None:
    """A command's `if __name__ == "__main__"`: ends the process with `command()`'s status. After a signal
    it skips interpreter teardown (flushing stdout and stderr first): tearing the interpreter down while
    XLA's threads still compile or run crashes with a segmentation fault, and every output is already
    complete or absent (the writes are atomic, training saved its checkpoint)."""
    code = command()
    if code > 128:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


def script(module: str) -> Callable[[], None]:
    """The console script (pyproject.toml's `[project.scripts]`, listed in `experiments.scripts`) of the command
    `python -m module`: its `main()` on this process's arguments, ended by `main` above as the `python -m`
    form is, so that an interrupted console script also skips the teardown that crashes. The module is
    imported when the script runs (commands import this module)."""
    def entry() -> None:
        main(importlib.import_module(module).main)

    entry.module = module
    entry.__qualname__ = entry.__name__ = f"script({module!r})"
    return entry


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, then every number flag checked against its range
    (`zarya_jax.config.check_bounds`: finite floats, seeds uint32, step counts ≤ 10^9, other integers
    int32); out of range is argparse's own error (one `error:` line naming the flag, exit 2)."""
    args = parser.parse_args(argv)
    for name, value in vars(args).items():
        try:
            check_bounds("--" + name.replace("_", "-"), value)
        except ConfigError as e:
            parser.error(str(e))
    return args


def check_workdir(workdir: str, inputs: dict, writes: tuple[str, ...] = ()) -> None:
    """A run's workdir may hold its own inputs (the quickstart's data, a checkpoint to evaluate), but may
    not be one, lie inside one, be a filesystem root, the home directory or the repository, nor contain
    an input where it writes one of `writes` (`zarya_jax.files.check_output`)."""
    check_output(workdir, inputs, "--workdir", writes=writes)


def training_lock(workdir: str, command: str, distributed: str = "auto"):
    """The workdir lock of a training command (`zarya_jax.lock`). A multi-host run's processes share the
    workdir, so each holds the lock of its host; `jax.distributed` is initialised first for that (before
    any device use, as `train` would, which then finds it initialised)."""
    import jax

    from zarya_jax.train.sharding import maybe_initialize_distributed

    maybe_initialize_distributed(distributed)
    return workdir_lock(workdir, command, name=host_lock_name(jax.process_index(), jax.process_count()))


def decode_mesh():
    """The mesh `generate` and `evaluate` read a checkpoint onto (`load_for_inference(mesh=)`): FSDP over
    this host's devices, each param's hidden dim split over them and the batch spread across them (the
    decoding layout `bench aot` compiles), so that no device holds the model whole; None on one device,
    where the params go to it as they would without a mesh."""
    import jax

    from zarya_jax.train.sharding import MeshConfig, make_mesh

    devices = jax.local_devices()
    return make_mesh(MeshConfig(data=1, fsdp=-1), devices) if len(devices) > 1 else None


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
