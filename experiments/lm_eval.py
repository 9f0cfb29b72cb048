"""lm-evaluation-harness's own command line, with the `zarya` model registered (`zarya_jax.eval.harness`).

    python -m experiments.lm_eval --model zarya --model_args ckpt=DIR,mode=slotted,slot_size=8 \\
        --tasks gsm8k --batch_size 8 --output_path OUT [--include_path TASKS_DIR] [any lm-eval flag]

Everything after the command is lm-eval's (`lm-eval run --help`); `--model_args` takes the checkpoint, the
decoding mode and its knobs, and prompt-format fields (see `zarya_jax.eval.harness`). Needs the `eval`
extra (`pip install -e ".[eval]"`).
"""
from __future__ import annotations

import sys

from lm_eval.__main__ import cli_evaluate

from zarya_jax.files import check_output

import zarya_jax.eval.harness  # noqa: F401  (registers the `zarya` model with lm-eval)

from . import cli


def main(argv: list[str] | None = None) -> int:
    """Runs lm-eval's command line on `argv` (default: this process's arguments)."""
    args = list(argv) if argv is not None else sys.argv[1:]
    return cli.run(lambda: _run(args))


def _run(args: list[str]) -> int:
    """Bad model arguments, tasks or paths (ValueError, FileNotFoundError) become one `error:` line."""
    check_output_path(args)
    saved = sys.argv
    sys.argv = [saved[0]] + args
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0


def check_output_path(args: list[str]) -> None:
    """`--output_path` may not be, contain or sit inside the checkpoint of `--model_args ckpt=DIR`."""
    def value(flag):
        for i, a in enumerate(args):
            if a == flag and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return None
    out, model_args = value("--output_path") or value("-o"), value("--model_args") or ""
    ckpt = [kv.split("=", 1)[1] for kv in model_args.split(",") if kv.startswith("ckpt=")]
    if out:
        check_output(out, {"ckpt": ckpt}, "--output_path")


if __name__ == "__main__":
    cli.main(main)
