"""Mode B's decoder pieces (docs/algorithms.md §6): the per-row selection of phase updates, and the traced knobs as one
complete value (no silent fallback to the static config)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax.sampling import GenerationConfig, slotted
from zarya_jax.sampling.slotted import DONE, INFILL_DRAFT, INFILL_VERIFY, PLAN, VERIFY, Update


def _update(value: int, b: int = 5, ns: int = 2, bs: int = 8) -> Update:
    """An update whose every field is filled with `value` (bool fields: value is odd)."""
    odd = bool(value % 2)
    return Update(slots=jnp.full((b, ns), value), draft=jnp.full((b, bs), value), tags=jnp.full((b, bs), odd),
                  commit=jnp.full((b, bs), odd), committed=jnp.full((b,), odd), next_phase=jnp.full((b,), value),
                  eos_pos=jnp.full((b,), value))


def test_select_takes_each_rows_own_phase():
    phase = jnp.asarray([DONE, INFILL_VERIFY, PLAN, VERIFY, INFILL_DRAFT])
    updates = [_update(10 + p) for p in range(4)]
    out = slotted.select(phase, updates, _update(99))
    for b, p in enumerate(np.asarray(phase)):
        want = _update(99) if p == DONE else updates[p]
        for got_leaf, want_leaf in zip(jax.tree.leaves(out), jax.tree.leaves(want)):
            np.testing.assert_array_equal(got_leaf[b], want_leaf[b], err_msg=f"row {b}, phase {p}")


def test_knobs_are_complete_and_required(tiny_config, tiny_params):
    gc = GenerationConfig(mode="slotted", max_new_tokens=8, slot_size=4, slot_threshold=0.7, token_threshold=0.3,
                          ar_infill=True)
    knobs = slotted.Knobs.of(gc)
    assert (float(knobs.slot_threshold), float(knobs.token_threshold), bool(knobs.ar_infill),
            bool(knobs.ar_first_token)) == (pytest.approx(0.7), pytest.approx(0.3), True, False)
    assert set(slotted.KNOBS) == {"slot_threshold", "token_threshold", "ar_infill", "ar_first_token"}
    with pytest.raises(TypeError):
        slotted.Knobs(slot_threshold=jnp.float32(0.5))  # a partial set cannot be built
    tokens, lengths = jnp.zeros((1, 4), jnp.int32), jnp.full((1,), 4, jnp.int32)
    for dyn in ({"slot_threshold": jnp.float32(0.5)}, None):  # the old partial dict, or nothing
        with pytest.raises(ValueError, match="slotted.Knobs with every field"):
            slotted.run(tiny_params, tokens, lengths, jax.random.PRNGKey(0), config=tiny_config, gcfg=gc, dyn=dyn)
