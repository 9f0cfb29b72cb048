"""The drafts' proposal at temperature > 0 (docs/algorithms.md §7.8, `spec.Speculative.proposal`): for every
speculative mode and every proposal ("sample", "argmax", "tempered"), the exact joint distribution of the
first two tokens (also with top-k and top-p) is the AR model's; greedy decoding is AR's whatever the
proposal; "tempered" at τ = 1 is "sample" bit for bit and τ is traced; the first draft's acceptance rate is
the enumerated Σ min(p, q') of its proposal q'."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.config import LoraConfig
from zarya_jax.sampling import GenerationConfig, generate, mode, spec_model
from zarya_jax.sampling.generate import TRACE_COUNTS
from zarya_jax.testing import SPEC_SMALL as SMALL, UNO_CONFIG as CFG, UNO_LORA, ragged_prompts, sharp_params
from zarya_jax.testing import uno_random_params

PROMPT, V = [1, 2, 3, 4], 7  # ids 0 … 6; the mask token (id 7) is never sampled
SMALL_LORA = LoraConfig(rank=2, alpha=4.0)


# ------------------------------------------------------------------ the models and the exact distribution
def _weights(name: str, config, params, lora: LoraConfig, seed: int) -> dict:
    """`generate`'s drafter arguments for mode `name`: an adapter unlike the AR model (LoRA modes), a
    separate random draft model of `config` (spec-model), nothing (self drafter)."""
    if name == "spec-model":
        return {"draft_params": sharp_params(config, seed, 20.0), "draft_config": config}
    if "lora" in name:
        lp = jax.tree.map(lambda x: x + 0.3, lora_lib.init_lora(config, lora, jax.random.PRNGKey(seed)))
        return {"lora_params": lp, "lora": lora}
    return {}


def ar_probs(logits: np.ndarray, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """float64 [..., V]: the AR sampler's distribution at temperature 1 over ids 0 … V−1, then top-k, then
    top-p (the smallest most likely set reaching top_p; the token that crosses it kept)."""
    z = np.asarray(logits, np.float64)[..., :V]
    if top_k:
        z = np.where(z >= np.sort(z, -1)[..., -top_k:-top_k + 1], z, -np.inf)
    probs = np.exp(z - z.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if top_p < 1.0:
        desc = -np.sort(-probs, -1)
        before = np.cumsum(desc, -1) - desc
        cutoff = np.min(np.where(before < top_p, desc, np.inf), -1, keepdims=True)
        probs = np.where(probs >= cutoff, probs, 0.0)
        probs /= probs.sum(-1, keepdims=True)
    return probs


def exact_two_tokens(params, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """float64 [V, V]: p(t1) p(t2 | t1) after PROMPT, from full causal forwards over PROMPT + t1."""
    seqs = jnp.asarray([PROMPT + [t1] for t1 in range(V)], jnp.int32)
    probs = ar_probs(model_lib.forward(params, SMALL, seqs), top_k, top_p)
    return probs[0, len(PROMPT) - 1][:, None] * probs[:, len(PROMPT)]


# ------------------------------------------------------------------ losslessness for every mode and proposal
CASES = [  # (mode, its knobs, proposal, τ, top_k, top_p): each mode with each new proposal, filters among them
    ("spec-self", {}, "argmax", 0.5, 0, 1.0),
    ("spec-self", {}, "tempered", 2.0, 0, 1.0),
    ("spec-lora", {}, "tempered", 0.5, 0, 0.8),
    ("spec-lora", {"draft_passes": 2}, "argmax", 0.5, 3, 1.0),
    ("spec-model", {}, "argmax", 0.5, 0, 1.0),
    ("spec-model", {}, "tempered", 0.5, 0, 0.8),
    ("spec-self-fused", {}, "argmax", 0.5, 0, 1.0),
    ("spec-self-fused", {}, "tempered", 2.0, 0, 1.0),
    ("spec-lora-fused", {}, "argmax", 0.5, 3, 1.0),
    ("spec-lora-fused", {}, "tempered", 2.0, 0, 0.9),
]


@pytest.mark.parametrize("name,knobs,proposal,tau,top_k,top_p", CASES)
def test_first_two_tokens_joint_distribution(name, knobs, proposal, tau, top_k, top_p):
    """Histogram of (token 1, token 2) over 60 000 rows at temperature 1 (3 drafts per cycle) through
    `generate()` vs the AR model's exact two-token distribution under the same top-k / top-p. Each case
    is one a proposal verified against the wrong distribution (an argmax or tempered draft against q)
    fails by 4 to 50 times the threshold. (The self drafter's q on this model is peaked enough that top-k
    or top-p leave it one token, where every proposal is the same: its cases run unfiltered.)"""
    params = sharp_params(SMALL, 11, 20.0)  # a spread, non-flat p
    exact = exact_two_tokens(params, top_k, top_p)
    n = 60_000
    gc = GenerationConfig(mode=mode(name, draft_length=3, proposal=proposal, proposal_temperature=tau, **knobs),
                          max_new_tokens=2, temperature=1.0, top_k=top_k, top_p=top_p)
    out = generate(params, SMALL, np.tile(PROMPT, (n, 1)), gc, jax.random.PRNGKey(13),
                   **_weights(name, SMALL, params, SMALL_LORA, 12))
    assert (out.lengths == 2).all() and out.tokens.max() < V
    hist = np.bincount(out.tokens[:, 0] * V + out.tokens[:, 1], minlength=V * V).reshape(V, V) / n
    tv = 0.5 * np.abs(hist - exact).sum()
    # sampling noise alone: E[TV] ≈ 0.5 Σ sqrt(2 p (1 − p) / (π n)); its spread is far smaller
    noise = 0.5 * np.sqrt(2 * exact * (1 - exact) / (np.pi * n)).sum()
    assert tv < 1.3 * noise + 0.003, (tv, noise)
    # the first verified draft was both accepted and rejected: the acceptance rule really ran
    first = out.stats["acceptance_by_position"][1 if name in ("spec-self", "spec-lora") else 0]
    assert 0.0 < first < 1.0, out.stats["acceptance_by_position"]


@pytest.mark.parametrize("name,knobs,proposal", [("spec-self", {}, "argmax"),
                                                 ("spec-lora", {"draft_passes": 2}, "tempered"),
                                                 ("spec-model", {}, "argmax"), ("spec-self-fused", {}, "tempered"),
                                                 ("spec-lora-fused", {}, "argmax")])
def test_greedy_ignores_the_proposal(name, knobs, proposal):
    """Temperature 0: every proposal decodes the AR sampler's tokens (ragged prompts, random model)."""
    params, prompts = uno_random_params(), ragged_prompts(False)
    base = GenerationConfig(mode="ar", max_new_tokens=12)
    ref = generate(params, CFG, prompts, base, jax.random.PRNGKey(0))
    gc = base.replace(mode=mode(name, draft_length=3, proposal=proposal, **knobs))
    out = generate(params, CFG, prompts, gc, jax.random.PRNGKey(1), **_weights(name, CFG, params, UNO_LORA, 1))
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.tokens, ref.tokens)


