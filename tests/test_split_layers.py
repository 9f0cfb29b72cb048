"""Decoding over per-layer weights (`model.split_layers`, `GenerationConfig.layer_loop`, docs/decoding.md):
the split model is the scanned one, with a cache and a gated adapter on some layers; every mode decodes the
same tokens either way; a decode program holds no layer scan and no stacked weight once it has split, and no
conditional."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.config import LoraConfig
from zarya_jax.nn import kv_cache
from zarya_jax.sampling import GenerationConfig, generate
from zarya_jax.testing import TINY, normal_params

CONFIG = TINY.replace(num_layers=3, mask_token_id=259, eos_token_id=258, pad_token_id=256)
LORA = LoraConfig(rank=4, alpha=8.0, layers=(0, 2))


@pytest.fixture(scope="module")
def weights():
    params = normal_params(CONFIG, seed=1)
    adapter = lora_lib.init_lora(CONFIG, LORA, jax.random.PRNGKey(2))
    keys = iter(jax.random.split(jax.random.PRNGKey(3), 2 * len(lora_lib.PROJECTIONS)))
    adapter = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), adapter)
    return params, adapter


def test_split_keeps_every_leaf_and_is_idempotent(weights):
    params, adapter = weights
    split = model_lib.split_layers(params)
    assert "layers" not in split and sorted(k for k in split if k.startswith("layers_")) == ["layers_0", "layers_1",
                                                                                          "layers_2"]
    for i in range(CONFIG.num_layers):
        jax.tree.map(lambda s, x, i=i: np.testing.assert_array_equal(s, x[i]), split[f"layers_{i}"], params["layers"])
    assert model_lib.split_layers(split) is split and model_lib.split_layers(None) is None
    assert set(model_lib.split_layers(adapter)) == {"layers_0", "layers_1", "layers_2"}


@jax.jit
def _windows(params, adapter):
    """(logits, window K/V) of a gated window against a cache holding 5 committed rows, and of a plain causal
    forward, for the layout `params` and `adapter` have."""
    cache = kv_cache.init(CONFIG, 2, 16)
    _, kv = model_lib.apply(params, CONFIG, jnp.arange(10).reshape(2, 5) + 7)
    cache = kv_cache.commit(cache, kv, jnp.ones((2, 5), bool))
    tokens = jnp.array([[3, 259, 259, 259], [9, 40, 259, 259]])
    gate = jnp.array([[False, True, True, True], [False, False, True, True]])
    cached = model_lib.apply(params, CONFIG, tokens, 5 + jnp.arange(4)[None].repeat(2, 0), cache=cache, gate=gate,
                             lora_params=adapter, lora=LORA)
    return cached, model_lib.apply(params, CONFIG, tokens)


def test_split_model_is_the_scanned_model(weights):
    params, adapter = weights
    stacked = _windows(params, adapter)
    split = _windows(model_lib.split_layers(params), model_lib.split_layers(adapter))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), stacked, split)


def test_layouts_cannot_be_mixed(weights):
    params, adapter = weights
    with pytest.raises(ValueError, match="must both be stacked or both split"):
        model_lib.apply(model_lib.split_layers(params), CONFIG, jnp.zeros((1, 3), jnp.int32), lora_params=adapter,
                        lora=LORA)


@pytest.mark.parametrize("mode,adapter", [("ar", False), ("slotted", False), ("spec-self", False),
                                          ("spec-lora-fused", True)])
def test_every_mode_decodes_the_same_tokens_split_or_scanned(weights, mode, adapter):
    params, lora_params = weights
    kw = {"lora_params": lora_params, "lora": LORA} if adapter else {}
    prompts = [[5, 17, 42, 99, 3], [12, 8, 30]]
    gc = GenerationConfig(mode=mode, max_new_tokens=12)
    split, stacked = (generate(params, CONFIG, prompts, gc.replace(layer_loop=s), jax.random.PRNGKey(0), **kw)
                      for s in ("split", "scan"))
    np.testing.assert_array_equal(split.tokens, stacked.tokens)
    if split.logprobs is not None:
        np.testing.assert_allclose(split.logprobs, stacked.logprobs, atol=1e-5)


def _lowered(gc: GenerationConfig, devices=None, config=CONFIG, **adapter) -> str:
    """`generate`'s program for `gc` on one of `devices` (default: this host's), lowered: StableHLO text."""
    from zarya_jax.sampling.generate import lower
    from zarya_jax.train.sharding import MeshConfig, make_mesh

    mesh = make_mesh(MeshConfig(), (devices or jax.devices())[:1])
    return lower(normal_params(config, seed=1), config, gc, 1, 8, mesh=mesh, **adapter).as_text()


def _while_loops(gc: GenerationConfig, devices=None, config=CONFIG) -> int:
    return len(re.findall(r"stablehlo\.while", _lowered(gc, devices, config)))


def test_a_split_program_runs_no_layer_scan():
    gc = GenerationConfig(max_new_tokens=4)
    dense = CONFIG.replace(cache_block=0)  # no live-cache loop: the layer scans are the loops that differ
    # the scans over the layers, of the prefill and of the decode pass, are gone; the other loops stay
    assert (_while_loops(gc.replace(layer_loop="scan"), config=dense)
            - _while_loops(gc.replace(layer_loop="split"), config=dense)) == 2
    # with a live cache of several blocks each layer reads the cache in a loop of its own: one per layer of the
    # split decode pass, one in the body of each scan over the layers (the prefill's and the pass's)
    blocks = CONFIG.replace(cache_block=4)
    loops = {loop: _while_loops(gc.replace(layer_loop=loop), config=blocks)
             - _while_loops(gc.replace(layer_loop=loop), config=dense) for loop in ("split", "scan")}
    assert loops == {"split": CONFIG.num_layers, "scan": 2}
    assert _while_loops(gc) == _while_loops(gc.replace(layer_loop="split"))  # "auto" on a CPU


def test_auto_scans_the_layers_on_a_tpu():
    from zarya_jax import target

    tpu = target.devices("tpu:v5e:2x2")
    gc = GenerationConfig(max_new_tokens=4)
    assert _while_loops(gc, tpu) == _while_loops(gc.replace(layer_loop="scan"), tpu) > _while_loops(
        gc.replace(layer_loop="split"), tpu)


@pytest.mark.parametrize("mode", ["ar", "mdm", "slotted", "spec-self", "spec-lora", "spec-self-fused",
                                  "spec-lora-fused"])
def test_no_decode_program_branches(weights, mode):
    """XLA moves loop-invariant work out of a `while` body, not out of a conditional inside one (on a CPU,
    a bf16 model's f32 weight copies and its tied head's transpose; docs/decoding.md): no mode's program
    holds one. Ψ-Spec's AR cycles under `draft_when_active_below` (traced, so always in the program)
    run in a loop of their own before the drafting ones."""
    adapter = {"lora_params": weights[1], "lora": LORA} if "lora" in mode else {}
    text = _lowered(GenerationConfig(mode=mode, max_new_tokens=8), **adapter)
    assert "stablehlo.while" in text and not re.search(r"stablehlo\.(case|if)\b", text)


def test_layer_loop_is_one_of_its_names():
    with pytest.raises(ValueError, match="layer_loop='unrolled'"):
        GenerationConfig(layer_loop="unrolled").validate()
