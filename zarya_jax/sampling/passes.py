"""One decode pass as a program of its own: the unit every decoding mode repeats (docs/algorithms.md §4–§7), for the
device benchmark (cost of a pass against its window size) and the memory plan (`experiments.bench`).

Inside `generate` the KV cache never leaves a mode's compiled `while_loop`, which updates it in place
(`kv_cache.commit` is one scatter into the loop-carried buffer). Here a pass is its own `jax.jit` and
the cache is *donated*: the returned cache reuses the argument's buffers, so a Python loop of passes
holds one cache, not two.

- `window_rows(gcfg)`: the rows of one pass of each mode: AR 1; mode A 2K (`mdm.window_rows`); mode B one
  block (`slotted.block_layout`); Ψ-Spec F (F + 1 with the self drafter: the seed and F masks); fused
  Ψ-Spec (K+1)(K+2) with the self drafter, (K+1)² with the LoRA drafter (`fused.window_rows`).
- `cycle_windows(gcfg)`: the window rows of every pass one cycle of a lossless mode runs (AR: one row;
  two-pass Ψ-Spec: its draft pass(es), then the F + 1-row verify pass; fused: its one window), which the
  pass-cost curve turns into time (`zarya_jax.eval.speed`).
- `pass_costs(params, config, batches, windows, context, repeats)`: that curve, ms per cached pass against
  its window rows at each batch size, measured on the device in use; a point that still fails after its
  remeasurements (`failed_points`: at the timer's floor, or out of order) is kept marked `failed`, no cost.
- `cache_rows(gcfg, prompt_len)`: the rows of the cache each mode allocates.
- `cached_pass(params, cache, tokens, positions, *, config)`: a causal window [B, W] at logical
  `positions` against every committed cache row; returns (logits fp32 [B, W, V], the cache with the
  whole window committed). `decode_pass` is it under `jax.jit` with the cache donated; wrap `cached_pass`
  in your own `jax.jit(..., in_shardings=…, donate_argnames="cache")` to place it on a mesh.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ..nn import kv_cache
from ..timing import loop_slope_ms
from .. import model as model_lib
from . import ar, decoding, fused, mdm, slotted, spec, spec_model
from .config import GenerationConfig

Array = jax.Array


SPECULATIVE = (spec.TwoPass, spec_model.SpecModel, fused.Fused)  # a cache with Ψ-Spec's slack rows


def window_rows(gcfg: GenerationConfig) -> int:
    mode = gcfg.mode
    if isinstance(mode, ar.AR):
        return 1
    if isinstance(mode, mdm.MDM):
        return 2 * mdm.window_rows(gcfg)
    if isinstance(mode, slotted.Slotted):
        return slotted.block_layout(gcfg)[1]
    if isinstance(mode, fused.Fused):
        return fused.window_rows(gcfg)
    return mode.draft_length + (1 if mode.drafter == "self" else 0)


def cache_rows(gcfg: GenerationConfig, prompt_len: int) -> int:
    if isinstance(gcfg.mode, SPECULATIVE):
        return spec.cache_rows(gcfg, prompt_len)
    return prompt_len + gcfg.max_new_tokens


def cached_pass(params, cache: dict, tokens: Array, positions: Array, *, config) -> tuple[Array, dict]:
    logits, kv = model_lib.apply(params, config, tokens, positions, cache=cache)
    return logits, kv_cache.commit(cache, kv, jnp.ones(tokens.shape, bool))


decode_pass = functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))(cached_pass)


def cycle_windows(gcfg: GenerationConfig) -> tuple[int, ...] | None:
    """The window rows of each base-model pass of one cycle of `gcfg`'s mode, in order; None for a mode
    whose cycle this does not cost (the lossy modes, and `spec-model`, whose draft passes run another model)."""
    mode = gcfg.mode
    if isinstance(mode, ar.AR):
        return (1,)
    if isinstance(mode, fused.Fused):
        return (fused.window_rows(gcfg),)
    if isinstance(mode, spec.TwoPass):
        return (window_rows(gcfg),) * getattr(mode, "draft_passes", 1) + (mode.draft_length + 1,)
    return None


FLOOR_MS = 1e-3
"""A curve point at or below this many ms per pass is a failed measurement, not a cost: no cached forward
pass on any device takes 1 µs (a kernel launch alone takes microseconds; a smoke run's tiny model takes tens
of µs a pass on a CPU), but the loop's slope on a noisy machine can come out at that or below, even ≤ 0
(`timing.loop_slope_ms`: a difference of best times; one such run gave 0.26 µs beside 0.17 ms for 4 rows)."""

ORDER_TOLERANCE = 0.8
"""A pass of more rows (a wider window at its batch, or its window at a bigger batch) costing under this
fraction of one it contains is out of order, a failed measurement; an inversion within noise is allowed."""

RETRIES = 3
"""Remeasurements of a failed curve point (`pass_costs`), each with `min_s` ×8 over the last."""


def failed_points(rows: list[dict]) -> dict[tuple[int, int], str]:
    """The failed points of a pass-cost curve ({batch, window, ms_per_pass} rows) and why (a line naming the
    point and its ms), by (batch, window). A point fails
    - marked `failed` already (a saved curve; its reason is kept);
    - at the floor: ms_per_pass None or not above `FLOOR_MS`;
    - out of order: of two points not at the floor, one that dominates the other (the same batch with more
      window rows, or the same window at a bigger batch) costs under `ORDER_TOLERANCE`× it. Which of the
      two is blamed: one bad point inverts against several (a spike at window 1 against every wider
      window, a collapsed wide window against every narrower one), so the point in the most inversions is
      blamed first, a tie going to the dominating, cheaper one (a slope collapsing towards 0, as at the
      floor, is the usual failure); its inversions are dropped, and so on until none are left.
    A narrower pass may cost less per row than a wider one: on a CPU a pass costs about in proportion to its
    rows, or more (a 25-row pass at 1.49 ms beside a 4-row one at 0.19 ms), so that is no failure."""
    out, ms = {}, {}
    for r in rows:
        key, v = (r["batch"], r["window"]), r["ms_per_pass"]
        if r.get("failed"):
            out[key] = r["failed"]
        elif v is None or not v > FLOOR_MS:
            out[key] = f"{_point(key)}: {_ms(v)} per pass is at the timer's floor (not above {FLOOR_MS:g} ms)"
        else:
            ms[key] = v
    inversions = [(small, big) for small in ms for big in ms
                  if _dominates(big, small) and ms[big] < ORDER_TOLERANCE * ms[small]]
    while inversions:
        blamed = max(ms, key=lambda k: (sum(k in pair for pair in inversions), sum(k == big for _, big in inversions)))
        small, big = next(pair for pair in inversions if blamed in pair)
        other = small if blamed == big else big
        out[blamed] = (f"{_point(blamed)}: {_ms(ms[blamed])} per pass is out of order with {_point(other)} "
                       f"({_ms(ms[other])}): the pass of more rows costs under {ORDER_TOLERANCE:g}× the other")
        inversions = [pair for pair in inversions if blamed not in pair]
    return out


def _point(key: tuple[int, int]) -> str:
    return f"batch {key[0]}, window {key[1]}"


def _ms(v: float | None) -> str:
    return "no ms" if v is None else f"{v:.4g} ms"


def _dominates(big: tuple[int, int], small: tuple[int, int]) -> bool:
    """`big` is the pass of `small` with more rows: the same batch and a wider window, or the same window
    at a bigger batch."""
    return (big[0] == small[0] and big[1] > small[1]) or (big[1] == small[1] and big[0] > small[0])


def pass_costs(params, config, batches, windows, context: int, repeats: int, passes: int = 8,
               on_row=None, min_s: float = 0.01, allocated: int = 0) -> list[dict]:
    """The pass-cost curve: ms per cached pass of W rows at batch b, for each (batch, window), against a cache
    of `context` committed rows, allocated for `allocated` rows (0: context + W; a decode loop's cache is
    allocated for its whole budget, and a pass reads only the live rows unless `config.cache_block` is 0).
    Passes run in one compiled loop (`_repeated_pass`: each reads the cache and
    commits its window, as a decode loop's pass does), timed at 1 and at 1 + n passes (`timing.loop_slope_ms`,
    best of `repeats` each; n from `passes` up, ×8 at a time, until the n passes take `min_s`): the slope is
    a pass without the call's dispatch and transfers, and the n passes' time is well above a call's jitter.

    A point that fails (`failed_points`: at the timer's floor, or out of order) is remeasured, up to
    `RETRIES` times with `min_s` ×8 each time (longer loops, further above the jitter); one that still
    fails is kept with `failed` (the reason), its raw slope as `measured_ms` and None for ms_per_pass
    and the ratios, so that no consumer can use it. Rows: {batch, window, ms_per_pass, vs_window_1 (the
    ratio to the batch's first window; None when either failed), ms_per_token_row, measurements (how
    many times it was timed)}, plus `failed` and `measured_ms` on a failed point. `on_row(row)` is told
    each measurement as it is made (one compiled program each: {batch, window, ms_per_pass,
    measurements}), and each failure found, before its remeasurement or as final ({…, failed})."""
    windows = list(windows)

    def measure(b, w, s):
        cache = kv_cache.init(config, b, max(allocated, context + w))
        cache = dict(cache, length=jnp.full((b,), context, jnp.int32))
        tokens = jnp.zeros((b, w), jnp.int32)
        run = lambda n: _repeated_pass(params, cache, tokens, jnp.int32(n), config=config)  # noqa: E731
        return loop_slope_ms(run, repeats, passes, s)

    def tell(row):
        if on_row:
            on_row(dict(row))

    rows = {}
    for b in batches:
        for w in windows:
            rows[b, w] = {"batch": b, "window": w, "ms_per_pass": measure(b, w, min_s), "measurements": 1}
            tell(rows[b, w])
    failed = failed_points(list(rows.values()))
    for _ in range(RETRIES):
        if not failed:
            break
        for key, why in failed.items():
            r = rows[key]
            tell(dict(r, failed=why))
            r.update(ms_per_pass=measure(*key, min_s * 8 ** r["measurements"]), measurements=r["measurements"] + 1)
            tell(r)
        failed = failed_points(list(rows.values()))
    for key, why in failed.items():
        r = rows[key]
        r.update(failed=why, measured_ms=r["ms_per_pass"], ms_per_pass=None)
        tell(r)
    out = []
    for (b, w), r in rows.items():
        base, ms = rows[b, windows[0]]["ms_per_pass"], r["ms_per_pass"]
        out.append({**r, "vs_window_1": None if ms is None or base is None else ms / base,
                    "ms_per_token_row": None if ms is None else ms / w})
    return out


@functools.partial(jax.jit, static_argnames=("config",))
def _repeated_pass(params, cache: dict, tokens: Array, n: Array, *, config) -> Array:
    """`n` (traced) cached passes of `tokens` [b, W] in one loop, each after the cache's committed rows (the
    cache's length is put back after each commit, so every pass sees the same context; each pass's input
    depends on the last one's logits, so none is skipped); returns the last logits' sum. The layers
    run as `generate` runs them by default (`decoding.layer_weights`)."""
    params, = decoding.layer_weights((params,))
    length = cache["length"]
    positions = length[:, None] + jnp.arange(tokens.shape[1], dtype=jnp.int32)[None, :]

    def body(_, carry):
        c, acc = carry
        logits, c = cached_pass(params, c, tokens + (acc > 0).astype(jnp.int32), positions, config=config)
        return dict(c, length=length), jnp.sum(logits)

    return jax.lax.fori_loop(0, n, body, (cache, jnp.float32(0)))[1]
