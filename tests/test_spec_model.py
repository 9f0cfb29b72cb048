"""Speculative sampling with an independent draft model (docs/algorithms.md §7.6, mode "spec-model"): greedy
identity with the AR sampler, the exact two-token distribution, both caches against a full recompute,
log-probabilities against a teacher-forced forward, and the draft model checked at the edge."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import model as model_lib
from zarya_jax.nn import kv_cache, masks
from zarya_jax.sampling import GenerationConfig, generate, pad_prompts, spec_model
from zarya_jax.sampling.spec_model import SpecModel
from zarya_jax.sampling.primitives import token_logprob
from zarya_jax.testing import SPEC_SMALL, UNO_CONFIG as CFG, ragged_prompts, sharp_params
from zarya_jax.testing import two_token_distribution, two_token_tv
from zarya_jax.testing import uno_random_params as random_model, uno_trained_params as trained_model

# a draft model a quarter of the base's width, reading the same ids
DRAFT_CFG = CFG.replace(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
_prompts = ragged_prompts


def _perturbed(params, scale: float, seed: int):
    """The base's weights plus Gaussian noise: a draft model (of the base's config) that agrees with the
    base on some tokens and not on others."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def _draft(kind: str, base):
    """(draft params, draft config): a small random model, a noisy copy of the base, or the base itself."""
    if kind == "small":
        return jax.jit(model_lib.init_params, static_argnums=0)(DRAFT_CFG, jax.random.PRNGKey(5)), DRAFT_CFG
    if kind == "noisy":
        return _perturbed(base, 0.05, 6), CFG
    return base, CFG


CASES = [("random", "small", 3), ("random", "noisy", 4), ("trained", "noisy", 5), ("trained", "same", 4),
         ("trained", "small", 1)]


@pytest.mark.parametrize("model,draft,f", CASES)
def test_greedy_identical_to_ar(model, draft, f):
    """Greedy: the same tokens and lengths as the AR sampler, ragged prompts (one of a single token) and
    ragged ends (EOS = a token row 0 emits early) included. A draft model equal to the base has every
    draft accepted (F + 1 tokens per cycle), which only holds when its cache is the text's."""
    params = random_model() if model == "random" else trained_model()
    dp, dcfg = _draft(draft, params)
    prompts = _prompts(model == "trained")
    base = GenerationConfig(mode="ar", max_new_tokens=24)
    if model == "trained":
        eos = int(generate(params, CFG, prompts, base.replace(stop_at_eos=False), jax.random.PRNGKey(0)).tokens[0, 2])
        base = base.replace(eos_token_id=eos)
    ref = generate(params, CFG, prompts, base, jax.random.PRNGKey(0))
    out = generate(params, CFG, prompts, base.replace(mode=SpecModel(draft_length=f)),
                   jax.random.PRNGKey(1), draft_params=dp, draft_config=dcfg)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    st = out.stats
    assert 0.0 <= st["accepted_per_cycle"] <= f and len(st["acceptance_by_position"]) == f
    # one base pass per cycle of at most F + 1 tokens, plus the prefill; F draft passes per cycle
    assert (out.num_forward_passes >= 1 + np.ceil(out.lengths / (f + 1))).all()
    cycles = out.num_forward_passes - 1
    assert st["draft_forwards"] == pytest.approx(np.mean(1 + f * cycles))
    assert st["tokens_per_forward"] == pytest.approx(out.lengths.sum() / cycles.sum())
    if draft == "same":
        assert st["acceptance_by_position"] == [1.0] * f
        # every cycle but a row's last (cut by EOS or the budget) yields F + 1 tokens
        np.testing.assert_array_equal(cycles, np.ceil(out.lengths / (f + 1)))
    if model == "trained":
        assert out.lengths[0] <= 3


def test_first_two_tokens_joint_distribution():
    """Histogram of (token 1, token 2) at temperature 1 (F = 3) vs the AR model's exact two-token
    distribution, enumerated with full forwards; the draft model is another sharp random model, so drafts
    are rejected often and the residual draws carry the distribution."""
    params, draft = sharp_params(SPEC_SMALL, 11), sharp_params(SPEC_SMALL, 31)
    prompt, v, n = [1, 2, 3, 4], 7, 60_000  # the mask token (id 7) is never sampled
    exact = two_token_distribution(params, SPEC_SMALL, prompt, v)
    gc = GenerationConfig(mode=SpecModel(draft_length=3), max_new_tokens=2, temperature=1.0)
    tokens = jnp.broadcast_to(jnp.asarray(prompt, jnp.int32), (n, len(prompt)))
    raw = spec_model.spec_model_decode(params, draft, tokens, jnp.full((n,), len(prompt), jnp.int32),
                                       jax.random.PRNGKey(13), jnp.int32(2), config=SPEC_SMALL,
                                       draft_config=SPEC_SMALL, gcfg=gc)
    out = np.asarray(raw["tokens"])
    assert (np.asarray(raw["lengths"]) == 2).all() and out.max() < v
    tv = two_token_tv(out, exact)
    assert tv < 0.025, (tv, exact)  # sampling noise alone: E[TV] ≤ 0.011
    rate = np.asarray(raw["accepted_at"]) / np.maximum(np.asarray(raw["reached_at"]), 1)
    assert 0.05 < rate[0] < 0.95, rate  # both branches of the rule were taken often


