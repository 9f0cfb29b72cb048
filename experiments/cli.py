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

import sys
from typing import Callable

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
