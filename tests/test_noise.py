"""Non-slotted Eso-LM transform (docs/algorithms.md §3): a loop-per-example NumPy reference driven by the same draws
(`draw_token_noise`), the four grouped-noise patterns, noise sorting, and invariants."""
import functools

import jax
import numpy as np
import pytest

from test_slots import (B, L, MASK, _window_mask, assert_same, check_example_layout, examples_of_row, leak_free_targets,
                        np_draws, random_batch)
from zarya_jax.config import ConfigError, ZaryaConfig
from zarya_jax.objectives.noise import draw_token_noise, noise_transform, noise_transform_from_draws

f32 = np.float32
NS = dict(slotted_training=False)
CONFIGS = [
    ZaryaConfig(**NS),
    ZaryaConfig(**NS, ordered_sampling=True, noise_sorting=True, sequential_shuffle=True, diffusion_shuffle=True,
                antithetic_sampling=True, elbo_weight=True),
    ZaryaConfig(**NS, grouped_noise=True, max_span_length=3, noise_sorting=True, diffusion_shuffle=True, alpha0=0.6),
    ZaryaConfig(**NS, grouped_noise=True, max_span_length=1, ordered_sampling=True, antithetic_sampling=True,
                noise_sorting=True, sequential_shuffle=True, alpha0=1.0),
]
KEYS = ("tokens", "positions", "segment_ids", "targets", "weights", "is_dif", "masked", "ans_len", "p_mask",
        "pattern")


# ----------------------------------------------------------------------------- NumPy reference (docs/algorithms.md §3)

def ref_t(d, batch, zc):
    """t[b, s-1] per example; antithetic: (u/N + e/N) mod 1 over the batch's N examples in row order."""
    per_row = batch["segment_ids"].max(1)
    n = f32(max(per_row.sum(), 1))
    t = {}
    e = 0
    for b in range(batch["tokens"].shape[0]):
        for s in range(1, per_row[b] + 1):
            u = d["u_t"][b, s - 1]
            t[b, s] = np.mod(f32(u / n + f32(e) / n), f32(1.0)) if zc.antithetic_sampling else u
            e += 1
    return t


def ref_mask(d, b, ex, answer, t, zc):
    """(masked set, per-token p, pattern) of example `ex` (segment - 1) of row b, whose answer sits at
    physical indices `answer`."""
    n = len(answer)
    alpha = lambda tt: f32(zc.alpha0) * (f32(1.0) - f32(1.0 - zc.eps) * tt)
    p_tok = []
    for a in range(n):
        ta = f32(t + min(t, f32(1) - t) * (f32(2 * a + 1 - n) / f32(n))) if zc.ordered_sampling else t
        p_tok.append(f32(1.0) - alpha(ta))
    if not zc.grouped_noise:
        return {i for a, i in enumerate(answer) if d["u_tok"][b, i] < p_tok[a]}, p_tok, -1
    if n == 0:
        return set(), p_tok, -1
    p_bar = f32(1.0) - alpha(t)
    m = min(int(np.floor(p_bar * f32(n) + d["u_round"][b, ex])), n)
    pattern = min(int(np.floor(d["u_pattern"][b, ex] * f32(4))), 3)
    if pattern == 0:
        chosen = range(n - m, n)
    elif pattern == 1:
        chosen = range(m)
    elif pattern == 2:
        free, u = n - m, d["u_start"][b, ex]
        k = 1 + int(np.floor(u * f32(free - 1))) if free >= 2 else int(np.floor(u * f32(free + 1)))
        chosen = range(k, k + m)
    else:
        q = f32(2.0 / (zc.max_span_length + 1))
        spans = []
        for a in range(n):
            i = answer[a]
            if a == 0 or d["u_break"][b, i] < q or len(spans[-1]) == zc.max_span_length:
                spans.append([a])
            else:
                spans[-1].append(a)
        spans.sort(key=lambda sp: (d["span_key"][b, answer[sp[0]]], sp[0]))
        chosen, left = [], m
        for sp in spans:
            chosen += sp[:left]
            left -= len(sp[:left])
    return {answer[a] for a in chosen}, p_tok, pattern