def test_caches_after_each_cycle_equal_a_recompute():
    """After 1, 2, 3 cycles (temperature 1, a noisy draft: varied acceptance): the base cache holds the
    AR K/V of the text minus its last token, the draft cache the draft model's K/V of the text minus its
    last two, each equal to a full causal recompute over the text."""
    params = random_model()
    dp = _perturbed(params, 0.05, 6)
    prompts = _prompts(False)
    gc = GenerationConfig(mode=SpecModel(draft_length=4), max_new_tokens=24, temperature=1.0,
                          stop_at_eos=False)
    tokens, lengths = pad_prompts(prompts, gc.prompt_bucket, CFG.pad_token_id)
    b, width = len(prompts), tokens.shape[1] + 24

    @jax.jit
    def recompute(p, text, valid):
        return model_lib.apply(p, CFG, text, window_mask=masks.causal_with_padding(valid))[1]

    for cycles in (1, 2, 3):
        raw = jax.device_get(spec_model.spec_model_decode(params, dp, jnp.asarray(tokens), jnp.asarray(lengths),
                                                          jax.random.PRNGKey(4), jnp.int32(cycles), config=CFG,
                                                          draft_config=CFG, gcfg=gc))
        gen = raw["lengths"]
        assert (gen < 24).all()
        text = np.full((b, width), CFG.pad_token_id, np.int32)
        for i, p in enumerate(prompts):
            text[i, :len(p)] = p
            text[i, len(p):len(p) + gen[i]] = raw["tokens"][i, :gen[i]]
        total = lengths + gen
        valid = jnp.asarray(np.arange(width)[None] < total[:, None])
        np.testing.assert_array_equal(raw["cache"]["length"], total - 1)
        np.testing.assert_array_equal(raw["draft_cache"]["length"], total - 2)
        np.testing.assert_array_equal(raw["seed"], text[np.arange(b), total - 1])
        for cache, weights, keep in ((raw["cache"], params, 1), (raw["draft_cache"], dp, 2)):
            kv = jax.device_get(recompute(weights, jnp.asarray(text), valid))
            for i in range(b):
                n = total[i] - keep
                for cached, window in zip(kv_cache.rows(cache, i, n), kv):
                    np.testing.assert_allclose(cached, window[:, i, :n], atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_match_a_teacher_forced_forward(temperature):
    """Each emitted token's log-probability equals log softmax(logits / T) of a full causal forward over
    prompt + output (the mask token banned), to 1e-4; 0 after a row's end."""
    params = random_model()
    dp, dcfg = _draft("small", params) if temperature else (_perturbed(params, 0.05, 6), CFG)
    prompts = _prompts(False)
    gc = GenerationConfig(mode=SpecModel(draft_length=3), max_new_tokens=16, temperature=temperature,
                          eos_token_id=5)
    out = generate(params, CFG, prompts, gc, jax.random.PRNGKey(3), draft_params=dp, draft_config=dcfg)
    forward = jax.jit(lambda t: model_lib.forward(params, CFG, t))
    for i, p in enumerate(prompts):
        n = int(out.lengths[i])
        seq = jnp.asarray([p + out.tokens[i, :n].tolist()], jnp.int32)
        logits = forward(seq)[0, len(p) - 1:len(p) - 1 + n]
        want = np.asarray(token_logprob(logits, seq[0, len(p):], temperature or 1.0, CFG.mask_token_id))
        np.testing.assert_allclose(out.logprobs[i, :n], want, atol=1e-4)
        assert (out.logprobs[i, n:] == 0).all()


def test_bad_draft_models_are_refused():
    """A missing draft model, another vocabulary or special id, too few positions, or params of another
    config: a ValueError naming the problem, before anything is compiled."""
    params = random_model()
    dp = jax.jit(model_lib.init_params, static_argnums=0)(DRAFT_CFG, jax.random.PRNGKey(5))
    gc = GenerationConfig(mode=SpecModel(draft_length=2), max_new_tokens=4)
    prompts = [[1, 2, 3]]
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="mode 'spec-model' needs the draft model"):
        generate(params, CFG, prompts, gc, key)
    with pytest.raises(ValueError, match="needs the draft model"):
        generate(params, CFG, prompts, gc, key, draft_params=dp)
    with pytest.raises(ValueError, match="vocab_size=300.*vocab_size=264"):
        generate(params, CFG, prompts, gc, key, draft_params=dp, draft_config=DRAFT_CFG.replace(vocab_size=300))
    with pytest.raises(ValueError, match="eos_token_id=1"):
        generate(params, CFG, prompts, gc, key, draft_params=dp, draft_config=DRAFT_CFG.replace(eos_token_id=1))
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        generate(params, CFG, prompts, gc, key, draft_params=dp,
                 draft_config=DRAFT_CFG.replace(max_position_embeddings=64))
    with pytest.raises(ValueError, match="draft_config: expected a ModelConfig"):
        generate(params, CFG, prompts, gc, key, draft_params=dp, draft_config={"vocab_size": 264})
    with pytest.raises(ValueError):  # the params of another config: the shape error names the param
        generate(params, CFG, prompts, gc, key, draft_params=params, draft_config=DRAFT_CFG)
    with pytest.raises(ValueError, match=r"mode 'spec-models': unknown; expected one of \['ar'"):
        GenerationConfig(mode="spec-models")
    with pytest.raises(ValueError, match="knobs.spec-model.draft_length=0: expected an integer ≥ 1"):
        GenerationConfig(mode=SpecModel(draft_length=0)).validate()