# ------------------------------------------------------------------ τ: traced, and τ = 1 is "sample"
@pytest.mark.parametrize("name,knobs", [("spec-self", {}), ("spec-lora", {"draft_passes": 2}), ("spec-model", {}),
                                        ("spec-self-fused", {}), ("spec-lora-fused", {})])
def test_tempered_at_one_is_sample_and_tau_is_traced(name, knobs):
    """softmax(log q / 1) is q and the draws share the Gumbel noise, so "tempered" at τ = 1 decodes
    exactly what "sample" does (tokens, log-probabilities, acceptance counts; top-k, top-p and the
    repetition penalty on). Another τ reuses the tempered program."""
    params, prompts = uno_random_params(), ragged_prompts(False)
    weights = _weights(name, CFG, params, UNO_LORA, 1)
    gc = GenerationConfig(mode=mode(name, draft_length=3, **knobs), max_new_tokens=10, temperature=0.9, top_k=40,
                          top_p=0.95, repetition_penalty=1.2)
    ref = generate(params, CFG, prompts, gc, jax.random.PRNGKey(2), **weights)
    before = TRACE_COUNTS[name]
    tempered = gc.with_knobs(proposal="tempered", proposal_temperature=1.0)
    out = generate(params, CFG, prompts, tempered, jax.random.PRNGKey(2), **weights)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.logprobs, ref.logprobs)
    assert out.stats["counts"] == ref.stats["counts"]
    generate(params, CFG, prompts, tempered.with_knobs(proposal_temperature=0.3), jax.random.PRNGKey(2), **weights)
    assert TRACE_COUNTS[name] - before == 1  # one program for both τ


