"""Eso-LM's reconstruction rows (`sequential_convention="mdm"`, docs/algorithms.md §3.3): a slow NumPy layout on a hand
example, and the loss against one plain causal forward per masked token."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_slots import MASK, random_batch
from zarya_jax import model as model_lib
from zarya_jax.config import ConfigError, ZaryaConfig
from zarya_jax.objectives.losses import zarya_loss
from zarya_jax.objectives.noise import noise_transform
from zarya_jax.objectives.reconstruction import reconstruction_rows


def np_reconstruction(tok, pos, seg, answer, masked):
    """Slow NumPy version of one row: (tokens, positions, targets, weights, visible [2L, 2L])."""
    n = len(tok)
    order = []
    for s in sorted(set(seg.tolist()) - {0}):
        idx = [i for i in range(n) if seg[i] == s]
        order += [i for i in idx if not answer[i]] + [i for i in idx if answer[i] and not masked[i]] + \
                 [i for i in idx if masked[i]]
    order += [i for i in range(n) if seg[i] == 0]
    tokens = [tok[i] for i in order] + [MASK if masked[i] else 0 for i in order]
    positions = [pos[i] for i in order] * 2
    targets = [0] * n + [tok[i] if masked[i] else 0 for i in order]
    weights = [0.0] * n + [1.0 if masked[i] else 0.0 for i in order]
    vis = np.eye(2 * n, dtype=bool)
    for a in range(n):
        for b in range(n):
            sa, sb = seg[order[a]], seg[order[b]]
            if b <= a and sa == sb and sb > 0:
                vis[a, b] = True  # the clean half: causal within the example
            if masked[order[a]] and b < a and sa == sb:
                vis[n + a, b] = True  # a copy: the clean rows before it, and itself
    return np.array(tokens), np.array(positions), np.array(targets), np.array(weights), vis


def test_hand_example_matches_numpy():
    # Example 1: prompt (10, 11), answer (20, 21, 22, 23) with 21 and 23 masked; example 2: prompt 30,
    # answer (31, 32) with 32 masked; then padding.
    tok = np.array([10, 11, 20, 21, 22, 23, 30, 31, 32, 0])
    pos = np.array([0, 1, 2, 3, 4, 5, 0, 1, 2, 0])
    seg = np.array([1, 1, 1, 1, 1, 1, 2, 2, 2, 0])
    answer = np.array([0, 0, 1, 1, 1, 1, 0, 1, 1, 0], bool)
    masked = np.array([0, 0, 0, 1, 0, 1, 0, 0, 1, 0], bool)
    seq = {"tokens": tok[None], "positions": pos[None], "segment_ids": seg[None], "answer": answer[None],
           "masked": masked[None], "p_mask": np.full((1, 10), 0.5, np.float32),
           "ans_len": np.where(answer, 4.0, 0.0)[None].astype(np.float32)}
    out = jax.tree.map(np.asarray, reconstruction_rows(jax.tree.map(jnp.asarray, seq), MASK))
    tokens, positions, targets, weights, vis = np_reconstruction(tok, pos, seg, answer, masked)
    np.testing.assert_array_equal(out["tokens"][0], tokens)
    np.testing.assert_array_equal(out["positions"][0], positions)
    np.testing.assert_array_equal(out["targets"][0], targets)
    np.testing.assert_array_equal(out["weights"][0], weights)
    np.testing.assert_array_equal(out["window_mask"][0], vis)
    # By hand: the clean half is 10 11 20 22 21 23 | 30 31 32 | pad; the copy of 21 (position 3) sees the
    # clean 22 at the later position 4 (Eso-LM's sampling order), not 21 itself nor 23.
    assert tokens[:10].tolist() == [10, 11, 20, 22, 21, 23, 30, 31, 32, 0]
    k = 10 + 4
    assert tokens[k] == MASK and positions[k] == 3 and targets[k] == 21
    assert np.flatnonzero(out["window_mask"][0, k]).tolist() == [0, 1, 2, 3, k]
    assert not out["is_dif"].any()


@pytest.mark.parametrize("sorting,convention", [(False, "mdm"), (True, "mdm"), (False, "both")])
def test_loss_equals_one_forward_per_masked_token(tiny_config, tiny_params, sorting, convention):
    """L_seq = mean CE of x0[i] at a mask placed after the example's clean context, one causal forward each;
    with "both", together with the AR convention's targets (row i → masked x0[i + 1], a plain causal forward)."""
    zc = ZaryaConfig(slotted_training=False, sequential_convention=convention, noise_sorting=sorting)
    batch = jax.tree.map(jnp.asarray, random_batch(3, rows=2, length=24))
    key = jax.random.PRNGKey(5)
    _, metrics = jax.jit(lambda p: zarya_loss(p, tiny_config, zc, batch, key, 0))(tiny_params)
    inputs = jax.tree.map(np.asarray, noise_transform(key, batch, zc, MASK))
    seqs, targets = [], []
    for r in range(0, inputs["tokens"].shape[0], 2):  # the sequential rows, in the transform's order
        tok, pos, seg = inputs["tokens"][r], inputs["positions"][r], inputs["segment_ids"][r]
        ans, msk = inputs["answer"][r], inputs["masked"][r]
        for s in sorted(set(seg.tolist()) - {0}):
            idx = [i for i in range(len(tok)) if seg[i] == s]
            ctx = [i for i in idx if not msk[i]]  # prompt and clean answer tokens first
            for i in [i for i in idx if msk[i]]:  # then the masked ones left to right
                seqs.append(([tok[j] for j in ctx] + [MASK], [pos[j] for j in ctx] + [pos[i]]))
                targets.append(tok[i])
                ctx.append(i)
    assert seqs
    width = max(len(t) for t, _ in seqs)
    toks = np.zeros((len(seqs), width), np.int32)
    poss = np.zeros((len(seqs), width), np.int32)
    for n, (t, p) in enumerate(seqs):
        toks[n, :len(t)], poss[n, :len(p)] = t, p
    logits = np.asarray(model_lib.forward(tiny_params, tiny_config, toks, poss)).astype(np.float64)
    last = logits[np.arange(len(seqs)), [len(t) - 1 for t, _ in seqs]]
    ce = list(_cross_entropy(last, targets))
    if convention == "both":  # the AR pass: each example alone, causal, in logical order (no noise sorting)
        for r in range(0, inputs["tokens"].shape[0], 2):
            tok, pos, seg = inputs["tokens"][r], inputs["positions"][r], inputs["segment_ids"][r]
            for s in sorted(set(seg.tolist()) - {0}):
                idx = np.flatnonzero(seg == s)
                rows = np.asarray(model_lib.forward(tiny_params, tiny_config, tok[idx][None], pos[idx][None]))[0]
                nxt = idx[1:][inputs["masked"][r][idx[1:]]]  # the masked tokens with a row before them
                ce += list(_cross_entropy(rows[np.searchsorted(idx, nxt) - 1].astype(np.float64), tok[nxt]))
    assert float(metrics["num_seq_targets"]) == len(ce)
    assert float(metrics["loss_seq"]) == pytest.approx(np.mean(ce), rel=1e-4)
    assert np.isfinite(float(metrics["loss"])) and float(metrics["num_dif_targets"]) == len(seqs)


def _cross_entropy(logits, targets):
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    return lse - logits[np.arange(len(targets)), targets]


def test_bad_convention():
    with pytest.raises(ConfigError, match="sequential_convention='next'"):
        ZaryaConfig(sequential_convention="next")
