"""Mode A (docs/algorithms.md §5): per-step logits vs a full causal forward over the physical order; budget; layout."""
import jax
import numpy as np
import pytest

from zarya_jax import model as model_lib
from zarya_jax.sampling import GenerationConfig, generate, mdm
from zarya_jax.sampling.mdm import MDM
from zarya_jax.testing import check_against_full_forward

PROMPTS = [[5, 17, 42, 99, 3], [12, 8, 100]]
M, T = 8, 3


@pytest.fixture(scope="module")
def run_a(tiny_config, tiny_params):
    gc = GenerationConfig(mode=MDM(steps=T, alpha0=0.5), max_new_tokens=M, temperature=1.0, stop_at_eos=False,
                          prompt_bucket=8)
    return gc, generate(tiny_params, tiny_config, PROMPTS, gc, jax.random.PRNGKey(2), debug=True)


def check_every_pass(out, config, params):
    st = out.stats
    n = check_against_full_forward(params, config, st["trace"], st["physical_tokens"], st["physical_positions"])
    assert n == int(out.num_forward_passes.sum()) - len(PROMPTS)  # every decode pass of every row checked


def test_step_logits_equal_full_forward(run_a, tiny_config, tiny_params):
    check_every_pass(run_a[1], tiny_config, tiny_params)


def test_layout_budget_and_no_mask(run_a, tiny_config):
    gc, out = run_a
    st = out.stats
    for b, prompt in enumerate(PROMPTS):
        p = len(prompt)
        assert out.lengths[b] == M
        pos = st["physical_positions"][b]
        toks = st["physical_tokens"][b]
        assert sorted(pos[pos >= 0].tolist()) == list(range(p + M))  # prompt + generated, each once
        assert not np.any(toks == tiny_config.mask_token_id)
        assert not np.any(out.tokens[b] == tiny_config.mask_token_id)
        # physical order: diffusion tokens (random order) first, then the sequential tail left to right
        n_d = int(st["num_diffusion"][b])
        assert list(st["order"][b, n_d:]) == sorted(st["order"][b, n_d:])
        # passes: prefill + non-empty diffusion steps (min(T, N_d)) + one per sequential token
        assert out.num_forward_passes[b] == 1 + min(T, n_d) + (M - n_d)
        # logical order restored: token at logical offset o is the one placed at position p + o
        for t, q in zip(toks[p:p + M], pos[p:p + M]):
            assert out.tokens[b, q - p] == t


