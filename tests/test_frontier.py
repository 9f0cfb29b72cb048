"""The frontier's grid and its choice rule (pure bookkeeping, checked by hand-made rows)."""
import pytest

from zarya_jax import overrides as ov
from zarya_jax.config import ConfigError
from zarya_jax.eval import frontier
from zarya_jax.eval.evaluate import MODES
from zarya_jax.eval.frontier import FrontierConfig
from zarya_jax.eval.results import FrontierPoint
from zarya_jax.sampling import modes

# The default grid as the frontier swept it before grids were generic (generated once from that code's
# `grid_points(FrontierConfig(), MODES, M)`): (mode, knobs…) in its order; mode A as (T, α0, order,
# sequential), mode B as (S, NB, τs, τt, ar_infill, ar_first_token), the speculative modes as (F or K,).
HEAD_8 = [
    ('ar',), ('mdm', 0, 0.5, 'random', 'mask'), ('mdm', 0, 0.5, 'logical', 'mask'), ('mdm', 0, 0.5, 'confidence',
    'mask'), ('mdm', 4, 0.5, 'random', 'mask'), ('mdm', 4, 0.5, 'random', 'ar'), ('mdm', 4, 0.5, 'logical', 'mask'),
    ('mdm', 4, 0.5, 'logical', 'ar'), ('mdm', 4, 0.5, 'confidence', 'mask'), ('mdm', 4, 0.5, 'confidence', 'ar'),
    ('mdm', 4, 1.0, 'random', 'mask'), ('mdm', 4, 1.0, 'logical', 'mask'), ('mdm', 4, 1.0, 'confidence', 'mask'),
    ('mdm', 8, 0.5, 'random', 'mask'), ('mdm', 8, 0.5, 'random', 'ar'), ('mdm', 8, 0.5, 'logical', 'mask'), ('mdm',
    8, 0.5, 'logical', 'ar'), ('mdm', 8, 0.5, 'confidence', 'mask'), ('mdm', 8, 0.5, 'confidence', 'ar'), ('mdm', 8,
    1.0, 'random', 'mask'), ('mdm', 8, 1.0, 'logical', 'mask'), ('mdm', 8, 1.0, 'confidence', 'mask'), ('slotted',
    4, 2, 0.9, 0.3, False, False), ('slotted', 4, 2, 0.9, 0.3, True, False), ('slotted', 4, 2, 0.9, 0.3, True,
    True), ('slotted', 4, 2, 0.9, 0.5, False, False), ('slotted', 4, 2, 0.9, 0.5, True, False), ('slotted', 4, 2,
    0.9, 0.5, True, True), ('slotted', 4, 2, 0.9, 0.7, False, False), ('slotted', 4, 2, 0.9, 0.7, True, False),
    ('slotted', 4, 2, 0.9, 0.7, True, True), ('slotted', 4, 2, 0.9, 0.9, False, False), ('slotted', 4, 2, 0.9, 0.9,
    True, False), ('slotted', 4, 2, 0.9, 0.9, True, True), ('slotted', 4, 1, 0.9, 0.3, False, False), ('slotted', 4,
    1, 0.9, 0.3, True, False), ('slotted', 4, 1, 0.9, 0.3, True, True), ('slotted', 4, 1, 0.9, 0.5, False, False),
    ('slotted', 4, 1, 0.9, 0.5, True, False), ('slotted', 4, 1, 0.9, 0.5, True, True), ('slotted', 4, 1, 0.9, 0.7,
    False, False), ('slotted', 4, 1, 0.9, 0.7, True, False), ('slotted', 4, 1, 0.9, 0.7, True, True), ('slotted', 4,
    1, 0.9, 0.9, False, False), ('slotted', 4, 1, 0.9, 0.9, True, False), ('slotted', 4, 1, 0.9, 0.9, True, True),
    ('slotted', 8, 1, 0.9, 0.3, False, False), ('slotted', 8, 1, 0.9, 0.3, True, False), ('slotted', 8, 1, 0.9, 0.3,
    True, True), ('slotted', 8, 1, 0.9, 0.5, False, False), ('slotted', 8, 1, 0.9, 0.5, True, False), ('slotted', 8,
    1, 0.9, 0.5, True, True), ('slotted', 8, 1, 0.9, 0.7, False, False), ('slotted', 8, 1, 0.9, 0.7, True, False),
    ('slotted', 8, 1, 0.9, 0.7, True, True), ('slotted', 8, 1, 0.9, 0.9, False, False), ('slotted', 8, 1, 0.9, 0.9,
    True, False), ('slotted', 8, 1, 0.9, 0.9, True, True), ('slotted', 8, 2, 0.9, 0.3, False, False), ('slotted', 8,
    2, 0.9, 0.3, True, False), ('slotted', 8, 2, 0.9, 0.3, True, True), ('slotted', 8, 2, 0.9, 0.5, False, False),
    ('slotted', 8, 2, 0.9, 0.5, True, False), ('slotted', 8, 2, 0.9, 0.5, True, True), ('slotted', 8, 2, 0.9, 0.7,
    False, False), ('slotted', 8, 2, 0.9, 0.7, True, False), ('slotted', 8, 2, 0.9, 0.7, True, True), ('slotted', 8,
    2, 0.9, 0.9, False, False), ('slotted', 8, 2, 0.9, 0.9, True, False), ('slotted', 8, 2, 0.9, 0.9, True, True),
    ('spec-self', 2), ('spec-self', 4), ('spec-self', 8), ('spec-self', 16), ('spec-lora', 2), ('spec-lora', 4),
    ('spec-lora', 8), ('spec-lora', 16), ('spec-model', 2), ('spec-model', 4), ('spec-model', 8), ('spec-model',
    16), ('spec-self-fused', 4, 0), ('spec-self-fused', 4, 1), ('spec-self-fused', 4, 2), ('spec-self-fused', 8, 0), ('spec-self-fused', 8, 1), ('spec-self-fused', 8, 2), ('spec-self-fused', 16, 0), ('spec-self-fused', 16, 1), ('spec-self-fused', 16, 2), ('spec-lora-fused', 4, 0), ('spec-lora-fused', 4, 1), ('spec-lora-fused', 4, 2),
    ('spec-lora-fused', 8, 0), ('spec-lora-fused', 8, 1), ('spec-lora-fused', 8, 2), ('spec-lora-fused', 16, 0), ('spec-lora-fused', 16, 1), ('spec-lora-fused', 16, 2)
]
HEAD_32 = [
    ('ar',), ('mdm', 0, 0.5, 'random', 'mask'), ('mdm', 0, 0.5, 'logical', 'mask'), ('mdm', 0, 0.5, 'confidence',
    'mask'), ('mdm', 4, 0.5, 'random', 'mask'), ('mdm', 4, 0.5, 'random', 'ar'), ('mdm', 4, 0.5, 'logical', 'mask'),
    ('mdm', 4, 0.5, 'logical', 'ar'), ('mdm', 4, 0.5, 'confidence', 'mask'), ('mdm', 4, 0.5, 'confidence', 'ar'),
    ('mdm', 4, 1.0, 'random', 'mask'), ('mdm', 4, 1.0, 'logical', 'mask'), ('mdm', 4, 1.0, 'confidence', 'mask'),
    ('mdm', 8, 0.5, 'random', 'mask'), ('mdm', 8, 0.5, 'random', 'ar'), ('mdm', 8, 0.5, 'logical', 'mask'), ('mdm',
    8, 0.5, 'logical', 'ar'), ('mdm', 8, 0.5, 'confidence', 'mask'), ('mdm', 8, 0.5, 'confidence', 'ar'), ('mdm', 8,
    1.0, 'random', 'mask'), ('mdm', 8, 1.0, 'logical', 'mask'), ('mdm', 8, 1.0, 'confidence', 'mask'), ('slotted',
    4, 8, 0.9, 0.3, False, False), ('slotted', 4, 8, 0.9, 0.3, True, False), ('slotted', 4, 8, 0.9, 0.3, True,
    True), ('slotted', 4, 8, 0.9, 0.5, False, False), ('slotted', 4, 8, 0.9, 0.5, True, False), ('slotted', 4, 8,
    0.9, 0.5, True, True), ('slotted', 4, 8, 0.9, 0.7, False, False), ('slotted', 4, 8, 0.9, 0.7, True, False),
    ('slotted', 4, 8, 0.9, 0.7, True, True), ('slotted', 4, 8, 0.9, 0.9, False, False), ('slotted', 4, 8, 0.9, 0.9,
    True, False), ('slotted', 4, 8, 0.9, 0.9, True, True), ('slotted', 4, 1, 0.9, 0.3, False, False), ('slotted', 4,
    1, 0.9, 0.3, True, False), ('slotted', 4, 1, 0.9, 0.3, True, True), ('slotted', 4, 1, 0.9, 0.5, False, False),
    ('slotted', 4, 1, 0.9, 0.5, True, False), ('slotted', 4, 1, 0.9, 0.5, True, True), ('slotted', 4, 1, 0.9, 0.7,
    False, False), ('slotted', 4, 1, 0.9, 0.7, True, False), ('slotted', 4, 1, 0.9, 0.7, True, True), ('slotted', 4,
    1, 0.9, 0.9, False, False), ('slotted', 4, 1, 0.9, 0.9, True, False), ('slotted', 4, 1, 0.9, 0.9, True, True),
    ('slotted', 4, 2, 0.9, 0.3, False, False), ('slotted', 4, 2, 0.9, 0.3, True, False), ('slotted', 4, 2, 0.9, 0.3,
    True, True), ('slotted', 4, 2, 0.9, 0.5, False, False), ('slotted', 4, 2, 0.9, 0.5, True, False), ('slotted', 4,
    2, 0.9, 0.5, True, True), ('slotted', 4, 2, 0.9, 0.7, False, False), ('slotted', 4, 2, 0.9, 0.7, True, False),
    ('slotted', 4, 2, 0.9, 0.7, True, True), ('slotted', 4, 2, 0.9, 0.9, False, False), ('slotted', 4, 2, 0.9, 0.9,
    True, False), ('slotted', 4, 2, 0.9, 0.9, True, True), ('slotted', 8, 4, 0.9, 0.3, False, False), ('slotted', 8,
    4, 0.9, 0.3, True, False), ('slotted', 8, 4, 0.9, 0.3, True, True), ('slotted', 8, 4, 0.9, 0.5, False, False),
    ('slotted', 8, 4, 0.9, 0.5, True, False), ('slotted', 8, 4, 0.9, 0.5, True, True), ('slotted', 8, 4, 0.9, 0.7,
    False, False), ('slotted', 8, 4, 0.9, 0.7, True, False), ('slotted', 8, 4, 0.9, 0.7, True, True), ('slotted', 8,
    4, 0.9, 0.9, False, False), ('slotted', 8, 4, 0.9, 0.9, True, False), ('slotted', 8, 4, 0.9, 0.9, True, True),
    ('slotted', 8, 1, 0.9, 0.3, False, False), ('slotted', 8, 1, 0.9, 0.3, True, False), ('slotted', 8, 1, 0.9, 0.3,
    True, True), ('slotted', 8, 1, 0.9, 0.5, False, False), ('slotted', 8, 1, 0.9, 0.5, True, False), ('slotted', 8,
    1, 0.9, 0.5, True, True), ('slotted', 8, 1, 0.9, 0.7, False, False), ('slotted', 8, 1, 0.9, 0.7, True, False),
    ('slotted', 8, 1, 0.9, 0.7, True, True), ('slotted', 8, 1, 0.9, 0.9, False, False), ('slotted', 8, 1, 0.9, 0.9,
    True, False), ('slotted', 8, 1, 0.9, 0.9, True, True), ('slotted', 8, 2, 0.9, 0.3, False, False), ('slotted', 8,
    2, 0.9, 0.3, True, False), ('slotted', 8, 2, 0.9, 0.3, True, True), ('slotted', 8, 2, 0.9, 0.5, False, False),
    ('slotted', 8, 2, 0.9, 0.5, True, False), ('slotted', 8, 2, 0.9, 0.5, True, True), ('slotted', 8, 2, 0.9, 0.7,
    False, False), ('slotted', 8, 2, 0.9, 0.7, True, False), ('slotted', 8, 2, 0.9, 0.7, True, True), ('slotted', 8,
    2, 0.9, 0.9, False, False), ('slotted', 8, 2, 0.9, 0.9, True, False), ('slotted', 8, 2, 0.9, 0.9, True, True),
    ('spec-self', 2), ('spec-self', 4), ('spec-self', 8), ('spec-self', 16), ('spec-lora', 2), ('spec-lora', 4),
    ('spec-lora', 8), ('spec-lora', 16), ('spec-model', 2), ('spec-model', 4), ('spec-model', 8), ('spec-model',
    16), ('spec-self-fused', 4, 0), ('spec-self-fused', 4, 1), ('spec-self-fused', 4, 2), ('spec-self-fused', 8, 0), ('spec-self-fused', 8, 1), ('spec-self-fused', 8, 2), ('spec-self-fused', 16, 0), ('spec-self-fused', 16, 1), ('spec-self-fused', 16, 2), ('spec-lora-fused', 4, 0), ('spec-lora-fused', 4, 1), ('spec-lora-fused', 4, 2),
    ('spec-lora-fused', 8, 0), ('spec-lora-fused', 8, 1), ('spec-lora-fused', 8, 2), ('spec-lora-fused', 16, 0), ('spec-lora-fused', 16, 1), ('spec-lora-fused', 16, 2)
]
FIELDS = {"mdm": ("steps", "alpha0", "order", "sequential"),
          **{m: ("draft_length", "scenarios") for m in ("spec-self-fused", "spec-lora-fused")},
          "slotted": ("slot_size", "serial_num_blocks", "slot_threshold", "token_threshold", "ar_infill",
                      "ar_first_token")}


