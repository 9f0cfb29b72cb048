"""The roofline by the target's own compiler: what a program reads and computes per chip, and the time that bounds.

`compiled.cost_analysis()` of a program compiled for the target (`zarya_jax.target`: a TPU topology through
libtpu, a GPU through the CUDA plugin, no chip needed) gives its FLOPs and bytes accessed per chip and the
compiler's `optimal_seconds`. Three things keep those from being read off a whole program:

- a `while_loop`'s body is counted once, whatever its trip count: the layer scan counts one layer, a decode
  loop one cycle, the live cache's read (`nn.attention.live`) one block. So a program is costed at `LAYERS`
  (two and four layers, unrolled by `scan_unroll`; a one-layer scan is still a loop) and `extrapolate`d to
  the model's depth (the layers are identical);
  a decode pass is costed with the cache read densely (`cache_block=0`) from a cache allocated for exactly
  the rows the live read reads (`live_rows`: the live context rounded up to whole blocks); and a decoding
  mode's cycle is the sum of its passes (`sampling.passes.cycle_windows`). Loops left in a costed program
  (a loss computed over sequence chunks, a drafter's shifts) are counted once, and said so (`loops`).
- a Pallas kernel (splash attention) is a custom call the cost model does not look inside: its FLOPs and
  bytes are missing from the counts, and the row says so.
- `optimal_seconds` can be negative or tiny for small programs: it is reported where positive, never used.

The FLOPs are exact (a matmul's 2mnk, linear in the depth); the bytes are the cost model's estimate of
its fused program's traffic, which at real decode shapes is not linear in the depth (qwen3-1.7b at batch 64
on v5e:4x4: 0.80, 0.77, 0.89 GB per chip at two, three, four layers) and can fall below what a pass must
read, or below zero once extrapolated. So a decode pass's bytes are never taken below the hand bound.

What is used is `seconds`: max(bytes ÷ HBM bandwidth, FLOPs ÷ peak) with the chip's data-sheet figures
(`train.metrics.HBM_BANDWIDTH`, `PEAK_FLOPS`), held against a hand roofline (`decode_hand_bytes`: the weights
and live K/V a chip of the mesh must read at the least; `train.metrics.train_flops_per_token`: 6N + attention
for a train step, so an MFU bound). Every figure here is the compiler's cost model, not a measurement.
"""
from __future__ import annotations

import dataclasses
import re

from ..config import ModelConfig
from ..train.metrics import HBM_BANDWIDTH, PEAK_FLOPS, _lookup
from .device import cache_bytes_per_row, weight_bytes


@dataclasses.dataclass(frozen=True)
class Counts:
    """Per chip: FLOPs, bytes accessed, the compiler's optimal seconds (None where not positive) and the loop
    bodies the counts hold once (`loops`)."""

    flops: float
    bytes: float
    optimal_s: float | None = None
    loops: int = 0

    def __add__(self, other: "Counts") -> "Counts":
        opt = None if self.optimal_s is None or other.optimal_s is None else self.optimal_s + other.optimal_s
        return Counts(self.flops + other.flops, self.bytes + other.bytes, opt, max(self.loops, other.loops))


class NoCostAnalysis(RuntimeError):
    """The compiler gave no counts (XLA:GPU compiling for a topology, with no GPU, gives none)."""


def counts(compiled, text: str | None = None) -> Counts:
    """The compiler's counts of one compiled program (`text`: its lowered StableHLO, for the loops left in it)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost  # a list of one dict in older JAX
    if not cost:
        raise NoCostAnalysis("the compiler gave no cost analysis for this program (XLA:GPU gives none when it "
                             "compiles for a GPU topology without a GPU)")
    opt = float(cost.get("optimal_seconds", 0.0))
    return Counts(float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)), opt if opt > 0 else None,
                  0 if text is None else len(re.findall(r"stablehlo\.while", text)))


LAYERS = (2, 4)  # the depths a program is costed at (two increments: the bytes of one are noisy)


def extrapolate(low: Counts, high: Counts, layers: int) -> Counts:
    """Counts at `layers` layers from those at `LAYERS` (identical layers: each adds `high − low`)."""
    grow = lambda a, b: a + (layers - LAYERS[0]) * (b - a) / (LAYERS[1] - LAYERS[0])  # noqa: E731
    opt = None if low.optimal_s is None or high.optimal_s is None else grow(low.optimal_s, high.optimal_s)
    return Counts(grow(low.flops, high.flops), grow(low.bytes, high.bytes), opt if opt and opt > 0 else None,
                  max(low.loops, high.loops))


def unrolled(cfg: ModelConfig, layers: int) -> ModelConfig:
    """`cfg` at `layers` layers, the layer scan unrolled (so the compiler counts every layer)."""
    return cfg.replace(num_layers=layers, scan_unroll=layers)


@dataclasses.dataclass(frozen=True)
class Chip:
    """A chip's data-sheet HBM bandwidth (bytes/s) and bf16 peak (FLOP/s), by `device_kind`."""

    kind: str
    bandwidth: float
    peak: float

    @classmethod
    def of(cls, device) -> "Chip | None":
        """None for a device the tables do not know (e.g. a CPU)."""
        return cls.of_kind(device.device_kind)

    @classmethod
    def of_kind(cls, kind: str) -> "Chip | None":
        bw, peak = _lookup(HBM_BANDWIDTH, kind), _lookup(PEAK_FLOPS, kind)
        return None if bw is None or peak is None else cls(kind, bw, peak)

    def seconds(self, c: Counts, least_bytes: float = 0.0) -> float:
        """The roofline time of `c`: max(bytes ÷ bandwidth, FLOPs ÷ peak), the bytes no fewer than `least_bytes`
        (what the program must read, `decode_hand_bytes`: the cost model's bytes can fall below it)."""
        return max(max(c.bytes, least_bytes) / self.bandwidth, c.flops / self.peak)

    def bound(self, c: Counts, least_bytes: float = 0.0) -> str:
        """'memory' or 'compute': which side of the roofline `c` is on."""
        return "memory" if max(c.bytes, least_bytes) / self.bandwidth >= c.flops / self.peak else "compute"


def live_rows(context: int, block: int) -> int:
    """Cache rows the live read reads for `context` live rows: whole blocks of `block` (0: dense, the rows)."""
    return context if block <= 0 else -(-context // block) * block


def decode_hand_bytes(cfg: ModelConfig, chips: int, batch: int, rows: int) -> float:
    """The least bytes a chip reads in one decode pass at `batch` with `rows` live cache rows per sequence: the
    weights and the batch's live K/V, each byte read once by one of `chips` (the mesh may do worse: FSDP
    gathering whole layers makes every chip read every weight)."""
    return (weight_bytes(cfg) + batch * cache_bytes_per_row(cfg, rows)) / chips
