"""Fused Ψ-Spec, one forward per cycle, with the self and the LoRA drafter (docs/algorithms.md §7.5): greedy
identity with the AR sampler, exact three-token distributions, the cache and the next drafts after every
cycle against full recomputes, and the forward count."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import lora as lora_lib
from zarya_jax.config import LoraConfig
from zarya_jax import model as model_lib
from zarya_jax.nn import kv_cache, masks
from zarya_jax.sampling import GenerationConfig, generate, mode, pad_prompts
from zarya_jax.sampling import fused, passes
from zarya_jax.testing import UNO_CONFIG as CFG, UNO_LORA as LORA
from zarya_jax.testing import uno_adapters as adapters
from zarya_jax.testing import uno_random_params as random_model, uno_trained_params as trained_model
from test_spec import SMALL, _prompts  # the two-pass tests' ragged prompts and V = 8 model

def test_window_layout():
    """K = 2: the verify block [y, d1, d2] at n−1 … n+1, then block m at n+m … n+m+2 seeing y … d_m."""
    offsets, mask = fused.window_layout(2)
    np.testing.assert_array_equal(offsets, [-1, 0, 1, 0, 1, 2, 1, 2, 3, 2, 3, 4])
    assert mask.shape == (12, 12) and fused.window_rows(GenerationConfig(mode=fused.FusedSelf(draft_length=2))) == 12
    assert passes.window_rows(GenerationConfig(mode=fused.FusedSelf(draft_length=4))) == 30
    np.testing.assert_array_equal(mask[:3, :3], np.tril(np.ones((3, 3), bool)))
    assert not mask[:3, 3:].any()  # the verify rows see no scenario row: they are the AR rows
    for m in range(3):
        rows = slice(3 * (m + 1), 3 * (m + 2))
        np.testing.assert_array_equal(mask[rows, :3], np.broadcast_to(np.arange(3) <= m, (3, 3)))
        np.testing.assert_array_equal(mask[rows, rows], np.tril(np.ones((3, 3), bool)))
        assert mask[rows].sum() == 3 * (m + 1) + 6  # nothing else


def test_window_layout_lora():
    """K = 2, LoRA: blocks of K noise rows, block m at n+m … n+m+1 (the two-pass window with seed d_m)."""
    offsets, mask = fused.window_layout(2, "lora")
    np.testing.assert_array_equal(offsets, [-1, 0, 1, 0, 1, 1, 2, 2, 3])
    gc = GenerationConfig(mode=fused.FusedLora(draft_length=2))
    assert mask.shape == (9, 9) and fused.window_rows(gc) == 9 == passes.window_rows(gc)
    np.testing.assert_array_equal(mask[:3, :3], np.tril(np.ones((3, 3), bool)))
    assert not mask[:3, 3:].any()
    for m in range(3):
        rows = slice(3 + 2 * m, 5 + 2 * m)
        np.testing.assert_array_equal(mask[rows, :3], np.broadcast_to(np.arange(3) <= m, (2, 3)))
        np.testing.assert_array_equal(mask[rows, rows], np.tril(np.ones((2, 2), bool)))
        assert mask[rows].sum() == 2 * (m + 1) + 3


def test_scenario_layout_is_the_window_layout_for_every_length():
    """The per-row layout of S chosen scenario blocks: with every length in order it is the static window;
    with a subset, each block is the static window's block of its length."""
    for drafter in ("self", "lora"):
        k = 3
        blk = fused.block_rows(k, drafter)
        offsets, mask = fused.window_layout(k, drafter)
        ms = jnp.asarray([[0, 1, 2, 3], [0, 1, 2, 3]], jnp.int32)
        got_o, got_m = fused.scenario_layout(ms, k, blk)
        np.testing.assert_array_equal(got_o, np.broadcast_to(offsets, got_o.shape))
        np.testing.assert_array_equal(got_m, np.broadcast_to(mask, got_m.shape))
        got_o, got_m = fused.scenario_layout(jnp.asarray([[3, 1]], jnp.int32), k, blk)
        w = k + 1
        rows = [np.arange(w)] + [w + m * blk + np.arange(blk) for m in (3, 1)]
        keep = np.concatenate(rows)
        np.testing.assert_array_equal(got_o[0], offsets[keep])
        np.testing.assert_array_equal(got_m[0], mask[np.ix_(keep, keep)])


