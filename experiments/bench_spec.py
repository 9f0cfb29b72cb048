"""Ψ-Spec benchmark (SPEC §7): accepted tokens per cycle, tokens per forward and wall-clock speed-up
over the AR sampler, for the gated-LoRA drafter and for Zarya self-speculation.

    python -m experiments.bench_spec [--ckpt CKPT] [--adapter DIR] [--draft-lengths 4,8,16]
                                     [--batch-sizes 1,8,32] [--max-new-tokens 128] [--out results.json]

Without --ckpt the script makes its own small model: a Qwen3 trained for a few hundred steps on a
deterministic synthetic text (letter sequences with a per-sequence stride, so the AR model is
predictable), plus a few steps of Zarya-style MDM training on masked copies so that the self drafter
has something to say. Without --adapter it trains a LoRA drafter on the same text with the TV loss
and the 2→16 block curriculum. Every configuration is compiled and warmed up first; the timed runs of
AR and spec at a batch size are interleaved, so both see the same machine load.
`run(...)` returns the results as a dict (also written to --out as JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from zarya_jax import drafter as drafter_lib
from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.config import LoraConfig, ModelConfig

LETTERS = 97  # 'a'
ALPHABET = 26
BENCH_CONFIG = ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                           num_kv_heads=2, head_dim=32, max_position_embeddings=1024, mask_token_id=259,
                           eos_token_id=258, pad_token_id=256, tie_word_embeddings=False)


# ------------------------------------------------------------------ synthetic text and quick training
def synthetic_tokens(rng: np.random.Generator, batch: int, length: int, strides=(1, 2, 3)) -> np.ndarray:
    """int32 [batch, length] letter ids: x_{i+1} = a + (x_i − a + k) mod 26, k drawn per row."""
    start = rng.integers(0, ALPHABET, (batch, 1))
    k = rng.choice(np.asarray(strides), (batch, 1))
    return (LETTERS + (start + k * np.arange(length)[None, :]) % ALPHABET).astype(np.int32)


def _batch_of(tokens: np.ndarray) -> dict:
    b, n = tokens.shape
    return {"tokens": jnp.asarray(tokens), "segment_ids": jnp.ones((b, n), jnp.int32),
            "positions": jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n)),
            "answer_mask": jnp.ones((b, n), bool)}


def pretrain_ar(config: ModelConfig, *, steps: int = 200, batch: int = 32, length: int = 32, lr: float = 3e-3,
                mdm_weight: float = 0.0, seed: int = 0):
    """A small AR model on the synthetic text (next-token CE). With mdm_weight > 0, also a masked
    copy (random mask rate, MDM convention: a mask predicts its own token) so the model can self-draft."""
    params = jax.jit(model_lib.init_params, static_argnums=0)(config, jax.random.PRNGKey(seed))
    opt = optax.adam(lr)
    state = opt.init(params)

    def loss_fn(p, toks, key):
        logits = model_lib.forward(p, config, toks)
        lp = jax.nn.log_softmax(logits[:, :-1], -1)
        ce = -jnp.take_along_axis(lp, toks[:, 1:, None], -1).mean()
        if mdm_weight == 0:
            return ce
        k1, k2 = jax.random.split(key)
        rate = jax.random.uniform(k1, (toks.shape[0], 1), minval=0.1, maxval=1.0)
        masked = jax.random.bernoulli(k2, rate, toks.shape) & (jnp.arange(toks.shape[1]) > 0)
        noisy = jnp.where(masked, config.mask_token_id, toks)
        lq = jax.nn.log_softmax(model_lib.forward(p, config, noisy), -1)
        mce = -jnp.take_along_axis(lq, toks[..., None], -1)[..., 0]
        return ce + mdm_weight * (mce * masked).sum() / jnp.maximum(masked.sum(), 1)

    @jax.jit
    def step(p, s, toks, key):
        loss, g = jax.value_and_grad(loss_fn)(p, toks, key)
        upd, s = opt.update(g, s, p)
        return optax.apply_updates(p, upd), s, loss

    rng = np.random.default_rng(seed)
    for i in range(steps):
        params, state, loss = step(params, state, jnp.asarray(synthetic_tokens(rng, batch, length)),
                                   jax.random.PRNGKey(i))
    return params, float(loss)


def fit_adapter(params, config: ModelConfig, lora: LoraConfig, dcfg: drafter_lib.DrafterConfig, *, steps: int = 100,
                batch: int = 16, length: int = 32, lr: float = 3e-3, seed: int = 0, lora_params=None):
    """In-memory drafter training (TV loss, block curriculum) on the synthetic text: only the adapter
    is differentiated and updated. Returns (lora_params, [loss per step])."""
    if lora_params is None:
        lora_params = lora_lib.init_lora(config, lora, jax.random.PRNGKey(seed + 1))
    opt = optax.adam(lr)
    state = opt.init(lora_params)

    @jax.jit
    def step(lp, s, b, key, block):
        pair = drafter_lib.make_pair_batch(key, b, block, config, dcfg)
        (loss, m), g = jax.value_and_grad(drafter_lib.drafter_loss, has_aux=True)(lp, params, config, lora, pair, dcfg)
        upd, s = opt.update(g, s, lp)
        return optax.apply_updates(lp, upd), s, loss

    rng = np.random.default_rng(seed + 7)
    losses = []
    for i in range(steps):
        block = drafter_lib.block_size_at(i, steps, dcfg)
        lora_params, state, loss = step(lora_params, state, _batch_of(synthetic_tokens(rng, batch, length)),
                                        jax.random.PRNGKey(1000 + i), jnp.int32(block))
        losses.append(float(loss))
    return lora_params, losses