def ref_noise(draws, batch, zc, mask_id):
    d = np_draws(draws)
    rows, length = batch["tokens"].shape
    t_of = ref_t(d, batch, zc)
    out = {k: [] for k in KEYS}
    for b in range(rows):
        tok, pos, seg = batch["tokens"][b], batch["positions"][b], batch["segment_ids"][b]
        info = {}  # physical index -> (masked, p, n, pattern)
        orders = ([], [])
        for s, prompt, answer in examples_of_row(batch, b):
            masked, p_tok, pattern = ref_mask(d, b, s - 1, answer, t_of[b, s], zc)
            for i in prompt:
                info[i] = (False, 0.0, 0, -1)
            for a, i in enumerate(answer):
                info[i] = (i in masked, p_tok[a], len(answer), pattern)
            clean = [i for i in answer if i not in masked]
            mk = [i for i in answer if i in masked]
            if zc.noise_sorting:
                if zc.sequential_shuffle:
                    clean.sort(key=lambda i: (d["key_clean"][b, i], i))
                mk_dif = sorted(mk, key=lambda i: (d["key_masked"][b, i], i)) if zc.diffusion_shuffle else mk
                orders[0].extend(prompt + clean + mk)
                orders[1].extend(prompt + clean + mk_dif)
            else:
                orders[0].extend(prompt + answer)
                orders[1].extend(prompt + answer)
        pads = [i for i in range(length) if seg[i] == 0]
        for i in pads:
            info[i] = (False, 0.0, 0, -1)
        for which, order in enumerate(orders):
            row = {k: [] for k in KEYS}
            for i in order + pads:
                masked, p, n, pattern = info[i]
                if which == 0:  # sequential: AR target x0[i + 1] when that token is masked
                    nxt = i + 1 < length and seg[i + 1] == seg[i] != 0 and info[i + 1][0]
                    vals = (tok[i], tok[i + 1] if nxt else 0, 1.0 if nxt else 0.0, False)
                else:
                    w = (f32(zc.alpha0 * (1 - zc.eps)) if zc.elbo_weight else f32(1.0)) / p if masked else 0.0
                    vals = (mask_id if masked else tok[i], tok[i] if masked else 0, w, masked)
                for k, v in zip(("tokens", "targets", "weights", "is_dif"), vals):
                    row[k].append(v)
                for k, v in zip(("positions", "segment_ids", "masked", "ans_len", "p_mask", "pattern"),
                                (pos[i], seg[i], masked, n, p, pattern)):
                    row[k].append(v)
            for k in KEYS:
                out[k].append(row[k])
    return {k: np.asarray(v) for k, v in out.items()}


_jit_from_draws = jax.jit(noise_transform_from_draws, static_argnums=(2, 3))


@functools.lru_cache(maxsize=None)
def case(ci, seed):
    zc = CONFIGS[ci]
    batch = random_batch(100 + seed)
    draws = np_draws(draw_token_noise(jax.random.PRNGKey(seed), (B, L)))
    # every grouped pattern occurs in every row
    draws["u_pattern"] = ((np.arange(B)[:, None] + np.arange(L)[None]) % 4 + 0.5).astype(np.float32) / 4
    draws["u_tok"][0:2] = 0.0  # Bernoulli configs: every answer token masked in rows 0-1 ...
    draws["u_tok"][2:4] = 1.0  # ... and none in rows 2-3
    out = jax.tree.map(np.asarray, _jit_from_draws(draws, batch, zc, MASK))
    return batch, draws, out


@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_matches_numpy_reference(ci):
    zc = CONFIGS[ci]
    for seed in range(3):
        batch, draws, out = case(ci, seed)
        ref = ref_noise(draws, batch, zc, MASK)
        for k in KEYS:
            if ref[k].dtype.kind == "f":
                # p_mask = 1 - alpha_t cancels: with alpha0 = 1 and p ~ 0.05, one ulp of alpha_t (XLA may
                # associate the schedule's float ops differently) is ~20 ulp of p and of 1/p.
                np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, err_msg=f"{k} (config {ci}, seed {seed})")
            else:
                np.testing.assert_array_equal(out[k], ref[k], err_msg=f"{k} (config {ci}, seed {seed})")
        np.testing.assert_array_equal(out["num_examples"][1::2],
                                      [sum(len(a) > 0 for _, _, a in examples_of_row(batch, b)) for b in range(B)])
        assert not out["num_examples"][0::2].any() and out["primary"][1::2].all() and not out["primary"][0::2].any()
        if zc.grouped_noise:
            assert set(out["pattern"][out["answer"]].tolist()) == {0, 1, 2, 3}
        else:
            np.testing.assert_array_equal(out["masked"][0:4], out["answer"][0:4])
            assert not out["masked"][4:8].any()


