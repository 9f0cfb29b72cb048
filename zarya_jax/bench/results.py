"""What every benchmark shares: wall-clock timing, pooled statistics, Markdown tables and the result files
(`NAME.json` with the code's provenance: commit, dirty tree, package versions, machine; `NAME.md`)."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from ..files import atomic_write, atomic_write_json
from ..provenance import provenance

GIB = 1 << 30


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), wall seconds). `fn` must block until its result is ready (`jax.block_until_ready`)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def timings(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of `repeats` calls of `fn` (which must block until its result is ready)."""
    return [timed(fn)[1] for _ in range(repeats)]


def pooled(per_round: list[list[float]]) -> dict:
    """{'median_s', 'min_s', 'calls'} over the timed calls of every round."""
    calls = [t for times in per_round for t in times]
    return {"median_s": statistics.median(calls), "min_s": min(calls), "calls": len(calls)}


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(out_dir: str, name: str, results: dict, markdown: str) -> None:
    """`out_dir/name.json` (`results` and the code's provenance) and `out_dir/name.md`, each written
    atomically."""
    atomic_write_json(f"{out_dir}/{name}.json", {**results, "provenance": provenance()})
    atomic_write(f"{out_dir}/{name}.md", markdown)
