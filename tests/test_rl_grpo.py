"""GRPO's pure core against slow NumPy versions: group advantages, the loss and its gradient in the
log-probabilities per aggregation mode, the loss through the model on real rollouts (rollout ratio 1,
teacher-forced log-probabilities = the sampler's) and its parameter gradient against central
differences; rewards; bad configs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax.config import ConfigError
from zarya_jax.rl import grpo, rewards
from zarya_jax.sampling import GenerationConfig, generate
from zarya_jax.testing import UNO_CONFIG as CFG, uno_random_params, uno_trained_params


def numpy_loss(lp, old, ref, adv, mask, eps, beta, mode):
    """Loop-by-loop GRPO loss and its gradient d loss / d lp (float64)."""
    n, g = lp.shape
    per, dper = np.zeros((n, g)), np.zeros((n, g))
    for i in range(n):
        for t in range(g):
            if not mask[i, t]:
                continue
            r = np.exp(lp[i, t] - old[i, t])
            c = min(max(r, 1 - eps), 1 + eps)
            unclipped, clipped = r * adv[i], c * adv[i]
            per[i, t] = -min(unclipped, clipped)
            # the min picks the unclipped term, or the clipped one whose slope is 0 outside the range
            picks_unclipped = unclipped <= clipped or (1 - eps < r < 1 + eps)
            dper[i, t] = -adv[i] * r if picks_unclipped else 0.0
            d = ref[i, t] - lp[i, t]
            per[i, t] += beta * (np.exp(d) - d - 1)
            dper[i, t] += beta * (1 - np.exp(d))
    counts = mask.sum(1)
    if mode == "token-mean":
        weight = np.where(mask, 1.0 / mask.sum(), 0.0)
    elif mode == "sequence-mean-token-mean":
        weight = np.where(mask, 1.0 / (n * np.maximum(counts, 1))[:, None], 0.0)
    else:
        weight = np.where(mask, 1.0 / n, 0.0)
    return float((per * weight).sum()), dper * weight


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
def test_policy_loss_and_gradient_match_numpy(mode):
    rng = np.random.default_rng(0)
    n, g = 6, 7
    lp = -rng.gamma(2.0, 1.0, (n, g))
    old = lp + rng.normal(0, 0.4, (n, g))  # ratios well inside and outside the clip range
    ref = lp + rng.normal(0, 0.5, (n, g))
    adv = rng.normal(0, 1, n)
    mask = np.arange(g)[None, :] < np.array([7, 3, 5, 1, 7, 4])[:, None]
    cfg = grpo.GRPOConfig(num_generations=3, beta=0.3, epsilon=0.2, loss_agg_mode=mode)
    f = lambda x: grpo.policy_loss(x, jnp.asarray(old, jnp.float32), jnp.asarray(ref, jnp.float32),  # noqa: E731
                                   jnp.asarray(adv, jnp.float32), jnp.asarray(mask), cfg)[0]
    loss, grad = jax.value_and_grad(f)(jnp.asarray(lp, jnp.float32))
    ref_loss, ref_grad = numpy_loss(lp, old, ref, adv, mask, 0.2, 0.3, mode)
    r = np.exp(lp - old)[mask]
    assert ((r < 0.8) | (r > 1.2)).any() and ((r > 0.8) & (r < 1.2)).any()
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def rollouts():
    """Two prompts × three spec-self rollouts at temperature 1 from the trained model, rewarded by a
    toy rule (the letter count of the completion), as a scoring batch with advantages."""
    params = uno_trained_params()
    prompts = [[97, 98, 99, 100], [104, 106]]
    rows = [p for p in prompts for _ in range(3)]
    gc = GenerationConfig(mode="spec", drafter="self", draft_length=3, max_new_tokens=10, temperature=1.0,
                          eos_token_id=97 + 25)
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
    gc = GenerationConfig(mode="mdm", max_new_tokens=4, steps=2, temperature=1.0)
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
