"""Stopping on a signal after the same step on every host: SIGTERM (a preemption notice) or SIGINT (Ctrl-C).

The loop asks `StopSignal.reached(step)` before each step; when it says yes, every host saves `step`
together (Orbax saves are collective) and returns with status 'interrupted'.

- One process: SIGTERM and SIGINT set a flag (handlers in the main thread only); `reached` reads it.
- Several processes: a signal may reach only some hosts, yet all must stop after the same step, or the
  others would wait forever in the next step's collectives. JAX's preemption service agrees on it: its
  notifier (installed by `jax.distributed.initialize`) catches SIGTERM on any host and tells the
  coordination service, which picks the sync step (the largest step any host has reached, plus one);
  `multihost_utils.reached_preemption_sync_point(step)` — what Orbax's `CheckpointManager.reached_preemption`
  calls — is then true on every host at that same step. So SIGTERM is left to the notifier, and a SIGINT
  on a host is forwarded to it as a SIGTERM to that process (`signal.raise_signal`), agreed on the same way;
  that host still reports SIGINT (exit 130), the others SIGTERM (exit 143).
"""
from __future__ import annotations

import _thread
import contextlib
import gc
import signal
import threading
from typing import Iterator

import jax
from jax.experimental import multihost_utils


class Interrupted(KeyboardInterrupt):
    """A command stopped by signal `signum` (SIGINT: Ctrl-C, SIGTERM: a preemption notice or `kill`); its
    exit status is 128 + signum (`experiments.cli`)."""

    def __init__(self, message: str = "", signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = int(signum or signal.SIGINT)


def _swallowed_here(frame) -> bool:
    """Whether an exception raised in `frame` would be swallowed ("Exception ignored in …"): inside a
    garbage-collector callback (JAX registers one, `_xla_gc_callback`) or a `__del__`."""
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _raise_interrupted(signum, frame):
    if _swallowed_here(frame):  # raised here, Ctrl-C would be lost: deliver it again once out of there
        threading.Timer(0.05, _thread.interrupt_main, (signum,)).start()
        return
    raise Interrupted(f"signal {signal.Signals(signum).name}", signum)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """For the block, in the main thread, SIGINT and SIGTERM raise `Interrupted` (Python's default ends
    the process on SIGTERM, and its Ctrl-C is lost when it lands in a garbage-collector callback), so
    that `finally` blocks and atomic writers clean up. (The training loop's `StopSignal` installs its
    own handlers inside, and restores these.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class StopSignal:
    """Installs the handlers on creation (restore them with `restore`); see the module doc."""

    def __init__(self):
        self.received: int | None = None  # the signal this process got, if any
        self.synced = jax.process_count() > 1 and bool(jax.config.jax_enable_preemption_service)
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT,) if self.synced else (signal.SIGTERM, signal.SIGINT):
                self._old[s] = signal.signal(s, self._handle)

    def _handle(self, signum, frame):
        self.received = self.received or signum
        if self.synced:
            signal.raise_signal(signal.SIGTERM)  # the preemption notifier's handler, not Python's

    def reached(self, step: int) -> bool:
        """True when the loop must save `step` and stop: the same step on every host. Every host must
        call it before every step (the sync protocol counts the calls)."""
        if self.synced:
            return multihost_utils.reached_preemption_sync_point(step)
        return self.received is not None

    @property
    def signum(self) -> int:
        """The signal to report: this host's own, else (a host stopped by another's notice) SIGTERM."""
        return int(self.received or signal.SIGTERM)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
