"""Supervised batch format (docs/algorithms.md §2–§3): prompt + answer examples padded (and optionally packed)
into fixed-length rows.

A batch is a dict of NumPy arrays, every row of length L:
  tokens      int32 [B, L]  token ids, `pad_id` on padding
  segment_ids int32 [B, L]  1, 2, … per example packed in the row, 0 on padding
  positions   int32 [B, L]  logical position inside the token's own example (0 at its first token;
                            0 on padding)
  answer_mask bool  [B, L]  supervised answer tokens; the prompt is `segment_ids > 0 & ~answer_mask`

Each example occupies one contiguous run of a row, prompt first then answer, and the examples of a
row come in increasing segment id followed by the padding. The transforms (`slots.py`, `noise.py`)
rely on this layout; build batches with the functions here.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

KEYS = ("tokens", "segment_ids", "positions", "answer_mask")


class BatchError(ValueError):
    """An example does not fit the requested batch layout."""


def _as_ids(x, what: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise BatchError(f"{what}: expected a flat list of token ids, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise BatchError(f"{what}: expected integer token ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= 2 ** 31):
        raise BatchError(f"{what}: token ids must lie in [0, 2^31), got min {arr.min()} max {arr.max()}")
    return arr


def _check_examples(examples, length: int) -> list[tuple[np.ndarray, np.ndarray]]:
    if not isinstance(length, (int, np.integer)) or length < 1:
        raise BatchError(f"length={length!r}: expected a positive integer")
    out = []
    for i, ex in enumerate(examples):
        if len(ex) != 2:
            raise BatchError(f"example {i}: expected a (prompt_ids, answer_ids) pair, got {len(ex)} items")
        prompt = _as_ids(ex[0], f"example {i} prompt")
        answer = _as_ids(ex[1], f"example {i} answer")
        n = prompt.size + answer.size
        if n == 0:
            raise BatchError(f"example {i} is empty (no prompt and no answer tokens)")
        if n > length:
            raise BatchError(
                f"example {i} has {n} tokens (prompt {prompt.size} + answer {answer.size}), more than the "
                f"row length {length}; truncate or drop it before batching")
        out.append((prompt, answer))
    return out


def pack_first_fit(sizes: Sequence[int], length: int) -> list[list[int]]:
    """Greedy first-fit: each example (in order) goes into the first row with room. Returns row bins
    of example indices."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(sizes):
        for r, free in enumerate(room):
            if n <= free:
                bins[r].append(i)
                room[r] -= n
                break
        else:
            bins.append([i])
            room.append(length - n)
    return bins


def _fill(rows: list[list[tuple[np.ndarray, np.ndarray]]], length: int, pad_id: int) -> dict[str, np.ndarray]:
    b = len(rows)
    tokens = np.full((b, length), pad_id, np.int32)
    segment_ids = np.zeros((b, length), np.int32)
    positions = np.zeros((b, length), np.int32)
    answer_mask = np.zeros((b, length), bool)
    for r, row in enumerate(rows):
        at = 0
        for s, (prompt, answer) in enumerate(row, start=1):
            n = prompt.size + answer.size
            tokens[r, at:at + n] = np.concatenate([prompt, answer])
            segment_ids[r, at:at + n] = s
            positions[r, at:at + n] = np.arange(n)
            answer_mask[r, at + prompt.size:at + n] = True
            at += n
    return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions, "answer_mask": answer_mask}


def make_batch(examples, length: int, pad_id: int, pack: bool = False) -> dict[str, np.ndarray]:
    """Builds a batch from `examples`, a list of (prompt_ids, answer_ids).

    pack=False: one row per example. pack=True: greedy first-fit packing, as many rows as needed.
    Raises BatchError if an example is longer than `length` (truncate or drop it before).
    """
    checked = _check_examples(examples, length)
    if not checked:
        raise BatchError("make_batch: expected at least one example")
    if pack:
        bins = pack_first_fit([p.size + a.size for p, a in checked], length)
        rows = [[checked[i] for i in row] for row in bins]
    else:
        rows = [[ex] for ex in checked]
    return _fill(rows, length, pad_id)


def make_batch_rows(examples, length: int, pad_id: int, num_rows: int, pack: bool = True):
    """Fixed-rows variant for a data pipeline: exactly `num_rows` rows (unused rows are all padding).

    Examples are placed in order (first-fit when `pack`, else one per row); those that do not fit
    are returned, in order, for the next batch. Returns (batch, leftover_examples).
    """
    if not isinstance(num_rows, (int, np.integer)) or num_rows < 1:
        raise BatchError(f"num_rows={num_rows!r}: expected a positive integer")
    checked = _check_examples(examples, length)
    rows: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(num_rows)]
    room = [length] * num_rows
    leftover = []
    next_row = 0
    for ex, (p, a) in zip(examples, checked):
        n = p.size + a.size
        placed = False
        if pack:
            for r in range(num_rows):
                if n <= room[r]:
                    rows[r].append((p, a))
                    room[r] -= n
                    placed = True
                    break
        elif next_row < num_rows:
            rows[next_row].append((p, a))
            next_row += 1
            placed = True
        if not placed:
            leftover.append(ex)
    return _fill(rows, length, pad_id), leftover



# ------------------------------------------------------------ per-row layout (JAX, inside jit/vmap)

def row_layout(segment_ids, answer_mask):
    """Per-token view of one row's examples (docs/algorithms.md §2–§3), for use inside `vmap`.

    segment_ids int [L], answer_mask bool [L] -> dict of [L] arrays:
      ans_start  physical index of the first answer token of the token's example (L if none)
      ans_index  index of the token inside its example's answer (valid where answer_mask)
      ans_len    number of answer tokens of the token's example
      example    segment_ids - 1 clipped to [0, L) (index into per-example draws)
      sort_seg   segment id with padding mapped past every example (sort key keeping examples in place)
    """
    length = segment_ids.shape[0]
    idx = jnp.arange(length, dtype=jnp.int32)
    seg = segment_ids.astype(jnp.int32)
    starts = jax.ops.segment_min(jnp.where(answer_mask, idx, length), seg, num_segments=length + 1)
    counts = jax.ops.segment_sum(answer_mask.astype(jnp.int32), seg, num_segments=length + 1)
    ans_start = jnp.minimum(starts[seg], length)
    return {
        "idx": idx,
        "ans_start": ans_start,
        "ans_index": jnp.where(answer_mask, idx - ans_start, 0),
        "ans_len": counts[seg],
        "example": jnp.clip(seg - 1, 0, length - 1),
        "sort_seg": jnp.where(seg > 0, seg, length + 1),
    }
