"""AR sampler (docs/algorithms.md §4) against Hugging Face transformers' greedy generate and a cache-free recompute."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import model as model_lib
from zarya_jax.config import ModelConfig
from zarya_jax.sampling import GenerationConfig, generate
from zarya_jax.sampling.generate import TRACE_COUNTS
from zarya_jax.testing import TINY, random_torch_model

MASK, EOS, PAD = 259, 258, 256
PROMPTS = [[5, 17, 42, 99, 3, 250, 7], [12, 8], [200, 1, 1, 64, 33]]
G = 10


def params_from_state_dict(sd, c: ModelConfig):
    """HF Qwen3 state dict → our params (layout in model.py), written here independently of the library."""
    d, h, k, q = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim

    def stack(name, fn=lambda w: w):
        return jnp.asarray(np.stack([fn(sd[f"model.layers.{i}.{name}.weight"]) for i in range(c.num_layers)]))

    return {"embed": jnp.asarray(sd["model.embed_tokens.weight"]),
            "final_norm": {"scale": jnp.asarray(sd["model.norm.weight"])},
            "layers": {"input_norm": {"scale": stack("input_layernorm")},
                       "post_attn_norm": {"scale": stack("post_attention_layernorm")},
                       "q_norm": {"scale": stack("self_attn.q_norm")},
                       "k_norm": {"scale": stack("self_attn.k_norm")},
                       "q_proj": {"kernel": stack("self_attn.q_proj", lambda w: w.T.reshape(d, h, q))},
                       "k_proj": {"kernel": stack("self_attn.k_proj", lambda w: w.T.reshape(d, k, q))},
                       "v_proj": {"kernel": stack("self_attn.v_proj", lambda w: w.T.reshape(d, k, q))},
                       "o_proj": {"kernel": stack("self_attn.o_proj", lambda w: w.T.reshape(h, q, d))},
                       "gate_proj": {"kernel": stack("mlp.gate_proj", lambda w: w.T)},
                       "up_proj": {"kernel": stack("mlp.up_proj", lambda w: w.T)},
                       "down_proj": {"kernel": stack("mlp.down_proj", lambda w: w.T)}}}


@pytest.fixture(scope="module")
def hf_pair():
    pytest.importorskip("torch")
    config = TINY  # mask MASK, EOS EOS, pad PAD
    hf = random_torch_model(config, 0, initializer_range=0.2)
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    return hf, config, params_from_state_dict(sd, config)


def hf_greedy(hf, prompt, eos):
    import torch

    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=G, do_sample=False, eos_token_id=eos,
                          pad_token_id=PAD, suppress_tokens=[MASK], attention_mask=torch.ones(1, len(prompt),
                                                                                              dtype=torch.long))
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def run_ar(hf_pair):
    hf, config, params = hf_pair
    # Pick as EOS a token greedy decoding reaches mid-way in row 0, so per-row EOS stopping is exercised.
    free = hf_greedy(hf, PROMPTS[0], eos=None)
    eos = free[3]
    gc = GenerationConfig(mode="ar", max_new_tokens=G, temperature=0.0, eos_token_id=eos, prompt_bucket=8)
    out = generate(params, config, PROMPTS, gc, jax.random.PRNGKey(0), debug=True)
    return hf, config, params, gc, eos, out


def test_greedy_matches_hf_generate(run_ar):
    hf, config, params, gc, eos, out = run_ar
    assert out.lengths[0] <= 4  # row 0 stops at the chosen EOS
    for b, prompt in enumerate(PROMPTS):
        ref = hf_greedy(hf, prompt, eos)
        n = int(out.lengths[b])
        assert out.tokens[b, :n].tolist() == ref, (b, out.tokens[b].tolist(), ref)
        assert np.all(out.tokens[b, n:] == PAD)
        assert out.num_forward_passes[b] == n  # prefill + one pass per further token


def test_cached_logits_equal_full_forward(run_ar):
    """Prefill + decode logits equal one causal forward without cache over prompt + generated, at every step."""
    hf, config, params, gc, eos, out = run_ar
    trace = np.asarray(out.stats["trace"]["logits"])  # [G, B, V]
    width = max(len(p) for p in PROMPTS) + G
    fwd = jax.jit(lambda t: model_lib.forward(params, config, t))
    for b, prompt in enumerate(PROMPTS):
        n = int(out.lengths[b])
        seq = prompt + out.tokens[b, :n].tolist()
        ref = np.asarray(fwd(jnp.asarray([seq + [PAD] * (width - len(seq))], jnp.int32)))[0]
        np.testing.assert_allclose(trace[:n, b], ref[len(prompt) - 1: len(prompt) - 1 + n], atol=2e-5, rtol=1e-5)


def test_no_recompile_and_uncached(run_ar):
    hf, config, params, gc, eos, out = run_ar
    before = TRACE_COUNTS["ar"]
    other = [[9, 9, 8], [1, 2, 3, 4, 5, 6, 7, 8], [77]]  # same batch, same bucket (8)
    out2 = generate(params, config, other, gc, jax.random.PRNGKey(1), debug=True)
    assert TRACE_COUNTS["ar"] == before
    # the cache-free decode gives the same greedy tokens
    ref = generate(params, config, other, gc, jax.random.PRNGKey(1), use_cache=False)
    np.testing.assert_array_equal(out2.tokens, ref.tokens)
    np.testing.assert_array_equal(out2.lengths, ref.lengths)


def test_array_prompts_match_hf_generate(run_ar):
    """A `[B, L]` integer array (NumPy or jax), or a list of 1-D arrays, is B prompts: greedy tokens equal
    Hugging Face's for each row. Arrays that are not 2-D integer ids are refused by name."""
    hf, config, params, gc, eos, _ = run_ar
    rows = np.asarray([p[:2] for p in PROMPTS], np.int64)
    want = [hf_greedy(hf, r.tolist(), eos) for r in rows]
    for prompts in (rows, jnp.asarray(rows, jnp.int32), list(rows.astype(np.uint16))):
        out = generate(params, config, prompts, gc, jax.random.PRNGKey(0), debug=True)
        assert [out.tokens[b, :out.lengths[b]].tolist() for b in range(len(rows))] == want, type(prompts)
    bad = {"float": (rows.astype(np.float32), "integer dtype, got float32"),
           "bool": (rows > 5, "integer dtype, got bool"),
           "1-d": (rows[0], r"2-D \[B, L\].*int64\(2,\)"),
           "3-d": (rows[None], r"2-D \[B, L\].*int64\(1, 3, 2\)"),
           "empty": (rows[:0], "non-empty"),
           "vocab": (rows + config.vocab_size, "outside the vocabulary")}
    for name, (prompts, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            generate(params, config, prompts, gc, jax.random.PRNGKey(0))


def test_params_of_another_config_are_refused_by_name(run_ar):
    """Params shaped for another config: one ShapeError (a ValueError) naming the first param that does
    not fit, its shape and the expected one, from `generate` and `forward` alike; the table it checks
    against agrees with what the model's `init` declares, tied head or not."""
    from zarya_jax.nn.hf_params import ShapeError, check_params

    _, config, params, gc, _, _ = run_ar
    for cfg in (config, config.replace(tie_word_embeddings=False, num_kv_heads=4)):
        check_params(jax.eval_shape(lambda k: model_lib.init_params(cfg, k), jax.random.PRNGKey(0)), cfg)
    wider = config.replace(intermediate_size=96)
    other = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         jax.eval_shape(lambda k: model_lib.init_params(wider, k), jax.random.PRNGKey(0)))
    message = r"layers/gate_proj/kernel.*\(2, 64, 96\), expected \(2, 64, 128\)"
    with pytest.raises(ShapeError, match=message):
        generate(other, config, PROMPTS, gc, jax.random.PRNGKey(0))
    with pytest.raises(ShapeError, match=message):
        model_lib.forward(other, config, jnp.zeros((1, 4), jnp.int32))
    untied = {**params, "lm_head": params["embed"].T}
    with pytest.raises(ShapeError, match=r"unexpected \['lm_head'\]"):
        generate(untied, config, PROMPTS, gc, jax.random.PRNGKey(0))
    assert issubclass(ShapeError, ValueError)