def test_budget_schedule():
    """T > 0: N_d ~ Binomial(M, alpha0) spread evenly over T steps, then one per step; T = 0: ⌈M/4⌉ steps ≤ 4."""
    m, t, a, rows = 10, 4, 0.3, 4000
    gc = GenerationConfig(mode=MDM(steps=t, alpha0=a), max_new_tokens=m)
    order, sizes, n_steps, n_d = jax.jit(lambda k: mdm.plan(k, gc, rows))(jax.random.PRNGKey(0))
    order, sizes, n_steps, n_d = map(np.asarray, (order, sizes, n_steps, n_d))
    assert abs(n_d.mean() - m * a) < 0.1 and abs(n_d.var() - m * a * (1 - a)) < 0.25
    for r in range(50):
        k = sizes[r, : n_steps[r]]
        assert k.sum() == m and np.all(k > 0)
        nd = n_d[r]
        diff = k[: min(t, nd)]
        assert diff.sum() == nd
        if nd:
            assert diff.max() - diff.min() <= 1 and diff.max() <= -(-m // t)
        assert np.all(k[min(t, nd):] == 1)
        assert sorted(order[r].tolist()) == list(range(m))
    gc0 = gc.with_knobs(steps=0)
    _, sizes0, n0, _ = mdm.plan(jax.random.PRNGKey(1), gc0, 2)
    assert np.asarray(n0).tolist() == [3, 3]
    assert np.asarray(sizes0)[0, :3].tolist() == [3, 3, 4]
    assert mdm.window_rows(gc) == 3 and mdm.window_rows(gc0) == 4


# Beyond the paper: diffusion order and the sequential phase's convention (mode A options).

@pytest.fixture(scope="module", params=["random", "logical", "confidence"])
def run_order(request, tiny_config, tiny_params):
    gc = GenerationConfig(mode=MDM(steps=T, alpha0=0.6, order=request.param), max_new_tokens=M, temperature=1.0,
                          stop_at_eos=False, prompt_bucket=8)
    return gc, generate(tiny_params, tiny_config, PROMPTS, gc, jax.random.PRNGKey(3), debug=True)


def test_each_order_equals_full_forward(run_order, tiny_config, tiny_params):
    """Every cached pass of every order equals an uncached causal recompute of the physical sequence."""
    gc, out = run_order
    check_every_pass(out, tiny_config, tiny_params)
    st = out.stats
    for b, prompt in enumerate(PROMPTS):
        p, n_d = len(prompt), int(st["num_diffusion"][b])
        pos = st["physical_positions"][b]
        assert sorted(pos[pos >= 0].tolist()) == list(range(p + M))
        assert out.num_forward_passes[b] == 1 + min(T, n_d) + (M - n_d)  # the same budget in every order
        order = st["order"][b]
        assert list(order[n_d:]) == sorted(order[n_d:])  # sequential tail left to right
        if gc.mode.order == "logical":
            assert order.tolist() == list(range(M))


@pytest.mark.parametrize("run_order", ["confidence"], indirect=True)
def test_confidence_order_commits_the_most_confident(run_order, tiny_config):
    """Each diffusion step commits the k undecoded masks whose top probability is highest."""
    gc, out = run_order
    assert gc.mode.order == "confidence"
    tr, st = out.stats["trace"], out.stats
    kw = mdm.window_rows(gc)
    for b, prompt in enumerate(PROMPTS):
        p, n_d = len(prompt), int(st["num_diffusion"][b])
        order = st["order"][b]
        done, start = set(), 0
        for s in range(min(T, n_d)):
            valid = np.asarray(tr["valid"][s, b, kw:])
            rows = np.asarray(tr["positions"][s, b, kw:])[valid] - p
            assert sorted(rows.tolist()) == sorted(set(range(M)) - done)  # every undecoded mask is scored
            logits = np.asarray(tr["logits"][s, b, kw:])[valid].astype(np.float64)
            logits[:, tiny_config.mask_token_id] = -np.inf
            top = np.max(logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
                         - logits.max(1, keepdims=True), axis=1)
            k = ((s + 1) * n_d) // T - (s * n_d) // T
            chosen = sorted(order[start:start + k].tolist())
            assert chosen == sorted(rows[np.argsort(-top, kind="stable")[:k]].tolist())
            assert list(order[start:start + k]) == chosen  # committed in logical order
            done |= set(chosen)
            start += k


def test_ar_sequential_at_alpha0_zero_equals_ar(tiny_config, tiny_params):
    """sequential="ar" with α0 = 0 is a left-to-right AR decode: token for token, ragged prompts, EOS."""
    prompts = [[5, 17, 42, 99, 3], [12, 8, 100], [7]]
    g = 10
    free = generate(tiny_params, tiny_config, prompts, GenerationConfig(mode="ar", max_new_tokens=g, stop_at_eos=False,
                                                                          prompt_bucket=8), jax.random.PRNGKey(0))
    eos = int(free.tokens[0, 4])  # a token the AR decode emits mid-answer
    ar_cfg = GenerationConfig(mode="ar", max_new_tokens=g, eos_token_id=eos, prompt_bucket=8)
    ref = generate(tiny_params, tiny_config, prompts, ar_cfg, jax.random.PRNGKey(0))
    assert (ref.lengths < g).any()
    a_cfg = GenerationConfig(mode=MDM(steps=4, alpha0=0.0, sequential="ar"), max_new_tokens=g, eos_token_id=eos,
                             prompt_bucket=8)
    out = generate(tiny_params, tiny_config, prompts, a_cfg, jax.random.PRNGKey(1))
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.tokens, ref.tokens)


@pytest.mark.parametrize("order", ["confidence", "random"])
def test_ar_sequential_rows_equal_recompute(tiny_config, tiny_params, order):
    """With diffusion tokens too, each AR-convention query equals a full forward over the decoded context
    in physical order followed by the token before the target (its committed copy not repeated), in the
    program of its own (confidence) and in the one the planned orders share with the mask convention."""
    gc = GenerationConfig(mode=MDM(steps=T, alpha0=0.5, sequential="ar", order=order), max_new_tokens=M,
                          temperature=1.0, stop_at_eos=False, prompt_bucket=8)
    out = generate(tiny_params, tiny_config, PROMPTS, gc, jax.random.PRNGKey(4), debug=True)
    tr, st = out.stats["trace"], out.stats
    kw = mdm.window_rows(gc)
    seqs, want = [], []
    for b, prompt in enumerate(PROMPTS):
        p, n_d = len(prompt), int(st["num_diffusion"][b])
        for s in range(min(T, n_d), min(T, n_d) + M - n_d):
            c = int(tr["cache_len"][s, b])
            ctx_t = list(st["physical_tokens"][b, :c])
            ctx_p = list(st["physical_positions"][b, :c])
            prev = np.asarray(tr["valid"][s, b, :kw])
            ctx_t += list(np.asarray(tr["tokens"][s, b, :kw])[prev])
            ctx_p += list(np.asarray(tr["positions"][s, b, :kw])[prev])
            q_tok, q_pos = int(tr["tokens"][s, b, kw]), int(tr["positions"][s, b, kw])
            assert q_tok != tiny_config.mask_token_id and q_pos == p - 1 + int(st["order"][b, s - min(T, n_d) + n_d])
            dup = [i for i, q in enumerate(ctx_p) if q == q_pos]
            assert len(dup) == 1  # the token before the target was committed exactly once
            seqs.append((ctx_t + [q_tok], ctx_p + [q_pos], dup[0]))
            want.append(np.asarray(tr["logits"][s, b, kw]))
    assert seqs
    for (toks, pos, dup), logits in zip(seqs, want):
        n = len(toks)
        visible = np.tril(np.ones((n, n), bool))
        visible[-1, dup] = False  # the query is that token again: it sees itself once
        ref, _ = model_lib.apply(tiny_params, tiny_config, np.asarray([toks], np.int32), np.asarray([pos], np.int32),
                                 window_mask=visible[None])
        np.testing.assert_allclose(logits, np.asarray(ref)[0, -1], atol=3e-5, rtol=1e-5)


