"""The roofline by the target's compiler (`bench.roofline`, `bench.aot`'s roofline rows) and the speed-up predicted
for a target (`bench.predict`, `experiments.speed --target`): counts extrapolated from two- and three-layer
programs against the compiler's own counts of the whole unrolled model; the expected tokens of a cycle against
an exact enumeration; the pricing shared with this device's measured curve; bad input refused before compute."""
import itertools
import json
import math

import jax
import pytest

from zarya_jax import target
from zarya_jax.bench import aot, predict
from zarya_jax.bench import roofline as rl
from zarya_jax.eval import speed as speed_lib
from zarya_jax.testing import TINY
from zarya_jax.train import sharding as shd

# Wide enough that a layer's matmuls, not fixed costs, set the counts.
CONFIG = TINY.replace(num_layers=4, hidden_size=128, intermediate_size=256, dtype="bfloat16", param_dtype="bfloat16")


@pytest.fixture(scope="module")
def mesh():
    return shd.make_mesh(shd.MeshConfig(data=1, fsdp=-1, tensor=1), target.devices("tpu:v5e:2x2"))


def test_counts_extrapolated_from_two_and_four_layers_match_the_whole_model(mesh):
    """The compiler counts a loop's body once, so a pass is costed unrolled at two and four layers and
    extrapolated; the reference is the compiler's count of the whole six-layer model, every layer unrolled."""
    deep = CONFIG.replace(num_layers=6)
    whole = rl.counts(aot.pass_lowered(rl.unrolled(deep, 6), mesh, 4, 4, 256).compile())
    costed = aot.pass_counts(deep, mesh, 4, 4, 256)
    assert costed.flops == pytest.approx(whole.flops, rel=0.01)
    assert costed.bytes == pytest.approx(whole.bytes, rel=0.1)  # the cost model's bytes are an estimate
    assert costed.loops == 0
    # the scanned model, as it runs, holds a loop whose body the compiler counts once: a fraction of the layers
    scanned = aot.pass_lowered(CONFIG, mesh, 4, 4, 256)
    once = rl.counts(scanned.compile(), scanned.as_text())
    assert once.loops >= 1 and once.flops < 0.5 * whole.flops


def test_a_pass_reads_more_as_its_live_rows_grow(mesh):
    small, big = (aot.pass_counts(CONFIG, mesh, 4, 1, rows) for rows in (256, 1024))
    assert big.bytes > small.bytes and big.flops > small.flops


def test_chip_roofline_is_the_slower_of_memory_and_compute():
    chip = rl.Chip.of(target.devices("tpu:v5e:2x2")[0])
    assert (chip.bandwidth, chip.peak) == (819e9, 197e12)
    memory, compute = rl.Counts(flops=1e9, bytes=819e9), rl.Counts(flops=394e12, bytes=1e9)
    assert chip.seconds(memory) == pytest.approx(1.0) and chip.bound(memory) == "memory"
    assert chip.seconds(compute) == pytest.approx(2.0) and chip.bound(compute) == "compute"
    # bytes counted below what a program must read are raised to it
    assert chip.seconds(rl.Counts(flops=0.0, bytes=-5.0), least_bytes=819e9) == pytest.approx(1.0)
    assert rl.Chip.of(jax.devices("cpu")[0]) is None
    assert rl.live_rows(1000, 256) == 1024 and rl.live_rows(1000, 0) == 1000


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8])
@pytest.mark.parametrize("drafts", [1, 4])
def test_expected_tokens_per_cycle_match_an_exact_enumeration(alpha, drafts):
    """Every accept/reject sequence of F drafts: the cycle keeps the drafts up to the first rejection and one
    more token (the correction, or the bonus after F acceptances)."""
    total = 0.0
    for outcome in itertools.product([True, False], repeat=drafts):
        p = math.prod(alpha if a else 1 - alpha for a in outcome)
        kept = next((i for i, a in enumerate(outcome) if not a), drafts)
        total += p * (kept + 1)
    assert predict.expected_tokens(alpha, drafts) == pytest.approx(total)


