"""Hooks: what the training loop does besides stepping (logging, progress, eval, checkpoints, export).

A hook is an object with any of four methods (the `Hook` base class gives no-op defaults):

- `on_step(event)`: after every `every`-th optimizer step (and after the run's last step when `last`),
  with the live train state in `event.state`;
- `on_metrics(event)`: after every step, with the step's metrics on the host;
- `on_end(state, summary)`: once, after the loop ended normally (completed or interrupted by a signal);
  a hook may add its results to the summary;
- `close()`: always, also after an error.

Order and synchronisation (`loop.train`): hooks run in the order given. The loop keeps the device one
step ahead of the host: a step's metrics are fetched after the next step is dispatched, and then only
the `on_metrics` methods run. At a step where some hook's `on_step` is due, the loop instead fetches that
step at once, checks it (a non-finite loss stops the run before any hook sees a broken state), and calls
each hook in order, `on_step` (when due) then `on_metrics`. So, in the default order — eval, metrics log,
progress bar, checkpoint, export, then the caller's hooks — an eval loss is in the log row of its step
and in its checkpoint's metadata, and a caller's hook sees whether this step was saved.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

from tqdm import tqdm

from .checkpoints import RunCheckpointer
from .metrics import MetricsLog


@dataclasses.dataclass
class StepEvent:
    """What hooks see after optimizer step `step` (steps completed, 1-based) of `total`.

    metrics: the step's host metrics (loss, grad_norm, lr and the objective's); hooks may add to
    them (the evaluator adds `eval_loss`). tokens: real (non-padding) tokens of the global batch.
    data_crc: checksum of this host's batch. state: the live train state, only during `on_step`.
    saved: a checkpoint of this step was saved.
    """

    step: int
    total: int
    metrics: dict[str, float]
    tokens: int
    data_crc: int
    state: dict | None = None
    saved: bool = False


class Hook:
    """No-op base: override the methods you need; `every` / `last` schedule `on_step`."""

    every: int = 0
    last: bool = False

    def due(self, step: int, total: int) -> bool:
        return bool(self.every and step % self.every == 0) or (self.last and step == total)

    def on_step(self, event: StepEvent) -> None:
        pass

    def on_metrics(self, event: StepEvent) -> None:
        pass

    def on_end(self, state: dict, summary: dict) -> None:
        pass

    def close(self) -> None:
        pass


class OnStep(Hook):
    """`fn(event)` after every `every`-th step (levanter's `trainer.add_hook(fn, every=N)`)."""

    def __init__(self, fn: Callable[[StepEvent], None], every: int = 1):
        self.fn, self.every = fn, every

    def on_step(self, event: StepEvent) -> None:
        self.fn(event)


class MetricsLogger(Hook):
    """Every `log_every` steps (and at the last): a row of WORKDIR/metrics.jsonl (+ TensorBoard and the
    experiment tracker, `tracker`: a function opening it, see `MetricsLog`) with
    the interval's mean loss, throughput and MFU estimate, the step's other metrics and its eval loss;
    an eval loss at another step gets a row of its own. Summary: tokens/s and MFU over the run, the
    first logged interval (compilation) excluded."""

    def __init__(self, workdir: str, start_step: int, log_every: int, rows_per_step: int, seq_len: int,
                 flops_per_token: float, peak_flops: float, tracker=None):
        self.log = MetricsLog(workdir, start_step, tracker=tracker)
        self.start, self.log_every = start_step, log_every
        self.rows_per_step, self.seq_len = rows_per_step, seq_len
        self.flops_per_token, self.peak = flops_per_token, peak_flops
        self.row: dict | None = None  # the last row written and its step
        self.row_step = -1
        self.totals = {"tokens": 0, "time": 0.0, "flops": 0.0}
        self._reset()

    def _reset(self) -> None:
        self.acc = {"loss": 0.0, "n": 0, "tokens": 0, "rows": 0, "t0": time.perf_counter()}

    def on_metrics(self, event: StepEvent) -> None:
        m, acc = event.metrics, self.acc
        acc["loss"] += m["loss"]
        acc["n"] += 1
        acc["tokens"] += event.tokens
        acc["rows"] += self.rows_per_step
        step = event.step
        if (self.log_every and step % self.log_every == 0) or step == event.total:
            dt = time.perf_counter() - acc["t0"]
            flops = self.flops_per_token * acc["rows"] * self.seq_len
            row = {"loss": acc["loss"] / acc["n"], "grad_norm": m["grad_norm"], "lr": m["lr"],
                   "tokens_per_s": acc["tokens"] / dt, "mfu": flops / dt / self.peak, "step_time_s": dt / acc["n"],
                   "data_crc": event.data_crc}
            row.update({k: v for k, v in m.items() if k not in ("loss", "grad_norm", "lr", "eval_loss")})
            if "eval_loss" in m:
                row["eval_loss"] = m["eval_loss"]
            self.log.write(step, row)
            self.row, self.row_step = row, step
            if acc["n"] and step - acc["n"] > self.start:  # the first interval includes compilation
                self.totals["tokens"] += acc["tokens"]
                self.totals["time"] += dt
                self.totals["flops"] += flops
            self._reset()
        elif "eval_loss" in m:
            self.log.write(step, {"eval_loss": m["eval_loss"]})

    def on_end(self, state: dict, summary: dict) -> None:
        t = self.totals
        summary["tokens_per_s"] = t["tokens"] / t["time"] if t["time"] else None
        summary["mfu"] = t["flops"] / t["time"] / self.peak if t["time"] else None

    def close(self) -> None:
        self.log.close()


class ProgressBar(Hook):
    """A tqdm bar over the run's steps; its postfix shows the metrics logger's latest row."""

    def __init__(self, total: int, start_step: int, logger: MetricsLogger):
        self.bar = tqdm(total=total, initial=start_step, desc="train", dynamic_ncols=True)
        self.logger = logger

    def on_metrics(self, event: StepEvent) -> None:
        self.bar.update(1)
        if self.logger.row_step == event.step:
            row = self.logger.row
            self.bar.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row['tokens_per_s']:.0f}",
                                 mfu=f"{row['mfu']:.2%}")

    def close(self) -> None:
        self.bar.close()