# ------------------------------------------------------------------ the acceptance rate of each proposal
def test_first_draft_accepts_at_its_proposals_exact_rate():
    """The draft model's first draft d1 (one cycle, 20 000 copies of the prompt, temperature 1) is accepted
    with probability Σ_t min(p(t), q'(t)) for its proposal q': q itself ("sample"), the point mass at
    argmax q ("argmax": p(argmax q)), softmax(log q / τ) ("tempered"). Enumerated from one forward of each
    model; the three values are far apart, so each run matches its own proposal's rate only. The draft model
    is the base with a flatter head (q ∝ p^0.4): sharpening it (τ = 0.5) brings it closer to p."""
    params, draft = sharp_params(SMALL, 11, 20.0), sharp_params(SMALL, 11, 8.0)
    seq = jnp.asarray([PROMPT], jnp.int32)
    p = ar_probs(model_lib.forward(params, SMALL, seq))[0, -1]
    q = ar_probs(model_lib.forward(draft, SMALL, seq))[0, -1]
    tau = 0.5
    tempered = q ** (1 / tau) / np.sum(q ** (1 / tau))
    exact = {"sample": np.minimum(p, q).sum(), "argmax": p[np.argmax(q)], "tempered": np.minimum(p, tempered).sum()}
    rates = sorted(exact.values())
    assert min(np.diff(rates)) > 0.1, exact  # 0.50, 0.78, 0.94: far apart, whatever the CPU's rounding

    n = 20_000
    tokens, lengths = jnp.asarray(np.tile(PROMPT, (n, 1)), jnp.int32), jnp.full((n,), len(PROMPT), jnp.int32)
    for proposal, want in exact.items():
        gc = GenerationConfig(mode=mode("spec-model", draft_length=2, proposal=proposal), max_new_tokens=3,
                              temperature=1.0)
        raw = spec_model.spec_model_decode(params, draft, tokens, lengths, jax.random.PRNGKey(14), jnp.int32(1),
                                           jnp.float32(tau), config=SMALL, draft_config=SMALL, gcfg=gc)
        assert int(raw["reached_at"][0]) == n
        # binomial sampling noise: σ ≤ 0.0036; 5σ
        assert abs(int(raw["accepted_at"][0]) / n - want) < 0.018, (proposal, int(raw["accepted_at"][0]) / n, exact)


# ------------------------------------------------------------------ the knobs
def test_proposal_knobs_are_checked_and_labelled():
    gc = GenerationConfig(mode="spec-lora", temperature=1.0)
    with pytest.raises(ValueError, match=r"knobs.spec-lora.proposal='greedy': expected one of \('sample', 'argmax', "
                                         r"'tempered'\)"):
        gc.with_knobs(proposal="greedy").validate(CFG)
    for bad in (0.0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError,
                           match=r"knobs.spec-model.proposal_temperature=.*: expected a finite temperature > 0"):
            GenerationConfig(mode="spec-model").with_knobs(proposal="tempered", proposal_temperature=bad).validate(CFG)
    assert mode("spec-self-fused", draft_length=4, proposal="argmax").short() == "K=4 argmax"
    assert mode("spec-lora", proposal="tempered", proposal_temperature=0.3).short() == "F=8 tempered τ=0.3"
    # only "tempered" reads τ: the other proposals' points decode alike whatever it is
    assert mode("spec-model", proposal="argmax", proposal_temperature=0.3).canonical(16) == mode("spec-model",
                                                                                                proposal="argmax")
    assert mode("spec-model", proposal="tempered", proposal_temperature=0.3).canonical(16).proposal_temperature == 0.3