def test_likely_scenarios_by_the_drafts_own_probabilities():
    """P(m) ∝ a1 ⋯ am (1 − a_{m+1}), enumerated in NumPy: the top S lengths per row."""
    conf = np.asarray([[0.9, 0.8, 0.1], [0.2, 0.99, 0.99], [0.99, 0.99, 0.99]])
    got = np.asarray(fused.likely_scenarios(jnp.asarray(conf, jnp.float32), 2))
    for row, c in zip(got, conf):
        a = np.append(c, 0.0)
        prob = [np.prod(a[:m]) * (1 - a[m]) for m in range(len(c) + 1)]
        assert sorted(row.tolist()) == sorted(np.argsort(prob)[::-1][:2].tolist())


@pytest.mark.parametrize("model,drafter,k,scenarios", [("random", "self", 3, 0), ("trained", "self", 4, 0),
                                                       ("random", "lora", 3, 0), ("trained", "lora", 4, 0),
                                                       ("trained", "self", 4, 2), ("trained", "lora", 4, 1)])
def test_greedy_identical_to_ar(model, drafter, k, scenarios):
    """Ragged batch; on the trained model (with the trained adapter) drafts are accepted, EOS falls
    inside a block and the budget (23, not a multiple of a cycle's yield) ends inside one. With S < K+1
    scenario blocks a cycle that stops elsewhere drafts from the wrong block, and the output is still AR's."""
    params = random_model() if model == "random" else trained_model()
    untrained, trained, _ = adapters()
    adapter = {"lora_params": trained if model == "trained" else untrained, "lora": LORA} if drafter == "lora" else {}
    prompts = _prompts(model == "trained")
    base = GenerationConfig(mode="ar", max_new_tokens=23, eos_token_id=None)
    if model == "trained":
        # EOS = row 0's fourth AR token: row 0 stops early whatever the trained model's numerics
        eos = int(generate(params, CFG, prompts, base.replace(stop_at_eos=False), jax.random.PRNGKey(0)).tokens[0, 3])
        base = base.replace(eos_token_id=eos)
    ref = generate(params, CFG, prompts, base, jax.random.PRNGKey(0))
    out = generate(params, CFG, prompts, base.replace(mode=mode(f"spec-{drafter}-fused", draft_length=k,
                                                                 scenarios=scenarios)),
                   jax.random.PRNGKey(1), **adapter)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-4)  # every token from a verify row
    st = out.stats
    assert st["fused"] and len(st["acceptance_by_position"]) == k and 0.0 <= st["accepted_per_cycle"] <= k
    assert st["scenarios"] == (scenarios or k + 1) and (st["scenario_hit_rate"] == 1.0 or scenarios)
    # the prefill (which drafts the first cycle) + one pass per cycle; a cycle yields 1 … K+1 tokens
    cycles = out.num_forward_passes - 1
    assert st["tokens_per_forward"] == pytest.approx(out.lengths.sum() / cycles.sum())
    assert (cycles >= np.ceil(out.lengths / (k + 1))).all() and (cycles <= out.lengths).all()
    if model == "trained":
        # the drafter drafts (some cycle emits a block), and row 0 stops at its EOS
        assert out.lengths[0] <= 4 and st["accepted_per_cycle"] > 0 and (cycles < out.lengths).any()


@pytest.mark.parametrize("drafter,rows", [("self", [6, 12]), ("lora", [5, 9])])
def test_one_forward_per_cycle(monkeypatch, drafter, rows):
    """The program calls the model twice: the prefill (which drafts the first cycle) and once in the loop body."""
    gc = GenerationConfig(mode=mode(f"spec-{drafter}-fused", draft_length=2), max_new_tokens=5)
    lp, lora = (adapters()[0], LORA) if drafter == "lora" else (None, None)
    args = (random_model(), lp, jnp.ones((2, 4), jnp.int32), jnp.asarray([4, 2]), jax.random.PRNGKey(0), jnp.int32(5))
    calls = []
    apply = model_lib.apply
    monkeypatch.setattr(model_lib, "apply", lambda *a, **kw: calls.append(a[2].shape) or apply(*a, **kw))
    jax.make_jaxpr(lambda *a: fused.fused_decode.__wrapped__(*a, config=CFG, gcfg=gc, lora=lora))(*args)  # fresh trace
    # the prompt followed by B−1 noise rows, the window (K+1)(1+B)
    assert [s[1] for s in calls] == rows
    raw = fused.fused_decode(*args, config=CFG, gcfg=gc, lora=lora)
    np.testing.assert_array_equal(raw["num_forward_passes"], 1 + raw["row_cycles"])
    assert int(raw["loop_passes"]) == 1 + int(raw["row_cycles"].max())


