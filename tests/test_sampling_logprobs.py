"""`GenerationOutput.logprobs` (modes ar and spec) against a teacher-forced recompute: one causal
`model.forward` over prompt + output per row, log-softmax in float64 NumPy at the sampling temperature
(1 when greedy), mask token banned, no top-k / top-p / repetition penalty."""
import jax
import numpy as np
import pytest

from zarya_jax import model as model_lib
from zarya_jax import lora as lora_lib
from zarya_jax.sampling import GenerationConfig, SpecSelf, generate
from zarya_jax.testing import UNO_CONFIG as CFG, UNO_LORA as LORA, synthetic_tokens
from zarya_jax.testing import uno_trained_params as trained_model

PROMPT_LENGTHS = (9, 3, 14, 1, 6, 11)
EOS = 97 + 25  # 'z': the trained model's letter cycles reach it, so rows stop at different lengths
G = 20


def _prompts():
    rows = synthetic_tokens(np.random.default_rng(3), len(PROMPT_LENGTHS), max(PROMPT_LENGTHS))
    return [list(map(int, r[:n])) for r, n in zip(rows, PROMPT_LENGTHS)]


_forward = jax.jit(model_lib.forward, static_argnums=1)


def teacher_forced(params, prompts, out, temperature):
    """float64 [B, G]: log p(out[b, i] | prompt_b, out[b, :i]) from one causal forward over each row's
    prompt + output (right-padded into one batch: causal, so the padding is never attended), 0 after the end."""
    rows = [prompt + out.tokens[b, :int(out.lengths[b])].tolist() for b, prompt in enumerate(prompts)]
    batch = np.zeros((len(rows), max(PROMPT_LENGTHS) + G), np.int32)
    for b, row in enumerate(rows):
        batch[b, :len(row)] = row
    logits = np.asarray(_forward(params, CFG, batch), np.float64)
    logits[..., CFG.mask_token_id] = -np.inf
    z = logits / (temperature or 1.0)
    top = z.max(-1, keepdims=True)
    logp = z - top - np.log(np.exp(z - top).sum(-1, keepdims=True))
    ref = np.zeros(out.tokens.shape)
    for b, prompt in enumerate(prompts):
        n, p = int(out.lengths[b]), len(prompt)
        ref[b, :n] = logp[b, np.arange(p - 1, p - 1 + n), batch[b, p:p + n]]
    return ref


CASES = [  # (mode, knobs: shared and the mode's)
    ("ar", dict(temperature=1.0)),
    ("ar", dict(temperature=0.7, top_k=3)),
    ("ar", dict(temperature=0.0)),
    ("ar_uncached", dict(temperature=1.3, top_p=0.9)),
    ("spec-self", dict(temperature=1.0, draft_length=3)),
    ("spec-self", dict(temperature=0.7, top_k=3, draft_length=4)),
    ("spec-self-fused", dict(temperature=1.0, draft_length=3)),
    ("spec-self-fused", dict(temperature=1.3, top_k=5, repetition_penalty=1.2, draft_length=3)),
    ("spec-lora", dict(temperature=1.0, draft_length=4)),
    ("spec-lora", dict(temperature=1.3, top_k=5, repetition_penalty=1.2, draft_length=3)),
    ("spec-lora-fused", dict(temperature=1.0, top_k=5, repetition_penalty=1.2, draft_length=3)),
]


@pytest.mark.parametrize("mode,knobs", CASES)
def test_logprobs_equal_teacher_forced_recompute(mode, knobs):
    params = trained_model()
    prompts = _prompts()
    adapter = {}
    if mode.startswith("spec-lora"):  # an untrained adapter: its drafts are mostly rejected
        adapter = dict(lora_params=lora_lib.init_lora(CFG, LORA, jax.random.PRNGKey(1)), lora=LORA)
    gc = GenerationConfig(mode="ar" if mode == "ar_uncached" else mode, max_new_tokens=G,
                          eos_token_id=EOS).with_knobs(**knobs)
    out = generate(params, CFG, prompts, gc, jax.random.PRNGKey(5), use_cache=mode != "ar_uncached", **adapter)
    assert out.logprobs.dtype == np.float32 and out.logprobs.shape == (len(prompts), G)
    assert (out.lengths < G).any() and len(set(out.lengths.tolist())) > 1  # rows finish early, at different ends
    ref = teacher_forced(params, prompts, out, knobs["temperature"])
    np.testing.assert_allclose(out.logprobs, ref, atol=1e-4, rtol=0)
    written = np.arange(G)[None, :] < out.lengths[:, None]
    assert (out.logprobs[~written] == 0).all()
    assert (out.logprobs[written] <= 0).all() and out.logprobs[written].min() < -0.05  # not all certain
    if mode.startswith("spec"):
        by_position = out.stats["acceptance_by_position"]
        first = 0 if mode.endswith("-fused") else 1  # the first drafted token (two-pass: index 0 is c0, from p0)
        assert 0 < by_position[first] < 1  # drafts both accepted and rejected


def test_greedy_spec_reports_the_ar_logprobs():
    """Greedy Ψ-Spec emits the AR tokens, so both modes report the same log-probabilities."""
    params, prompts = trained_model(), _prompts()
    gc = GenerationConfig(mode="ar", max_new_tokens=G, eos_token_id=EOS, temperature=0.0)
    ref = generate(params, CFG, prompts, gc, jax.random.PRNGKey(0))
    out = generate(params, CFG, prompts, gc.replace(mode=SpecSelf(draft_length=3)), jax.random.PRNGKey(1))
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("mode,knobs", [("mdm", dict(steps=2)), ("slotted", dict(slot_size=2))])
def test_threshold_and_mdm_modes_report_none(mode, knobs):
    gc = GenerationConfig(mode=mode, max_new_tokens=4, temperature=1.0).with_knobs(**knobs)
    assert generate(trained_model(), CFG, _prompts()[:2], gc, jax.random.PRNGKey(0)).logprobs is None
