"""The one override mechanism (`zarya_jax.overrides`): typed dotted keys on frozen dataclass trees, typo
hints, external names, sparse per-mode knobs; checked against values written out by hand."""
import dataclasses

import pytest

from zarya_jax import overrides as ov
from zarya_jax.config import ConfigError
from zarya_jax.eval.evaluate import EvalConfig, ModeKnobs
from zarya_jax.sampling import GenerationConfig, Slotted
from zarya_jax.train import config as rc


@dataclasses.dataclass(frozen=True)
class Inner:
    lr: float = 1e-3
    sizes: tuple[int, ...] = (2, 4)
    name: str = "x"
    limit: int | None = None


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner = Inner()
    flag: bool = False
    odd: Inner = dataclasses.field(default=Inner(), metadata={"key": "odd-name"})


def test_apply_coerces_to_field_types_and_copies():
    base = Outer()
    out = ov.apply(base, ["inner.lr=1e-2", "inner.sizes=8,16", "flag=yes", "inner.limit=3", "odd-name.name=7"])
    assert out == Outer(Inner(lr=0.01, sizes=(8, 16), limit=3), True, Inner(name="7"))
    assert base == Outer()  # a copy: the base tree is not changed
    assert ov.apply(out, {"inner.limit": None, "inner.sizes": [1]}).inner == Inner(lr=0.01, sizes=(1,))
    assert ov.get(out, "odd-name.name") == "7" and ov.to_dict(out)["odd-name"]["name"] == "7"
    assert ov.build(Outer, {"inner": {"lr": "5e-4"}}, base=out) == dataclasses.replace(out, inner=Inner(5e-4, (8, 16),
                                                                                                      "x", 3))


@pytest.mark.parametrize("item,match", [
    ("inner.lrr=1", r"unknown config key 'inner.lrr'; did you mean \['inner.lr', "),
    ("inne.lr=1", r"unknown config key 'inne.lr'; did you mean \['inner.lr'"),
    ("inner.lr.x=1", "unknown config key 'inner.lr.x'"),
    ("inner.lr=fast", "inner.lr='fast': expected a number"),
    ("inner.sizes=1.5", r"inner.sizes=1.5: expected an integer"),
    ("flag=maybe", "flag='maybe': expected true or false"),
    ("flag", "expected KEY=VALUE"),
])
def test_bad_overrides_name_the_key(item, match):
    with pytest.raises(ConfigError, match=match):
        ov.apply(Outer(), [item])


def test_sparse_knobs_and_listing():
    knobs = ov.apply(ModeKnobs(), {"spec-self.draft_length": "4", "slotted.slot_threshold": 2})
    assert knobs.spec_self.draft_length == 4 and knobs.slotted.slot_threshold == 2.0
    assert knobs.as_dict() == {"ar": {}, "mdm": {}, "slotted": {"slot_threshold": 2.0},
                               "spec-self": {"draft_length": 4}, "spec-lora": {}, "spec-model": {},
                               "spec-self-fused": {}, "spec-lora-fused": {}}
    assert ov.to_dict(knobs)["spec-self"] == {"draft_length": 4}
    with pytest.raises(ConfigError, match=r"spec-self.draft_lenght: mode 'spec-self' has no field 'draft_lenght' "
                                          r"\(did you mean \['draft_length'\]\?\); its fields are \['draft_length'"):
        ov.apply(ModeKnobs(), {"spec-self.draft_lenght": 4})
    # each mode's fields and the shared ones are its knobs: one row per mode in the listing
    rows = {k: (t, d) for k, t, d in ov.keys(EvalConfig, defaults=EvalConfig(knobs=knobs))}
    assert rows["knobs.spec-self.FIELD"] == ("SpecSelfKnobs field", {"draft_length": 4})
    shared = {f.name for f in dataclasses.fields(GenerationConfig)} - {"mode"}
    assert {f.name for f in dataclasses.fields(knobs.slotted)} == {f.name for f in dataclasses.fields(Slotted)} | shared
    with pytest.raises(ConfigError, match="unknown mode"):
        EvalConfig(modes=("ar", "beam"))


@dataclasses.dataclass(frozen=True)
class WithGrid:
    grid: dict[str, dict[str, list]] = dataclasses.field(default_factory=lambda: {"a": {"x": [1], "y": [2]}})


