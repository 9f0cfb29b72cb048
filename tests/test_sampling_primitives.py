"""Sampling primitives (docs/algorithms.md §4) against exact distributions and a NumPy reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax.sampling import primitives


def np_process(logits, temperature, top_k, top_p, penalty, presence, exclude):
    """Slow NumPy reference of the transform chain: ban, CTRL penalty, temperature, top-k, top-p."""
    out = np.array(logits, np.float64)
    for r in range(out.shape[0]):
        row = out[r]
        if exclude is not None:
            row[exclude] = -np.inf
        if presence is not None:
            for v in np.flatnonzero(presence[r]):
                row[v] = row[v] / penalty if row[v] > 0 else row[v] * penalty
        if temperature > 0:
            row /= temperature
        if top_k:
            kth = np.sort(row)[::-1][top_k - 1]
            row[row < kth] = -np.inf
        if top_p < 1.0:
            order = np.argsort(-row, kind="stable")
            p = np.exp(row[order] - row[order][0])
            p /= p.sum()
            kept, mass = [], 0.0
            for idx, pi in zip(order, p):
                if mass >= top_p:
                    break
                kept.append(idx)
                mass += pi
            cut = min(row[i] for i in kept)
            row[row < cut] = -np.inf
    return out


def test_gumbel_max_matches_softmax():
    """≥ 1e5 draws on V=6 at T=0.7: chi-square and total variation against softmax(logits/T)."""
    logits = jnp.asarray([1.0, -0.5, 2.0, 0.0, -3.0, 0.7])
    t, n = 0.7, 100_000
    # logits are an argument, not a closure constant, so XLA does not constant-fold the [n, V] work
    draws = jax.jit(lambda k, x: primitives.sample(k, x, t))(jax.random.PRNGKey(3), jnp.broadcast_to(logits, (n, 6)))
    counts = np.bincount(np.asarray(draws), minlength=6)
    p = np.exp(np.asarray(logits, np.float64) / t)
    p /= p.sum()
    expected = n * p
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 25.7, chi2  # 99.99th percentile of chi-square with 5 degrees of freedom
    assert 0.5 * np.abs(counts / n - p).sum() < 5e-3


def test_gumbel_from_words_matches_float64():
    """The 53-bit construction equals −log(−log(1 − v)) in float64, v = (bits + ½)/2^53, up to float32
    rounding, including the extreme words (tail beyond float32's 16.6)."""
    rng = np.random.default_rng(0)
    w0 = rng.integers(0, 2 ** 32, size=4000, dtype=np.uint64)
    w1 = rng.integers(0, 2 ** 32, size=4000, dtype=np.uint64)
    edges = np.array([[0, 0], [0, 1], [2 ** 32 - 1, 2 ** 32 - 1], [2 ** 31, 0], [2 ** 11, 5], [2 ** 32 - 2 ** 11, 7]],
                     np.uint64)
    w0 = np.concatenate([w0, edges[:, 0]])
    w1 = np.concatenate([w1, edges[:, 1]])
    got = np.asarray(primitives.gumbel_from_words(jnp.asarray(w0, jnp.uint32), jnp.asarray(w1, jnp.uint32)))
    bits = (w0 >> np.uint64(11)).astype(object) * (2 ** 32) + w1.astype(object)
    from fractions import Fraction
    ref = []
    for b in bits:
        v = Fraction(2 * int(b) + 1, 2 ** 54)
        vf, uf = float(v), float(1 - v)  # each exact to float64 relative precision
        e = -np.log1p(-vf) if vf < 0.5 else -np.log(uf)
        ref.append(-np.log(e))
    ref = np.asarray(ref)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)
    assert got[-6] > 37.0  # bits = 0: far beyond the float32-uniform limit ≈ 16.6


@pytest.mark.parametrize("temperature,top_k,top_p,penalty", [
    (1.0, 3, 1.0, 1.0), (0.8, 0, 0.6, 2.0), (1.3, 5, 0.9, 1.5)])
def test_process_logits_matches_numpy(temperature, top_k, top_p, penalty):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(5, 12)) * 2
    presence = rng.random((5, 12)) < 0.4
    got = primitives.process_logits(jnp.asarray(logits, jnp.float32), temperature, top_k, top_p, penalty,
                                    jnp.asarray(presence), exclude_id=7)
    ref = np_process(logits, temperature, top_k, top_p, penalty, presence if penalty != 1.0 else None, 7)
    got = np.asarray(got)
    assert np.array_equal(np.isinf(got), np.isinf(ref))
    np.testing.assert_allclose(got[~np.isinf(got)], ref[~np.isinf(ref)], rtol=1e-5, atol=1e-5)
    # probs is the normalised distribution of the same logits
    p = np.asarray(primitives.probs(jnp.asarray(logits, jnp.float32), temperature, top_k, top_p, penalty,
                                    jnp.asarray(presence), exclude_id=7))
    e = np.exp(ref - ref.max(1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(1, keepdims=True), atol=1e-6)


def test_filtered_sampling_distribution():
    """Draws with top-k + top-p + repetition penalty follow the NumPy reference distribution."""
    logits = np.array([[2.0, 1.5, 0.3, -0.2, 1.0, 0.9, -1.0, 0.0]])
    presence = np.array([[False, True, False, False, True, False, False, False]])
    n = 100_000
    args = (1.1, 6, 0.85, 1.4)
    draws = jax.jit(lambda k, x, pr: primitives.sample(k, x, *args, presence=pr, exclude_id=3))(
        jax.random.PRNGKey(5), jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (n, 8)),
        jnp.broadcast_to(jnp.asarray(presence), (n, 8)))
    ref = np_process(logits, *args, presence, 3)[0]
    p = np.exp(ref - ref.max())
    p /= p.sum()
    counts = np.bincount(np.asarray(draws), minlength=8)
    assert np.all(counts[p == 0] == 0)
    assert 0.5 * np.abs(counts / n - p).sum() < 6e-3


def test_greedy_and_mask_ban():
    logits = jnp.asarray([[0.0, 5.0, 1.0], [3.0, 0.0, 9.0]])
    assert primitives.sample(jax.random.PRNGKey(0), logits, 0.0).tolist() == [1, 2]
    assert primitives.sample(jax.random.PRNGKey(0), logits, 0.0, exclude_id=2).tolist() == [1, 0]
    # the banned token is never drawn, even when it dominates
    draws = primitives.sample(jax.random.PRNGKey(1), jnp.broadcast_to(jnp.asarray([0.0, 0.0, 50.0]), (5000, 3)),
                              1.0, exclude_id=2)
    assert not np.any(np.asarray(draws) == 2)
    np.testing.assert_array_equal(primitives.probs(logits, 0.0, exclude_id=2), [[0, 1, 0], [1, 0, 0]])