@pytest.mark.parametrize("budget, head", [(8, HEAD_8), (32, HEAD_32)])
def test_default_grid_is_todays_point_for_point(budget, head):
    """Same points, same knob values, same order: mode B's corrections as one joint key, NB 0 → G // S (a
    point that then decodes like another is dropped, S > G too), mode A's folds (T = 0 reads neither α0
    nor the sequential convention, α0 = 1 no convention: one point each, the first of the grid), F for
    the two-pass drafters and K × the scenario blocks (all, 1, 2) for the fused ones."""
    want = [(name, modes.mode(name, **dict(zip(FIELDS.get(name, ("draft_length",)), values))))
            for name, *values in head]
    got = [(name, modes.mode(name, **knobs)) for name, knobs in frontier.grid_points(FrontierConfig(), MODES, budget)]
    assert got == want
    assert [name for name, _ in frontier.grid_points(FrontierConfig(), ["spec-lora", "ar"], budget)] == \
        ["spec-lora"] * 4 + ["ar"]  # the modes asked for, in their order


def test_grid_points_generic():
    fc = FrontierConfig(grid={"slotted": {"slot_size": [4, 8, 64], "serial_num_blocks": [0, 1],
                                          "token_threshold": [0.5, 0.9],
                                          "ar_infill,ar_first_token": [[False, False], [True, True]]},
                              "mdm": {"steps": [0, 8], "alpha0": [0.25, 1.0]}, "spec-self": {"draft_length": [4, 8]}})
    pts = frontier.grid_points(fc, ["ar", "mdm", "slotted", "spec-self", "spec-lora"], 32)
    slotted = [k for m, k in pts if m == "slotted"]
    assert len(slotted) == 2 * 2 * 2 * 2            # S=64 > G is dropped
    assert list(slotted[0]) == ["slot_size", "serial_num_blocks", "token_threshold", "ar_infill", "ar_first_token"]
    assert {k["serial_num_blocks"] for k in slotted if k["slot_size"] == 8} == {4, 1}   # 0 → G // S
    assert {(k["ar_infill"], k["ar_first_token"]) for k in slotted} == {(False, False), (True, True)}
    assert [k for m, k in pts if m == "mdm"] == [
        {"steps": 0, "alpha0": 0.25}, {"steps": 8, "alpha0": 0.25}, {"steps": 8, "alpha0": 1.0}]
    assert [k for m, k in pts if m == "spec-self"] == [{"draft_length": 4}, {"draft_length": 8}]
    assert pts[0] == ("ar", {}) and pts[-1] == ("spec-lora", {})  # a mode without a grid: its defaults
    # any field of a mode is a grid key, without the frontier naming it
    fc = FrontierConfig(grid={"slotted": {"max_block_size": [8, 16]}})
    assert frontier.grid_points(fc, ["slotted"], 32) == [("slotted", {"max_block_size": 8}),
                                                          ("slotted", {"max_block_size": 16})]


