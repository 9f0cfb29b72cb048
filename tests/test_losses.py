"""Hybrid loss (docs/algorithms.md §2.6, §3.5): against a NumPy loss on the reference transforms' outputs, a perfect
predictor, λ ∈ {0, 1}, and gradients through the tiny model."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_noise
import test_slots
from test_slots import MASK, examples_of_row, random_batch
from zarya_jax import model as model_lib
from zarya_jax.config import ConfigError, ZaryaConfig
from zarya_jax.objectives.losses import loss_from_logits, zarya_loss

V = 264


def np_loss(logits, ref, batch, zc, rows_of_example):
    """docs/algorithms.md §2.6 by hand: mean CE over AR targets; per example Σ w·CE / #answer tokens, mean over examples.
    ref: a NumPy reference transform output; rows_of_example(b) -> the output row holding the MDM targets
    of batch row b."""
    x = logits.astype(np.float64)
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    ce = lse - np.take_along_axis(x, ref["targets"][..., None], -1)[..., 0]
    has = ref["weights"] > 0
    seq = has & ~ref["is_dif"]
    l_seq = ce[seq].mean() if seq.any() else 0.0
    per_example = []
    for b in range(batch["tokens"].shape[0]):
        r = rows_of_example(b)
        for s, _, answer in examples_of_row(batch, b):
            if answer:
                sel = has[r] & ref["is_dif"][r] & (ref["segment_ids"][r] == s)
                per_example.append((ref["weights"][r][sel] * ce[r][sel]).sum() / len(answer))
    l_dif = np.mean(per_example)
    return zc.diffusion_loss_proportion * l_dif + (1 - zc.diffusion_loss_proportion) * l_seq, l_seq, l_dif


def _check_against_numpy(zc, batch, ref, out, rows_of_example, slot_size=0):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=out["tokens"].shape + (V,)).astype(np.float32) * 3
    want, want_seq, want_dif = np_loss(logits, ref, batch, zc, rows_of_example)
    loss, m = loss_from_logits(jnp.asarray(logits), out, zc, slot_size)
    np.testing.assert_allclose([float(loss), float(m["loss_seq"]), float(m["loss_dif"])],
                               [want, want_seq, want_dif], rtol=2e-5)
    # λ = 1 and λ = 0 keep exactly one term
    l1, m1 = loss_from_logits(jnp.asarray(logits), out, zc.replace(diffusion_loss_proportion=1.0))
    l0, m0 = loss_from_logits(jnp.asarray(logits), out, zc.replace(diffusion_loss_proportion=0.0))
    assert float(l1) == float(m1["loss_dif"]) and float(l0) == float(m0["loss_seq"])
    np.testing.assert_allclose([float(l1), float(l0)], [want_dif, want_seq], rtol=2e-5)
    # accuracies and ratios by hand
    hit = logits.argmax(-1) == ref["targets"]
    has = ref["weights"] > 0
    np.testing.assert_allclose(float(m["acc_seq"]), hit[has & ~ref["is_dif"]].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(m["acc_dif"]), hit[has & ref["is_dif"]].mean(), rtol=1e-6)
    return m


def test_slotted_loss_matches_numpy():
    zc, S = test_slots.CONFIGS[1]
    batch, draws, out = test_slots.case(1, 0)
    ref = test_slots.ref_slotted(draws, batch, zc, S, MASK)
    m = _check_against_numpy(zc, batch, ref, out, lambda b: b, S)
    answer = batch["answer_mask"]
    assert float(m["mask_ratio"]) == pytest.approx(ref["is_dif"].sum() / answer.sum())
    assert float(m["slot_size"]) == S and float(m["num_answer_tokens"]) == answer.sum()


def test_noise_loss_matches_numpy():
    for ci in (1, 2):
        zc = test_noise.CONFIGS[ci]
        batch, draws, out = test_noise.case(ci, 0)
        ref = test_noise.ref_noise(draws, batch, zc, MASK)
        m = _check_against_numpy(zc, batch, ref, out, lambda b: 2 * b + 1)
        answer = batch["answer_mask"]
        assert float(m["num_answer_tokens"]) == answer.sum()  # each example counted once
        assert float(m["mask_ratio"]) == pytest.approx(ref["masked"][1::2].sum() / answer.sum())
        assert float(m["slot_size"]) == 0


def test_perfect_predictor_gives_zero():
    for zc, (batch, draws, out) in ((test_slots.CONFIGS[0][0], test_slots.case(0, 1)),
                                    (test_noise.CONFIGS[2], test_noise.case(2, 1))):
        logits = 60.0 * jax.nn.one_hot(out["targets"], V)
        loss, m = loss_from_logits(logits, out, zc)
        assert float(m["num_seq_targets"]) > 0 and float(m["num_dif_targets"]) > 0
        for k in ("loss", "loss_seq", "loss_dif"):
            assert 0.0 <= float(m[k]) < 1e-6, (k, float(m[k]))
        assert float(m["acc_seq"]) == 1.0 and float(m["acc_dif"]) == 1.0


def test_gradients_reach_every_param(tiny_config, tiny_params):
    calls = []

    def apply_fn(params, config, tokens, positions, *, segment_ids, return_hidden):
        calls.append(tokens.shape)  # traced once per compile
        return model_lib.apply(params, config, tokens, positions, segment_ids=segment_ids, return_hidden=return_hidden)

    batch = random_batch(3, rows=2, length=16)
    grad = jax.jit(jax.value_and_grad(functools.partial(zarya_loss, apply_fn=apply_fn), has_aux=True),
                   static_argnums=(1, 2, 5))
    for zc, S, rows in ((ZaryaConfig(ordered_sampling=True, sequential_shuffle=True), 2, 2),
                        (ZaryaConfig(slotted_training=False, sequential_convention="ar", grouped_noise=True,
                                     noise_sorting=True), 2, 4)):
        (loss, metrics), g = grad(tiny_params, tiny_config, zc, batch, jax.random.PRNGKey(1), S)
        assert np.isfinite(float(loss)) and float(loss) > 0
        assert float(metrics["num_seq_targets"]) > 0 and float(metrics["num_dif_targets"]) > 0
        assert calls[-1] == (rows, 16)  # the two non-slotted passes are one call on [2B, L]
        for path, leaf in jax.tree_util.tree_leaves_with_path(g):
            leaf = np.asarray(leaf)
            assert np.all(np.isfinite(leaf)), path
            name = jax.tree_util.keystr(path)
            per_layer = leaf.reshape(tiny_config.num_layers, -1) if "layers" in name else leaf.reshape(1, -1)
            assert np.all(np.abs(per_layer).max(axis=1) > 0), name  # every layer of every param
    assert len(calls) == 2


def test_missing_mask_token(tiny_config, tiny_params):
    batch = random_batch(3, rows=2, length=16)
    with pytest.raises(ConfigError, match="mask_token_id is None"):
        zarya_loss(tiny_params, tiny_config.replace(mask_token_id=None), ZaryaConfig(), batch,
                   jax.random.PRNGKey(0), 2)


def test_ar_objective_matches_per_example_forward(tiny_config, tiny_params):
    """The AR-only baseline's loss on a packed batch equals the mean next-token CE over the answer
    tokens, computed from one plain causal forward per example (packing must not leak across examples)."""
    from zarya_jax.data.batch import make_batch
    from zarya_jax.objectives.ar import ar_objective

    rng = np.random.default_rng(3)
    examples = [(rng.integers(0, 250, size=p).tolist(), rng.integers(0, 250, size=a).tolist())
                for p, a in [(4, 5), (3, 2), (6, 4), (2, 6)]]
    batch = make_batch(examples, length=24, pad_id=256, pack=True)
    assert batch["tokens"].shape[0] < len(examples)  # packed
    loss, metrics = ar_objective(tiny_config).loss_fn(tiny_params, None, batch, jax.random.PRNGKey(0), None)
    ces = []
    for prompt, answer in examples:
        seq = np.asarray(prompt + answer)
        logits = np.asarray(model_lib.forward(tiny_params, tiny_config, jnp.asarray(seq[None])))[0].astype(np.float64)
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        for i in range(len(prompt), len(seq)):
            ces.append(-logp[i - 1, seq[i]])
    np.testing.assert_allclose(float(loss), np.mean(ces), rtol=1e-5)
    assert int(metrics["num_seq_targets"]) == sum(len(a) for _, a in examples)


def np_draft_terms(logits, targets, exclude):
    """Uno's drafter terms by hand in float64: softmax without the excluded column, TV, CE and KL per row."""
    x = np.asarray(logits, np.float64).copy()
    x[..., exclude] = -np.inf
    length = x.shape[-2] // 2
    logp_all = x - np.logaddexp.reduce(x, axis=-1, keepdims=True)
    lq, lp = logp_all[..., :length, :], logp_all[..., length:, :]
    q, p = np.exp(lq), np.exp(lp)
    tv = np.abs(q - p).sum(-1)
    ce = -np.take_along_axis(lq, targets[..., None], -1)[..., 0]
    ratio = np.where(q > 0, np.where(np.isfinite(lq), lq, 0) - np.where(np.isfinite(lp), lp, 0), 0)
    return tv, ce, (q * ratio).sum(-1)


