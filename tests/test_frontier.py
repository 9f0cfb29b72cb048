"""The frontier's grid and its choice rule (pure bookkeeping, checked by hand-made rows)."""
import pytest

from zarya_jax.eval import frontier
from zarya_jax.eval.frontier import FrontierConfig


def test_grid_points():
    fc = FrontierConfig(slotted_slot_size=(4, 8, 64), slotted_serial_num_blocks=(0, 1), slotted_slot_threshold=(0.9,),
                        slotted_token_threshold=(0.5, 0.9), slotted_corrections=("refusion", "both"),
                        mdm_steps=(0, 8), mdm_alpha0=(0.25, 1.0), draft_lengths=(4, 8))
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


def test_choose_and_pareto():
    rows = [{"mode": "ar", "accuracy": 0.90, "tokens_per_forward": 1.0},
            {"mode": "slotted", "accuracy": 0.89, "tokens_per_forward": 3.0},
            {"mode": "slotted", "accuracy": 0.70, "tokens_per_forward": 6.0},
            {"mode": "slotted", "accuracy": 0.88, "tokens_per_forward": 5.0},
            {"mode": "slotted", "accuracy": 0.88, "tokens_per_forward": 5.0},
            {"mode": "mdm", "accuracy": 0.30, "tokens_per_forward": 2.0},
            {"mode": "mdm", "accuracy": 0.40, "tokens_per_forward": 1.0}]
    chosen = frontier.choose(rows, tolerance=0.02)
    assert chosen["slotted"]["tokens_per_forward"] == 5.0 and chosen["slotted"]["within_tolerance"]
    assert chosen["mdm"]["accuracy"] == 0.40 and not chosen["mdm"]["within_tolerance"]  # none close: most accurate
    assert chosen["ar"]["accuracy"] == 0.90
    strict = frontier.choose(rows, tolerance=0.0)   # the default: at least AR's accuracy, else the most accurate
    assert strict["slotted"]["tokens_per_forward"] == 3.0 and not strict["slotted"]["within_tolerance"]
    assert FrontierConfig().tolerance == 0.0
    front = frontier.pareto(rows)
    assert [(r["mode"], r["tokens_per_forward"]) for r in front] == [
        ("ar", 1.0), ("slotted", 3.0), ("slotted", 6.0), ("slotted", 5.0), ("mdm", 2.0), ("mdm", 1.0)]
    assert frontier.describe("slotted", {"slot_size": 8, "serial_num_blocks": 4, "slot_threshold": 0.9,
                                         "token_threshold": 0.5, "ar_infill": True, "ar_first_token": True}) \
        == "S=8 NB=4 τs=0.9 τt=0.5 AR infill + first token"
