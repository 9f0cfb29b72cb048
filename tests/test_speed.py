"""Knobs chosen for time (`zarya_jax.eval.speed`): the prediction from the pass-cost curve, the nearest
calibrated batch, the saved table; and the curve itself against a plain timing of the same passes."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

from zarya_jax.eval.results import FrontierPoint
from zarya_jax.eval.speed import (BatchChoice, Candidate, SpeedChoice, SpeedConfig, markdown, measured, pick, predict,
                                  to_time)
from zarya_jax.config import ConfigError
from zarya_jax.sampling import GenerationConfig, passes
from zarya_jax.sampling.modes import mode
from zarya_jax.timing import loop_slope_ms, once_s


def point(name, tpf, **knobs):
    return FrontierPoint(mode=name, label=name, knobs=knobs, point="", accuracy=1.0, tokens_per_forward=tpf,
                         tokens_per_s=1.0, examples=1, correct=[True])


def test_cycle_windows_of_each_mode():
    def windows(name, **knobs):
        return passes.cycle_windows(GenerationConfig(mode=mode(name, **knobs), max_new_tokens=32))

    assert windows("ar") == (1,)
    assert windows("spec-lora", draft_length=8) == (8, 9)                     # F noise rows, then F + 1 verified
    assert windows("spec-lora", draft_length=8, draft_passes=3) == (8, 8, 8, 9)
    assert windows("spec-self", draft_length=8) == (9, 9)                     # the seed and F masks
    assert windows("spec-self-fused", draft_length=4) == (30,)                # (K+1)(K+2)
    assert windows("spec-lora-fused", draft_length=4) == (25,)                # (K+1)²
    assert windows("slotted") is None and windows("mdm") is None and windows("spec-model") is None


def test_prediction_prices_each_cycle_by_its_passes():
    """A point's predicted speed-up is its tokens per forward over AR's, scaled by AR's pass cost over the
    mean cost of its cycle's passes; lossy points are not candidates; AR comes first."""
    costs = [{"batch": 4, "window": w, "ms_per_pass": ms} for w, ms in ((1, 1.0), (4, 2.0), (5, 2.5), (30, 9.0))]
    pts = [point("ar", 1.0), point("slotted", 5.0), point("spec-lora", 3.0, draft_length=4),
           point("spec-self-fused", 4.5, draft_length=4)]
    cands = predict(pts, costs, 4, 32)
    assert [c.mode for c in cands] == ["ar", "spec-lora", "spec-self-fused"]
    assert cands[1].predicted_speedup == pytest.approx(3.0 / ((2.0 + 2.5) / 2))  # two passes: 4 and 5 rows
    assert cands[2].predicted_speedup == pytest.approx(4.5 / 9.0)                # one pass of 30 rows
    with pytest.raises(KeyError):  # a window the curve did not measure is not guessed
        predict(pts, costs[:2], 4, 32)


def curve(*points):
    return [{"batch": b, "window": w, "ms_per_pass": ms} for b, w, ms in points]


def test_failed_points_are_at_the_floor_or_out_of_order():
    """A point fails at the timer's floor, or when a pass of more rows (wider, or a bigger batch) costs
    under 0.8× one of fewer; the point in the most inversions is blamed, a tie going to the cheaper, larger
    one; an inversion within noise is allowed, and a point marked failed stays failed."""
    rows = curve((1, 1, 1.0), (1, 4, 1.2), (1, 5, 1e-6), (1, 8, 1.0), (1, 9, -0.002), (1, 16, 0.5),
                 (2, 1, 5.0), (2, 4, 1.0), (2, 8, 1.1), (2, 16, 1.3),
                 (8, 1, 0.5), (8, 4, 2.0), (8, 8, 2.2), (8, 16, 3.0))
    rows.append({"batch": 4, "window": 1, "ms_per_pass": None, "failed": "batch 4, window 1: measured before"})
    failed = passes.failed_points(rows)
    assert set(failed) == {(1, 5), (1, 9), (1, 16), (2, 1), (8, 1), (4, 1)}
    assert "batch 1, window 9" in failed[1, 9] and "-0.002 ms" in failed[1, 9] and "floor" in failed[1, 9]
    assert "batch 1, window 5" in failed[1, 5] and "1e-06 ms" in failed[1, 5]
    assert "batch 1, window 16: 0.5 ms" in failed[1, 16] and "out of order" in failed[1, 16]  # under 1.0 and 1.2
    assert "batch 2, window 1: 5 ms" in failed[2, 1]          # a spike: dearer than every wider window at batch 2
    assert "batch 8, window 1: 0.5 ms" in failed[8, 1]        # under batch 1's window 1
    assert failed[4, 1] == "batch 4, window 1: measured before"
    # (1, 8) and (2, 1) under (1, 1), but within 0.8×: allowed
    assert passes.failed_points(curve((1, 1, 1.0), (1, 8, 0.85), (2, 1, 0.85))) == {}
    # one inversion: the wider or bigger, cheaper point is blamed
    assert list(passes.failed_points(curve((1, 1, 1.0), (1, 8, 0.5)))) == [(1, 8)]
    assert list(passes.failed_points(curve((1, 4, 1.0), (2, 4, 0.7)))) == [(2, 4)]
    # a smoke run's 0.26 µs one-row pass (beside 0.17 ms for four rows) is at the floor; a narrower pass
    # cheaper per row than a wider one is how a CPU runs (about linear in the rows, or worse), not a failure
    assert list(passes.failed_points(curve((2, 1, 0.00026), (2, 4, 0.165)))) == [(2, 1)]
    assert passes.failed_points(curve((1, 4, 0.19), (1, 25, 1.49), (8, 25, 15.4))) == {}