class Evaluator(Hook):
    """Every `every` steps and at the last: `eval_fn(state, step) -> loss` on the held-out batches,
    recorded as the step's `eval_loss`. Summary: the latest eval loss."""

    last = True

    def __init__(self, eval_fn: Callable[[Any, int], float], every: int):
        self.eval_fn, self.every = eval_fn, every
        self.latest: float | None = None

    def on_step(self, event: StepEvent) -> None:
        self.latest = self.eval_fn(event.state, event.step)
        event.metrics["eval_loss"] = self.latest

    def on_end(self, state: dict, summary: dict) -> None:
        summary["eval_loss"] = self.latest


class Checkpointer(Hook):
    """Every `every` steps and at the last: the train state, the data iterator position and
    {step, loss} (plus the step's eval loss, for keep_best) into the run's `RunCheckpointer`."""

    last = True

    def __init__(self, checkpointer: RunCheckpointer, data_iterator, every: int, start_step: int):
        self.checkpointer, self.data_iterator, self.every = checkpointer, data_iterator, every
        self.saved_step = start_step  # the latest step whose state is on disk (or being written)

    def on_step(self, event: StepEvent) -> None:
        self.checkpointer.save(event.step, event.state, self.data_iterator,
                               {"step": event.step, "loss": event.metrics.get("loss")},
                               event.metrics.get("eval_loss"))
        self.saved_step = event.step
        event.saved = True


class Export(Hook):
    """When the run completed: `export(params, WORKDIR/final, tokenizer, prompt_format)` (an objective's
    model export, recording how the data was rendered); the summary's `final_params` is the written path.
    A rerun of a finished run (no step taken) keeps the export already there."""

    def __init__(self, export: Callable[[Any, str, Any, Any], str], workdir: str, tokenizer, prompt_format):
        self.export, self.workdir, self.tokenizer, self.prompt_format = export, workdir, tokenizer, prompt_format

    def on_end(self, state: dict, summary: dict) -> None:
        if summary["status"] == "completed":
            path = os.path.join(self.workdir, "final")
            if not (summary["start_step"] == summary["step"] and os.path.isdir(path)):
                path = self.export(state["params"], path, self.tokenizer, self.prompt_format)
            summary["final_params"] = os.path.abspath(path)
