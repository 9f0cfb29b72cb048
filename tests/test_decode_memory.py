"""Decoding memory as the TPU compiler sees it (libtpu, no TPU: `zarya_jax.target`), docs/decoding.md.

A model whose KV cache dwarfs everything else (wide K/V, small hidden size and vocabulary) at a long
budget, compiled for one v5e chip: the prefill projects only the rows it keeps (no [B, P, V] logits),
mode B's window is bounded whatever `max_new_tokens`, and each decoder's temporaries against the AR
decoder's, which hold the cache once.
"""
import functools

import jax
import jax.numpy as jnp
import pytest

from zarya_jax.config import LoraConfig, ModelConfig
from zarya_jax.nn import kv_cache
from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.sampling.config import GenerationConfig


CONFIG = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=8,
                     num_kv_heads=8, head_dim=128, max_position_embeddings=16384, dtype="bfloat16",
                     param_dtype="bfloat16", mask_token_id=511, eos_token_id=510, attention="dense")
BATCH, PROMPT, NEW = 4, 128, 8192


@functools.cache
def compiled(mode: str):
    """`mode`'s decode compiled for one TPU v5e chip."""
    from zarya_jax import target

    device = target.devices("tpu:v5e:2x2")[0]
    on = jax.sharding.SingleDeviceSharding(device)
    abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on), tree)  # noqa: E731
    gcfg = GenerationConfig(mode=mode, max_new_tokens=NEW, prompt_bucket=PROMPT)
    decoder = gcfg.mode.decoder
    knobs = abstract(gcfg.mode.arrays())
    extra = {}
    if decoder.uses_adapter and gcfg.mode.drafter == "lora":
        lora = LoraConfig()
        extra = {"lora": lora, "lora_params": abstract(jax.eval_shape(
            lambda k: lora_lib.init_lora(CONFIG, lora, k), jax.random.PRNGKey(0)))}
    params = abstract(jax.eval_shape(lambda k: model_lib.init_params(CONFIG, k), jax.random.PRNGKey(0)))

    def run(params, lora_params, tokens, lengths, key, knobs):
        kw = dict(extra, lora_params=lora_params) if extra else {}
        return decoder.run(params, tokens, lengths, key, config=CONFIG, gcfg=gcfg, knobs=knobs, **kw)

    return jax.jit(run).lower(
        params, extra.get("lora_params"), jax.ShapeDtypeStruct((BATCH, PROMPT), jnp.int32, sharding=on),
        jax.ShapeDtypeStruct((BATCH,), jnp.int32, sharding=on), abstract(jax.random.PRNGKey(0)), knobs).compile()


def temporaries(mode: str) -> int:
    return compiled(mode).memory_analysis().temp_size_in_bytes


def test_the_cache_dominates():
    cache = kv_cache.nbytes(jax.eval_shape(lambda: kv_cache.init(CONFIG, BATCH, PROMPT + NEW)))
    assert cache <= temporaries("ar") <= 2 * cache  # the cache, the prefill's activations, one pass's


@pytest.mark.parametrize("mode", ["ar", "slotted", "spec-self", "spec-lora-fused"])
def test_prefill_projects_only_the_rows_it_keeps(mode):
    assert f"f32[{BATCH},{PROMPT},{CONFIG.vocab_size}]" not in compiled(mode).as_text()


def test_mode_b_window_is_bounded():
    """8192 new tokens in NB = 2 blocks would be 4096-row windows; the default bound makes them 256."""
    hlo = compiled("slotted").as_text()
    assert f"f32[{BATCH},256,{CONFIG.vocab_size}]" in hlo
    assert f",{NEW // 2},{CONFIG.vocab_size}]" not in hlo


@pytest.mark.parametrize("mode,bound", [("spec-self", 1.3), ("spec-lora", 1.3), ("spec-self-fused", 1.3),
                                        ("spec-lora-fused", 1.3), ("slotted", 2.5)])
def test_the_cache_is_held_once(mode, bound):
    """Every decoder holds the cache once, as AR does: Ψ-Spec and fused within 1.3× of AR's temporaries
    (their multi-row windows read a head-major cache with no relayout copy, `kv_cache`); mode B adds its
    bounded window (256 rows of logits here, where the cache is small)."""
    ratio = temporaries(mode) / temporaries("ar")
    assert ratio <= bound, (mode, ratio)
