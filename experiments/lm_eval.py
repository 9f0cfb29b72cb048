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

import zarya_jax.eval.harness  # noqa: F401  (registers the `zarya` model with lm-eval)


def main(argv: list[str] | None = None) -> int:
    """Runs lm-eval's command line on `argv` (default: this process's arguments)."""
    saved = sys.argv
    sys.argv = [saved[0]] + (list(argv) if argv is not None else saved[1:])
    try:
        cli_evaluate()
    except (ValueError, FileNotFoundError) as e:  # bad model arguments, tasks or paths: one line, no traceback
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
