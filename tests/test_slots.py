"""Slotted transform (docs/algorithms.md §2), batch format and slot-size curriculum.

The transform is checked against `ref_slotted`, a slow loop-over-slots NumPy version written from
docs/algorithms.md §2 and driven by the same draws (`draw_slot_noise`), plus invariants that need no reference.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax.config import ConfigError, ZaryaConfig
from zarya_jax.data.batch import BatchError, make_batch, make_batch_rows, pack_first_fit
from zarya_jax.objectives import curriculum
from zarya_jax.objectives.slots import draw_slot_noise, slotted_transform, slotted_transform_from_draws

MASK, PAD = 259, 256
L, B = 40, 24


# ----------------------------------------------------------------------------- helpers shared with other tests

def random_examples(rng, count, max_prompt=6, answer_lengths=(0, 1, 2, 3, 4, 5, 7, 9, 12, 17, 25), length=L):
    """Examples (at most `length` tokens) whose token ids are distinct inside each example, so a leak
    shows up as an id."""
    out = []
    for _ in range(count):
        p = int(rng.integers(0, max_prompt + 1))
        a = min(int(rng.choice(answer_lengths)), length - p)
        if p + a == 0:
            a = 1
        ids = rng.permutation(250)[: p + a]
        out.append((ids[:p].tolist(), ids[p:].tolist()))
    return out


def random_batch(seed, rows=B, length=L):
    """Fixed-shape batch: the first half one example per row (with padding), the rest packed."""
    rng = np.random.default_rng(seed)
    half = rows // 2
    single, _ = make_batch_rows(random_examples(rng, half, length=length), length, PAD, half, pack=False)
    packed, _ = make_batch_rows(random_examples(rng, 4 * rows, length=length), length, PAD, rows - half, pack=True)
    return {k: np.concatenate([single[k], packed[k]]) for k in single}


def examples_of_row(batch, b):
    """[(segment, prompt physical indices, answer physical indices)] of row b, read from the batch."""
    out = []
    for s in sorted(set(batch["segment_ids"][b].tolist()) - {0}):
        idxs = [i for i in range(batch["tokens"].shape[1]) if batch["segment_ids"][b, i] == s]
        out.append((s, [i for i in idxs if not batch["answer_mask"][b, i]],
                    [i for i in idxs if batch["answer_mask"][b, i]]))
    return out


def assert_same(a, b, what=""):
    """Integers and bools exactly; floats up to rounding (XLA fuses float ops differently under jit,
    vmap or op by op)."""
    for k in a:
        if np.asarray(a[k]).dtype.kind == "f":
            np.testing.assert_allclose(a[k], b[k], rtol=1e-6, err_msg=f"{what}{k}")
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{what}{k}")


def np_draws(draws):
    return {k: np.array(v) for k, v in draws.items()}


# ----------------------------------------------------------------------------- NumPy reference (docs/algorithms.md §2)

def ref_slotted(draws, batch, zc, S, mask_id):
    """Loop version of docs/algorithms.md §2: slots, Bernoulli per slot, targets, weights, physical layout."""
    d = np_draws(draws)
    rows, length = batch["tokens"].shape
    f32 = np.float32
    keys = ("tokens", "positions", "segment_ids", "targets", "weights", "is_dif", "ans_len", "p_mask")
    out = {k: [] for k in keys}
    for b in range(rows):
        row = {k: [] for k in keys}
        tok, pos = batch["tokens"][b], batch["positions"][b]

        def emit(i, token, target, weight, is_dif, n, p):
            for k, v in zip(keys, (token, pos[i], batch["segment_ids"][b, i], target, weight, is_dif, n, p)):
                row[k].append(v)

        for s, prompt, answer in examples_of_row(batch, b):
            n = len(answer)
            p = f32(f32(zc.eps) + f32(1.0 - zc.eps) * d["u_pmask"][b, s - 1])
            slots = [answer[k:k + S] for k in range(0, n, S)]
            is_masked = [d["u_slot"][b, sl[0]] < p for sl in slots]
            clean = [k for k in range(len(slots)) if not is_masked[k]]
            masked = [k for k in range(len(slots)) if is_masked[k]]
            if zc.sequential_shuffle:
                clean.sort(key=lambda k: (d["key_clean"][b, slots[k][0]], k))
            if zc.diffusion_shuffle:
                masked.sort(key=lambda k: (d["key_masked"][b, slots[k][0]], k))
            for i in prompt:
                boundary = zc.boundary_targets and i == prompt[-1] and n > 0
                emit(i, tok[i], tok[answer[0]] if boundary else 0, 1.0 if boundary else 0.0, False, 0.0, 0.0)
            def p_tok(j, m):  # per-token p_mask of every answer token (the ordered one rises in the slot)
                return f32(p + min(p, 1 - p) * f32(2 * j + 1 - m) / f32(m)) if zc.ordered_sampling else p

            for k in clean:
                sl = slots[k]
                for j, i in enumerate(sl):
                    nxt = sl[j + 1] if j + 1 < len(sl) else None
                    if nxt is None and zc.boundary_targets and k + 1 < len(slots):
                        # the next slot's first token, unless that slot is clean and laid out before this one
                        key = lambda m: (d["key_clean"][b, slots[m][0]], m)  # noqa: E731
                        if is_masked[k + 1] or not zc.sequential_shuffle or key(k + 1) > key(k):
                            nxt = slots[k + 1][0]
                    emit(i, tok[i], 0 if nxt is None else tok[nxt], 0.0 if nxt is None else 1.0, False, n,
                         p_tok(j, len(sl)))
            for k in masked:
                sl = slots[k]
                for j, i in enumerate(sl):
                    pj = p_tok(j, len(sl))
                    emit(i, mask_id, tok[i], 1.0 / pj, True, n, pj)
        for i in range(length):
            if batch["segment_ids"][b, i] == 0:
                emit(i, tok[i], 0, 0.0, False, 0.0, 0.0)
        for k in keys:
            out[k].append(row[k])
    return {k: np.asarray(v) for k, v in out.items()}


_jit_from_draws = jax.jit(slotted_transform_from_draws, static_argnums=(2, 3, 4))

CONFIGS = [
    (ZaryaConfig(), 3),
    (ZaryaConfig(sequential_shuffle=True, diffusion_shuffle=True, ordered_sampling=True), 4),
    (ZaryaConfig(ordered_sampling=True, diffusion_shuffle=True, eps=0.2), 1),
    (ZaryaConfig(sequential_shuffle=True), 8),
    (ZaryaConfig(boundary_targets=False, sequential_shuffle=True, ordered_sampling=True), 3),
]


@functools.lru_cache(maxsize=None)
def case(ci, seed):
    """(batch, draws, transform output as NumPy) for config index ci; rows 0-1 all masked, 2-3 none."""
    zc, S = CONFIGS[ci]
    batch = random_batch(seed)
    draws = np_draws(draw_slot_noise(jax.random.PRNGKey(seed), (B, L)))
    draws["u_slot"][0:2] = 0.0   # u < p_mask for every slot: all masked
    draws["u_slot"][2:4] = 1.0   # never below p_mask: none masked
    out = jax.tree.map(np.asarray, _jit_from_draws(draws, batch, zc, S, MASK))
    return batch, draws, out


@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_matches_numpy_reference(ci):
    zc, S = CONFIGS[ci]
    for seed in range(3):
        batch, draws, out = case(ci, seed)
        ref = ref_slotted(draws, batch, zc, S, MASK)
        for k in ("tokens", "positions", "segment_ids", "targets", "is_dif"):
            np.testing.assert_array_equal(out[k], ref[k], err_msg=f"{k} (config {ci}, seed {seed})")
        for k in ("weights", "ans_len", "p_mask"):
            np.testing.assert_allclose(out[k], ref[k], rtol=1e-6, err_msg=f"{k} (config {ci}, seed {seed})")
        # the forced rows really are all / none masked
        np.testing.assert_array_equal(out["is_dif"][0:2], out["answer"][0:2])
        assert not np.any(out["is_dif"][2:4])
    lens = [len(a) for bb in range(B) for _, _, a in examples_of_row(batch, bb)]
    assert 0 in lens and (S == 1 or any(0 < n < S for n in lens)) and (batch["segment_ids"].max(1) > 1).any()
    assert (batch["segment_ids"] == 0).any()


def check_example_layout(out, r, batch, b, s, prompt, answer, masked_key):
    """Example `s` of input row `b`, laid out in output row `r`: it keeps its physical range, its positions
    are a permutation of the original ones, clean tokens keep their ids at their logical positions, and
    the layout is [prompt][clean][masked] (`masked_key` marks the masked tokens). Returns its rows."""
    phys = np.nonzero(out["segment_ids"][r] == s)[0]
    np.testing.assert_array_equal(phys, prompt + answer)
    np.testing.assert_array_equal(np.sort(out["positions"][r, phys]), np.sort(batch["positions"][b, phys]))
    orig = dict(zip(batch["positions"][b, phys], batch["tokens"][b, phys]))
    for q in phys:
        if out["tokens"][r, q] != MASK:
            assert orig[out["positions"][r, q]] == out["tokens"][r, q]
    kinds = [0 if not out["answer"][r, q] else 1 + int(out[masked_key][r, q]) for q in phys]
    assert kinds == sorted(kinds)
    return phys


def leak_free_targets(out, r, wm):
    """Yields (target row, rows it sees) of output row `r` under window mask `wm`, after checking that
    neither the target's logical position (clean) nor its id is visible to its row."""
    for q in np.nonzero(out["weights"][r] > 0)[0]:
        want = out["positions"][r, q] + (0 if out["is_dif"][r, q] else 1)
        seen = np.nonzero(wm[q])[0]
        clean_seen = seen[out["tokens"][r, seen] != MASK]
        assert want not in out["positions"][r, clean_seen]
        assert out["targets"][r, q] not in out["tokens"][r, clean_seen]
        yield q, seen