def test_grid_overrides_and_bad_grids():
    """`frontier.grid.<mode>.<key>` (`--set`, sweep files) replaces one key's values and keeps the rest,
    typed from the mode's field; a bad grid names the key, the mode's fields or what is expected."""
    fc = ov.apply(FrontierConfig(), {"grid.slotted.token_threshold": "0.5,0.9", "grid.mdm.steps": [4],
                                     "grid.slotted.ar_infill,ar_first_token": [[True, True]]})
    default = FrontierConfig().grid
    assert fc.grid["slotted"] == {**default["slotted"], "token_threshold": (0.5, 0.9),
                                  "ar_infill,ar_first_token": ((True, True),)}
    assert fc.grid["mdm"]["steps"] == (4,) and fc.grid["mdm"]["order"] == default["mdm"]["order"]
    assert ov.get(fc, "grid.mdm.steps") == (4,) and ov.to_dict(fc)["grid"]["mdm"]["steps"] == [4]
    assert ov.build(FrontierConfig, ov.to_dict(fc)) == fc  # a report's config reads back
    assert "grid.spec-model.draft_length" in [k for k, _, _ in ov.keys(FrontierConfig)]
    for grid, match in [({"beam": {"width": [2]}}, "frontier.grid.beam: unknown mode"),
                        ({"slotted": {"slot_sise": [4]}}, r"mode 'slotted' has no field 'slot_sise' \(did you mean "
                                                          r"\['slot_size'"),
                        ({"slotted": {"slot_size": [0]}},
                         r"frontier.grid.slotted: the point {'slot_size': 0}: .*expected an integer ≥ 1"),
                        ({"slotted": {"slot_size": [4], "slot_size,max_block_size": [[8, 8]]}}, "in another key"),
                        ({"slotted": {"slot_size": ["four"]}}, "expected an integer"),
                        ({"slotted": {"slot_size": []}}, "expected at least one value"),
                        ({"slotted": {"ar_infill,ar_first_token": [[True]]}}, "expected lists of 2 values"),
                        ({"mdm": {"order": ["sorted"]}}, "expected one of")]:
        with pytest.raises(ConfigError, match=match):
            FrontierConfig(grid=grid)
    # points are checked whole: a slot above the default block fits the block the grid gives with it
    assert FrontierConfig(grid={"slotted": {"slot_size": [512], "max_block_size": [1024]}})
    with pytest.raises(ConfigError, match="frontier.grid.slotted.slot_sise"):
        ov.apply(FrontierConfig(), ["grid.slotted.slot_sise=4"])
    with pytest.raises(ValueError, match="tolerance"):
        FrontierConfig(tolerance=2.0)


