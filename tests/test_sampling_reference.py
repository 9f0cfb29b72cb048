"""Shared reference for the sampler tests: recompute every cached pass with one full causal forward.

A pass recorded by a sampler (debug trace) saw the cache (a prefix of the physical sequence) plus its
window. The reference concatenates that physical prefix and the pass's valid window rows and runs the
model without any cache (plain causal attention over the physical order, logical positions as RoPE
positions, docs/algorithms.md §0). For slot-local passes each slot is recomputed on its own.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from zarya_jax import model as model_lib


@functools.partial(jax.jit, static_argnums=3)
def _forward(params, tokens, positions, config):
    return model_lib.forward(params, config, tokens, positions)


def reference_sequences(trace, phys_tok, phys_pos, groups_of=None, select=None):
    """Yields (pass n, row b, window row indices, tokens, positions) for every reference forward."""
    n_pass, b, w = np.asarray(trace["valid"]).shape
    for n in range(n_pass):
        for r in range(b):
            valid = np.asarray(trace["valid"][n, r])
            if not valid.any() or (select is not None and not select(n, r)):
                continue
            c = int(trace["cache_len"][n, r])
            prefix_t = list(phys_tok[r, :c])
            prefix_p = list(phys_pos[r, :c])
            assert min(prefix_t) >= 0 and min(prefix_p) >= 0
            groups = groups_of(n, r) if groups_of is not None else np.zeros(w, int)
            for g in np.unique(groups[valid]):
                idx = np.flatnonzero(valid & (groups == g))
                yield n, r, idx, prefix_t + list(trace["tokens"][n, r, idx]), prefix_p + list(
                    trace["positions"][n, r, idx])


def check_against_full_forward(params, config, trace, phys_tok, phys_pos, groups_of=None, select=None,
                               atol=3e-5):
    """Asserts each recorded pass's logits equal the full causal recompute; returns how many were checked.
    groups_of(n, b) -> int [window] recomputes each group separately; select(n, b) -> bool filters passes."""
    items = list(reference_sequences(trace, phys_tok, phys_pos, groups_of, select))
    assert items, "no pass recorded"
    # Shapes rounded up to buckets so that every check in a session reuses one compiled forward.
    width = -(-max(len(t) for *_, t, _ in items) // 32) * 32
    rows = -(-len(items) // 64) * 64
    toks = np.zeros((rows, width), np.int32)
    pos = np.zeros((rows, width), np.int32)
    for i, (*_, t, p) in enumerate(items):
        toks[i, : len(t)] = t  # right padding: causal rows before it are unaffected
        pos[i, : len(p)] = p
    ref = np.asarray(_forward(params, jnp.asarray(toks), jnp.asarray(pos), config))
    logits = np.asarray(trace["logits"])
    for i, (n, r, idx, t, _) in enumerate(items):
        k = len(idx)
        np.testing.assert_allclose(logits[n, r, idx], ref[i, len(t) - k: len(t)], atol=atol, rtol=1e-5,
                                   err_msg=f"pass {n}, row {r}, window rows {idx.tolist()}")
    return len(items)
