"""The training loop at a signal and across a resume, with a step made slow (a loop of matmuls beside
the loss) so that a signal lands while it runs: SIGINT during step N stops after at most that step (no
second step runs after the signal), saves it once, exits 130; the resumed run ends bit-exact with an
uninterrupted one and its metrics.jsonl holds the same rows (the logging interval that spans the resume
included); the summary's throughput and MFU are measured (the CPU's peak measured) with no row logged.
The CPU's peak is measured only when an MFU is first computed, at most once per process, with no step
on the device, and its time is not step time."""
import dataclasses
import math
import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import cli
from zarya_jax.objectives.zarya import zarya_objective
from zarya_jax.train import config as rc
from zarya_jax.train.hooks import Hook, MetricsLogger, StepEvent
from zarya_jax.train.loop import train
from zarya_jax.train.metrics import Peak, device_peak, measured_peak, read_metrics
from zarya_jax.testing import write_sum_records

OVERRIDES = {"mesh.num_devices": 1, "data.max_length": 24, "data.batch_size": 4, "data.eval_fraction": 0,
             "optim.lr": 1e-2, "optim.warmup_steps": 1, "train.steps": 6, "train.log_every": 4, "train.save_every": 0,
             "train.keep_best": 0, "train.export_final": False, "train.progress_bar": False,
             "train.async_checkpointing": False, "zarya.slot_size_set": [2], "zarya.slot_step_borders": [1.0]}
TIMING = ("tokens_per_s", "mfu", "step_time_s")
SIGNAL_AT = 2  # SIGINT while step 2 runs: inside the logging interval 1–4, so the resume splits it
STEP_S, DELAY_S = 0.4, 0.1  # a step's least duration; the signal's delay after the step started
SPIN = 256


def _spin(x, iterations):
    return jax.lax.fori_loop(0, iterations, lambda i, y: jnp.tanh(y @ y), x)


def spin_iterations(seconds: float) -> int:
    """Iterations of `_spin` that take at least `seconds` on this machine now (timed, with a margin)."""
    fn = jax.jit(_spin, static_argnums=1)
    x = jnp.full((SPIN, SPIN), 1e-3, jnp.float32)
    jax.block_until_ready(fn(x, 20))
    t = time.perf_counter()
    jax.block_until_ready(fn(x, 20))
    return max(20, math.ceil(1.5 * seconds / ((time.perf_counter() - t) / 20)))


def slowed(cfg, iterations: int):
    """The run's Zarya objective with `iterations` matmuls beside the loss: the same loss and gradients,
    a step that lasts. No host callback: those make XLA:CPU run the step before returning from its dispatch."""
    base = zarya_objective(cfg.model.replace(mask_token_id=259), cfg.zarya)

    def loss_fn(params, frozen, batch, key, info):
        loss, metrics = base.loss_fn(params, frozen, batch, key, info)
        x = jnp.full((SPIN, SPIN), 1e-3, jnp.float32) * batch["positions"][0, 1].astype(jnp.float32)
        return loss + 0.0 * _spin(x, iterations)[0, 0], metrics

    return dataclasses.replace(base, loss_fn=loss_fn)


class SignalDuring(Hook):
    """Records when each step finished (its metrics reached the host); once step `at` - 1's metrics are in
    (the loop has dispatched step `at` by then), sends SIGINT from another thread `delay` s later."""

    def __init__(self, at: int, delay: float):
        self.at, self.delay = at, delay
        self.finished: dict[int, float] = {}
        self.signalled: float | None = None

    def _send(self) -> None:
        self.signalled = time.perf_counter()
        os.kill(os.getpid(), signal.SIGINT)

    def on_metrics(self, event) -> None:
        self.finished[event.step] = event.time
        if event.step == self.at - 1:
            threading.Timer(self.delay, self._send).start()


def _params(summary):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(summary["state"]["params"]))]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_sum_records(tmp_path_factory.mktemp("data") / "train.jsonl", 24)


