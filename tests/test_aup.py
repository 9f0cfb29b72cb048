"""AUP (`zarya_jax.eval.aup`) against the d3LLM formula worked out by hand."""
import math

import pytest

from zarya_jax.eval import aup
from zarya_jax.eval.results import FrontierPoint


def test_hand_worked_curve():
    # (1, 80) and (2, 78) count; (4, 70) is more than 5 points below the least parallel point's 80.
    w78 = math.exp(-3 * (1 - 78 / 80))
    expected = 1 * 80 + (2 - 1) * (78 * w78 + 80 * 1.0) / 2
    assert aup.aup([(4.0, 70.0), (1.0, 80.0), (2.0, 78.0)], y_max=80.0) == pytest.approx(expected, rel=1e-12)


def test_weight_is_against_the_best_of_all_modes():
    # one point: ρ·y, unweighted; two points below a better mode's 90 are weighted down
    assert aup.aup([(3.0, 50.0)], y_max=90.0) == pytest.approx(150.0)
    w = lambda y: math.exp(-3 * (1 - y / 90))  # noqa: E731
    assert aup.aup([(1.0, 60.0), (3.0, 58.0)], y_max=90.0) == pytest.approx(60 + 2 * (58 * w(58) + 60 * w(60)) / 2)


def test_only_the_upper_envelope_counts():
    base = aup.aup([(1.0, 80.0), (2.0, 79.0)], y_max=80.0)
    # a point beaten on both axes, and a less accurate one at the same ρ, change nothing
    assert aup.aup([(1.0, 80.0), (2.0, 79.0), (1.5, 70.0), (2.0, 76.0)], y_max=80.0) == pytest.approx(base)


def test_bad_points_are_refused():
    with pytest.raises(ValueError, match="no points"):
        aup.aup([], y_max=1.0)
    with pytest.raises(ValueError, match="positive"):
        aup.aup([(0.0, 50.0)], y_max=50.0)


def _point(mode, tpf, acc):
    return FrontierPoint(mode=mode, label=mode, knobs={}, point="", accuracy=acc, tokens_per_forward=tpf,
                         tokens_per_s=1.0, examples=10, correct=[])


def test_by_mode_on_frontier_points():
    pts = [_point("ar", 1.0, 0.9), _point("slotted", 1.0, 0.9), _point("slotted", 3.0, 0.88),
           _point("mdm", 2.0, 0.6)]
    got = aup.by_mode(pts)
    assert got["ar"] == pytest.approx(90.0)  # AR: its accuracy
    w88 = math.exp(-3 * (1 - 88 / 90))
    assert got["slotted"] == pytest.approx(90 + 2 * (88 * w88 + 90) / 2)
    assert got["mdm"] == pytest.approx(120.0)
    assert aup.by_mode([]) == {}
    assert aup.by_mode([_point("mdm", 0.0, 0.0)]) == {"mdm": 0.0}  # nothing decoded: no area, no error
