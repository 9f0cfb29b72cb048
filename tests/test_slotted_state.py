"""Mode B's decoder pieces (docs/algorithms.md §6): the per-row selection of phase updates, and the traced knobs read
from the mode itself."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax.sampling import GenerationConfig, slotted
from zarya_jax.sampling.slotted import DONE, INFILL_DRAFT, INFILL_VERIFY, PLAN, VERIFY, Slotted, Update


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


def test_traced_knobs_are_the_modes_own(tiny_config, tiny_params):
    """The decoder reads its traced knobs from the mode itself (its traced fields as arrays), not from the
    static config, whose traced fields are reset to their defaults: one program, two decodes."""
    gc = GenerationConfig(mode=Slotted(slot_size=4, slot_threshold=0.7, token_threshold=0.0, ar_infill=True),
                          max_new_tokens=8)
    knobs = gc.mode.arrays()
    assert (float(knobs.slot_threshold), float(knobs.token_threshold), bool(knobs.ar_infill),
            bool(knobs.ar_first_token)) == (pytest.approx(0.7), 0.0, True, False)
    assert knobs.token_threshold.dtype == jnp.float32 and knobs.ar_infill.dtype == jnp.bool_
    assert Slotted.TRACED == ("slot_threshold", "token_threshold", "ar_infill", "ar_first_token")
    static = gc.replace(mode=gc.mode.static())
    assert static.mode == Slotted(slot_size=4)  # the compile key: traced fields at their defaults
    run = jax.jit(functools.partial(slotted.run, config=tiny_config, gcfg=static))
    tokens, lengths = jnp.asarray([[5, 6, 7, 8]], jnp.int32), jnp.full((1,), 4, jnp.int32)
    mine = run(tiny_params, tokens, lengths, jax.random.PRNGKey(0), knobs=knobs)
    default = run(tiny_params, tokens, lengths, jax.random.PRNGKey(0), knobs=static.mode.arrays())
    assert run._cache_size() == 1
    # τt = 0 accepts every drafted token: fewer passes than the default τt = 0.9 on this random model
    assert (mine["num_forward_passes"] < default["num_forward_passes"]).all()
