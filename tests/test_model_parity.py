"""HF → JAX parity: tiny random Hugging Face Qwen3 models, converted with `conversion.hf_to_jax`,
must give the logits of transformers' PyTorch Qwen3 (the independent reference), docs/algorithms.md §0–§1."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from conversion import hf_to_jax
from zarya_jax.config import ModelConfig
from zarya_jax import checkpoint, model
from zarya_jax.nn import hf_params, masks
from zarya_jax.testing import random_torch_model

FP32_TOL = 1e-4
# bf16 keeps 8 mantissa bits (relative rounding 2^-9 ≈ 0.2%) in weights and activations. Through two
# layers of these deliberately "hot" random weights and the head, the max logit error measured
# 2.0–3.4% of the logits' own scale (max |logit| ≈ 4) over seeds 7–9; the bound is 5% of that scale.
BF16_REL_TOL = 0.05


# One compile per (config, shapes): eager Linen + nn.scan would re-trace the layer stack on every call.
apply = jax.jit(model.apply, static_argnums=1)
forward = jax.jit(model.forward, static_argnums=1)


def make_hf_model(seed: int, *, vocab=96, hidden=32, inter=48, layers=2, heads=4, kv_heads=2, head_dim=8,
                  tie=False, theta=10000.0, eps=1e-6):
    """A random Qwen3 (`testing.random_torch_model`) with O(1) logits: weights re-drawn ~ N(0, 1/fan_in),
    norm scales ~ U(0.5, 1.5) (not all ones)."""
    config = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                         num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, tie_word_embeddings=tie,
                         rope_theta=theta, rms_norm_eps=eps, max_position_embeddings=256, eos_token_id=vocab - 1)
    m = random_torch_model(config, seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
    return m.eval()


def hf_logits(m, tokens, attention_mask=None, position_ids=None) -> np.ndarray:
    as_t = lambda a: None if a is None else torch.tensor(np.asarray(a), dtype=torch.long)  # noqa: E731
    with torch.no_grad():
        return m(input_ids=as_t(tokens), attention_mask=as_t(attention_mask),
                 position_ids=as_t(position_ids)).logits.float().numpy()


def convert(hf_dir, out, *flags) -> str:
    assert hf_to_jax.main(["--hf-dir", str(hf_dir), "--out", str(out), *flags]) == 0
    return str(out)


def save_and_convert(m, tmp_path_factory, name, *flags):
    """save_pretrained + hf_to_jax; returns (params, config) loaded from the new checkpoint."""
    root = tmp_path_factory.mktemp(name)
    m.save_pretrained(root / "hf")
    return checkpoint.load(convert(root / "hf", root / "ckpt", *flags))


def padded_batch(vocab: int, seed: int = 0):
    """Tokens [3, 9]: a full row, a left-padded row (3 pads), a right-padded row (2 pads)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (3, 9))
    valid = np.ones((3, 9), bool)
    valid[1, :3] = False
    valid[2, 7:] = False
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
    return tokens, valid, positions


