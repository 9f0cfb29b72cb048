"""Gated-LoRA adapter params (SPEC §7): structure, gate semantics, save/load, merge."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.config import ConfigError, LoraConfig

LORA = LoraConfig(rank=4, alpha=32.0)


@pytest.fixture(scope="module")
def tiny_params(tiny_config):
    """Jitted init (the eager, op-by-op init is slow on a busy CPU)."""
    return jax.jit(model_lib.init_params, static_argnums=0)(tiny_config, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def adapter(tiny_config):
    """A non-trivial adapter (b ≠ 0), so the gate visibly changes the output."""
    return perturbed(lora_lib.init_lora(tiny_config, LORA, jax.random.PRNGKey(1)), jax.random.PRNGKey(2))


@jax.jit
def perturbed(tree, key):
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten([x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def test_init_matches_model_collection(tiny_config):
    """init_lora builds exactly the tree the model's 'lora' collection declares; b starts at zero."""
    lp = lora_lib.init_lora(tiny_config, LORA, jax.random.PRNGKey(0))
    _, ref = jax.eval_shape(lambda k: model_lib.init_params(tiny_config, k, lora=LORA), jax.random.PRNGKey(0))
    shapes = jax.tree.map(lambda x: x.shape, lp)
    assert shapes == jax.tree.map(lambda x: x.shape, ref)
    assert all(float(jnp.abs(v["b"]).max()) == 0.0 for v in lp["layers"].values())
    lora_lib.check_lora(lp, tiny_config, LORA)
    per_layer = sum(int(np.prod(i)) * 4 + 4 * int(np.prod(o))
                    for i, o in lora_lib.projection_shapes(tiny_config).values())
    assert lora_lib.num_params(lp) == per_layer * tiny_config.num_layers


def test_gate_off_bit_identical_gate_on_differs(tiny_config, tiny_params, adapter):
    tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 10), 0, 256)
    gate = jax.random.bernoulli(jax.random.PRNGKey(4), 0.5, (2, 10))
    base, _ = jax.jit(lambda p, t: model_lib.apply(p, tiny_config, t))(tiny_params, tokens)
    mixed, _ = jax.jit(lambda p, a, t, g: model_lib.apply(p, tiny_config, t, gate=g, lora_params=a, lora=LORA))(
        tiny_params, adapter, tokens, gate)
    # rows with the gate off before the first gated row are the AR model exactly (later rows attend to
    # gated rows' K/V and legitimately differ)
    first_on = np.where(np.asarray(gate).any(1), np.argmax(np.asarray(gate), axis=1), 10)
    for b in range(2):
        np.testing.assert_array_equal(np.asarray(mixed[b, :first_on[b]]), np.asarray(base[b, :first_on[b]]))
    assert not np.allclose(np.asarray(mixed)[np.asarray(gate)], np.asarray(base)[np.asarray(gate)], atol=1e-4)


POISONS = [("nan", np.nan, 32.0), ("inf", np.inf, 32.0), ("huge", 1e30, 32.0), ("nan-alpha", 0.05, float("nan"))]


@pytest.mark.parametrize("name,value,alpha", POISONS)
def test_gate_off_rows_are_the_base_model_whatever_the_adapter_holds(tiny_config, tiny_params, name, value, alpha):
    """The gate selects the update, it does not multiply it (0 · NaN = NaN): with an adapter of NaN, inf or
    1e30 arrays, or alpha=nan, gate-off rows equal `model.forward` bit for bit — also when they share the
    window with gated rows they do not attend to (a drafter-training pair: gated noisy half, clean half)."""
    poisoned = jax.tree.map(lambda x: jnp.full_like(x, value), lora_lib.init_lora(tiny_config, LORA,
                                                                                  jax.random.PRNGKey(1)))
    lora = LoraConfig(rank=LORA.rank, alpha=alpha)
    n = 8
    tokens = jax.random.randint(jax.random.PRNGKey(6), (2, n), 0, 256)
    run = jax.jit(lambda a, lora, t, g, m, pos: model_lib.apply(tiny_params, tiny_config, t, pos, gate=g,
                                                                lora_params=a, lora=lora, window_mask=m)[0],
                  static_argnums=1)
    ref = np.asarray(model_lib.forward(tiny_params, tiny_config, tokens))
    off = model_lib.apply(tiny_params, tiny_config, tokens, gate=jnp.zeros((2, n), bool), lora_params=poisoned,
                          lora=lora)[0]
    np.testing.assert_array_equal(np.asarray(off), ref)

    # [noisy copy, gate on | clean copy, gate off], each half causal within itself only
    pair = jnp.concatenate([tokens, tokens], 1)
    pos = jnp.broadcast_to(jnp.concatenate([jnp.arange(n), jnp.arange(n)]), (2, 2 * n))
    half = jnp.arange(2 * n) // n
    mask = (half[:, None] == half[None, :]) & (jnp.arange(2 * n)[:, None] >= jnp.arange(2 * n)[None, :])
    mask = jnp.broadcast_to(mask, (2, 2 * n, 2 * n))
    gate = jnp.broadcast_to(half == 0, (2, 2 * n))
    clean = np.asarray(run(poisoned, lora, pair, gate, mask, pos))[:, n:]
    harmless = np.asarray(run(jax.tree.map(jnp.zeros_like, poisoned), LORA, pair, gate, mask, pos))[:, n:]
    np.testing.assert_array_equal(clean, harmless)
    np.testing.assert_allclose(clean, ref, atol=1e-5, rtol=1e-5)


def test_merge_equals_gate_on_everywhere(tiny_config, tiny_params, adapter):
    tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 9), 0, 256)
    gated, _ = jax.jit(lambda p, a, t: model_lib.apply(p, tiny_config, t, gate=jnp.ones((2, 9), bool),
                                                       lora_params=a, lora=LORA))(tiny_params, adapter, tokens)
    merged = jax.jit(lambda p, a, t: model_lib.forward(lora_lib.merge(p, a, LORA), tiny_config, t))(
        tiny_params, adapter, tokens)
    np.testing.assert_allclose(np.asarray(merged), np.asarray(gated), atol=2e-4, rtol=1e-4)
    # merging leaves the non-projection params alone
    np.testing.assert_array_equal(np.asarray(lora_lib.merge(tiny_params, adapter, LORA)["embed"]),
                                  np.asarray(tiny_params["embed"]))


def test_save_load_roundtrip_and_errors(tmp_path, tiny_config, adapter):
    path = lora_lib.save(tmp_path / "adapter", adapter, LORA)
    assert path.name == lora_lib.ADAPTER_FILE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no temp dir left behind
    loaded, cfg = lora_lib.load(tmp_path / "adapter")
    assert cfg == LORA
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), loaded, adapter)
    with pytest.raises(FileNotFoundError, match="expected a directory"):
        lora_lib.load(tmp_path / "missing")
    with pytest.raises(ConfigError, match="rank 8"):
        lora_lib.check_lora(loaded, tiny_config, LoraConfig(rank=8, alpha=16.0))
