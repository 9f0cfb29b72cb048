"""GRPO's pure core against an independent float64 NumPy reference written from the papers
(DeepSeekMath's GRPO objective, TRL's GRPOTrainer and tunix's grpo_learner: group-normalised advantages,
per-token importance ratio, clipped surrogate, k3 KL estimator, the three aggregation modes), its
gradient by central differences; the JAX loss and gradient with respect to the logits match it. Also:
`clip_fraction` counts exactly the tokens whose clipping removes the gradient, the loss through the
model on real rollouts (rollout ratio 1, teacher-forced log-probabilities = the sampler's) and its
parameter gradient against central differences; rewards; bad configs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax.config import ConfigError
from zarya_jax.rl import grpo, rewards
from zarya_jax.sampling import MDM, GenerationConfig, SpecSelf, generate, primitives
from zarya_jax.testing import UNO_CONFIG as CFG, uno_random_params, uno_trained_params


# --------------------------------------------------------------------------- the float64 reference
def reference_advantages(rewards, group: int) -> np.ndarray:
    """Â_i = (r_i − mean(r_group)) / (std(r_group) + 1e-6), the unbiased std (torch's, as in TRL)."""
    r = np.asarray(rewards, np.float64).reshape(-1, group)
    return ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)).ravel()


def reference_logprobs(logits, tokens, temperature: float) -> np.ndarray:
    """log softmax(logits / T)[token] in float64."""
    z = np.asarray(logits, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return np.take_along_axis(logp, np.asarray(tokens)[..., None], -1)[..., 0]


def reference_loss(lp, old, ref, adv, mask, eps: float, beta: float, mode: str) -> float:
    """−J(θ): J = the mean over completion tokens (by `mode`) of
    min(ρ·Â, clip(ρ, 1 − ε, 1 + ε)·Â) − β·D, with ρ = π/π_old and D = π_ref/π − log(π_ref/π) − 1 (k3).
    token-mean: Σ_i Σ_t / Σ_i |o_i|; sequence-mean-token-mean: (1/G) Σ_i (1/|o_i|) Σ_t (the paper's eq. 3);
    sequence-mean-token-sum: (1/G) Σ_i Σ_t."""
    lp, old, ref = (np.asarray(x, np.float64) for x in (lp, old, ref))
    m = np.asarray(mask, np.float64)
    a = np.asarray(adv, np.float64)[:, None]
    rho = np.exp(lp - old)
    surrogate = np.minimum(rho * a, np.clip(rho, 1 - eps, 1 + eps) * a)
    kl = np.exp(ref - lp) - (ref - lp) - 1
    per_token = (surrogate - beta * kl) * m
    if mode == "token-mean":
        objective = per_token.sum() / m.sum()
    elif mode == "sequence-mean-token-mean":
        objective = np.mean(per_token.sum(1) / np.maximum(m.sum(1), 1))
    else:
        objective = np.mean(per_token.sum(1))
    return -float(objective)


def finite_difference(f, x, h: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar f at x (float64), entry by entry."""
    x = np.array(x, np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        grad[i] = (f(x + e) - f(x - e)) / (2 * h)
    return grad


def numpy_loss(lp, old, ref, adv, mask, eps, beta, mode):
    """(the reference loss, its gradient d loss / d log π by central differences), float64."""
    f = lambda x: reference_loss(x, old, ref, adv, mask, eps, beta, mode)  # noqa: E731
    return f(lp), finite_difference(f, lp)


def clipped_fraction(lp, old, adv, mask, eps: float) -> float:
    """The share of completion tokens whose clipped term is the min and differs from the unclipped one."""
    rho = np.exp(np.asarray(lp, np.float64) - old)
    a = np.asarray(adv, np.float64)[:, None]
    return float(((np.clip(rho, 1 - eps, 1 + eps) * a < rho * a) & mask).sum() / mask.sum())


def test_group_advantages():
    r = np.array([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 3.0, 5.0])
    adv = grpo.group_advantages(r, 4)
    for k in range(2):
        grp = r[4 * k:4 * k + 4]
        np.testing.assert_allclose(adv[4 * k:4 * k + 4], (grp - grp.mean()) / (grp.std(ddof=1) + 1e-6), rtol=1e-6)
    np.testing.assert_array_equal(grpo.group_advantages([1.0, 1.0], 2), [0.0, 0.0])  # no signal in a tie
    with pytest.raises(ValueError, match="num_generations=3"):
        grpo.group_advantages(r, 3)


@pytest.mark.parametrize("mode", grpo.LOSS_AGG_MODES)
def test_loss_and_logit_gradient_match_the_float64_reference(mode):
    """Two groups of three completions (one group with tied rewards, so zero advantages), ratios inside and
    outside the clip range on both sides: the loss, its gradient with respect to the logits, the KL and
    ratio metrics and `clip_fraction` agree with the reference."""
    rng = np.random.default_rng(0)
    n, g, v, temperature, eps, beta = 6, 5, 7, 0.8, 0.2, 0.3
    logits = rng.normal(0, 1.5, (n, g, v))
    tokens = rng.integers(0, v, (n, g))
    mask = np.arange(g)[None, :] < np.array([5, 2, 4, 1, 5, 3])[:, None]
    lp = reference_logprobs(logits, tokens, temperature)
    old = lp + rng.normal(0, 0.35, (n, g))
    ref = lp + rng.normal(0, 0.5, (n, g))
    rewards_ = np.array([1.0, 0.0, 0.5, 2.0, 2.0, 2.0])
    adv = grpo.group_advantages(rewards_, 3)
    np.testing.assert_allclose(adv, reference_advantages(rewards_, 3), rtol=1e-6, atol=1e-7)
    assert (adv[3:] == 0).all()
    rho = np.exp(lp - old)[mask]
    assert ((rho < 1 - eps) | (rho > 1 + eps)).any() and ((rho > 1 - eps) & (rho < 1 + eps)).any()
    assert np.abs(rho - (1 - eps)).min() > 1e-4 and np.abs(rho - (1 + eps)).min() > 1e-4  # no kink within h

    cfg = grpo.GRPOConfig(num_generations=3, beta=beta, epsilon=eps, loss_agg_mode=mode)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731

    def loss(x):
        logprobs = primitives.token_logprob(x, jnp.asarray(tokens), temperature)
        return grpo.policy_loss(logprobs, f32(old), f32(ref), f32(adv), jnp.asarray(mask), cfg)

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(f32(logits))
    want = reference_loss(lp, old, ref, adv, mask, eps, beta, mode)
    want_grad = finite_difference(
        lambda x: reference_loss(reference_logprobs(x, tokens, temperature), old, ref, adv, mask, eps, beta, mode),
        logits)
    np.testing.assert_allclose(float(value), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=2e-6)
    assert np.abs(want_grad).max() > 1e-2  # a gradient, not zeros compared with zeros
    kl_only = reference_loss(lp, lp, ref, np.zeros(n), mask, eps, 1.0, mode)  # −(−KL): the aggregated k3 KL
    np.testing.assert_allclose(float(metrics["kl"]), kl_only, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["ratio"]), np.exp(lp - old)[mask].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["clip_fraction"]), clipped_fraction(lp, old, adv, mask, eps), rtol=1e-6)


def test_clip_fraction_counts_the_tokens_whose_clipping_removes_the_gradient():
    """Ratios 1.5 and 0.5 for a positive, a negative and a zero advantage, and 1 (in range): only A > 0 with
    ρ > 1 + ε and A < 0 with ρ < 1 − ε are clipped — exactly the tokens whose surrogate has no gradient
    although their advantage is not 0."""
    ratios = np.array([[1.5, 0.5, 1.0], [1.5, 0.5, 1.0], [1.5, 0.5, 1.0]])
    adv = np.array([1.0, -1.0, 0.0])
    mask = np.ones((3, 3), bool)
    mask[0, 2] = False
    old = np.zeros((3, 3))
    lp = np.log(ratios)
    cfg = grpo.GRPOConfig(num_generations=3, beta=0.0, epsilon=0.2, loss_agg_mode="sequence-mean-token-sum")
    loss = lambda x: grpo.policy_loss(x, jnp.asarray(old, jnp.float32), None,  # noqa: E731
                                      jnp.asarray(adv, jnp.float32), jnp.asarray(mask), cfg)
    (_, metrics), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(lp, jnp.float32))
    clipped = (np.asarray(grad) == 0) & (adv[:, None] != 0) & mask
    assert clipped.sum() == 2 and clipped[0, 0] and clipped[1, 1]  # (A > 0, ρ = 1.5) and (A < 0, ρ = 0.5)
    assert float(metrics["clip_fraction"]) == pytest.approx(2 / 8)
    assert clipped_fraction(lp, old, adv, mask, 0.2) == pytest.approx(2 / 8)


@pytest.fixture(scope="module")
def rollouts():
    """Two prompts × three spec-self rollouts at temperature 1 from the trained model, rewarded by a
    toy rule (the letter count of the completion), as a scoring batch with advantages."""
    params = uno_trained_params()
    prompts = [[97, 98, 99, 100], [104, 106]]
    rows = [p for p in prompts for _ in range(3)]
    gc = GenerationConfig(mode=SpecSelf(draft_length=3), max_new_tokens=10, temperature=1.0, eos_token_id=97 + 25)
    out = generate(params, CFG, rows, gc, jax.random.PRNGKey(4))
    batch = grpo.rollout_batch(rows, out, CFG.pad_token_id)
    adv = grpo.group_advantages(out.lengths.astype(np.float32), 3)
    return params, out, batch, adv


def test_teacher_forced_logprobs_are_the_samplers(rollouts):
    params, out, batch, _ = rollouts
    assert batch["mask"].sum(1).tolist() == out.lengths.tolist()
    lp = grpo.completion_logprobs(params, CFG, batch, temperature=1.0)
    np.testing.assert_allclose(np.asarray(lp), out.logprobs, atol=1e-4)


def test_grpo_loss_through_the_model(rollouts):
    """Loss at other params than the rollouts' (a random reference and the trained policy moved
    along a random direction) equals the NumPy loss on the NumPy-side log-probabilities; its parameter
    gradient matches central differences along a random direction."""
    params, out, batch, adv = rollouts
    cfg = grpo.GRPOConfig(num_generations=3, beta=0.1, epsilon=0.2)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(9), len(leaves))
    direction = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])
    moved = jax.tree.map(lambda p, d: p + 0.02 * d, params, direction)
    ref_lp = grpo.completion_logprobs(uno_random_params(), CFG, batch)
    f = jax.jit(lambda p: grpo.grpo_loss(p, CFG, batch, adv, ref_lp, cfg)[0])
    loss, grad = jax.value_and_grad(f)(moved)
    lp = np.asarray(grpo.completion_logprobs(moved, CFG, batch), np.float64)
    ref_loss, _ = numpy_loss(lp, batch["old_logprobs"].astype(np.float64), np.asarray(ref_lp, np.float64),
                             adv.astype(np.float64), batch["mask"], 0.2, 0.1, cfg.loss_agg_mode)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-4)
    h = 1e-3  # small against the distance to a clip boundary: the loss is piecewise smooth
    fd = (f(jax.tree.map(lambda p, d: p + h * d, moved, direction))
          - f(jax.tree.map(lambda p, d: p - h * d, moved, direction))) / (2 * h)
    analytic = sum(jnp.vdot(a, d) for a, d in zip(jax.tree.leaves(grad), jax.tree.leaves(direction)))
    np.testing.assert_allclose(float(analytic), float(fd), rtol=1e-2)
    # at the rollout params the ratio is 1 (π_old is the sampler's own log-probabilities)
    _, metrics = grpo.grpo_loss(params, CFG, batch, adv, ref_lp, cfg)
    np.testing.assert_allclose(float(metrics["ratio"]), 1.0, atol=1e-4)
    assert float(metrics["clip_fraction"]) == 0.0


def test_off_policy_rollouts_are_refused(rollouts):
    _, out, _, _ = rollouts
    gc = GenerationConfig(mode=MDM(steps=2), max_new_tokens=4, temperature=1.0)
    mdm = generate(uno_trained_params(), CFG, [[97, 98]], gc, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="'mdm'.*on-policy"):
        grpo.rollout_batch([[97, 98]], mdm, CFG.pad_token_id)


def test_rewards():
    record = {"prompt": "Q: 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
    assert rewards.answer_reward(record, "it is 5\n#### 5") == 1.0
    assert rewards.answer_reward(record, "#### 6") == 0.0
    assert rewards.answer_reward({"prompt": "Q", "answer": "#### 1,000"}, "#### 1000") == 1.0
    assert rewards.format_reward(record, "#### 6") == 1.0 and rewards.format_reward(record, "5") == 0.0
    np.testing.assert_allclose(rewards.score([record] * 3, ["#### 5", "#### 4", "five"]), [1.1, 0.1, 0.0])
    with pytest.raises(ValueError, match="expected 2"):
        rewards.score([record] * 2, ["#### 5"])


@pytest.mark.parametrize("field,value", [("num_generations", 1), ("beta", -0.1), ("epsilon", float("nan")),
                                         ("num_iterations", 0), ("loss_agg_mode", "seq-mean")])
def test_bad_config(field, value):
    with pytest.raises(ConfigError, match=f"{field}={value!r}"):
        grpo.GRPOConfig(**{field: value})
