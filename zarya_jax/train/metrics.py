"""Metrics: JSONL + TensorBoard (+ Weights & Biases / trackio, `trackers`) writers, the
model-FLOPs-utilisation (MFU) estimate, and the device tables (bf16 peak FLOP/s, HBM bandwidth) that MFU
and the decode roofline are measured against; a device with no table entry (a CPU) gets its peak measured
(once per process, when an MFU is first computed)."""
from __future__ import annotations

import functools
import json
import math
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp

from ..config import ModelConfig
from ..files import atomic_write
from .trackers import Tracker

# Dense bf16 peak FLOP/s per device (vendor data sheets), matched as substrings of `device_kind`.
PEAK_FLOPS = (
    ("TPU v6", 918e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12),
    ("TPU v5", 459e12), ("TPU v4", 275e12), ("TPU v3", 123e12),
    ("B200", 2250e12), ("H200", 989e12), ("H100", 989e12), ("GH200", 989e12), ("A100", 312e12),
    ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12), ("RTX 4090", 165e12), ("V100", 125e12),
)


# HBM bandwidth in bytes/s per device (vendor data sheets), matched in order as substrings of `device_kind`: the
# memory roofline of decoding (every weight is read once per forward pass).
HBM_BANDWIDTH = (
    ("TPU v6", 1640e9), ("TPU v5p", 2765e9), ("TPU v5 lite", 819e9), ("TPU v5e", 819e9), ("TPU v5", 2765e9),
    ("TPU v4", 1228e9), ("TPU v3", 900e9),
    ("B200", 8000e9), ("GH200", 4000e9), ("H200", 4800e9), ("H100 PCIe", 2000e9), ("H100", 3350e9),
    ("A100-SXM4-80GB", 2039e9), ("A100 80GB", 1935e9), ("A100", 1555e9), ("L40S", 864e9), ("L4", 300e9),
    ("A10", 600e9), ("RTX 4090", 1008e9), ("V100", 900e9),
)


def _lookup(table, kind: str) -> float | None:
    for name, value in table:
        if name.lower() in kind.lower():
            return value
    return None


def hbm_bandwidth(device=None, override: float = 0.0) -> tuple[float | None, str]:
    """(bytes/s of one device's memory, how it was obtained); None for a kind not in `HBM_BANDWIDTH`
    (e.g. a CPU) unless `override` gives it."""
    device = device or jax.devices()[0]
    if override > 0:
        return override, f"given ({override / 1e9:.0f} GB/s)"
    value = _lookup(HBM_BANDWIDTH, device.device_kind)
    if value is None:
        return None, f"unknown memory bandwidth of {device.device_kind!r} (give one)"
    return value, f"{device.device_kind} {value / 1e9:.0f} GB/s"


class Peak:
    """Peak FLOP/s of a set of devices (`device_peak`): `source` ('given': `train.peak_flops`; 'table':
    `PEAK_FLOPS`; 'measured': `measured_peak`), `flops` (total) and `note` (how it was obtained). A peak
    to be measured is measured when `flops` is first read, not before: a run that reports no MFU never
    spends the second it takes."""

    def __init__(self, source: str, note: str, flops: float | Callable[[], tuple[float, str]]):
        self.source, self._note, self._flops = source, note, flops  # flops: the value, or () -> (value, detail)

    @property
    def known(self) -> bool:
        """Whether `flops` is at hand (reading it runs no measurement)."""
        return not callable(self._flops)

    @property
    def flops(self) -> float:
        if callable(self._flops):
            self._flops, detail = self._flops()
            self._note += detail
        return self._flops

    @property
    def note(self) -> str:
        return self._note if self.known else f"{self._note} (when the first MFU is computed)"


def _bench_size(device) -> int:
    return 1024 if device.platform == "cpu" else 8192


