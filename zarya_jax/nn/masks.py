"""Boolean attention masks over the physical order (docs/algorithms.md §0). Shapes `[b, t, s]`, True = may attend."""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def causal(batch: int, length: int) -> Array:
    return jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)), (batch, length, length))


def causal_with_padding(valid: Array) -> Array:
    """Causal, and no query or key at an invalid (padding) index. valid bool [b, t].

    Padding queries still see themselves so their softmax stays finite.
    """
    b, t = valid.shape
    m = causal(b, t) & valid[:, None, :] & valid[:, :, None]
    return m | jnp.eye(t, dtype=bool)[None]


def segment_causal(segment_ids: Array) -> Array:
    """Causal within equal segment ids (packed rows); segment id 0 marks padding. [b, t] -> [b, t, t]."""
    b, t = segment_ids.shape
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    m = causal(b, t) & same & (segment_ids[:, None, :] > 0)
    return m | jnp.eye(t, dtype=bool)[None]


def group_local(groups: Array) -> Array:
    """Causal, restricted to queries and keys of the same group id (e.g. mode B's slot-local infill).

    groups int [b, t]; a negative group sees nothing but itself.
    """
    b, t = groups.shape
    same = (groups[:, :, None] == groups[:, None, :]) & (groups[:, None, :] >= 0)
    return (causal(b, t) & same) | jnp.eye(t, dtype=bool)[None]
