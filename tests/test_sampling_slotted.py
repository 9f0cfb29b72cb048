"""Mode B (docs/algorithms.md §6): cached passes vs a full recompute, τt = 0, EOS, layout, routing, bad input."""
import jax
import numpy as np
import pytest

from zarya_jax.sampling import MODES, GenerationConfig, generate, slotted
from zarya_jax.sampling.slotted import Slotted
from zarya_jax.sampling.slotted import INFILL_DRAFT, INFILL_VERIFY, PLAN, VERIFY
from zarya_jax.testing import check_against_full_forward

PROMPTS = [[5, 17, 42, 99, 3], [12, 8, 100]]
G, S, NB = 16, 4, 2


@pytest.fixture(scope="module")
def peaked_params(tiny_params):
    """The shared random model with its embedding (tied head) scaled to std 1: peaked next-token
    distributions, so that with these keys token 20 is frequent enough to serve as EOS below."""
    return {**tiny_params, "embed": tiny_params["embed"] * 50.0}


@pytest.fixture(scope="module")
def run_one_slot(tiny_config, peaked_params):
    """τs > 1: one slot per plan; τt = 0.9 so infill rounds happen."""
    gc = GenerationConfig(mode=Slotted(slot_size=S, serial_num_blocks=NB, slot_threshold=2.0, token_threshold=0.9),
                          max_new_tokens=G, temperature=1.0, stop_at_eos=False, prompt_bucket=8)
    return gc, generate(peaked_params, tiny_config, PROMPTS, gc, jax.random.PRNGKey(4), debug=True)


@pytest.fixture(scope="module")
def run_tau_zero(tiny_config, peaked_params):
    """τt = 0 and τs = 0 (every slot chosen at once); EOS = the model's most frequent token so rows stop."""
    gc = GenerationConfig(mode=Slotted(slot_size=S, serial_num_blocks=NB, slot_threshold=0.0, token_threshold=0.0),
                          max_new_tokens=G, temperature=1.0, eos_token_id=20, prompt_bucket=8)
    return gc, generate(peaked_params, tiny_config, PROMPTS, gc, jax.random.PRNGKey(5), debug=True)