def test_grouped_patterns_shapes():
    """Geometry of each pattern, read from the output alone."""
    for ci in (2, 3):
        zc = CONFIGS[ci]
        batch, _, out = case(ci, 0)
        for r in range(1, 2 * B, 2):
            b = r // 2
            for s, prompt, answer in examples_of_row(batch, b):
                sel = (out["segment_ids"][r] == s) & out["answer"][r]
                if not sel.any():
                    continue
                a = np.sort(out["positions"][r][sel & out["masked"][r]]) - len(prompt)
                n, m = len(answer), len(a)
                pattern = out["pattern"][r][sel][0]
                p_bar = out["p_mask"][r][sel].mean()
                assert m in (int(np.floor(p_bar * n)), int(np.floor(p_bar * n)) + 1, min(n, int(np.ceil(p_bar * n))))
                if m == 0:
                    continue
                if pattern == 0:
                    np.testing.assert_array_equal(a, np.arange(n - m, n))
                elif pattern == 1:
                    np.testing.assert_array_equal(a, np.arange(m))
                elif pattern == 2:
                    np.testing.assert_array_equal(a, np.arange(a[0], a[0] + m))
                    if n - m >= 2:
                        assert 0 < a[0] and a[-1] < n - 1
                elif zc.max_span_length == 1:
                    pass  # every token its own span: any subset of size m


def test_invariants_and_no_leak():
    for ci in (1, 2):
        batch, _, out = case(ci, 1)
        for r in range(2 * B):
            b = r // 2
            for s, prompt, answer in examples_of_row(batch, b):
                # noise sorting: [prompt][clean][masked]
                phys = check_example_layout(out, r, batch, b, s, prompt, answer, "masked")
                if r % 2 == 0:  # sequential pass: masked tokens left to right
                    mpos = [out["positions"][r, q] for q in phys if out["masked"][r, q]]
                    assert mpos == sorted(mpos)
            wm = _window_mask(out["segment_ids"][r])
            np.testing.assert_array_equal(out["window_mask"][r], wm)
            for q, _ in leak_free_targets(out, r, wm):
                assert out["is_dif"][r, q] == (r % 2 == 1)


def test_antithetic_t_is_stratified():
    batch, draws, out = case(1, 2)
    per_row = batch["segment_ids"].max(1)
    n = per_row.sum()
    # with ordered_sampling the mean per-token t of an example is t: recover it from the mean p_mask
    zc = CONFIGS[1]
    ts = []
    for b in range(B):
        for s in range(1, per_row[b] + 1):
            sel = (out["segment_ids"][2 * b + 1] == s) & out["answer"][2 * b + 1]
            if sel.any():
                p_bar = out["p_mask"][2 * b + 1][sel].mean()
                ts.append((1 - (1 - p_bar) / zc.alpha0) / (1 - zc.eps))
    strata = np.floor(np.asarray(ts) * n + 1e-4).astype(int)
    assert len(set(strata.tolist())) == len(ts)  # one example per stratum [e/N, (e+1)/N)


def test_mask_rate_statistics():
    """Masked tokens vs Σ p_mask (Bernoulli) and vs Σ p̄·n (grouped), z-scores over many examples."""
    for ci in (1, 2):
        zc = CONFIGS[ci]
        masked = expected = var = 0.0
        for seed in range(8):
            batch = random_batch(200 + seed)
            out = _jit_from_draws(draw_token_noise(jax.random.PRNGKey(50 + seed), (B, L)), batch, zc, MASK)
            out = jax.tree.map(np.asarray, out)
            sel = out["answer"][1::2]
            p = out["p_mask"][1::2][sel]
            masked += out["masked"][1::2][sel].sum()
            expected += p.sum()
            # grouped: m = floor(p̄·n + u) has mean p̄·n and variance <= 1/4 per example
            var += (p * (1 - p)).sum() if not zc.grouped_noise else 0.25 * out["num_examples"].sum()
        assert abs(masked - expected) < 5 * np.sqrt(var), (ci, masked, expected, var)


def test_jit_equals_eager_and_keys():
    zc = CONFIGS[1]
    batch = random_batch(21, rows=4, length=24)
    key = jax.random.PRNGKey(5)
    f = jax.jit(noise_transform, static_argnums=(2, 3))
    a = jax.tree.map(np.asarray, f(key, batch, zc, MASK))
    e = jax.tree.map(np.asarray, noise_transform(key, batch, zc, MASK))  # op by op
    again = jax.tree.map(np.asarray, f(key, batch, zc, MASK))
    other = jax.tree.map(np.asarray, f(jax.random.PRNGKey(6), batch, zc, MASK))
    assert_same(a, e, "eager ")
    for k in a:
        np.testing.assert_array_equal(a[k], again[k], err_msg=k)  # same key: bit-identical
    assert any(not np.array_equal(a[k], other[k]) for k in ("tokens", "positions", "weights"))


def test_bad_inputs():
    batch = random_batch(0, rows=2, length=16)
    with pytest.raises(ConfigError, match="mask_id"):
        noise_transform(jax.random.PRNGKey(0), batch, CONFIGS[0], None)