def test_mapping_fields_merge_key_by_key():
    """A dict-typed field is reached by dotted keys; what is given is merged into its value (new keys last)."""
    out = ov.apply(WithGrid(), ["grid.a.y=[3,4]", "grid.a.z=[5]", "grid.b.x=[6]"])
    assert out.grid == {"a": {"x": [1], "y": [3, 4], "z": [5]}, "b": {"x": [6]}}
    assert list(out.grid["a"]) == ["x", "y", "z"] and ov.get(out, "grid.a.z") == [5]
    assert ov.build(WithGrid, {"grid": {"a": {"x": [0]}}}).grid == {"a": {"x": [0], "y": [2]}}  # over the default
    assert [k for k, _, _ in ov.keys(WithGrid)] == ["grid.a.x", "grid.a.y"]
    with pytest.raises(ConfigError, match="holds a value, not a mapping"):
        ov.apply(WithGrid(), {"grid.a.x": 1, "grid.a.x.deeper": 1})


def test_run_config_round_trip_and_listing():
    run = rc.load("tiny", ["model.num_layers=3", "zarya.alpha0=0.3", "optim.no_decay=norm"])
    assert run.model.num_layers == 3 and run.model.hidden_size == 64 and run.optim.no_decay == ("norm",)
    assert rc.from_dict(run.to_dict()) == run
    keys = [k for k, _, _ in rc.knobs()]
    assert keys[0] == "model.preset" and "mesh.fsdp" in keys and "train.progress_bar" in keys
    with pytest.raises(ConfigError, match="unknown config sections"):
        rc.build({"model": "tiny", "zaria": {}})


@pytest.mark.parametrize("item,match", [
    # a field of another mode: the mode, the field, and the mode's own fields (and the shared ones for a knob)
    ("eval.knobs.ar.slot_size=4", r"eval.knobs.ar.slot_size: mode 'ar' has no field 'slot_size'; its fields are "
                                  r"\[\], and the shared ones \['max_new_tokens'"),
    ("eval.knobs.mdm.slot_size=4", r"mode 'mdm' has no field 'slot_size'.*; its fields are \['steps', "),
    ("eval.knobs.beam.width=2", r"eval.knobs.beam.width: unknown mode 'beam'; expected one of \('ar', "),
    ("frontier.grid.ar.slot_size=[4]", r"frontier.grid.ar.slot_size: mode 'ar' has no field 'slot_size'; its fields "
                                       r"are \[\]$"),
    ("frontier.grid.mdm.alpha=[0.5]", r"frontier.grid.mdm.alpha: mode 'mdm' has no field 'alpha' \(did you mean "
                                      r"\['alpha0'\]\?\); its fields are \['steps', "),
])
def test_a_field_the_mode_lacks_names_the_mode_and_its_fields(item, match):
    from zarya_jax.experiment.config import default_config
    with pytest.raises(ConfigError, match=match):
        ov.apply(default_config(), [item])


def test_frozen_maps_hash_and_compare_as_dicts():
    """A config's mapping field is held frozen: hashable (order-free, as equality), equal to the dict it was
    made from, written out as one."""
    a, b = ov.frozen({"x": [1, 2], "y": {"z": (3,)}}), ov.frozen({"y": {"z": [3]}, "x": (1, 2)})
    assert a == b and hash(a) == hash(b) and a == {"x": (1, 2), "y": {"z": (3,)}}
    assert ov.to_dict(a) == {"x": [1, 2], "y": {"z": [3]}} and hash(a) != hash(ov.frozen({"x": (1,)}))
    with pytest.raises(TypeError):
        a["x"] = 1  # noqa: the point: it cannot be changed


def test_the_quickstart_names_the_mode_of_a_bad_knob(tmp_path, capsys):
    """Through the command line: exit 2, one error line naming the mode and the field, nothing written."""
    from experiments import quickstart
    for item, message in [("eval.knobs.ar.slot_size=4", "eval.knobs.ar.slot_size: mode 'ar' has no field 'slot_size'"),
                          ("frontier.grid.spec-self.slot_size=[4]",
                           "frontier.grid.spec-self.slot_size: mode 'spec-self' has no field 'slot_size'; its fields "
                           "are ['draft_length'")]:
        assert quickstart.main(["--smoke", "--workdir", str(tmp_path / "w"), "--set", item]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "w").exists()