def test_mode_a_option_errors():
    for field, value in (("order", "sorted"), ("sequential", "clean"), ("alpha0", 1.5), ("steps", -1)):
        with pytest.raises(ValueError, match=f"knobs.mdm.{field}={value!r}: expected"):
            GenerationConfig(mode=MDM(**{field: value})).validate()


def test_alpha0_is_traced_and_matches_its_schedule(tiny_config, tiny_params):
    """α0 is a runtime knob: two values at one T run one program, and each decodes the schedule `plan`
    draws for it from the same key (N_d per row), the α0 = 1 rows without a sequential phase."""
    from zarya_jax.sampling.generate import TRACE_COUNTS, static_key

    gc = GenerationConfig(mode=MDM(steps=T, alpha0=0.3), max_new_tokens=M, temperature=1.0, stop_at_eos=False,
                          prompt_bucket=8)
    assert static_key(gc) == static_key(gc.with_knobs(alpha0=1.0))
    key = jax.random.PRNGKey(5)
    outs = {}
    for a in (0.3, 1.0):
        before = TRACE_COUNTS["mdm"]
        outs[a] = generate(tiny_params, tiny_config, PROMPTS, gc.with_knobs(alpha0=a), key)
        traced = TRACE_COUNTS["mdm"] - before
        assert traced == (1 if a == 0.3 else 0)
        _, _, _, n_d = mdm.plan(jax.random.split(key)[0], gc.with_knobs(alpha0=a), len(PROMPTS))
        assert outs[a].stats["num_diffusion"].tolist() == np.asarray(n_d).tolist()
        assert outs[a].num_forward_passes.tolist() == [1 + min(T, n) + (M - n) for n in np.asarray(n_d)]
    assert outs[1.0].stats["num_diffusion"].tolist() == [M, M]


def test_orders_and_conventions_share_a_program(tiny_config, tiny_params):
    """The random and the logical order and both sequential conventions are traced knobs: the four run one
    program at one T (confidence, which scores every mask, another), each decoding its own schedule: the
    logical order's diffusion tokens left to right, the AR-row convention's sequential rows at the offset
    before their target (a different output than the mask convention's on this random model)."""
    from zarya_jax.sampling.generate import TRACE_COUNTS, static_key

    gc = GenerationConfig(mode=MDM(steps=T, alpha0=0.5), max_new_tokens=M, temperature=0.0, stop_at_eos=False,
                          prompt_bucket=16)
    combos = [(o, s) for o in ("random", "logical") for s in ("mask", "ar")]
    keys = {static_key(gc.with_knobs(order=o, sequential=s)) for o, s in combos}
    assert len(keys) == 1 and static_key(gc.with_knobs(order="confidence")) not in keys
    before = TRACE_COUNTS["mdm"]
    outs = {c: generate(tiny_params, tiny_config, PROMPTS, gc.with_knobs(order=c[0], sequential=c[1]),
                        jax.random.PRNGKey(4), debug=True) for c in combos}
    assert TRACE_COUNTS["mdm"] - before == 1
    for (order, seq), out in outs.items():
        if seq == "mask":  # the AR-row queries: test_ar_sequential_rows_equal_recompute
            check_every_pass(out, tiny_config, tiny_params)
        for b in range(len(PROMPTS)):
            n_d = int(out.stats["num_diffusion"][b])
            dif = out.stats["order"][b, :n_d].tolist()
            if order == "logical":
                assert dif == sorted(dif)
    assert any((outs[(o, "mask")].tokens != outs[(o, "ar")].tokens).any() for o in ("random", "logical"))


def test_canonical_resets_the_knobs_a_point_does_not_read():
    """T = 0 reads neither α0 nor the sequential convention, α0 = 1 not the convention (no sequential
    phase): the frontier's equivalent points fold onto one; the others stay as they are."""
    assert MDM(steps=0, alpha0=0.5, sequential="ar").canonical(M) == MDM(steps=0, order="random")
    assert MDM(steps=0, alpha0=1.0, order="logical").canonical(M) == MDM(steps=0, order="logical")
    assert MDM(steps=4, alpha0=1.0, sequential="ar").canonical(M) == MDM(steps=4, alpha0=1.0)
    point = MDM(steps=4, alpha0=0.5, order="confidence", sequential="ar")
    assert point.canonical(M) == point
    assert point.short() == "T=4 α0=0.5 confidence order AR-row sequential" and MDM().short() == "T=0"