@functools.cache
def measured_peak(device, dtype: str = "float32") -> float:
    """FLOP/s of a square matmul in `dtype` on `device`, the best of a few runs (about a second on a CPU;
    measured once per process and device). On CPU it is the host's: one device's program uses every core."""
    n = _bench_size(device)
    a = jax.device_put(jnp.ones((n, n), dtype), device)
    matmul = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(matmul(a, a))  # compile and warm up
    best = math.inf
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(matmul(a, a))
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def device_peak(devices=None, override: float = 0.0, dtype: str = "float32") -> Peak:
    """The peak FLOP/s MFU is measured against: `override` per device when given, else the device table
    (bf16 data sheets), else a matmul in the compute `dtype` (`measured_peak`, run when the peak is first
    read). CPU devices share the host's cores, so their peak is the host's whatever the number of (virtual)
    devices."""
    devices = list(jax.devices() if devices is None else devices)
    if override > 0:
        return Peak("given", f"given ({override:.3g}/device)", override * len(devices))
    kind = devices[0].device_kind
    peak = None if devices[0].platform == "cpu" else _lookup(PEAK_FLOPS, kind)
    if peak is not None:
        return Peak("table", f"{kind} bf16 peak {peak / 1e12:.0f} TFLOP/s × {len(devices)}", peak * len(devices))
    n = 1 if devices[0].platform == "cpu" else len(devices)
    size = _bench_size(devices[0])

    def measure() -> tuple[float, str]:
        one = measured_peak(devices[0], dtype)
        return one * n, f" at {one / 1e9:.1f} GFLOP/s" + (
            f" × {n}" if n > 1 else " (the host's cores)" if devices[0].platform == "cpu" else "")

    return Peak("measured", f"measured: {size}×{size} {dtype} matmul", measure)


def train_flops_per_token(config: ModelConfig, seq_len: int, forward_passes: float = 1.0) -> float:
    """6·N (matmul params, LM head included even when tied, embedding lookup excluded) plus the
    attention term 12·layers·heads·head_dim·seq_len (QKᵀ and AV, forward + backward), times the
    number of forward passes the objective makes per example."""
    table = config.vocab_size * config.hidden_size
    n = config.num_params() - table + (table if config.tie_word_embeddings else 0)
    attn = 12 * config.num_layers * config.num_heads * config.head_dim * seq_len
    return forward_passes * (6 * n + attn)


class MetricsLog:
    """Appends `{"step": s, ...}` lines to WORKDIR/metrics.jsonl, scalars to TensorBoard (WORKDIR/tb) and
    the rows to an experiment tracker (`tracker`: a function opening one, `trackers.open_tracker`).

    On resume from step s, lines after s are dropped first so the file reads as one uninterrupted run.
    Only process 0 writes (and opens the tracker).
    """

    def __init__(self, workdir: str, start_step: int, tensorboard: bool = True,
                 tracker: Callable[[], Tracker | None] | None = None):
        self.enabled = jax.process_index() == 0
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = self._tracker = None
        if not self.enabled:
            return
        if os.path.exists(self.path):
            with open(self.path) as f:
                lines = [line for line in f if line.strip()]
            keep = [line for line in lines if json.loads(line).get("step", 0) <= start_step]
            if len(keep) < len(lines):  # untouched when nothing is dropped (a rerun of a finished run)
                atomic_write(self.path, "".join(keep))
        self._file = open(self.path, "a")
        if tensorboard:
            from tensorboardX import SummaryWriter  # protobuf and friends load only when a run logs
            self._tb = SummaryWriter(os.path.join(workdir, "tb"))
        if tracker is not None:
            self._tracker = tracker()

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": int(step)}
        for k, v in metrics.items():
            row[k] = v if isinstance(v, (str, int)) else float(v)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        if self._tracker is not None:
            self._tracker.log(int(step), {k: v for k, v in row.items() if k != "step"})

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._tracker is not None:
            self._tracker.close()


def read_metrics(workdir: str) -> list[dict]:
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
