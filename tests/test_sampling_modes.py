"""The decoding-mode machinery (`sampling.mode`, `sampling.modes`): for every registered mode, its TRACED fields
are the pytree leaves the compiled program receives and every other field is in the static key; a mode defined
outside the package (here, in this test) gets the same treatment from `generate()` without any other change."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax.sampling import MODES, GenerationConfig, Mode, generate, mode
from zarya_jax.sampling.ar import run as ar_run
from zarya_jax.sampling.decoder import Decoder
from zarya_jax.sampling.generate import TRACE_COUNTS, static_key

SHARED = [f.name for f in dataclasses.fields(GenerationConfig) if f.name != "mode"]
NAMES = ["ar", "mdm", "slotted", "spec-self", "spec-lora", "spec-model", "spec-self-fused", "spec-lora-fused"]


def _other(value, field, cls):
    """A valid value of a field unlike `value` (a traced str field: another of its choices)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, str):
        return next(c for c in cls.CHOICES[field] if c != value)
    return value / 2 if isinstance(value, float) else value + 1


def test_the_eight_modes_by_name():
    assert list(MODES) == NAMES
    for name, cls in MODES.items():
        assert cls.name == name and mode(name) == cls() and GenerationConfig(mode=name).mode == cls()
        assert isinstance(cls.decoder, Decoder) and cls.label
    with pytest.raises(ValueError, match=r"mode 'spec': unknown; expected one of \['ar', 'mdm'"):
        mode("spec")
    with pytest.raises(ValueError, match=r"\['mdm.slot_size'\]: not field\(s\) of mode 'mdm'; its fields are \['steps'"):
        mode("mdm", slot_size=4)
    with pytest.raises(ValueError, match="its fields are none"):
        mode("ar", draft_length=4)


@pytest.mark.parametrize("name", NAMES)
def test_traced_fields_are_leaves_and_the_others_the_static_key(name):
    """Every TRACED field is a pytree leaf (in TRACED order) and reset by `static()`; every other field is
    in the treedef and kept by `static()`: changing it changes the compile key, changing a traced one does
    not. No mode field shadows a shared field, and each round-trips through `mode()` and `as_dict()`."""
    cls = MODES[name]
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    assert set(cls.TRACED) <= set(fields) and not set(fields) & set(SHARED)
    assert all(v is not dataclasses.MISSING for v in fields.values())  # a name alone is a complete mode
    m = cls()
    leaves, treedef = jax.tree.flatten(m)
    assert leaves == [fields[f] for f in cls.TRACED]
    assert jax.tree.unflatten(treedef, leaves) == m
    gc = GenerationConfig(mode=m, max_new_tokens=64)
    for field, value in fields.items():
        changed = gc.with_knobs(**{field: _other(value, field, cls)})
        changed.validate()
        traced = field in cls.TRACED
        assert (jax.tree.structure(changed.mode) == treedef) == traced, field
        assert (static_key(changed) == static_key(gc)) == traced, field
        assert mode(name, **dataclasses.asdict(changed.mode)) == changed.mode
        assert GenerationConfig.from_dict(changed.as_dict()) == changed
        assert changed.mode.describe() == {field: getattr(changed.mode, field)}
    arrays = m.arrays()
    assert jax.tree.structure(arrays) == treedef
    assert [np.asarray(x).item() for x in jax.tree.leaves(arrays.arrays())] == [x.item() for x in jax.tree.leaves(arrays)]
    for leaf, field in zip(jax.tree.leaves(arrays), cls.TRACED):
        want = {float: jnp.float32, bool: jnp.bool_, int: jnp.int32, str: jnp.int32}[type(fields[field])]
        assert leaf.dtype == want and leaf.shape == (), field
        assert isinstance(leaf, np.ndarray), field  # host values stay on the host: no transfer per call
    # inside a trace the fields are tracers, and stay JAX arrays of the same dtypes
    traced_leaves = jax.jit(lambda a: jax.tree.leaves(a.arrays()))(arrays)
    assert [x.dtype for x in traced_leaves] == [x.dtype for x in jax.tree.leaves(arrays)]


@dataclasses.dataclass(frozen=True)
class Shifted(Mode):
    """A mode defined here, not in the package: AR decoding whose tokens are shifted by a traced `offset`
    (a stand-in for a new traced knob) and cut at a static `width`."""

    name = "shifted-test"
    label = "AR, shifted"
    TRACED = ("offset",)

    width: int = 3
    offset: int = 0

    def check(self, gc) -> None:
        if self.width > gc.max_new_tokens:
            raise ValueError(f"{self.knob_name('width')}={self.width}: expected ≤ max_new_tokens={gc.max_new_tokens}")


def _shifted_run(params, tokens, lengths, key, *, config, gcfg, debug=False, knobs=None):
    out = ar_run(params, tokens, lengths, key, config=config, gcfg=gcfg, debug=debug)
    width = gcfg.mode.width  # static: a shape
    keep = jnp.arange(out["tokens"].shape[1])[None, :] < width
    return {**out, "tokens": jnp.where(keep, out["tokens"] + knobs.offset, 0),
            "lengths": jnp.minimum(out["lengths"], width)}


Shifted.decoder = Decoder(_shifted_run)


def test_a_new_traced_knob_needs_only_its_modes_definition(tiny_config, tiny_params):
    """`generate()` runs a mode it has never heard of: its check runs at the edge, its traced field reaches
    the program as a leaf (a new value reuses the compiled program), its static field selects a program."""
    prompts = [[5, 6, 7], [8, 9]]
    gc = GenerationConfig(mode=Shifted(offset=0), max_new_tokens=4, stop_at_eos=False)
    before = TRACE_COUNTS["shifted-test"]
    base = generate(tiny_params, tiny_config, prompts, gc, jax.random.PRNGKey(0))
    shifted = generate(tiny_params, tiny_config, prompts, gc.with_knobs(offset=5), jax.random.PRNGKey(0))
    assert TRACE_COUNTS["shifted-test"] - before == 1  # one program for both offsets
    np.testing.assert_array_equal(shifted.tokens[:, :3], base.tokens[:, :3] + 5)
    assert base.stats["mode"] == "shifted-test"
    wider = generate(tiny_params, tiny_config, prompts, gc.with_knobs(width=4), jax.random.PRNGKey(0))
    assert TRACE_COUNTS["shifted-test"] - before == 2 and (wider.lengths == 4).all()
    with pytest.raises(ValueError, match="knobs.shifted-test.width=9: expected ≤ max_new_tokens=4"):
        generate(tiny_params, tiny_config, prompts, gc.with_knobs(width=9), jax.random.PRNGKey(0))
    assert TRACE_COUNTS["shifted-test"] - before == 2


def test_traced_fields_must_be_fields():
    @dataclasses.dataclass(frozen=True)
    class Broken(Mode):
        name = "broken-test"
        TRACED = ("thresold",)
        threshold: float = 0.5

    with pytest.raises(TypeError, match=r"Broken.TRACED names \['thresold'\], which are not fields of it"):
        jax.tree.leaves(Broken())