@pytest.mark.parametrize("drafter,temperature,scenarios", [("self", 1.0, 0), ("self", 0.0, 0), ("lora", 0.0, 0),
                                                            ("self", 1.0, 2)])
def test_cache_and_drafts_after_each_cycle_equal_a_recompute(drafter, temperature, scenarios):
    """After the prefill and after 1, 2, 3 cycles: the cache is the AR K/V of the committed text minus its
    last token y, and (greedy) the next drafts are the drafter's argmax of a full forward over text minus
    y followed by the scenario block the cycle chose: K+1 masks, read by the MDM convention (self); K
    mask-noise rows with the adapter on, read by the next-token convention (LoRA: the adapter trained
    with mask noise, so the noise is the same in both). The prefill's block holds y itself in e's place."""
    params = trained_model()
    prompts = _prompts(True)
    k, budget = 3, 24
    lp, lora = (adapters()[1], dataclasses.replace(LORA, noise="mask")) if drafter == "lora" else (None, None)
    blk = fused.block_rows(k, drafter)
    gc = GenerationConfig(mode=mode(f"spec-{drafter}-fused", draft_length=k, scenarios=scenarios),
                          max_new_tokens=budget, temperature=temperature, stop_at_eos=False)
    tokens, lengths = pad_prompts(prompts, gc.prompt_bucket, CFG.pad_token_id)
    width = tokens.shape[1] + budget + k + 1

    @jax.jit
    def recompute(text, valid, gate):
        if lp is None:
            return model_lib.apply(params, CFG, text, window_mask=masks.causal_with_padding(valid))
        return model_lib.apply(params, CFG, text, window_mask=masks.causal_with_padding(valid), gate=gate,
                               lora_params=lp, lora=lora)

    for cycles in (0, 1, 2, 3):
        raw = jax.device_get(fused.fused_decode(params, lp, jnp.asarray(tokens), jnp.asarray(lengths),
                                                jax.random.PRNGKey(4), jnp.int32(cycles), config=CFG, gcfg=gc, lora=lora))
        gen = raw["lengths"]
        assert (gen < budget).all() and (raw["row_cycles"] == cycles).all()
        total = lengths + gen
        text = np.full((len(prompts), width), CFG.pad_token_id, np.int32)
        for i, p in enumerate(prompts):
            committed = p + list(raw["tokens"][i, :gen[i]])
            text[i, :total[i] - 1] = committed[:-1]
            text[i, total[i] - 1:total[i] - 1 + blk] = CFG.mask_token_id  # e's place, then the draft rows
            if cycles == 0:
                text[i, total[i] - 1] = committed[-1]
            assert raw["seed"][i] == committed[-1]
        np.testing.assert_array_equal(raw["cache"]["length"], total - 1)
        np.testing.assert_array_equal(raw["positions"], total)
        cols = np.arange(width)[None]
        valid = cols < (total - 1 + blk)[:, None]
        gate = valid & (cols >= (total - 1 + (cycles == 0))[:, None])
        logits, kv = jax.device_get(recompute(jnp.asarray(text), jnp.asarray(valid), jnp.asarray(gate)))
        for i in range(len(prompts)):
            n = total[i] - 1
            for cached, window in zip(kv_cache.rows(raw["cache"], i, n), kv):
                np.testing.assert_allclose(cached, window[:, i, :n], atol=1e-5)
            if temperature == 0:  # the rows drafting n+1 … n+k: their own (self) or the next (LoRA) position
                first = n + 1 if drafter == "self" else n
                rows = logits[i, first:first + k].copy()
                rows[:, CFG.mask_token_id] = -np.inf
                np.testing.assert_array_equal(raw["drafts"][i], rows.argmax(-1))