def test_alpha_points_price_like_the_measured_curve():
    """The same pricing (`eval.speed.predict`) for α points and a hand curve c(b, W) = 1 + W/10 ms: a two-pass
    self-speculative cycle of F = 4 (two passes of 5 rows) at α = 0.5 yields 1.9375 tokens for 3 ms, AR
    one token for 1.1 ms."""
    points = predict.alpha_points(0.5, draft_lengths=(4,))
    windows = sorted({w for _, ws in speed_lib.costed(points, 64) for w in ws})
    curve = [{"batch": 1, "window": w, "ms_per_pass": 1 + w / 10} for w in windows]
    cands = {c.mode: c for c in speed_lib.predict(points, curve, 1, 64)}
    assert cands["ar"].predicted_speedup == 1.0
    assert cands["spec-self"].predicted_speedup == pytest.approx(1.9375 * 1.1 / 3.0)
    assert set(cands) >= {"ar", "spec-self", "spec-lora", "spec-self-fused", "spec-lora-fused"}


def test_speed_predicted_for_a_target_writes_a_labelled_choice(tmp_path, capsys):
    from experiments.speed import main

    out = tmp_path / "predicted.json"
    assert main(["--alpha", "0.7", "--target", "tpu:v5e:2x2", "--preset", "tiny", "--batches", "4", "--prompt",
                 "32", "--new", "64", "--draft-lengths", "2", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["label"] == "predicted by the target compiler's cost model, not measured" and "not measured" in printed
    assert [b["batch"] for b in result["batches"]] == [4]
    for b in result["batches"]:
        ar = next(c for c in b["candidates"] if c["mode"] == "ar")
        best = max(b["candidates"], key=lambda c: c["predicted_vs_ar"])
        assert ar["predicted_vs_ar"] == 1.0 and b["chosen"] == f"{best['mode']} {best['knobs']}".strip()
    per_pass = {(r["batch"], r["window"]): r["ms_per_pass"] for r in result["curve"]}
    assert sorted(w for _, w in per_pass) == [1, 2, 3, 9, 12]  # AR; F = 2 two-pass; fused (K+1)² and (K+1)(K+2)
    assert all(ms > 0 for ms in per_pass.values()) and per_pass[4, 12] > per_pass[4, 1]


@pytest.mark.parametrize("argv, message", [
    (["--alpha", "1.0"], "--alpha=1.0: expected an acceptance rate in [0, 1)"),
    (["--alpha", "-0.1"], "--alpha=-0.1"),
    (["--alpha", "0.5", "--target", "tpu:v9:2x2"], "target 'tpu:v9:2x2'"),
    (["--alpha", "0.5", "--preset", "qwen9"], "qwen9"),
    (["--alpha", "0.5", "--batches", "1,x"], "--batches '1,x'"),
    (["--alpha", "0.5", "--new", "0"], "--new=0"),
    (["--alpha", "0.5", "--target", "cpu"], "predict for a TPU or GPU target"),
    ([], "a workdir (its measured acceptance) or --alpha"),
])
def test_bad_prediction_input_is_one_error_line(tmp_path, capsys, argv, message):
    from experiments.speed import main

    out = tmp_path / "p.json"
    full = ["--target", "tpu:v5e:2x2", "--preset", "tiny", "--out", str(out), "--no-progress"] + argv
    assert main(full) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


def test_a_workdir_without_a_report_is_refused(tmp_path, capsys):
    from experiments.speed import main

    assert main([str(tmp_path), "--target", "tpu:v5e:2x2", "--preset", "tiny", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.json" in err[0]
    assert not (tmp_path / "eval").exists()


def test_aot_roofline_rows(tmp_path):
    """A train step's row: counts at the model's depth, a hand bound (6N + attention FLOPs ÷ peak) and the MFU
    bound; a decoder's: its cycle, the sum of the passes listed beside it."""
    s = aot.AotSettings(targets=("tpu:v5e:2x2",), presets=("tiny",), programs=("eval", "spec-lora"), seq=64,
                        batch=4, decode_batch=4, prompt=16, new=16)
    compiled = aot.compile_rows(s, log=lambda line: None)
    rows = {r.program: r.roofline for r in compiled}
    ev, spec = rows["eval"], rows["spec-lora"]
    assert ev["counted"] == "step" and ev["gflops"] > 0 and ev["roofline_ms"] > 0 and 0 < ev["mfu_bound"]
    assert spec["counted"] == "cycle of passes 8+9" and [p["window"] for p in spec["passes"]] == [8, 9]
    assert spec["gbytes"] == pytest.approx(sum(p["gbytes"] for p in spec["passes"]))
    md = aot.markdown(compiled)
    assert "Roofline per chip" in md and "| tpu:v5e:2x2 | tiny | spec-lora | 8 | 256 |" in md  # its passes


def test_device_check_smoke_prints_measured_beside_predicted(tmp_path):
    """`bench check --smoke`: the device check's code on this CPU with the tiny preset, predicted for a TPU
    topology (a CPU has no bandwidth and peak in the tables): every curve point measured or failed and
    predicted, and each cycle's cost in AR steps predicted beside the measured one."""
    from experiments.bench.__main__ import main as bench_main

    assert bench_main(["--out", str(tmp_path), "check", "--smoke"]) == 0
    result = json.loads((tmp_path / "check.json").read_text())
    (preset,) = result["presets"]
    assert result["predicted_for"] == "TPU v5 lite" and result["label"] == predict.LABEL
    assert [(r["batch"], r["window"]) for r in preset["curve"]] == [(2, 1), (2, 2)]
    assert all(r["predicted_ms"] > 0 for r in preset["curve"])
    cycles = {r["mode"]: r["predicted_cycle_in_ar_steps"] for r in preset["decode"]}
    assert cycles["ar"] == 1.0 and cycles["spec-self"] > 1.0 and cycles["spec-self-fused"] > 1.0
    assert "measured beside predicted" in (tmp_path / "check.md").read_text()


def test_speed_against_answer_length_predicted_beside_measured(tmp_path, capsys):
    """`--length-table`: per answer budget of a `bench length` result, each mode priced with the tokens per
    forward measured at that budget, beside the speed-up it measured; a table of another shape is refused."""
    from experiments.speed import main

    rows = [{"max_new_tokens": 32, "mode": "ar", "tokens_per_forward": 1.0, "speedup": 1.0, "mean_tokens": 30.0},
            {"max_new_tokens": 32, "mode": "spec-self", "knobs": {"draft_length": 2}, "tokens_per_forward": 1.5,
             "speedup": 0.9, "mean_tokens": 30.0}]
    table = tmp_path / "length.json"
    table.write_text(json.dumps({"device": "cpu", "rows": rows}))
    out = tmp_path / "by-length.json"
    base = ["--target", "tpu:v5e:2x2", "--preset", "tiny", "--batches", "1", "--prompt", "16", "--no-progress"]
    assert main(base + ["--length-table", str(table), "--out", str(out)]) == 0
    got = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert got["ar"]["predicted_vs_ar"] == 1.0 and got["spec-self"]["measured_vs_ar"] == 0.9
    assert got["spec-self"]["tokens_per_forward"] == 1.5 and got["spec-self"]["predicted_vs_ar"] > 0
    capsys.readouterr()
    table.write_text(json.dumps({"rows": rows[1:]}))
    assert main(base + ["--length-table", str(table), "--out", str(tmp_path / "x.json")]) == 2
    assert "every answer budget needs its AR row" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_a_pass_the_chips_cannot_hold_is_refused_in_its_row(mesh):
    """The compiler's refusal (out of HBM) is that point's result, named; no candidate needing it is priced."""
    chip = rl.Chip.of(mesh.devices.flat[0])
    (row,) = predict.compiler_curve(CONFIG, mesh, chip, [2048], [1], 400_128)
    assert row["ms_per_pass"] is None and "batch 2048, window 1: the compiler refused it" in row["failed"]
    assert "RESOURCE_EXHAUSTED" in row["failed"]
    assert [c.mode for c in speed_lib.predict(predict.alpha_points(0.5, (2,)), [row], 2048, 64)] == ["ar"]