def test_one_slot_passes_equal_full_recompute(run_one_slot, tiny_config, peaked_params):
    gc, out = run_one_slot
    st = out.stats
    phases = np.asarray(st["trace"]["phase"])
    assert np.any((phases == INFILL_DRAFT) | (phases == INFILL_VERIFY))  # infill was exercised
    raw = st["raw_physical"]
    n = check_against_full_forward(peaked_params, tiny_config, st["trace"], raw["physical_tokens"],
                                   raw["physical_positions"])
    assert n == int(out.num_forward_passes.sum()) - len(PROMPTS)
    assert np.all(st["plans"] == G // S)  # one slot per plan


def test_layout_and_no_mask(run_one_slot, run_tau_zero, tiny_config):
    for gc, out in (run_one_slot, run_tau_zero):
        st = out.stats
        for b, prompt in enumerate(PROMPTS):
            p, n = len(prompt), int(out.lengths[b])
            pos = st["physical_positions"][b]
            toks = st["physical_tokens"][b]
            assert sorted(pos[pos >= 0].tolist()) == list(range(p + n))
            assert not np.any(toks == tiny_config.mask_token_id)
            assert not np.any(out.tokens[b] == tiny_config.mask_token_id)
            for t, q in zip(toks[p:p + n], pos[p:p + n]):  # logical order restored
                assert out.tokens[b, q - p] == t


def test_tau_t_zero_commits_after_one_verify(run_tau_zero, tiny_config, peaked_params):
    gc, out = run_tau_zero
    st = out.stats
    phases = np.asarray(st["trace"]["phase"])
    valid = np.asarray(st["trace"]["valid"])
    assert not np.any((phases == INFILL_DRAFT) | (phases == INFILL_VERIFY))
    for b in range(len(PROMPTS)):
        ph = phases[:, b]
        ph = ph[ph <= VERIFY]
        assert ph.tolist() == [PLAN, VERIFY] * (len(ph) // 2)  # plan, verify, commit, plan, ...
        # each plan chose every pending slot (τs = 0) and the verify pass covered them all
        for i in np.flatnonzero(phases[:, b] == PLAN):
            assert valid[i, b].sum() == valid[i + 1, b].sum()
    # plan/verify passes are causal: they too equal the full recompute
    raw = st["raw_physical"]
    check_against_full_forward(peaked_params, tiny_config, st["trace"], raw["physical_tokens"],
                               raw["physical_positions"])


def test_eos_cuts_rows(run_tau_zero):
    gc, out = run_tau_zero
    eos = gc.eos_token_id
    for b in range(len(PROMPTS)):
        n = int(out.lengths[b])
        row = out.tokens[b]
        if eos in row[:n].tolist():
            assert row[n - 1] == eos and eos not in row[: n - 1].tolist()
            assert np.all(row[n:] == 256)
            # the row stopped after the block holding its EOS: at most 1 + 2 passes per block started
            block = (n - 1) // out.stats["block_size"]
            assert out.num_forward_passes[b] <= 1 + 2 * (block + 1)
    assert any(eos in out.tokens[b, : out.lengths[b]].tolist() for b in range(len(PROMPTS)))


def test_block_layout():
    mk = lambda g, s, nb: GenerationConfig(mode=Slotted(slot_size=s, serial_num_blocks=nb),  # noqa: E731
                                           max_new_tokens=g)
    assert slotted.block_layout(mk(16, 4, 2)) == (2, 8)
    assert slotted.block_layout(mk(100, 8, 2)) == (2, 48)   # ⌊100/2⌋ = 50 rounded down to 48
    assert slotted.block_layout(mk(12, 4, 8)) == (3, 4)     # NB lowered so that block ≥ slot


def _unbounded_layout(g: int, s: int, nb: int) -> tuple[int, int]:
    """The block layout without `max_block_size` (§6.0 before the bound): the reference."""
    if g // nb < s:
        nb = max(1, g // s)
    return nb, (g // nb) // s * s


def test_block_layout_bound():
    for g in (4, 12, 16, 100, 257, 1000, 8192):
        for s in (1, 4, 8):
            for nb in (1, 2, 3, 8):
                if s > g:
                    continue
                gc = GenerationConfig(mode=Slotted(slot_size=s, serial_num_blocks=nb, max_block_size=10 ** 6),
                                      max_new_tokens=g)
                assert slotted.block_layout(gc) == _unbounded_layout(g, s, nb)  # unbound: as before
                for cap in (s, 16, 256):
                    if cap < s:
                        continue
                    n, bs = slotted.block_layout(gc.with_knobs(max_block_size=cap))
                    assert bs <= cap // s * s and (n, bs) == _unbounded_layout(g, s, n)
                    # where the bound does not bind, the layout is today's
                    if _unbounded_layout(g, s, nb)[1] <= cap:
                        assert (n, bs) == _unbounded_layout(g, s, nb)
    # Uno's 8192 new tokens: 4096-row blocks unbounded, 256 by default
    assert slotted.block_layout(GenerationConfig(mode="slotted", max_new_tokens=8192)) == (32, 256)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bounded_block_decodes_as_more_blocks(temperature, tiny_config, peaked_params):
    """A binding `max_block_size` is the unbounded decode with more blocks (here G/S), token for token."""
    base = GenerationConfig(mode=Slotted(slot_size=S, slot_threshold=0.5, token_threshold=0.5), max_new_tokens=G,
                            temperature=temperature, prompt_bucket=8, stop_at_eos=False)
    bounded = generate(peaked_params, tiny_config, PROMPTS,
                       base.with_knobs(serial_num_blocks=1, max_block_size=S), jax.random.PRNGKey(3))
    assert bounded.stats["num_blocks"] == G // S and bounded.stats["block_size"] == S
    reference = generate(peaked_params, tiny_config, PROMPTS,
                         base.with_knobs(serial_num_blocks=G // S, max_block_size=G), jax.random.PRNGKey(3))
    np.testing.assert_array_equal(bounded.tokens, reference.tokens)
    np.testing.assert_array_equal(bounded.num_forward_passes, reference.num_forward_passes)


@pytest.mark.parametrize("kwargs,prompts,match", [
    (dict(mode=Slotted(slot_size=32), max_new_tokens=16), [[1]],
     "knobs.slotted.slot_size=32 does not fit max_new_tokens=16"),
    (dict(mode=Slotted(token_threshold=1.5)), [[1]], r"knobs.slotted.token_threshold=1.5: expected a value in \[0, 1\]"),
    (dict(mode=Slotted(slot_size=8, max_block_size=4)), [[1]], "slot_size=8 does not fit max_block_size=4"),
    (dict(mode=Slotted(slot_threshold=-0.1)), [[1]], "knobs.slotted.slot_threshold=-0.1: expected"),
    (dict(mode=Slotted(serial_num_blocks=0)), [[1]], "knobs.slotted.serial_num_blocks=0: expected an integer ≥ 1"),
    (dict(mode=Slotted(ar_infill=1)), [[1]], "knobs.slotted.ar_infill=1: expected true or false"),
    (dict(max_new_tokens=0), [[1]], "GenerationConfig.max_new_tokens=0"),
    (dict(max_new_tokens=500), [[1] * 20], "max_position_embeddings=512"),
    (dict(), [[1, 2], []], r"prompts\[1\] is empty"),
    (dict(), [], "non-empty list"),
    (dict(), [[1, 999]], "token id 999"),
    (dict(mode="mdm", temperature=-1.0), [[1]], "GenerationConfig.temperature=-1.0"),
    (dict(mode="ar", top_p=0.0), [[1]], "GenerationConfig.top_p=0.0"),
])
def test_bad_input_raises_before_compiling(kwargs, prompts, match, tiny_config, peaked_params):
    from zarya_jax.sampling.generate import TRACE_COUNTS

    before = sum(TRACE_COUNTS.values())
    with pytest.raises(ValueError, match=match):
        generate(peaked_params, tiny_config, prompts, GenerationConfig(**kwargs), jax.random.PRNGKey(0))
    assert sum(TRACE_COUNTS.values()) == before


def test_mode_by_name():
    """A mode's name is its default knobs; an unknown name or knob is refused naming the valid ones."""
    assert GenerationConfig(mode="slotted").mode == Slotted()
    assert GenerationConfig().mode.name == "ar"
    assert GenerationConfig(mode="slotted").with_knobs(slot_size=4, top_k=3) == GenerationConfig(
        mode=Slotted(slot_size=4), top_k=3)
    with pytest.raises(ValueError, match=r"mode 'beam': unknown; expected one of \[") as refused:
        GenerationConfig(mode="beam")
    assert all(f"'{name}'" in str(refused.value) for name in MODES)  # every mode by its name
    with pytest.raises(ValueError, match=r"not a field of mode 'slotted' \(\['slot_size'.*nor a shared"):
        GenerationConfig(mode="slotted").with_knobs(draft_length=4)
    hash(GenerationConfig(mode="slotted"))


def test_parallel_infill_equals_per_slot_recompute(run_one_slot, tiny_config, peaked_params):
    """τs = 0 and τt = 1 (no drafted token passes on its own, so every plan goes to infill with all its
    slots): several slots are infilled in one pass with the slot-local mask; each slot's
    logits equal a full forward over the committed text plus that slot alone. Checked up to the end of
    each row's first infill (afterwards the cache holds slot-local K/V, ReFusion's approximation, which
    no single causal recompute reproduces)."""
    from zarya_jax.sampling.generate import TRACE_COUNTS

    traces = TRACE_COUNTS["slotted"]
    gc = run_one_slot[0].with_knobs(slot_threshold=0.0, token_threshold=1.0)
    out = generate(peaked_params, tiny_config, PROMPTS, gc, jax.random.PRNGKey(6), debug=True)
    assert TRACE_COUNTS["slotted"] == traces  # thresholds are traced: a sweep reuses the program
    st = out.stats
    tr = st["trace"]
    phases = np.asarray(tr["phase"])
    local = (phases == INFILL_DRAFT) | (phases == INFILL_VERIFY)
    slot_ids = np.arange(G // NB) // S
    last = {}
    for b in range(len(PROMPTS)):
        idx = np.flatnonzero(local[:, b])
        if not idx.size:  # no infill in this row: every commit was causal, check every pass
            last[b] = len(local)
            continue
        end = idx[0]
        while end + 1 < len(local) and local[end + 1, b]:
            end += 1
        last[b] = end
    multi = [b for b in last if last[b] < len(local)
             and len(np.unique(slot_ids[np.asarray(tr["valid"][last[b], b])])) > 1]
    assert multi, "no first infill covered several slots"

    def groups_of(n, b):
        return slot_ids if local[n, b] else np.zeros_like(slot_ids)

    raw = st["raw_physical"]
    check_against_full_forward(peaked_params, tiny_config, tr, raw["physical_tokens"], raw["physical_positions"],
                               groups_of, select=lambda n, b: n <= last[b])
    assert np.all(out.lengths == G) and not np.any(out.tokens == tiny_config.mask_token_id)


def test_eos_found_during_infill(run_tau_zero, tiny_config, peaked_params):
    """τt = 1: only a slot's first token passes verification, everything else goes through infill.
    EOS (the model's most frequent token) is accepted as a first token or during infill: the text is
    cut after it, the slots after it are dropped, and the committed positions are exactly the
    prompt + generated ones."""
    gc = run_tau_zero[0].with_knobs(token_threshold=1.0)
    out = generate(peaked_params, tiny_config, PROMPTS, gc, jax.random.PRNGKey(7), debug=True)
    st = out.stats
    hit = 0
    for b, prompt in enumerate(PROMPTS):
        p, n = len(prompt), int(out.lengths[b])
        row = out.tokens[b].tolist()
        if 20 in row[:n]:
            hit += 1
            assert row[n - 1] == 20 and 20 not in row[: n - 1] and all(t == 256 for t in row[n:])
        pos = st["physical_positions"][b]
        assert sorted(pos[pos >= 0].tolist()) == list(range(p + n))
        assert not np.any(st["physical_tokens"][b] == tiny_config.mask_token_id)
    assert hit


@pytest.fixture(scope="module")
def ar_reference(tiny_config, peaked_params):
    gc = GenerationConfig(mode="ar", max_new_tokens=G, eos_token_id=20, prompt_bucket=8)
    return generate(peaked_params, tiny_config, PROMPTS + [[7] * 7 + [1]], gc, jax.random.PRNGKey(0))


@pytest.mark.parametrize("slot_size,token_threshold", [(2, 0.5), (4, 0.9), (8, 0.99)])
def test_ar_corrections_with_one_slot_blocks_equal_ar(slot_size, token_threshold, ar_reference, tiny_config,
                                                      peaked_params):
    """Both AR corrections on and NB·S = G (every slot directly follows committed text): every committed
    token is AR's own choice or passed τt ≥ 0.5, so greedy mode B reproduces AR token for token; each
    correction alone does not (the random model's MDM drafts are poor)."""
    gc = GenerationConfig(mode=Slotted(slot_size=slot_size, serial_num_blocks=G // slot_size,
                                       token_threshold=token_threshold, ar_infill=True, ar_first_token=True),
                          max_new_tokens=G, eos_token_id=20, prompt_bucket=8)
    prompts = PROMPTS + [[7] * 7 + [1]]
    ar = ar_reference

    def same(out):
        return [np.array_equal(ar.tokens[i, :ar.lengths[i]], out.tokens[i, :out.lengths[i]])
                for i in range(len(prompts))]

    out = generate(peaked_params, tiny_config, prompts, gc, jax.random.PRNGKey(1), debug=True)
    assert all(same(out))
    # every cached pass (corrected tokens included) equals a full recompute of what it saw
    raw = out.stats["raw_physical"]
    check_against_full_forward(peaked_params, tiny_config, out.stats["trace"], raw["physical_tokens"],
                               raw["physical_positions"])
    for flags in (dict(ar_first_token=False), dict(ar_infill=False)):
        assert not all(same(generate(peaked_params, tiny_config, prompts, gc.with_knobs(**flags),
                                     jax.random.PRNGKey(1))))


def test_ar_corrections_several_slots_and_eos(run_tau_zero, tiny_config, peaked_params):
    """Corrections with several slots per plan (τs = 0) and infill (τt = 1): the layout stays a
    permutation of the prompt + generated positions, no mask is left, EOS cuts its row."""
    gc = run_tau_zero[0].with_knobs(token_threshold=1.0, ar_infill=True, ar_first_token=True)
    out = generate(peaked_params, tiny_config, PROMPTS, gc, jax.random.PRNGKey(7), debug=True)
    st = out.stats
    phases = np.asarray(st["trace"]["phase"])
    assert np.any(phases == INFILL_VERIFY)
    for b, prompt in enumerate(PROMPTS):
        p, n = len(prompt), int(out.lengths[b])
        row = out.tokens[b].tolist()
        if 20 in row[:n]:
            assert row[n - 1] == 20 and 20 not in row[: n - 1]
        pos = st["physical_positions"][b]
        assert sorted(pos[pos >= 0].tolist()) == list(range(p + n))
        assert not np.any(st["physical_tokens"][b] == tiny_config.mask_token_id)