@pytest.mark.parametrize("drafter,top_k,scenarios", [("self", 0, 0), ("self", 3, 0), ("lora", 0, 0), ("self", 0, 1)])
def test_first_three_tokens_joint_distribution(drafter, top_k, scenarios):
    """Histogram of the first three tokens from fused Ψ-Spec (temperature 1, K = 2) vs the AR model's
    exact distribution, enumerated with full forwards (V = 7 sampleable ids: 343 outcomes). The LoRA
    drafter is a random adapter shifted off zero, so its q differs from p and drafts are rejected. With
    one scenario block, most cycles take their next drafts from a block prepared for another length."""
    params = jax.jit(model_lib.init_params, static_argnums=0)(SMALL, jax.random.PRNGKey(11))
    params = {**params, "lm_head": params["lm_head"] * 20.0}  # a spread but non-flat p
    small_lora = LoraConfig(rank=2, alpha=4.0)
    lp = jax.tree.map(lambda x: x + 0.3, lora_lib.init_lora(SMALL, small_lora, jax.random.PRNGKey(12)))
    lp, lora = (lp, small_lora) if drafter == "lora" else (None, None)
    prompt, v = [1, 2, 3, 4], 7  # the mask token (id 7) is never sampled

    def ar_probs(logits):  # the AR sampler's distribution: mask banned, top-k, temperature 1
        z = np.asarray(logits, np.float64)[..., :v]
        if top_k:
            z = np.where(z >= np.sort(z, -1)[..., -top_k:-top_k + 1], z, -np.inf)
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    seqs = np.asarray([prompt + [a, b] for a in range(v) for b in range(v)], np.int32)
    probs = ar_probs(model_lib.forward(params, SMALL, jnp.asarray(seqs)))  # [v·v, 6, v]
    p1 = probs[0, len(prompt) - 1]
    p2 = probs[::v, len(prompt)]  # [a] → p(· | a)
    p3 = probs[:, len(prompt) + 1].reshape(v, v, v)  # [a, b] → p(· | a, b)
    exact = p1[:, None, None] * p2[:, :, None] * p3

    n = 60_000
    gc = GenerationConfig(mode=mode(f"spec-{drafter}-fused", draft_length=2, scenarios=scenarios), max_new_tokens=3,
                          temperature=1.0, top_k=top_k)
    raw = fused.fused_decode(params, lp, jnp.broadcast_to(jnp.asarray(prompt, jnp.int32), (n, len(prompt))),
                             jnp.full((n,), len(prompt), jnp.int32), jax.random.PRNGKey(13), jnp.int32(3),
                             config=SMALL, gcfg=gc, lora=lora)
    out = np.asarray(raw["tokens"])
    assert (np.asarray(raw["lengths"]) == 3).all() and out.max() < v
    hist = np.bincount((out[:, 0] * v + out[:, 1]) * v + out[:, 2], minlength=v ** 3).reshape(v, v, v) / n
    tv = 0.5 * np.abs(hist - exact).sum()
    # sampling noise alone: E[TV] ≈ 0.5 Σ sqrt(2 p (1 − p) / (π n)); its spread is far smaller
    noise = 0.5 * np.sqrt(2 * exact * (1 - exact) / (np.pi * n)).sum()
    assert tv < 1.3 * noise + 0.003, (tv, noise)
    # drafts were both accepted and rejected: the acceptance rule really ran
    assert 0.0 < float(raw["accepted_sum"]) / n < 2.0 * 3


def test_fused_modes_have_their_own_knobs():
    """The fused modes are modes of their own ("spec-self-fused", "spec-lora-fused"), whose knobs are K and
    the drafts' proposal: a knob of two-pass speculation is refused naming the mode's fields; the LoRA
    drafter's adapter is checked as two-pass's is."""
    for name, cls in (("spec-self-fused", fused.FusedSelf), ("spec-lora-fused", fused.FusedLora)):
        gc = GenerationConfig(mode=name).with_knobs(draft_length=3)
        assert gc.mode == cls(draft_length=3) and gc.mode.lossless and gc.mode.short() == "K=3"
        gc.validate(CFG)
        for knob in ("draft_passes", "draft_when_active_below", "fused", "drafter"):
            with pytest.raises(ValueError, match=rf"not a field of mode '{name}' \(\['draft_length', 'proposal', "
                                                 r"'proposal_temperature', 'scenarios'\]\)"):
                gc.with_knobs(**{knob: 2})
        with pytest.raises(ValueError, match=f"knobs.{name}.draft_length=0: expected an integer ≥ 1"):
            gc.with_knobs(draft_length=0).validate(CFG)
        with pytest.raises(ValueError, match=rf"knobs.{name}.scenarios=5: expected an integer in \[0, draft_length \+ 1 = 4\]"):
            gc.with_knobs(scenarios=5).validate(CFG)
        assert gc.with_knobs(scenarios=4).mode.canonical(32) == gc.mode  # all K+1: the default window
        assert gc.with_knobs(scenarios=2).mode.short() == "K=3 S=2"
    assert GenerationConfig(mode="spec-self-fused").needs_mask_token
    assert not GenerationConfig(mode="spec-lora-fused").needs_mask_token
    with pytest.raises(ValueError, match="mode 'spec-lora-fused' needs the adapter"):
        generate(random_model(), CFG, [[1, 2]], GenerationConfig(mode="spec-lora-fused"), jax.random.PRNGKey(0))
