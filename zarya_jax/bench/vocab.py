"""The losses and one decode pass at Qwen3's vocabulary (V = 151,936 + the mask row) on this machine.

A one-layer model of width `hidden` with Qwen3's vocabulary, so the [B, L, V] logits dominate. For
each of: the Zarya loss and its gradient (`objectives.losses.zarya_loss`), Uno's drafter loss and its
gradient w.r.t. the adapter (`objectives.drafter.drafter_loss`, 2L rows), and AR decoding of 16 tokens
(`sampling.generate`), `measure` returns the median wall time of `repeats` runs after a compile and the
compiled program's temporary buffers (XLA's `memory_analysis().temp_size_in_bytes`: independent of the
machine's load), also as a multiple of one [B, L, V] float32 array.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import lora as lora_lib
from ..config import LoraConfig, ModelConfig, ZaryaConfig
from ..model import init_params
from ..objectives import drafter as drafter_lib
from ..objectives.losses import zarya_loss
from ..sampling import GenerationConfig, generate
from .results import timings

VOCAB = 151936 + 1  # Qwen3's rows plus <mdm_mask>


def _median_s(call, repeats: int) -> float:
    """Median wall seconds of `repeats` calls of `call` (blocking), after one that compiles and warms up."""
    call()
    return float(np.median(timings(call, repeats)))


def _temp_bytes(fn, args) -> int:
    return int(jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes)


def measure(batch: int = 4, length: int = 256, hidden: int = 64, repeats: int = 3) -> dict:
    config = ModelConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=32, max_position_embeddings=2 * length + 64,
                         mask_token_id=VOCAB - 1, eos_token_id=151645, pad_token_id=151643)
    params = init_params(config, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 151643, (batch, length)), jnp.int32)
    data = {"tokens": tokens, "segment_ids": jnp.ones((batch, length), jnp.int32),
            "positions": jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length)),
            "answer_mask": jnp.asarray(np.arange(length)[None] >= length // 4).repeat(batch, 0)}
    key = jax.random.PRNGKey(1)
    zcfg = ZaryaConfig(slotted_training=True)
    zarya = jax.jit(lambda p, b, k: jax.value_and_grad(zarya_loss, has_aux=True)(p, config, zcfg, b, k, 4))
    lora = LoraConfig(rank=4, alpha=8.0)
    adapter = lora_lib.init_lora(config, lora, jax.random.PRNGKey(2))
    dcfg = drafter_lib.DrafterConfig(block_sizes=(4,), kl_weight=0.1, ce_weight=0.1)

    def drafter(a, p, b, k):
        pair = drafter_lib.make_pair_batch(k, b, 4, config, lora)
        return jax.value_and_grad(drafter_lib.drafter_loss, has_aux=True)(a, p, config, lora, pair, dcfg)

    drafter_j = jax.jit(drafter)
    one = batch * length * VOCAB * 4
    rows = {}
    for name, fn, args in (("zarya_loss+grad", zarya, (params, data, key)),
                           ("drafter_loss+grad", drafter_j, (adapter, params, data, key))):
        temp = _temp_bytes(fn, args)
        median = _median_s(lambda: jax.block_until_ready(fn(*args)), repeats)  # noqa: B023 (called here)
        rows[name] = {"median_s": round(median, 3), "temp_mb": round(temp / 2**20, 1),
                      "temp_per_BLV_f32": round(temp / one, 2)}
    prompts = [list(map(int, tokens[i, :32])) for i in range(batch)]
    gc = GenerationConfig(mode="ar", max_new_tokens=16, temperature=1.0, stop_at_eos=False)
    median = _median_s(lambda: generate(params, config, prompts, gc, jax.random.PRNGKey(3)).tokens, repeats)
    rows["ar_decode_16_tokens"] = {"median_s": round(median, 3), "per_token_ms": round(1000 * median / 16, 1)}
    return {"batch": batch, "length": length, "hidden": hidden, "vocab": VOCAB,
            "BLV_f32_mb": round(one / 2**20, 1), "results": rows}