def test_prediction_never_uses_a_failed_point():
    """A candidate whose cycle needs a failed point at the batch is not priced (nor timed); the others are
    priced as before; where AR's window 1 failed only AR (1×) is left; the report names the failed points."""
    good = [{"batch": 4, "window": w, "ms_per_pass": ms} for w, ms in ((1, 1.0), (4, 2.0), (5, 2.5), (30, 9.0))]
    fail = lambda r: dict(r, ms_per_pass=None, failed=f"batch 4, window {r['window']}: failed")  # noqa: E731
    pts = [point("ar", 1.0), point("spec-lora", 3.0, draft_length=4), point("spec-self-fused", 4.5, draft_length=4)]
    elsewhere = [{"batch": 8, "window": 30, "ms_per_pass": None, "failed": "batch 8, window 30: failed"}]
    cands = predict(pts, good[:3] + [fail(good[3])] + elsewhere, 4, 32)
    assert [(c.mode, c.predicted_speedup) for c in cands] == [("ar", 1.0), ("spec-lora", pytest.approx(3.0 / 2.25))]
    assert to_time(cands, 3) == cands
    floor = dict(good[2], ms_per_pass=1e-6)   # an old clamped slope: at the floor, so failed too
    assert [c.mode for c in predict(pts, good[:2] + [floor, good[3]], 4, 32)] == ["ar", "spec-self-fused"]
    only_ar = predict(pts, [fail(good[0])] + good[1:], 4, 32)
    assert [(c.mode, c.predicted_speedup) for c in only_ar] == [("ar", 1.0)]
    timed = measured(to_time(only_ar, 3), [[100.0, 90.0]])
    assert pick(timed, 0.05) == timed[0]
    table = dataclasses.replace(choice(), costs=[fail(good[0])] + good[1:])
    assert "batch 4, window 1: failed" in markdown(table) and "batch 4, window 4" not in markdown(table)
    assert SpeedChoice.from_json(json.loads(json.dumps(table.to_json()))) == table


def test_every_mode_has_its_fastest_predicted_point_timed():
    """AR and the `confirm` predicted fastest are timed, and so is each other mode's best predicted point, once."""
    cand = lambda m, s, f: Candidate(m, {"draft_length": f}, f"F={f}", 2.0, s)  # noqa: E731
    cands = [Candidate("ar", {}, "", 1.0, 1.0), cand("spec-self-fused", 1.3, 4), cand("spec-self-fused", 1.2, 8),
             cand("spec-lora", 1.1, 8), cand("spec-self", 1.05, 8), cand("spec-self", 1.0, 16), cand("spec-lora", 0.9, 4)]
    assert [(c.mode, c.point) for c in to_time(cands, 2)] == [
        ("ar", ""), ("spec-self-fused", "F=4"), ("spec-self-fused", "F=8"), ("spec-lora", "F=8"), ("spec-self", "F=8")]
    assert to_time(cands, 6) == cands and to_time(cands[:1], 3) == cands[:1]


def test_a_candidate_replaces_ar_only_by_beating_it_in_every_round():
    """Per round a candidate's speed-up is its tokens/s over AR's in that round; it replaces AR only if it is
    at least 1 + margin in each round, and among those the greatest median wins. One lucky round (the
    best-of-rounds ratio says 1.5×) does not make a choice."""
    cand = lambda m, f: Candidate(m, {"draft_length": f}, f"F={f}", 2.0, 1.0)  # noqa: E731
    timed = [Candidate("ar", {}, "", 1.0, 1.0), cand("spec-self", 4), cand("spec-lora", 4), cand("spec-self", 8)]
    tps = [[100.0, 90.0, 100.0],     # AR, its speed varying between rounds
           [150.0, 85.0, 104.0],     # 1.5×, 0.94×, 1.04×: best over best 1.5×, but it lost a round
           [112.0, 99.0, 111.0],     # 1.12×, 1.1×, 1.11×
           [108.0, 108.0, 140.0]]    # 1.08×, 1.2×, 1.4×: the greatest median, the worst round 1.08×
    out = measured(timed, tps)
    assert out[1].tokens_per_s == 150.0 and out[1].ar_tokens_per_s == 100.0
    assert out[1].round_speedups == pytest.approx([1.5, 85 / 90, 1.04])
    assert out[1].speedup == pytest.approx(1.04)                      # the median round
    assert out[0].round_speedups == [1.0, 1.0, 1.0] and out[0].speedup == 1.0
    assert [c.beats_ar(0.05) for c in out] == [False, False, True, True]
    assert pick(out, 0.05) == out[3] and pick(out, 0.0) == out[3]    # median 1.2 over 1.11
    assert pick(out, 0.09) == out[2]                                  # spec-self F=8's worst round is 1.08×
    assert pick(out, 0.2) == out[0]                                   # nobody wins by 20% every round: AR
    assert not Candidate("ar", {}, "", 1.0, 1.0).beats_ar(0.0)      # untimed: never chosen over AR