def test_describe_is_the_modes_short_label():
    assert frontier.describe("slotted", {"slot_size": 8, "serial_num_blocks": 4, "slot_threshold": 0.9,
                                         "token_threshold": 0.5, "ar_infill": True, "ar_first_token": True}) \
        == "S=8 NB=4 τs=0.9 τt=0.5 AR infill + first token"
    assert frontier.describe("mdm", {"steps": 8, "alpha0": 0.5, "order": "confidence", "sequential": "ar"}) == \
        "T=8 α0=0.5 confidence order AR-row sequential"
    assert [frontier.describe(m, {"draft_length": 4}) for m in ("spec-model", "spec-lora-fused")] == ["F=4", "K=4"]


def row(mode, correct, tokens_per_forward):
    """A frontier point from its per-example results (1: answered correctly)."""
    return FrontierPoint(mode=mode, label=mode, knobs={}, point="", correct=[bool(c) for c in correct],
                         accuracy=sum(correct) / len(correct), tokens_per_forward=tokens_per_forward,
                         tokens_per_s=0.0, examples=len(correct))


def test_choose_and_pareto():
    ar = [1] * 8 + [0, 0]                                        # AR: 8 of 10
    rows = [row("ar", ar, 1.0),
            row("slotted", ar, 3.0),                             # AR's answers exactly
            row("slotted", [0] * 7 + [1, 1, 1], 6.0),            # gains both of AR's misses, loses 7 of its answers
            row("slotted", [0] + [1] * 7 + [1, 0], 5.0),         # AR's accuracy, one example lost, one gained
            row("slotted", [1] * 7 + [0, 0, 0], 4.0),            # one lost
            row("mdm", [1, 1, 1, 0, 0, 0, 0, 0, 0, 0], 2.0),
            row("mdm", [1, 1, 1, 1, 0, 0, 0, 0, 0, 0], 1.0)]
    assert [frontier.losses_to(rows[0], r) for r in rows] == [0, 0, 7, 1, 1, 5, 4]
    # The default: no example AR answers correctly may be lost; a tie in accuracy is not enough.
    strict = frontier.choose(rows, tolerance=0.0)
    assert strict["slotted"].tokens_per_forward == 3.0 and strict["slotted"].within_tolerance
    assert strict["mdm"].tokens_per_forward == 1.0 and not strict["mdm"].within_tolerance  # most accurate
    assert strict["ar"].accuracy == 0.8
    assert FrontierConfig().tolerance == 0.0
    loose = frontier.choose(rows, tolerance=0.1)                 # one example of ten may be lost
    assert loose["slotted"].tokens_per_forward == 5.0
    front = frontier.pareto(rows)
    assert [(r.mode, r.tokens_per_forward) for r in front] == [
        ("ar", 1.0), ("slotted", 6.0), ("slotted", 5.0), ("mdm", 2.0), ("mdm", 1.0)]


