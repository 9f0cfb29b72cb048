"""The frontier's grid and its choice rule (pure bookkeeping, checked by hand-made rows)."""
import pytest

from zarya_jax.eval import frontier
from zarya_jax.eval.frontier import FrontierConfig


def test_grid_points():
    fc = FrontierConfig(slotted_slot_size=(4, 8, 64), slotted_serial_num_blocks=(0, 1), slotted_slot_threshold=(0.9,),
                        slotted_token_threshold=(0.5, 0.9), slotted_corrections=("refusion", "both"),
                        mdm_steps=(0, 8), mdm_alpha0=(0.25, 1.0), mdm_orders=("random",), mdm_sequential=("mask",),
                        draft_lengths=(4, 8))
    pts = frontier.grid_points(fc, ["ar", "mdm", "slotted", "spec-self"], 32)
    slotted = [k for m, k in pts if m == "slotted"]
    assert len(slotted) == 2 * 2 * 2 * 2            # S=64 > G is skipped
    assert {k["serial_num_blocks"] for k in slotted if k["slot_size"] == 8} == {4, 1}   # 0 → G // S
    assert {(k["ar_infill"], k["ar_first_token"]) for k in slotted} == {(False, False), (True, True)}
    assert [k for m, k in pts if m == "mdm"] == [{"steps": 0, "alpha0": 0.25}, {"steps": 8, "alpha0": 0.25},
                                                 {"steps": 8, "alpha0": 1.0}]
    assert [k for m, k in pts if m == "spec-self"] == [{"draft_length": 4}, {"draft_length": 8}]
    assert pts[0] == ("ar", {})
    with pytest.raises(ValueError, match="slotted_corrections"):
        FrontierConfig(slotted_corrections=("magic",))


def test_mdm_grid_new_knobs():
    """Order × convention, without points a knob cannot change (T = 0: no α0, no sequential phase;
    α0 = 1: no sequential phase); the default grid has points with α0·M > T and every knob."""
    fc = FrontierConfig(mdm_steps=(0, 8), mdm_alpha0=(0.5, 1.0), mdm_orders=("random", "confidence"),
                        mdm_sequential=("mask", "ar"))
    pts = frontier.mdm_points(fc)
    assert pts == [{"steps": 0, "alpha0": 0.5}, {"steps": 0, "alpha0": 0.5, "mdm_order": "confidence"},
                   {"steps": 8, "alpha0": 0.5}, {"steps": 8, "alpha0": 0.5, "mdm_sequential": "ar"},
                   {"steps": 8, "alpha0": 0.5, "mdm_order": "confidence"},
                   {"steps": 8, "alpha0": 0.5, "mdm_order": "confidence", "mdm_sequential": "ar"},
                   {"steps": 8, "alpha0": 1.0}, {"steps": 8, "alpha0": 1.0, "mdm_order": "confidence"}]
    assert frontier.describe("mdm", pts[5]) == "T=8 α0=0.5 confidence order AR-row sequential"
    default = frontier.mdm_points(FrontierConfig())
    assert any(k["steps"] and k["alpha0"] * 32 > k["steps"] for k in default)
    assert {k.get("mdm_order") for k in default} >= {None, "logical", "confidence"}
    assert any(0 < k["steps"] <= 32 // 8 and k.get("mdm_order") == "logical" for k in default)  # slot-sized chunks
    assert {k.get("mdm_sequential") for k in default} >= {None, "ar"}
    with pytest.raises(ValueError, match="sorted"):
        FrontierConfig(mdm_orders=("sorted",))


def row(mode, correct, tokens_per_forward):
    """A frontier row from its per-example results (1: answered correctly)."""
    return {"mode": mode, "correct": [bool(c) for c in correct], "accuracy": sum(correct) / len(correct),
            "tokens_per_forward": tokens_per_forward}


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
    assert strict["slotted"]["tokens_per_forward"] == 3.0 and strict["slotted"]["within_tolerance"]
    assert strict["mdm"]["tokens_per_forward"] == 1.0 and not strict["mdm"]["within_tolerance"]  # most accurate
    assert strict["ar"]["accuracy"] == 0.8
    assert FrontierConfig().tolerance == 0.0
    loose = frontier.choose(rows, tolerance=0.1)                 # one example of ten may be lost
    assert loose["slotted"]["tokens_per_forward"] == 5.0
    front = frontier.pareto(rows)
    assert [(r["mode"], r["tokens_per_forward"]) for r in front] == [
        ("ar", 1.0), ("slotted", 6.0), ("slotted", 5.0), ("mdm", 2.0), ("mdm", 1.0)]
    assert frontier.describe("slotted", {"slot_size": 8, "serial_num_blocks": 4, "slot_threshold": 0.9,
                                         "token_threshold": 0.5, "ar_infill": True, "ar_first_token": True}) \
        == "S=8 NB=4 τs=0.9 τt=0.5 AR infill + first token"
