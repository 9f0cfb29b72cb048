"""Checkpoint integrity: a checksum per array (and per side file) written at save, verified at load.

Orbax/TensorStore read whatever bytes are on disk: a flipped byte in a data file loads as a wrong
weight without a word, and a truncated file fails deep inside TensorStore. So every checkpoint records,
when it is written, a checksum of each array's bits (and of each small side file: configs, tokenizer),
and every load recomputes them on what was actually restored and compares. A mismatch, a missing
array or an unreadable file is one `CheckpointError` naming the checkpoint path.

The array checksum is two 32-bit position-weighted sums of the array's bits, read as little-endian
words of its item size (1, 2 or 4 bytes; 8-byte items as two 4-byte words) in C order:

    sum_a = Σ_i word_i · (2i + 1)              mod 2³²
    sum_b = Σ_i word_i · ((i · 0x9E3779B9) | 1)  mod 2³²

Every weight is odd, so any change of a single word changes both sums, and a swap of two words changes
`sum_a`. It is computed where the array lives: with NumPy for host arrays (in chunks, so a large
tensor needs no full-size temporary) and with one jitted reduction for device arrays, sharded or not,
so no array is gathered to one host. Both give the same number (tested against each other).
"""
from __future__ import annotations

import functools
import json
import re
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_MASK = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_CHUNK = 1 << 22  # words per NumPy chunk: 32 MB of uint64 temporaries


class CheckpointError(ValueError):
    """A checkpoint that is damaged, truncated, incomplete or does not fit what is asked of it."""


def _word_dtype(itemsize: int):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[itemsize]


def _numpy_sums(x: np.ndarray) -> tuple[int, int]:
    words = np.ascontiguousarray(x).reshape(-1).view(_word_dtype(x.dtype.itemsize))
    sum_a = sum_b = 0
    for start in range(0, words.size, _CHUNK):
        w = words[start:start + _CHUNK].astype(np.uint64)
        i = np.arange(start, start + w.size, dtype=np.uint64)
        # uint64 products of two 32-bit values cannot overflow; the sums wrap mod 2⁶⁴, a multiple of 2³².
        sum_a = (sum_a + int((w * ((2 * i + 1) & _MASK)).sum(dtype=np.uint64))) & _MASK
        sum_b = (sum_b + int((w * (((i * _GOLDEN) & _MASK) | 1)).sum(dtype=np.uint64))) & _MASK
    return sum_a, sum_b


def _device_sums(x: jax.Array) -> jax.Array:
    """uint32[2] of one (possibly sharded) array; traced, no reshape, so no resharding."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if x.ndim == 0:
        x = x[None]
    size = x.dtype.itemsize
    words = jax.lax.bitcast_convert_type(x, jnp.dtype(_word_dtype(size)))  # 8-byte items gain a last axis of 2
    words = words.astype(jnp.uint32)
    index = jnp.zeros(words.shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(words.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(stride & _MASK)
        stride *= words.shape[axis]
    sum_a = jnp.sum(words * (index * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)
    sum_b = jnp.sum(words * ((index * jnp.uint32(_GOLDEN)) | jnp.uint32(1)), dtype=jnp.uint32)
    return jnp.stack([sum_a, sum_b])


@functools.partial(jax.jit)
def _device_tree_sums(tree):
    return jax.tree.map(_device_sums, tree)


def _format(sums) -> str:
    return f"{int(sums[0]) & _MASK:08x}{int(sums[1]) & _MASK:08x}"


def _on_host(x) -> bool:
    """NumPy arrays, and jax arrays held whole by this process on the CPU, are summed with NumPy."""
    if isinstance(x, np.ndarray) or np.isscalar(x):
        return True
    return x.is_fully_addressable and all(d.platform == "cpu" for d in x.devices())


def array_checksums(tree: Any) -> dict[str, dict]:
    """{keystr path: {"shape", "dtype", "sum"}} for every leaf of a pytree of NumPy or jax arrays.

    Device arrays are summed on their devices in one jitted call (every process of a multi-host run
    must call this together, as with a save)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    device = {jax.tree_util.keystr(p): x for p, x in leaves if not _on_host(x)}
    device_sums = jax.device_get(_device_tree_sums(device)) if device else {}
    out = {}
    for path, x in leaves:
        key = jax.tree_util.keystr(path)
        sums = device_sums[key] if key in device_sums else _numpy_sums(np.asarray(x))
        out[key] = {"shape": list(np.shape(x)), "dtype": np.dtype(x.dtype).name, "sum": _format(sums)}
    return out


def compare(expected: dict[str, dict], actual: dict[str, dict], where: str) -> None:
    """Raises CheckpointError naming `where` when the arrays restored differ from those saved."""
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    changed = [k for k in expected if k in actual and expected[k] != actual[k]]
    if missing or extra or changed:
        parts = []
        if changed:
            parts.append(f"{len(changed)} array(s) differ from the checksums written at save, e.g. {changed[0]} "
                         f"({_describe(expected[changed[0]])} saved, {_describe(actual[changed[0]])} read)")
        if missing:
            parts.append(f"{len(missing)} array(s) missing, e.g. {missing[0]}")
        if extra:
            parts.append(f"{len(extra)} unexpected array(s), e.g. {extra[0]}")
        raise CheckpointError(f"checkpoint {where} is damaged: " + "; ".join(parts))


def _describe(record: dict) -> str:
    return f"{record['dtype']}{tuple(record['shape'])} sum {record['sum']}"


def file_checksum(path: str) -> str:
    """crc32 of a file's bytes (side files: configs, tokenizer), as 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def json_checksum(obj: Any) -> str:
    """crc32 of an object's canonical JSON (e.g. a data iterator's state)."""
    return f"{zlib.crc32(json.dumps(obj, sort_keys=True).encode()):08x}"


# What a TensorStore status code says of a checkpoint's data files, for a reader who never met TensorStore.
_STATUS_MEANING = {"OUT_OF_RANGE": "a data file is truncated",
                   "DATA_LOSS": "a data file's bytes are corrupt"}
_STATUS = re.compile(r"([A-Z][A-Z_]+): ")
_OBJECT_REPR = re.compile(r"\s*(See full \w+ details:\s*)?<[\w.]+[ >].*")


def describe_error(e: BaseException) -> str:
    """A short cause for an I/O library's error: the first line of the error it was raised from (Orbax
    wraps TensorStore's error in one whose text is an object's repr cut mid-way, `<bound method … of
    TensorStore({`), object reprs dropped, and a TensorStore status code's meaning first."""
    for _ in range(8):  # the explicit `raise … from` chain only: its root is the library's own error
        if e.__cause__ is None:
            break
        e = e.__cause__
    lines = str(e).strip().splitlines()
    text = _OBJECT_REPR.sub("", lines[0] if lines else "").rstrip(" .:(") or type(e).__name__
    status = _STATUS.match(text)
    if status:  # TensorStore's errors are ValueErrors whose text starts with the status code
        meaning = _STATUS_MEANING.get(status.group(1))
        return (f"{meaning}; {text}" if meaning else text)[:400]
    return f"{type(e).__name__}: {text}"[:400]
