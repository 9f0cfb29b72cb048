"""Mode A (SPEC §5): per-step logits vs a full causal forward over the physical order; budget; layout."""
import jax
import numpy as np
import pytest

from test_sampling_reference import check_against_full_forward
from zarya_jax.sampling import GenerationConfig, generate, mdm

PROMPTS = [[5, 17, 42, 99, 3], [12, 8, 100]]
M, T = 8, 3


@pytest.fixture(scope="module")
def run_a(tiny_config, tiny_params):
    gc = GenerationConfig(mode="mdm", max_new_tokens=M, steps=T, alpha0=0.5, temperature=1.0, stop_at_eos=False,
                          prompt_bucket=8)
    return gc, generate(tiny_params, tiny_config, PROMPTS, gc, jax.random.PRNGKey(2), debug=True)


def test_step_logits_equal_full_forward(run_a, tiny_config, tiny_params):
    gc, out = run_a
    st = out.stats
    n = check_against_full_forward(tiny_params, tiny_config, st["trace"], st["physical_tokens"],
                                   st["physical_positions"])
    assert n == int(out.num_forward_passes.sum()) - len(PROMPTS)  # every decode pass of every row checked


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
    gc = GenerationConfig(mode="mdm", max_new_tokens=m, steps=t, alpha0=a)
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
    gc0 = gc.replace(steps=0)
    _, sizes0, n0, _ = mdm.plan(jax.random.PRNGKey(1), gc0, 2)
    assert np.asarray(n0).tolist() == [3, 3]
    assert np.asarray(sizes0)[0, :3].tolist() == [3, 3, 4]
    assert mdm.window_rows(gc) == 3 and mdm.window_rows(gc0) == 4