CONFIGS = {
    "tied-gqa1-hd8": dict(tie=True, heads=4, kv_heads=4, head_dim=8, theta=10000.0, eps=1e-6),
    "untied-gqa2-hd10": dict(tie=False, heads=4, kv_heads=2, head_dim=10, theta=1e6, eps=1e-5),
    "untied-gqa4-hd14": dict(tie=False, heads=8, kv_heads=2, head_dim=14, theta=500.0, eps=1e-6),
    "tied-gqa4-hd16-3layers": dict(tie=True, heads=4, kv_heads=1, head_dim=16, theta=1e6, eps=1e-5, layers=3),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def converted(request, tmp_path_factory):
    m = make_hf_model(len(request.param), **CONFIGS[request.param])
    params, config = save_and_convert(m, tmp_path_factory, request.param)
    return m, params, config


def test_logits_match_hf_with_padding(converted):
    m, params, config = converted
    assert config.tie_word_embeddings == m.config.tie_word_embeddings
    assert ("lm_head" in params) == (not config.tie_word_embeddings)
    tokens, valid, positions = padded_batch(config.vocab_size)
    ours, _ = apply(params, config, jnp.asarray(tokens), jnp.asarray(positions),
                    window_mask=masks.causal_with_padding(jnp.asarray(valid)))
    ref = hf_logits(m, tokens, attention_mask=valid.astype(int), position_ids=positions)
    diff = np.abs(np.asarray(ours) - ref)[valid]
    assert diff.max() <= FP32_TOL, diff.max()
    # No padding: every row matches HF's default call (arange positions, plain causal mask).
    arange = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    plain, _ = apply(params, config, jnp.asarray(tokens), jnp.asarray(arange),
                     window_mask=masks.causal(*tokens.shape))
    assert np.abs(np.asarray(plain) - hf_logits(m, tokens)).max() <= FP32_TOL


@pytest.fixture(scope="module")
def small_model():
    return make_hf_model(7, **CONFIGS["untied-gqa2-hd10"])


def test_bf16_params_close_to_fp32(small_model, tmp_path_factory):
    params, config = save_and_convert(small_model, tmp_path_factory, "bf16", "--dtype", "bfloat16")
    assert config.param_dtype == config.dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for _, x in hf_params.leaves(params))
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (2, 12))
    ref = hf_logits(small_model, tokens)
    ours = np.asarray(forward(params, config, tokens))
    assert ours.dtype == np.float32
    scale = np.abs(ref).max()
    err = np.abs(ours - ref).max()
    assert err <= BF16_REL_TOL * scale, (err, scale)
    assert err > FP32_TOL  # it really ran in bf16


def test_physical_permutation_with_positions(small_model, tmp_path_factory):
    """docs/algorithms.md §0: permuting a prefix physically, positions carried along, changes nothing for a token
    whose mask lets it see the same set; HF with the same positions is the reference."""
    params, config = save_and_convert(small_model, tmp_path_factory, "perm")
    rng = np.random.default_rng(2)
    n_prefix, n = 6, 9
    tokens = rng.integers(0, config.vocab_size, (1, n))
    positions = np.arange(n)[None]
    perm = np.concatenate([rng.permutation(n_prefix), np.arange(n_prefix, n)])
    assert (perm[:n_prefix] != np.arange(n_prefix)).any()
    p_tokens, p_positions = tokens[:, perm], positions[:, perm]

    def run(tok, pos, mask):
        logits, _ = apply(params, config, jnp.asarray(tok), jnp.asarray(pos), window_mask=jnp.asarray(mask))
        return np.asarray(logits)[0]

    causal = np.tril(np.ones((n, n), bool))[None]
    base = run(tokens, positions, causal)
    # Physical-causal mask on the permuted order: what HF computes for these tokens and positions.
    permuted = run(p_tokens, p_positions, causal)
    ref = hf_logits(small_model, p_tokens, position_ids=p_positions)[0]
    assert np.abs(permuted - ref).max() <= FP32_TOL
    # Prefix tokens then see other sets than in the plain run, so rows change (the test is not vacuous).
    assert np.abs(permuted[:n_prefix] - base[perm[:n_prefix]]).max() > 1e-2
    # Logical-causal mask written in physical order (key position ≤ query position): every token sees
    # the same set as in the plain run, so every row, in particular each later token's, is unchanged.
    logical = (p_positions[:, None, :] <= p_positions[:, :, None])
    permuted = run(p_tokens, p_positions, logical)
    np.testing.assert_allclose(permuted[n_prefix:], base[n_prefix:], atol=1e-5, rtol=0)
    np.testing.assert_allclose(permuted, base[perm], atol=1e-5, rtol=0)
    # Same with a bidirectional prefix block, a mask that is invariant under the permutation.
    bidir = causal.copy()
    bidir[:, :n_prefix, :n_prefix] = True
    base, permuted = run(tokens, positions, bidir), run(p_tokens, p_positions, bidir)
    np.testing.assert_allclose(permuted, base[perm], atol=1e-5, rtol=0)
