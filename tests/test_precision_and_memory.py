"""Memory and throughput options against the plain fp32 path: bf16 compute with fp32 master weights, the
remat policies, the train state donated into the step, a decode pass donating its KV cache, the bf16 KV
cache, and the decode loop updating its cache in place. Each changes results by dtype noise at most."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax.model import forward, init_params
from zarya_jax.nn import kv_cache
from zarya_jax.objectives.ar import ar_objective
from zarya_jax.sampling import GenerationConfig, ar, generate, mdm, passes, slotted, spec
from zarya_jax.testing import TINY, batch_of, synthetic_tokens
from zarya_jax.train import sharding as shd
from zarya_jax.train.optim import OptimConfig
from zarya_jax.train.step import build_steps

CFG = TINY.replace(num_layers=1, hidden_size=32, intermediate_size=64)


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def batch():
    return batch_of(synthetic_tokens(np.random.default_rng(0), 4, 32))


@functools.partial(jax.jit, static_argnums=1)
def _grads(params, cfg, tokens):
    """(mean next-token cross-entropy, its gradient): precision and remat are the model's, not the loss's."""
    def loss(p):
        logits = forward(p, cfg, tokens)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], -1))
    return jax.value_and_grad(loss)(params)


@pytest.fixture(scope="module")
def fp32_grads(params, batch):
    """The reference: fp32 compute, no remat."""
    return _grads(params, CFG, batch["tokens"])


def test_bf16_compute_with_fp32_master_weights(params, batch, fp32_grads):
    loss32, g32 = fp32_grads
    loss16, g16 = _grads(params, CFG.replace(dtype="bfloat16"), batch["tokens"])
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(g16))  # gradients of the fp32 master weights
    np.testing.assert_allclose(loss16, loss32, rtol=1e-2)
    a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)]) for g in (g16, g32))
    assert np.linalg.norm(a - b) < 0.05 * np.linalg.norm(b)


@pytest.mark.parametrize("policy", ["full", "dots", "qkv"])
def test_remat_policies_keep_the_gradients(params, batch, fp32_grads, policy):
    loss, grads = fp32_grads
    loss_r, grads_r = _grads(params, CFG.replace(remat=True, remat_policy=policy), batch["tokens"])
    np.testing.assert_allclose(loss_r, loss, rtol=1e-6)
    for g, r in zip(jax.tree.leaves(grads_r), jax.tree.leaves(grads)):
        np.testing.assert_allclose(g, r, atol=1e-6)


def test_train_state_is_donated_into_the_step(params, batch):
    mesh = shd.make_mesh(shd.MeshConfig(data=1, num_devices=1))
    steps = build_steps(ar_objective(CFG), OptimConfig(lr=1e-3, warmup_steps=0), 10, lambda k: params, mesh,
                        tuple(batch), jax.random.PRNGKey(0))
    state = steps.from_params(params)
    old = jax.tree.leaves(state)
    new, metrics = steps.cache.train(None)(state, None, batch)
    assert all(x.is_deleted() for x in old)  # the new state reused the old one's buffers
    assert int(new["step"]) == 1 and np.isfinite(float(metrics["loss"]))


def _prefilled(params, cache_dtype, tokens, n):
    """A cache of `cache_dtype` holding the first n tokens, via one decode pass on an empty cache."""
    b = tokens.shape[0]
    cache = kv_cache.init(CFG, b, tokens.shape[1], cache_dtype)
    positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
    _, cache = passes.decode_pass(params, cache, tokens[:, :n], positions, config=CFG)
    return cache


@pytest.mark.parametrize("cache_dtype", ["auto", "bfloat16"])
def test_decode_pass_donates_its_cache_and_matches_a_full_forward(params, cache_dtype):
    tokens = jnp.asarray(synthetic_tokens(np.random.default_rng(1), 2, 24))
    full = jax.jit(forward, static_argnums=1)(params, CFG, tokens)  # the reference: no cache, fp32
    cache = _prefilled(params, cache_dtype, tokens, 16)
    assert cache["k"].dtype == (jnp.float32 if cache_dtype == "auto" else jnp.bfloat16)
    window = jnp.broadcast_to(16 + jnp.arange(8, dtype=jnp.int32), (2, 8))
    old = jax.tree.leaves(cache)
    logits, cache = passes.decode_pass(params, cache, tokens[:, 16:], window, config=CFG)
    assert all(x.is_deleted() for x in old) and int(cache["length"][0]) == 24
    tol = 1e-5 if cache_dtype == "auto" else 2e-2  # bf16 K/V: rounding of the cached rows only
    np.testing.assert_allclose(logits, full[:, 16:], atol=tol * float(jnp.abs(full).max()))


def test_every_mode_allocates_its_cache_in_kv_cache_dtype(params):
    """Traced, not compiled: each decoder's program holds a cache of the configured dtype."""
    b, p = 2, 8
    for mode in (ar.AR(), mdm.MDM(), slotted.Slotted(slot_size=4), spec.SpecSelf(draft_length=4)):
        for dtype, want in (("auto", np.dtype("float32")), ("bfloat16", np.dtype(jnp.bfloat16))):
            gc = GenerationConfig(mode=mode, max_new_tokens=8, kv_cache_dtype=dtype)
            cache_len = passes.cache_rows(gc, p)
            jaxpr = jax.make_jaxpr(functools.partial(mode.decoder.run, config=CFG, gcfg=gc, knobs=mode.arrays()))(
                params, jnp.zeros((b, p), jnp.int32), jnp.full((b,), p, jnp.int32), jax.random.PRNGKey(0))
            shapes = {(v.aval.shape, v.aval.dtype) for eqn in jaxpr.eqns for v in eqn.outvars}
            cache = jax.eval_shape(lambda: kv_cache.init(CFG, b, cache_len, dtype))
            assert (cache["k"].shape, want) in shapes, (mode, dtype)
    with pytest.raises(ValueError, match="kv_cache_dtype='int8'"):
        generate(params, CFG, [[97, 98]], GenerationConfig(kv_cache_dtype="int8"), jax.random.PRNGKey(0))


def test_ar_decode_updates_its_cache_in_place():
    """The compiled AR loop holds its cache once: XLA's temporaries are the cache plus per-layer scratch, not a
    second cache. (When `kv_cache.commit` was a vmapped scatter, a relayout copied the whole cache every step:
    temporaries of 2.6× the cache.) CPU buffer assignment; the loop is the same program on any backend."""
    cfg, (b, p, g) = TINY, (8, 16, 1024)
    gc = GenerationConfig(mode="ar", max_new_tokens=g)
    program = jax.jit(functools.partial(ar.run, config=cfg, gcfg=gc))
    abstract_params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    compiled = program.lower(abstract_params, jnp.zeros((b, p), jnp.int32), jnp.full((b,), p, jnp.int32),
                             jax.random.PRNGKey(0)).compile()
    cache_bytes = kv_cache.nbytes(jax.eval_shape(lambda: kv_cache.init(cfg, b, p + g)))
    assert compiled.memory_analysis().temp_size_in_bytes < 1.75 * cache_bytes
