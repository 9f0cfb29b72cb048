"""The live cache (`nn.attention.live`, `ModelConfig.cache_block`): a decoding pass reads the cache blocks below the
batch's longest live row only, with the outputs of attention over every live row.

References: a slow NumPy softmax over [live cache rows ; window] per query; the model's cache-free forward over the
whole sequence (a full recompute); and the dense path over the allocation (`cache_block=0`). Rows past the live
blocks hold NaN, so a read of them would show; the compiled decode loop holds no second copy of the cache."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import model as model_lib
from zarya_jax.nn import attention, kv_cache
from zarya_jax.sampling import passes
from zarya_jax.testing import TINY

L, B, KVH, S, D, T, H = 2, 3, 2, 80, 8, 4, 4
LENGTHS = np.array([0, 37, 50])
HIDE = np.array([[-1, -1, 3, -1], [5, -1, 36, 0], [49, -1, -1, 2]])


def _reference(q, k, v, k_cache, v_cache, length, hide, window_mask):
    """Per query: softmax over its visible cache rows and window keys, in float64."""
    q, k, v, kc, vc = (np.asarray(x, np.float64) for x in (q, k, v, k_cache, v_cache))
    out = np.zeros(q.shape)
    g = H // KVH
    for b in range(q.shape[0]):
        for t in range(q.shape[1]):
            rows = [r for r in range(length[b]) if hide is None or r != hide[b, t]]
            cols = [j for j in range(q.shape[1]) if window_mask[b, t, j]]
            for head in range(H):
                kvh = head // g
                keys = np.concatenate([kc[b, kvh, rows], k[b, cols, kvh]])
                vals = np.concatenate([vc[b, kvh, rows], v[b, cols, kvh]])
                s = keys @ q[b, t, head] / np.sqrt(D)
                p = np.exp(s - s.max())
                out[b, t, head] = (p / p.sum()) @ vals
    return out


@pytest.fixture(scope="module")
def operands():
    ks = jax.random.split(jax.random.PRNGKey(0), 5)
    q, k, v = (jax.random.normal(kk, (B, T, n, D)) for kk, n in zip(ks[:3], (H, KVH, KVH)))
    k_all, v_all = (jax.random.normal(kk, (L, B, KVH, S, D)) for kk in ks[3:])
    window_mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    return q, k, v, k_all, v_all, window_mask


@pytest.mark.parametrize("block", [16, 32, 256])  # 32: the last block is clamped to the cache's end
@pytest.mark.parametrize("hidden", [False, True])
def test_live_equals_attention_over_every_live_row(operands, block, hidden):
    q, k, v, k_all, v_all, wm = operands
    hide = jnp.asarray(HIDE) if hidden else None
    length = jnp.asarray(LENGTHS)
    out = attention.live(q, k, v, k_all, v_all, 1, length, hide, wm, block)
    ref = _reference(q, k, v, k_all[1], v_all[1], LENGTHS, HIDE if hidden else None, np.asarray(wm))
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5)
    dense = attention.cached(q, k, v, k_all[1], v_all[1], attention.cache_mask(length, hide, T, S), wm)
    np.testing.assert_allclose(np.asarray(out), np.asarray(dense), atol=1e-5)


def test_rows_past_the_live_blocks_are_never_read(operands):
    """NaN in every row from the end of the last live block on: a read of one would make the output NaN."""
    q, k, v, k_all, v_all, wm = operands
    block, live_end = 16, -(-int(LENGTHS.max()) // 16) * 16
    poisoned = [x.at[:, :, :, live_end:].set(jnp.nan) for x in (k_all, v_all)]
    out = attention.live(q, k, v, *poisoned, 0, jnp.asarray(LENGTHS), None, wm, block)
    ref = _reference(q, k, v, k_all[0], v_all[0], LENGTHS, None, np.asarray(wm))
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5)


def test_bf16_live_is_as_close_to_the_reference_as_the_dense_path(operands):
    q, k, v, k_all, v_all, wm = (x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x for x in operands)
    length = jnp.asarray(LENGTHS)
    ref = _reference(q, k, v, k_all[0], v_all[0], LENGTHS, None, np.asarray(wm))
    live = np.asarray(attention.live(q, k, v, k_all, v_all, 0, length, None, wm, 32), np.float64)
    dense = np.asarray(attention.cached(q, k, v, k_all[0], v_all[0], attention.cache_mask(length, None, T, S), wm),
                       np.float64)
    assert np.abs(live - ref).max() <= 2 * np.abs(dense - ref).max() + 1e-2


@pytest.fixture(scope="module")
def tiny():
    config = TINY.replace(max_position_embeddings=256)
    return config, model_lib.init_params(config, jax.random.PRNGKey(1))


@pytest.mark.parametrize("cache_block", [16, 0])
def test_a_cached_window_equals_the_full_recompute(tiny, cache_block):
    """A prefix committed by one pass, then a window against it in a cache allocated far past the live rows:
    the window's logits are the cache-free forward's over the whole sequence."""
    config, params = tiny
    config = config.replace(cache_block=cache_block)
    b, prefix, w = 2, 37, 5
    tokens = jax.random.randint(jax.random.PRNGKey(2), (b, prefix + w), 0, config.vocab_size)
    full = model_lib.forward(params, config, tokens)
    cache = kv_cache.init(config, b, 200)
    pos = jnp.broadcast_to(jnp.arange(prefix + w), (b, prefix + w))
    _, cache = passes.cached_pass(params, cache, tokens[:, :prefix], pos[:, :prefix], config=config)
    logits, _ = passes.cached_pass(params, cache, tokens[:, prefix:], pos[:, prefix:], config=config)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full[:, prefix:]), atol=1e-4)


def test_a_decode_loop_holds_one_cache(tiny):
    """The passes' compiled loop writes the cache in place: its temporaries hold the loop's one carried cache (the
    argument is not donated) and little else. Without `model.after`, a commit scheduled before the last layer's
    read makes the compiler copy the whole K and V on every pass: measured 2.08× the cache, against 1.08×."""
    config, params = tiny
    config = config.replace(cache_block=16)
    cache = kv_cache.init(config, 4, 2048)
    cache = dict(cache, length=jnp.full((4,), 100, jnp.int32))
    compiled = passes._repeated_pass.lower(params, cache, jnp.zeros((4, 4), jnp.int32), jnp.int32(2),
                                          config=config).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < 1.5 * kv_cache.nbytes(cache)


def test_cache_block_is_checked():
    with pytest.raises(ValueError, match="cache_block=-1"):
        TINY.replace(cache_block=-1)