def test_invariants():
    zc, S = CONFIGS[1]
    batch, _, out = case(1, 0)
    for b in range(B):
        for s, prompt, answer in examples_of_row(batch, b):
            check_example_layout(out, b, batch, b, s, prompt, answer, "is_dif")
        wm = np.asarray(_window_mask(out["segment_ids"][b]))
        for r, seen in leak_free_targets(out, b, wm):
            assert all(out["segment_ids"][b, seen] == out["segment_ids"][b, r])


def _window_mask(segment_ids):
    # independent: causal over physical indices, same nonzero segment, plus the diagonal
    t = segment_ids.shape[0]
    i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
    same = (segment_ids[:, None] == segment_ids[None, :]) & (segment_ids[None, :] > 0)
    return ((j <= i) & same) | (i == j)


def test_window_mask_is_segment_causal():
    _, _, out = case(0, 1)
    for b in range(B):
        np.testing.assert_array_equal(out["window_mask"][b], _window_mask(out["segment_ids"][b]))


def test_mask_rate_matches_p_mask():
    """Masked slots counted in the output vs Σ p_mask·slots: a z-score over many examples."""
    zc, S = CONFIGS[0]
    masked_slots = expected = var = 0.0
    for seed in range(3):
        batch, draws, out = case(0, seed)
        for b in range(4, B):  # rows 0-3 are forced
            for s, prompt, answer in examples_of_row(batch, b):
                n_slots = -(-len(answer) // S)
                p = zc.eps + (1 - zc.eps) * float(draws["u_pmask"][b, s - 1])
                sel = (out["segment_ids"][b] == s) & (out["tokens"][b] == MASK)
                masked_slots += len({(q - len(prompt)) // S for q in out["positions"][b][sel]})
                expected += p * n_slots
                var += p * (1 - p) * n_slots
    assert abs(masked_slots - expected) < 5 * np.sqrt(var)


def test_mask_rate_statistics_from_output():
    """Masked answer tokens with slot size 1 against Σ p_mask, counted in the transform's output."""
    zc, S = CONFIGS[2]
    masked = expected = var = 0.0
    for seed in range(8):
        batch = random_batch(300 + seed)
        out = _jit_from_draws(draw_slot_noise(jax.random.PRNGKey(70 + seed), (B, L)), batch, zc, S, MASK)
        out = jax.tree.map(np.asarray, out)
        p = out["p_mask"][out["answer"]]
        masked += out["masked"][out["answer"]].sum()
        expected += p.sum()
        var += (p * (1 - p)).sum()
    assert abs(masked - expected) < 5 * np.sqrt(var)


def test_jit_equals_eager_and_keys():
    zc, S = CONFIGS[1]
    batch = random_batch(11, rows=4, length=24)
    key = jax.random.PRNGKey(5)
    f = jax.jit(slotted_transform, static_argnums=(2, 3, 4))
    a = jax.tree.map(np.asarray, f(key, batch, zc, S, MASK))
    e = jax.tree.map(np.asarray, slotted_transform(key, batch, zc, S, MASK))  # op by op
    again = jax.tree.map(np.asarray, f(key, batch, zc, S, MASK))
    other = jax.tree.map(np.asarray, f(jax.random.PRNGKey(6), batch, zc, S, MASK))
    assert_same(a, e, "eager ")
    for k in a:
        np.testing.assert_array_equal(a[k], again[k], err_msg=k)  # same key: bit-identical
    assert any(not np.array_equal(a[k], other[k]) for k in ("tokens", "positions", "weights"))
    # a traced slot size (one compile for the whole curriculum) gives the same batch
    traced = jax.jit(slotted_transform, static_argnums=(2, 4))(key, batch, zc, jnp.int32(S), MASK)
    assert_same(jax.tree.map(np.asarray, traced), a, "traced slot size ")


def test_ordered_sampling_rises_with_slot_mean():
    zc, S = CONFIGS[1]
    batch, draws, out = case(1, 2)
    for b in range(B):
        for s, _, answer in examples_of_row(batch, b):
            p = np.float32(zc.eps) + np.float32(1 - zc.eps) * draws["u_pmask"][b, s - 1]
            for k in range(0, len(answer), S):
                logical = [batch["positions"][b, i] for i in answer[k:k + S]]
                rows = [int(np.nonzero((out["segment_ids"][b] == s) & (out["positions"][b] == q))[0][0])
                        for q in logical]
                if not out["is_dif"][b, rows[0]]:
                    continue
                pj = out["p_mask"][b, rows]
                assert np.all(np.diff(pj) > 0) or len(pj) == 1
                assert abs(pj.mean() - p) < 1e-6 and pj.min() > 0 and pj.max() < 1


def test_bad_inputs():
    batch = random_batch(0, rows=2, length=16)
    with pytest.raises(ConfigError, match="slot_size=0"):
        slotted_transform(jax.random.PRNGKey(0), batch, ZaryaConfig(), 0, MASK)
    with pytest.raises(ConfigError, match="mask_id"):
        slotted_transform(jax.random.PRNGKey(0), batch, ZaryaConfig(), 2, None)
    with pytest.raises(ConfigError, match="slot_size"):
        slotted_transform(jax.random.PRNGKey(0), batch, ZaryaConfig(), jnp.float32(2), MASK)


# ----------------------------------------------------------------------------- batch format

def test_make_batch_layout():
    ex = [([1, 2], [3, 4, 5]), ([6], []), ([], [7, 8])]
    b = make_batch(ex, 8, PAD)
    np.testing.assert_array_equal(b["tokens"][0], [1, 2, 3, 4, 5, PAD, PAD, PAD])
    np.testing.assert_array_equal(b["segment_ids"][1], [1, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(b["positions"][2], [0, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(b["answer_mask"][0], [0, 0, 1, 1, 1, 0, 0, 0])
    assert b["tokens"].dtype == np.int32 and b["answer_mask"].dtype == bool
    p = make_batch(ex, 8, PAD, pack=True)
    np.testing.assert_array_equal(p["tokens"], [[1, 2, 3, 4, 5, 6, 7, 8]])
    np.testing.assert_array_equal(p["segment_ids"], [[1, 1, 1, 1, 1, 2, 3, 3]])
    np.testing.assert_array_equal(p["positions"], [[0, 1, 2, 3, 4, 0, 0, 1]])
    np.testing.assert_array_equal(p["answer_mask"], [[0, 0, 1, 1, 1, 0, 1, 1]])


def test_first_fit_and_fixed_rows():
    assert pack_first_fit([5, 4, 3, 2, 1], 6) == [[0, 4], [1, 3], [2]]
    ex = [([1] * 3, [2] * 2), ([3], [4] * 3), ([5] * 2, [6]), ([7], [8])]
    batch, left = make_batch_rows(ex, 6, PAD, 1)
    assert batch["tokens"].shape == (1, 6) and left == ex[1:]
    batch, left = make_batch_rows(ex, 6, PAD, 3, pack=False)
    assert left == [ex[3]] and batch["segment_ids"].max(1).tolist() == [1, 1, 1]
    batch, left = make_batch_rows(ex[:1], 6, PAD, 2)
    assert left == [] and not batch["segment_ids"][1].any()


def test_make_batch_errors():
    with pytest.raises(BatchError, match="example 1 has 9 tokens"):
        make_batch([([1], [2]), ([1] * 4, [2] * 5)], 8, PAD)
    with pytest.raises(BatchError, match="example 0 is empty"):
        make_batch([([], [])], 8, PAD)
    with pytest.raises(BatchError, match="length=0"):
        make_batch([([1], [2])], 0, PAD)
    with pytest.raises(BatchError, match="token ids"):
        make_batch([([-1], [2])], 8, PAD)
    with pytest.raises(BatchError, match="integer token ids"):
        make_batch([([1.5], [2])], 8, PAD)


# ----------------------------------------------------------------------------- curriculum (docs/algorithms.md §2.1)

def test_curriculum_fraction_borders():
    zc = ZaryaConfig()  # sizes 2..64, borders .06 .2 .4 .6 .8 1.0
    total = 1000
    want = {0: 2, 60: 2, 61: 4, 200: 4, 201: 8, 400: 8, 401: 16, 600: 16, 601: 32, 800: 32, 801: 64,
            999: 64, 1000: 64, 5000: 64}
    for step, size in want.items():
        assert curriculum.slot_size_at(zc, step, total) == size, step
    traced = jax.jit(curriculum.slot_size_at_traced, static_argnums=(0, 2))
    assert [int(traced(zc, jnp.int32(s), total)) for s in want] == list(want.values())
    assert curriculum.schedule(zc, total) == [(0, 2), (61, 4), (201, 8), (401, 16), (601, 32), (801, 64)]
    # every step of a short run against the definition (first i with step/total <= border)
    for total in (7, 50, 333):
        expect = []
        for step in range(total + 3):
            i = next((i for i, b in enumerate(zc.slot_step_borders) if step / total <= b), 5)
            expect.append(zc.slot_size_set[i])
            assert curriculum.slot_size_at(zc, step, total) == zc.slot_size_set[i]
        np.testing.assert_array_equal(curriculum.slot_size_at_traced(zc, np.arange(total + 3), total), expect)


def test_curriculum_absolute_borders():
    zc = ZaryaConfig(slot_size_set=(4, 16, 8), slot_step_borders=(10, 25, 30))
    sizes = [curriculum.slot_size_at(zc, s, 100) for s in range(40)]
    assert sizes == [4] * 11 + [16] * 15 + [8] * 14
    np.testing.assert_array_equal(curriculum.slot_size_at_traced(zc, np.arange(40), 100), sizes)
    assert curriculum.schedule(zc, 20) == [(0, 4), (11, 16)]
    with pytest.raises(ConfigError, match="total_steps"):
        curriculum.slot_size_at(zc, 1, 0)
    with pytest.raises(ConfigError, match="step=-1"):
        curriculum.slot_size_at(zc, -1, 10)


def test_objective_runs_the_curriculum_in_one_program(tiny_config, tiny_params):
    """The slotted objective reads the slot size as a traced value of the step: one compiled loss over the
    whole curriculum, equal bit for bit (loss and gradient) to the loss at that stage's static size."""
    from zarya_jax.objectives.base import StepInfo
    from zarya_jax.objectives.losses import zarya_loss
    from zarya_jax.objectives.zarya import zarya_objective

    zc = ZaryaConfig(slot_size_set=(2, 4, 8), slot_step_borders=(0.1, 0.4, 1.0))
    objective = zarya_objective(tiny_config, zc)
    total = 20
    assert len({objective.static_at(s, total) for s in range(total)}) == 1
    rng = np.random.default_rng(0)
    b, length = 4, 24
    batch = {"tokens": jnp.asarray(rng.integers(0, 256, (b, length)), jnp.int32),
             "segment_ids": jnp.ones((b, length), jnp.int32),
             "positions": jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length)),
             "answer_mask": jnp.broadcast_to(jnp.arange(length) >= 6, (b, length))}
    traces = []

    @jax.jit
    def traced(params, step, key):
        traces.append(1)
        info = StepInfo(step=step, static=objective.static_at(0, total), total_steps=total)
        return jax.value_and_grad(lambda p: objective.loss_fn(p, None, batch, key, info)[0])(params)

    @functools.partial(jax.jit, static_argnums=2)
    def static(params, key, size):
        return jax.value_and_grad(lambda p: zarya_loss(p, tiny_config, zc, batch, key, size)[0])(params)

    for step in (2, 3, 8, 9):  # both sides of each border (steps 2 and 8 end the first two stages)
        key = jax.random.PRNGKey(step)
        want = static(tiny_params, key, curriculum.slot_size_at(zc, step, total))
        got = traced(tiny_params, jnp.int32(step), key)
        for x, y in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert len(traces) == 1
