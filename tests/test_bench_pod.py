"""`zarya_jax.bench.device` in its smoke run (the one-command accelerator benchmark, on the CPU with the tiny
preset; `python -m experiments.bench device --smoke`) and `python -m experiments.bench plan` (ahead-of-time
memory/FLOP plan on virtual devices): the numbers they report against independent recomputations from the
model config."""
import json

import numpy as np
import pytest

from experiments.bench.__main__ import main as bench
from zarya_jax.bench import device
from zarya_jax.config import preset
from zarya_jax.sampling import GenerationConfig, passes

GIB = 1 << 30


def _read(out, name):
    with open(out / f"{name}.json") as f:
        return json.load(f)


def test_device_smoke():
    bw = 2e10
    r, md = device.run(device.smoke(device.DeviceSettings(bandwidth=bw)))
    assert "Cached forward pass vs window:" in md
    assert r["smoke"] and r["skipped"] == [] and r["preset"] == "tiny"
    assert r["train"]["tokens_per_s"] > 0 and 0 < r["train"]["mfu"] < 1 and np.isfinite(r["train"]["loss"])
    assert [(w["batch"], w["window"]) for w in r["window"]] == [(2, 1), (2, 4)]
    one_row = {w["batch"]: w["ms_per_pass"] for w in r["window"] if w["window"] == 1}
    for w in r["window"]:  # each window's pass against the one-row pass of its own batch
        assert w["vs_window_1"] == pytest.approx(w["ms_per_pass"] / one_row[w["batch"]])
        assert w["ms_per_token_row"] == pytest.approx(w["ms_per_pass"] / w["window"])
    cfg = preset("tiny")  # fp32 in the smoke run
    assert [row["mode"] for row in r["decode"]] == ["ar", "spec-self", "spec-self-fused"]
    ar = r["decode"][0]
    for row in r["decode"]:  # rows never stop at EOS: every one generates batch × new_tokens tokens
        assert row["new_tokens"] == 8 and row["tokens_per_s"] == pytest.approx(2 * 8 / row["seconds"])
        assert row["ms_per_pass"] == pytest.approx(1e3 * row["seconds"] / row["passes"])
        assert row["pass_vs_ar"] == pytest.approx(row["ms_per_pass"] / ar["ms_per_pass"])
    assert ar["passes"] == ar["new_tokens"]  # AR: one token per pass (the prefill yields the first)
    for row in r["decode"][1:]:  # two-pass and fused speculation, their pass cost against AR's in the same run
        assert 2 <= row["passes"] <= 2 * row["new_tokens"] and "roofline_tokens_per_s" not in row
    for row in r["decode"][:1]:
        weights = 4 * cfg.num_params()
        cache = 4 * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * (row["prompt"] + row["new_tokens"] / 2)
        expect = row["batch"] * bw / (weights + row["batch"] * cache)
        np.testing.assert_allclose(row["roofline_tokens_per_s"], expect, rtol=1e-9)
        np.testing.assert_allclose(row["fraction_of_roofline"], row["tokens_per_s"] / expect, rtol=1e-9)


def test_device_time_budget_and_bad_input(tmp_path, capsys):
    assert bench(["--out", str(tmp_path), "device", "--smoke", "--budget-s", "0"]) == 0
    r = _read(tmp_path, "device")
    assert r["skipped"] == ["train", "window", "decode ar batch 2", "decode spec-self batch 2",
                            "decode spec-self-fused batch 2"] and r["decode"] == []
    assert bench(["--out", str(tmp_path / "bad"), "device", "--seq", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --seq=0")
    assert not (tmp_path / "bad").exists()


def test_plan_on_two_virtual_devices(tmp_path, capsys):
    code = bench(["--out", str(tmp_path), "plan", "--presets", "tiny", "--devices", "2", "--seq", "128",
                  "--attention", "dense", "--modes", "ar"])
    assert code == 0, capsys.readouterr().err
    r = _read(tmp_path, "plan")
    cfg = preset("tiny")
    train = {row["attention"]: row for row in r["train"]}
    assert set(train) == {"dense"}
    for row in train.values():
        assert row["devices"] == 2 and row["batch"] == 2 and row["temp_gib"] > 0
        # per device: fp32 master weights and two Adam moments, FSDP-sharded in two (plus the batch and scalars)
        state = 3 * 4 * cfg.num_params() / 2
        assert state <= row["args_gib"] * GIB <= 1.2 * state + 4 * 128 * 4 * 2
        assert 0.8 < row["tflop_per_device"] / row["model_tflop_per_device"] < 2  # + remat, transform, loss, AdamW
    (row,) = r["decode"]
    assert row["mode"] == "ar" and row["window"] == 1 and row["cache_rows"] == 128 + 64
    np.testing.assert_allclose(row["cache_gib"] * GIB, 2 * cfg.num_layers * 2 * 192 * cfg.num_kv_heads * cfg.head_dim * 4 / 2)
    assert row["total_gib"] >= row["cache_gib"] and row["gflop_per_device"] > 0
    assert "| tiny | 2 |" in capsys.readouterr().out


def test_pass_windows_of_each_mode():
    gc = GenerationConfig(max_new_tokens=64)  # every mode at its defaults: S = 8, NB = 2, T = 0, F = 8
    assert [passes.window_rows(gc.replace(mode=m)) for m in ("ar", "mdm", "slotted", "spec-lora")] == [1, 8, 32, 8]
    assert passes.window_rows(gc.replace(mode="spec-self")) == 9  # the seed and F masks
    assert passes.cache_rows(gc.replace(mode="spec-lora"), 10) == 10 + 64 + 8 + 2


@pytest.mark.parametrize("argv, message", [(["--attention", "flash"], "attention='flash'"),
                                           (["--modes", "beam"], "--modes ['beam']"),
                                           (["--modes", "spec"], "--modes ['spec']"),
                                           (["--mesh", "2,x,1"], "--mesh '2,x,1'")])
def test_plan_bad_input(tmp_path, capsys, argv, message):
    assert bench(["--out", str(tmp_path), "plan", "--presets", "tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and not (tmp_path / "plan.json").exists()


def test_out_after_the_subcommand(tmp_path):
    """`--out` is accepted after the subcommand too, and wins there over one given before it."""
    assert bench(["--out", str(tmp_path / "before"), "device", "--smoke", "--budget-s", "0",
                  "--out", str(tmp_path / "after")]) == 0
    assert _read(tmp_path / "after", "device")["skipped"] and not (tmp_path / "before").exists()
    assert bench(["device", "--smoke", "--budget-s", "0", "--out", str(tmp_path / "only")]) == 0
    assert (tmp_path / "only" / "device.md").exists()