def test_frontier_config_is_hashable_and_written_as_before():
    """The grid is held frozen (a jit static argument like every config): equal configs hash equal, whatever
    the order their grid was given in; `--set` and the report's JSON spell it as the dictionary it was."""
    import json

    a = FrontierConfig(grid={"mdm": {"steps": [4], "alpha0": [0.5]}, "slotted": {"slot_size": [4]}})
    b = FrontierConfig(grid={"slotted": {"slot_size": (4,)}, "mdm": {"alpha0": (0.5,), "steps": (4,)}})
    assert a == b and hash(a) == hash(b) and hash(FrontierConfig()) == hash(FrontierConfig())
    changed = ov.apply(a, {"grid.mdm.steps": [4, 8]})
    assert changed.grid["mdm"] == {"steps": (4, 8), "alpha0": (0.5,)} and hash(changed) != hash(a)
    doc = json.loads(json.dumps(ov.to_dict(changed)))
    assert doc["grid"] == {"mdm": {"steps": [4, 8], "alpha0": [0.5]}, "slotted": {"slot_size": [4]}}
    assert FrontierConfig(**doc) == changed  # read back from the JSON


def test_a_mode_with_no_point_at_the_budget_is_refused_when_the_config_is_built():
    """A grid whose every point exceeds eval.max_new_tokens (a slot of 16 for 8 new tokens) would sweep
    the other modes and then have nothing to choose: refused up front, naming the grid."""
    from zarya_jax.experiment import default_config

    with pytest.raises(ConfigError, match=r"frontier.grid.slotted: no point of it decodes at eval.max_new_tokens=8"):
        ov.apply(default_config(), {"frontier.grid.slotted.slot_size": [16], "eval.max_new_tokens": 8,
                                    "eval.knobs.slotted.slot_size": 4})
    ok = ov.apply(default_config(), {"frontier.grid.slotted.slot_size": [4, 16], "eval.max_new_tokens": 8,
                                     "eval.knobs.slotted.slot_size": 4})
    assert {m for m, _ in frontier.grid_points(ok.frontier, ok.eval.modes, 8)} == set(ok.eval.modes)


def test_a_grid_override_replaces_the_keys_it_shares_a_field_with():
    """Setting one field of a default joint key replaces that key; {} leaves a mode (or every mode) one point."""
    from zarya_jax.experiment import default_config

    config = default_config()
    slotted = dict(ov.apply(config, {"frontier.grid.slotted.ar_infill": [True]}).frontier.grid["slotted"])
    assert "ar_infill,ar_first_token" not in slotted and slotted["ar_infill"] == (True,)
    assert slotted["slot_size"] == dict(config.frontier.grid["slotted"])["slot_size"]  # the others kept
    emptied = ov.apply(config, ["frontier.grid.mdm={}"]).frontier
    assert dict(emptied.grid)["mdm"] == {} and emptied.grid["slotted"] == config.frontier.grid["slotted"]
    assert [k for m, k in frontier.grid_points(emptied, ["mdm"], 32)] == [{}]  # one point: mode A's defaults
    assert dict(ov.apply(config, ["frontier.grid={}"]).frontier.grid) == {}
