"""`LoraConfig.layers`: the adapter on some decoder layers only (docs/uno.md). Layers outside the selection
compute the base model on every row, whatever their adapter entries hold; gate-off rows are the base model
exactly; the selection is saved with the adapter, merged and exported to PEFT as the layers it names."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.config import ConfigError, LoraConfig
from zarya_jax.testing import TINY

CONFIG = TINY.replace(num_layers=4)
TOKENS = jax.random.randint(jax.random.PRNGKey(3), (2, 10), 0, 256)


@pytest.fixture(scope="module")
def params():
    return jax.jit(model_lib.init_params, static_argnums=0)(CONFIG, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def adapter():
    """Non-zero factors in every layer."""
    ad = lora_lib.init_lora(CONFIG, LoraConfig(rank=4, alpha=32.0), jax.random.PRNGKey(1))
    keys = iter(jax.random.split(jax.random.PRNGKey(2), 2 * len(lora_lib.PROJECTIONS)))
    return jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), ad)


@functools.partial(jax.jit, static_argnames="lora")
def gated(params, adapter, gate, *, lora):
    return model_lib.apply(params, CONFIG, TOKENS, gate=gate, lora_params=adapter, lora=lora)[0]


@jax.jit
def base_logits(params):
    return model_lib.apply(params, CONFIG, TOKENS)[0]


def with_layers(adapter, layers, fn):
    """The adapter with `fn` applied to the entries of `layers` (every projection, both factors)."""
    idx = jnp.asarray(layers)
    return jax.tree.map(lambda x: x.at[idx].set(fn(x[idx])), adapter)


@pytest.mark.parametrize("layers,outside", [("top", [0, 1]), ("bottom", [2, 3]), ((0, 3), [1, 2])])
def test_layers_outside_the_selection_are_the_base_model(params, adapter, layers, outside):
    """Gate on everywhere: the selected adapter equals the all-layer adapter with the other layers' b zeroed
    (a reference that never reads the selection), and NaN in the unselected entries changes nothing."""
    on = jnp.ones(TOKENS.shape, bool)
    sel = LoraConfig(rank=4, alpha=32.0, layers=layers)
    got = np.asarray(gated(params, adapter, on, lora=sel))
    ref = gated(params, with_layers(adapter, outside, jnp.zeros_like), on, lora=LoraConfig(rank=4, alpha=32.0))
    np.testing.assert_array_equal(got, np.asarray(ref))
    poisoned = gated(params, with_layers(adapter, outside, lambda x: jnp.full_like(x, jnp.nan)), on, lora=sel)
    np.testing.assert_array_equal(got, np.asarray(poisoned))
    base = np.asarray(base_logits(params))
    assert not np.allclose(got, base, atol=1e-4)  # the selected layers do change the output
    # merge folds in the selected layers only
    merged = jax.jit(lambda p, a: model_lib.apply(lora_lib.merge(p, a, sel), CONFIG, TOKENS)[0])(params, adapter)
    np.testing.assert_allclose(np.asarray(merged), got, atol=2e-4, rtol=1e-4)


def test_gate_off_rows_are_bit_identical_to_the_base(params, adapter):
    gate = jnp.zeros(TOKENS.shape, bool).at[:, 6:].set(True)
    got = np.asarray(gated(params, adapter, gate, lora=LoraConfig(rank=4, alpha=32.0, layers="top")))
    base = np.asarray(base_logits(params))
    np.testing.assert_array_equal(got[:, :6], base[:, :6])
    assert not np.allclose(got[:, 6:], base[:, 6:], atol=1e-4)


@pytest.mark.parametrize("layers,same", [("top", 2), ("bottom", 0)])
def test_per_layer_states_change_only_from_the_first_selected_layer(params, adapter, layers, same):
    """Each layer's K/V (a function of that layer's input hidden state and its k/v projections), gate on
    everywhere, against the base model's: equal bit for bit in the layers below the first selected one,
    different from it on."""
    on = jnp.ones(TOKENS.shape, bool)
    run = jax.jit(lambda p, a, g, lora: model_lib.apply(p, CONFIG, TOKENS, gate=g, lora_params=a, lora=lora)[1],
                  static_argnums=3)
    k, v = run(params, adapter, on, LoraConfig(rank=4, alpha=32.0, layers=layers))
    k0, v0 = jax.jit(lambda p: model_lib.apply(p, CONFIG, TOKENS)[1])(params)
    for layer in range(CONFIG.num_layers):
        if layer < same:
            np.testing.assert_array_equal(np.asarray(k[layer]), np.asarray(k0[layer]))
            np.testing.assert_array_equal(np.asarray(v[layer]), np.asarray(v0[layer]))
        else:
            assert not np.allclose(np.asarray(k[layer]), np.asarray(k0[layer]), atol=1e-5)
    assert LoraConfig(layers="top").layer_ids(5) == (2, 3, 4)
    assert LoraConfig(layers="bottom").layer_ids(5) == (0, 1)


def test_selection_is_saved_and_loaded(tmp_path, adapter):
    for layers in ("top", (1, 3)):
        cfg = LoraConfig(rank=4, alpha=32.0, layers=layers)
        lora_lib.save(tmp_path / str(layers), adapter, cfg)
        loaded, got = lora_lib.load(tmp_path / str(layers))
        assert got == cfg
        assert lora_lib.metadata(tmp_path / str(layers))["layers"] == cfg.layers_text()
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), loaded, adapter)
    # a selection the adapter's model does not have is refused at load, naming the file and the value
    lora_lib.save(tmp_path / "far", adapter, LoraConfig(rank=4, alpha=32.0, layers=(7,)))
    with pytest.raises(ConfigError, match=r"far.*layers=\(7,\).*4 layer"):
        lora_lib.load(tmp_path / "far")
    with pytest.raises(ConfigError, match=r"layers=\(7,\)"):
        lora_lib.check_lora(adapter, CONFIG, LoraConfig(rank=4, alpha=32.0, layers=(7,)))


@pytest.mark.parametrize("value", ["middle", "", "1,1", "-1", (2, "x"), 1.5, True, []])
def test_bad_selections_are_config_errors_naming_the_value(value):
    with pytest.raises(ConfigError, match=r"LoraConfig.layers=.*expected one of \('all', 'top', 'bottom'\)"):
        LoraConfig(layers=value)


def test_selection_spellings():
    assert LoraConfig(layers="2,0").layers == (0, 2)
    assert LoraConfig(layers=[3]).layers == (3,) == LoraConfig(layers=3).layers
    assert LoraConfig(layers=" top").layers == "top"
    with pytest.raises(ConfigError, match="selects layers"):
        LoraConfig(layers="bottom").layer_ids(1)  # no bottom half in a 1-layer model