def test_sigint_stops_after_the_step_in_flight_and_the_resume_logs_the_same_rows(tmp_path, data_file):
    cfg = rc.build({"model": "tiny"}, {**OVERRIDES, "data.train": data_file})
    objective = slowed(cfg, spin_iterations(STEP_S))
    hook = SignalDuring(SIGNAL_AT, DELAY_S)
    stopped = train(cfg, str(tmp_path / "run"), objective=objective, hooks=[hook])

    assert stopped["status"] == "interrupted" and stopped["signal"] == signal.SIGINT
    assert cli.run_status(stopped) == 130
    after = [n for n, t in hook.finished.items() if t > hook.signalled]
    assert len(after) <= 1, after  # at most the step that was running: the next one was never dispatched
    assert stopped["step"] in (SIGNAL_AT, SIGNAL_AT + 1) and stopped["step"] == max(hook.finished)
    assert os.listdir(tmp_path / "run" / "checkpoints") == [str(stopped["step"])]
    # measured although no row was logged: compilation excluded, the CPU's peak measured
    assert stopped["tokens_per_s"] > 0 and 0 < stopped["mfu"] and stopped["peak_flops_source"] == "measured"
    assert stopped["compile_s"] > 0 and stopped["memory_peak_bytes"] > 0

    resumed = train(cfg, str(tmp_path / "run"), objective=objective, return_state=True)
    straight = train(cfg, str(tmp_path / "straight"), objective=objective, return_state=True)
    assert resumed["start_step"] == stopped["step"] and resumed["step"] == straight["step"] == 6
    for a, b in zip(_params(straight), _params(resumed)):
        np.testing.assert_array_equal(a, b)

    rows, want = read_metrics(tmp_path / "run"), read_metrics(tmp_path / "straight")
    assert [r["step"] for r in rows] == [r["step"] for r in want] == [4, 6]
    for row, ref in zip(rows, want):
        assert set(row) == set(ref)
        for key in set(ref) - set(TIMING):
            assert row[key] == pytest.approx(ref[key], rel=1e-6, abs=1e-9), key
        assert all(np.isfinite(row[k]) and row[k] > 0 for k in TIMING)


def test_the_peak_is_measured_when_first_read_and_once_per_process():
    measured_peak.cache_clear()
    peak = device_peak(jax.devices()[:1])
    assert peak.source == "measured" and not peak.known and peak.note.endswith("(when the first MFU is computed)")
    assert measured_peak.cache_info().currsize == 0  # building it (a train start) measured nothing
    flops = peak.flops
    assert peak.known and flops > 0 and "GFLOP/s (the host's cores)" in peak.note
    again = device_peak(jax.devices())  # another run of this process, on the 8 virtual devices of one host
    assert again.flops == flops and measured_peak.cache_info().misses == 1
    assert device_peak(override=2e12).known and device_peak(override=2e12).flops == 2e12 * len(jax.devices())


def test_metrics_logger_measures_the_peak_at_its_first_row_between_steps(tmp_path):
    """The logger is due (the loop waits for the step) only at its first row while the peak is unknown; the
    measurement's time counts neither in that row nor the next one, nor in the summary's throughput; a
    logger that saw no step measures nothing."""
    calls = []

    def slow_measure():
        calls.append(time.perf_counter())
        time.sleep(0.5)
        return 1e9, " at 1.0 GFLOP/s"

    for name in ("idle", "run"):
        (tmp_path / name).mkdir()
    idle = MetricsLogger(str(tmp_path / "idle"), 0, 2, 1, 4, 1.0, Peak("measured", "test matmul", slow_measure))
    summary = {}
    idle.on_end({}, summary)
    idle.close()
    assert calls == [] and summary["peak_flops"] is None and summary["peak_flops_source"] == "measured"

    logger = MetricsLogger(str(tmp_path / "run"), 0, 2, 1, 4, 1.0, Peak("measured", "test matmul", slow_measure))
    due = []
    for step in range(1, 7):
        time.sleep(0.02)  # the step
        event = StepEvent(step, 6, {"loss": 1.0, "grad_norm": 1.0, "lr": 0.1}, 4, 0, time=time.perf_counter())
        due.append(logger.due(step, 6))
        if due[-1]:
            logger.on_step(event)
        logger.on_metrics(event)
    summary = {}
    logger.on_end({}, summary)
    logger.close()
    assert due == [False, True, False, False, False, False] and len(calls) == 1
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert all(r["step_time_s"] < 0.25 for r in rows), rows  # 20 ms steps, not 0.5 s of measuring
    assert summary["tokens_per_s"] > 24 / 0.5 and summary["peak_flops"] == 1e9
    assert summary["peak_flops_note"] == "test matmul at 1.0 GFLOP/s"