def test_draft_row_losses_values_and_gradient():
    """The fused drafter terms against float64 NumPy, and their custom gradient against finite differences
    of that NumPy reference (p rows get none)."""
    from zarya_jax.objectives.losses import draft_row_losses

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 6, 11)).astype(np.float32) * 2
    targets = rng.integers(0, 10, (2, 3)).astype(np.int32)
    exclude = 10
    got = draft_row_losses(jnp.asarray(logits), jnp.asarray(targets), exclude)
    for g, w in zip(got, np_draft_terms(logits, targets, exclude)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)

    weights = np.asarray([1.0, 0.3, 0.7])  # tv, ce, kl
    combine = lambda terms: sum(c * t.sum() for c, t in zip(weights, terms))
    grad = np.asarray(jax.grad(lambda z: combine(draft_row_losses(z, jnp.asarray(targets), exclude)))(jnp.asarray(logits)))
    x = logits.astype(np.float64)
    want = np.zeros_like(x)
    eps = 1e-5
    for idx in np.ndindex(*x.shape[:-2], 3, x.shape[-1]):  # the q rows; |q − p| is smooth away from q = p
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        want[idx] = (combine(np_draft_terms(up, targets, exclude)) - combine(np_draft_terms(down, targets, exclude))) / (2 * eps)
    np.testing.assert_allclose(grad, want, atol=2e-4)
    assert not grad[:, 3:].any() and not grad[..., exclude].any()
