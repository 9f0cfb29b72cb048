"""Wall-clock timing of compiled JAX programs: one call, and the slope of a compiled loop.

A call's time includes what every call pays once (dispatch, the arguments' handling, a prefill); the
slope of a loop between two budgets does not: it is what one more step costs, as it does inside a
decode loop. Both the pass-cost curve (`sampling.passes.pass_costs`) and the cycle profile
(`bench.cycle`) time that way.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import jax
import numpy as np


def once_s(call: Callable[[], Any]) -> float:
    """Seconds of one call of `call` (compiled before), waited for."""
    t0 = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - t0


def slope_ms(run: Callable[[int], Any], steps: Callable[[Any, int], int], lo: int, hi: int,
             repeats: int) -> tuple[float, int, Any]:
    """(ms per step, steps of the long run, its output) of a compiled loop `run(budget)` timed at budgets `lo`
    and `hi`: Δ best time ÷ Δ steps it ran (`steps(output, budget)`), so what every call pays once (prefill,
    dispatch, the arguments' handling) cancels. The budgets take turns, `repeats` times, so both see the
    same machine load; the best of each counts (on a shared machine the least disturbed)."""
    out_hi = run(hi)  # these two calls compile, and say how many steps each budget runs
    n_lo, n_hi = steps(run(lo), lo), steps(out_hi, hi)
    if n_hi <= n_lo:
        raise ValueError(f"the loop ran {n_hi} steps at budget {hi} and {n_lo} at {lo}: raise the budget")
    best = {lo: np.inf, hi: np.inf}
    for _ in range(repeats):
        for budget in best:
            best[budget] = min(best[budget], once_s(lambda: run(budget)))  # noqa: B023 (called here)
    return 1e3 * (best[hi] - best[lo]) / (n_hi - n_lo), n_hi, out_hi


def loop_slope_ms(run: Callable[[int], Any], repeats: int, calls: int = 8, min_s: float = 0.005,
                  max_calls: int = 1 << 18) -> float:
    """ms per iteration of a compiled loop `run(n)` whose iteration count `n` is traced (one program for every
    count): `slope_ms` between 1 and 1 + `calls` iterations, `calls` first raised ×8 until the long run
    takes at least `min_s` longer than the short one (one try each, up to `max_calls`). A fixed count that
    is short next to a call's jitter (tenths of a ms on a busy CPU) lets one disturbed run move the slope
    by half; a difference of several ms keeps it to a few percent."""
    while calls < max_calls and _longer_s(run, calls) < min_s:
        calls *= 8
    return slope_ms(run, lambda _, n: n, 1, 1 + calls, repeats)[0]


def _longer_s(run: Callable[[int], Any], calls: int) -> float:
    """Seconds `run(1 + calls)` takes longer than `run(1)` (one try each: a calibration; the first call compiles)."""
    jax.block_until_ready(run(1 + calls))
    return once_s(lambda: run(1 + calls)) - once_s(lambda: run(1))
