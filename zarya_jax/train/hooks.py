"""Hooks: what the training loop does besides stepping (logging, progress, eval, checkpoints, export).

A hook is an object with any of five methods (the `Hook` base class gives no-op defaults):

- `on_start(event)`: once, before the first step the run takes (after its state was initialised or
  restored), with the state in `event.state` and the step the run starts from in `event.step`; metrics a
  hook adds to `event.metrics` are logged as a row of that step (an evaluation of the initial state);
- `on_step(event)`: after every `every`-th optimizer step (and after the run's last step when `last`),
  with the live train state in `event.state`;
- `on_metrics(event)`: after every step, with the step's metrics on the host;
- `on_end(state, summary)`: once, after the loop ended normally (completed or interrupted by a signal);
  a hook may add its results to the summary;
- `close()`: always, also after an error.

Order and synchronisation (`loop.train`): hooks run in the order given. The loop keeps at most one step
on the device: the host draws the next batch while a step runs, fetches that step's metrics, checks them
and dispatches the next step, and only then runs the fetched step's `on_metrics` methods (while the next
step runs). At a step where some hook's `on_step` is due, the loop instead fetches that step at once,
checks it (a non-finite loss stops the run before any hook sees a broken state), and calls each hook in
order, `on_step` (when due) then `on_metrics`. So, in the default order — the run's early hooks (its
evaluations), metrics log, progress bar, checkpoint, export, then the caller's hooks — an eval loss is in
the log row of its step and in its checkpoint's metadata, and a caller's hook sees whether this step was
saved.

State: `on_step` may replace entries of `event.state` that the train step does not own — a companion's
train state (`step.TrainSteps.companions`, e.g. GRPO's refreshed drafter trained by an early hook); the
loop continues from, and the checkpoint hook saves, the state as the hooks leave it.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable

from tqdm import tqdm

from .checkpoints import RunCheckpointer
from .metrics import MetricsLog, Peak


@dataclasses.dataclass
class StepEvent:
    """What hooks see after optimizer step `step` (steps completed, 1-based) of `total`.

    metrics: the step's host metrics (loss, grad_norm, lr and the objective's); hooks may add to
    them (the evaluator adds `eval_loss`). tokens: real (non-padding) tokens of the global batch.
    data_crc: checksum of this host's batch. state: the live train state, only during `on_step`.
    saved: a checkpoint of this step was saved. time: `time.perf_counter()` when the step's metrics
    reached the host (the step had finished). compile_s: seconds spent compiling the train step before
    this step ran (0 but for the first step of each compiled shape).
    """

    step: int
    total: int
    metrics: dict[str, float]
    tokens: int
    data_crc: int
    state: dict | None = None
    saved: bool = False
    time: float = 0.0
    compile_s: float = 0.0


class Hook:
    """No-op base: override the methods you need; `every` / `last` schedule `on_step`."""

    every: int = 0
    last: bool = False

    def due(self, step: int, total: int) -> bool:
        return bool(self.every and step % self.every == 0) or (self.last and step == total)

    def on_start(self, event: StepEvent) -> None:
        pass

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
    the interval's mean loss, throughput and MFU estimate, the step's other metrics and its evaluations
    (`eval_*`); an evaluation at another step gets a row of its own. Summary: tokens/s and MFU over the steps this
    call ran, compilation excluded.

    A resumed run logs the rows an uninterrupted run would: a checkpoint saved inside a logging interval
    carries the interval's loss sum and step count (`resume_record`, in the checkpoint's meta record), and
    the resumed logger continues from them (`resume_from`), so the row at the interval's end holds the
    same mean loss. Throughput is measured over the steps this process ran (compilation excluded): the
    time of the steps before a resume is not known after it.

    The peak FLOP/s of the MFU (`peak`, a `metrics.Peak`) is read at the first row; one still to be
    measured (a CPU's matmul) is measured then, with no step on the device (the hook is due at that step,
    so the loop waits for it), and its time is not counted as step time. Summary: `peak_flops`,
    `peak_flops_source` and `peak_flops_note` (None when no step ran and the peak was never measured)."""

    RESUME_KEY = "metrics_interval"

    def __init__(self, workdir: str, start_step: int, log_every: int, rows_per_step: int, seq_len: int,
                 flops_per_token: float, peak: Peak, tracker=None):
        self.log = MetricsLog(workdir, start_step, tracker=tracker)
        self.log_every = log_every
        self.rows_per_step, self.seq_len = rows_per_step, seq_len
        self.flops_per_token, self.peak = flops_per_token, peak
        self.row: dict | None = None  # the last row written and its step
        self.row_step = -1
        self.measured = (0, 0.0)  # (after step, seconds) the peak's measurement took: host time, not step time
        t0 = time.perf_counter()
        self.totals = {"tokens": 0, "steps": 0, "compile": 0.0, "measure": 0.0, "t0": t0, "t1": t0}
        self._reset(t0)

    def _reset(self, t0: float) -> None:
        # loss/n: the interval's loss sum and steps (carried over a resume); timed_*: the steps this process
        # ran in it (throughput); excluded: seconds in it that were not step time (compiles, the measurement)
        self.acc = {"loss": 0.0, "n": 0, "tokens": 0, "timed_steps": 0, "excluded": 0.0, "t0": t0}

    def _logs(self, step: int, total: int) -> bool:
        return bool(self.log_every and step % self.log_every == 0) or step == total

    def due(self, step: int, total: int) -> bool:
        return not self.peak.known and self._logs(step, total)

    def on_step(self, event: StepEvent) -> None:
        """Measures the peak before the first row (due only then, with no step on the device)."""
        t = time.perf_counter()
        _ = self.peak.flops  # reading it measures it
        self.measured = (event.step, time.perf_counter() - t)

    def resume_record(self) -> dict:
        """The open interval's loss sum and step count, for the checkpoint's meta record."""
        return {self.RESUME_KEY: {"loss_sum": self.acc["loss"], "steps": self.acc["n"]}}

    def on_start(self, event: StepEvent) -> None:
        """A row of what the hooks before this one measured on the initial state, if anything."""
        if event.metrics:
            self.log.write(event.step, dict(event.metrics))

    def resume_from(self, meta: dict) -> None:
        """Continues the interval a checkpoint's meta record (`resume_record`) was saved in."""
        saved = meta.get(self.RESUME_KEY) or {}
        self.acc["loss"], self.acc["n"] = float(saved.get("loss_sum", 0.0)), int(saved.get("steps", 0))

    def _rate(self, tokens: int, steps: int, seconds: float) -> tuple[float, float]:
        """(tokens/s, MFU) of `steps` steps with `tokens` real tokens in `seconds`."""
        if seconds <= 0 or not steps:
            return math.nan, math.nan
        flops = self.flops_per_token * self.rows_per_step * self.seq_len * steps
        return tokens / seconds, flops / seconds / self.peak.flops

    def on_metrics(self, event: StepEvent) -> None:
        m, acc, t = event.metrics, self.acc, self.totals
        now = event.time or time.perf_counter()
        after, measure_s = self.measured
        if measure_s and event.step > after:  # the measurement ran between the previous step and this one
            acc["excluded"] += measure_s
            t["measure"] += measure_s
            self.measured = (0, 0.0)
        acc["loss"] += m["loss"]
        acc["n"] += 1
        acc["tokens"] += event.tokens
        acc["timed_steps"] += 1
        acc["excluded"] += event.compile_s
        t["tokens"] += event.tokens
        t["steps"] += 1
        t["compile"] += event.compile_s
        t["t1"] = now
        step = event.step
        if self._logs(step, event.total):
            dt = now - acc["t0"] - acc["excluded"]
            tokens_per_s, mfu = self._rate(acc["tokens"], acc["timed_steps"], dt)
            row = {"loss": acc["loss"] / acc["n"], "grad_norm": m["grad_norm"], "lr": m["lr"],
                   "tokens_per_s": tokens_per_s, "mfu": mfu, "step_time_s": dt / acc["timed_steps"],
                   "data_crc": event.data_crc}
            row.update({k: v for k, v in m.items() if k not in ("loss", "grad_norm", "lr", "eval_loss")})
            if "eval_loss" in m:
                row["eval_loss"] = m["eval_loss"]
            self.log.write(step, row)
            self.row, self.row_step = row, step
            self._reset(now)
        elif any(k.startswith("eval_") for k in m):  # an evaluation at another step: a row of its own
            self.log.write(step, {k: v for k, v in m.items() if k.startswith("eval_")})

    def on_end(self, state: dict, summary: dict) -> None:
        t = self.totals
        tokens_per_s, mfu = self._rate(t["tokens"], t["steps"], t["t1"] - t["t0"] - t["compile"] - t["measure"])
        summary["tokens_per_s"] = None if math.isnan(tokens_per_s) else tokens_per_s
        summary["mfu"] = None if math.isnan(mfu) else mfu
        summary["compile_s"] = t["compile"]
        summary["peak_flops_source"] = self.peak.source
        summary["peak_flops"] = self.peak.flops if self.peak.known else None
        summary["peak_flops_note"] = self.peak.note if self.peak.known else None

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
    {step, loss} (plus the step's eval loss, for keep_best, and what `meta()` returns, e.g. the metrics
    logger's open interval) into the run's `RunCheckpointer`. `save` is the one way the run saves, also
    when a signal stops it."""

    last = True

    def __init__(self, checkpointer: RunCheckpointer, data_iterator, every: int, start_step: int,
                 meta: Callable[[], dict] | None = None):
        self.checkpointer, self.data_iterator, self.every = checkpointer, data_iterator, every
        self.meta = meta or dict
        self.saved_step = start_step  # the latest step whose state is on disk (or being written)

    def save(self, step: int, state: dict, metrics: dict) -> None:
        """Saves `state` as checkpoint `step` unless that step is saved already (never twice)."""
        if step == self.saved_step:
            return
        self.checkpointer.save(step, state, self.data_iterator,
                               {"step": step, "loss": metrics.get("loss"), **self.meta()}, metrics.get("eval_loss"))
        self.saved_step = step

    def on_step(self, event: StepEvent) -> None:
        self.save(event.step, event.state, event.metrics)
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