def choice():
    cand = lambda m, s, **k: Candidate(m, k, "", 1.0, s, 100.0 * s, 100.0)
    ar = cand("ar", 1.0)
    return SpeedChoice(device="cpu", costs=[{"batch": 1, "window": 1, "ms_per_pass": 0.1}], max_new_tokens=32,
                       choices=[BatchChoice(1, cand("spec-lora", 1.5, draft_length=8), [ar, cand("spec-lora", 1.5, draft_length=8)],
                                            test_tokens_per_s=120.0, test_ar_tokens_per_s=100.0),
                                BatchChoice(8, ar, [ar]), BatchChoice(64, ar, [ar])])


def test_mode_for_takes_the_nearest_calibrated_batch(tmp_path):
    table = choice()
    assert table.mode_for(1)[0] == mode("spec-lora", draft_length=8)
    # nearest in ratio: 2 is 2× from 1 and 4× from 8; 3 is 3× from 1 and 2.7× from 8
    assert table.mode_for(2)[1].batch == 1 and table.mode_for(3)[1].batch == 8
    assert table.mode_for(20)[1].batch == 8 and table.mode_for(1000)[1].batch == 64
    assert table.config_for(1, temperature=0.5) == GenerationConfig(mode=mode("spec-lora", draft_length=8),
                                                                   max_new_tokens=32, temperature=0.5)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="batch="):
            table.mode_for(bad)
    path = str(tmp_path / "speed.json")
    table.save(path)
    assert SpeedChoice.load(path) == table
    assert json.load(open(path))["choices"][0]["test_speedup"] == pytest.approx(1.2)
    (tmp_path / "bad.json").write_text('{"device": "cpu"}')
    for bad in ("bad.json", "missing.json"):
        with pytest.raises(ValueError, match=bad):
            SpeedChoice.load(str(tmp_path / bad))


def test_config_is_checked():
    for bad, what in (({"batches": ()}, "speed.batches"), ({"batches": (0,)}, "speed.batches"),
                      ({"confirm": 0}, "speed.confirm"), ({"repeats": 1.5}, "speed.repeats"),
                      ({"margin": -0.1}, "speed.margin"), ({"margin": 1.0}, "speed.margin"),
                      ({"margin": "5%"}, "speed.margin"), ({"margin": True}, "speed.margin")):
        with pytest.raises(ConfigError, match=what):
            SpeedConfig(**bad)


def test_pass_cost_curve_matches_a_plain_timing(tiny_config, tiny_params):
    """The curve's ms per pass (slope of a compiled loop of passes) against timing the same cached pass
    as a Python loop of jitted calls: the same order of magnitude, and more rows never cost less by much."""
    params, config = tiny_params, tiny_config
    rows = passes.pass_costs(params, config, (2,), (1, 64), context=16, repeats=3)
    assert [(r["batch"], r["window"]) for r in rows] == [(2, 1), (2, 64)]
    from zarya_jax.nn import kv_cache
    cache = dict(kv_cache.init(config, 2, 16 + 64), length=jnp.full((2,), 16, jnp.int32))
    tokens = jnp.zeros((2, 64), jnp.int32)
    pos = 16 + jnp.broadcast_to(jnp.arange(64, dtype=jnp.int32), (2, 64))
    step = jax.jit(lambda c: passes.cached_pass(params, c, tokens, pos, config=config)[0])
    jax.block_until_ready(step(cache))
    best = min(once_s(lambda: step(cache)) for _ in range(5))
    assert 0.05 < rows[1]["ms_per_pass"] / (1e3 * best) < 20
    assert rows[1]["ms_per_pass"] > 0.5 * rows[0]["ms_per_pass"]


def test_loop_slope_raises_the_count_until_the_difference_is_long_enough():
    """`timing.loop_slope_ms` times 1 against 1 + n iterations, n raised ×8 from its start until the n
    iterations take `min_s`: with 1 ms iterations and 40 ms, 8 → 64; then the slope is the iteration's (ms
    iterations, so that a loaded machine's scheduling jitter stays small beside them)."""
    import time
    budgets = []

    def run(n):  # a stand-in for a compiled loop: 1 ms per iteration, its count the argument
        budgets.append(n)
        time.sleep(1e-3 * n)
        return jnp.zeros(())

    ms = loop_slope_ms(run, repeats=2, calls=8, min_s=0.04)
    assert max(budgets) == 65 and 9 in budgets and 513 not in budgets
    assert 0.5 < ms < 3.0
    budgets.clear()
    loop_slope_ms(run, repeats=1, calls=8, min_s=0.04, max_calls=8)  # the cap: no calibration beyond it
    assert max(budgets) == 9
