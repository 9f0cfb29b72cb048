"""`python -m experiments.bench cycle` (`zarya_jax.bench.cycle`): the profile of a two-pass Ψ-Spec cycle has
every step, each timed, the remainder is the loop's cycle minus their sum, and bad settings are refused by
name before anything is written. Structure only, never a timing threshold."""
import json

import pytest

from experiments.bench.__main__ import main as bench
from zarya_jax.bench import cycle


def test_smoke_profiles_both_modes_against_ar(tmp_path, capsys):
    assert bench(["--out", str(tmp_path), "cycle", "--smoke"]) == 0, capsys.readouterr().err
    r = json.loads((tmp_path / "cycle.json").read_text())
    assert {"commit", "dirty", "packages", "devices"} <= set(r["provenance"])
    ar = r["ar"]
    assert ar["loop_ms_per_pass"] > 0 and ar["pass_ms"] > 0 and ar["passes_timed"] == r["setup"]["new_tokens"]
    assert [(row["mode"], row["draft_length"]) for row in r["cycles"]] == [("spec-lora", 4), ("spec-self", 4)]
    for row in r["cycles"]:
        loop = row["loop_ms_per_cycle"]
        parts = [row[f"{name}_ms"] for name in cycle.COMPONENTS]
        assert all(ms > 0 for ms in parts), row
        assert loop > ar["loop_ms_per_pass"]  # two passes of F + 1 rows against one of one row
        assert row["sum_ms"] == pytest.approx(sum(parts))
        assert row["remainder_ms"] == pytest.approx(loop - sum(parts))
        assert row[f"{cycle.COMPONENTS[0]}_share"] == pytest.approx(parts[0] / loop)
        assert row["cycle_in_ar_passes"] == pytest.approx(loop / ar["loop_ms_per_pass"])
        assert row["cycles_timed"] >= 2 and row["tokens_per_cycle"] > 1  # c0 and the correction, at least
    md = (tmp_path / "cycle.md").read_text()
    assert "| mode | F | loop ms/cycle | draft | verify | accept | emit | commit | remainder |" in md


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "--batch=0: expected a positive integer"),
    (["--smoke", "--batch", "0"], "--batch=0: expected a positive integer"),
    (["--modes", "spec-lora,ar"], "--modes='spec-lora,ar': expected a comma-separated subset of spec-lora,spec-self"),
    (["--new-tokens", "20"], "--new-tokens=20: expected ≥ 34"),
    (["--data", "{dir}/x.jsonl"], "--data '{dir}/x.jsonl' needs --ckpt"),
    (["--ckpt", "{dir}/ckpt", "--modes", "spec-lora"],
     "with --ckpt, mode spec-lora (the LoRA drafter) needs --adapter"),
    (["--preset", "huge"], "unknown model preset 'huge'"),
])
def test_bad_settings_exit_2_naming_the_value(tmp_path, capsys, argv, message):
    (tmp_path / "ckpt").mkdir()
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    assert bench(["--out", str(tmp_path / "b"), "cycle", *argv]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message.replace('{dir}', str(tmp_path))}")
    assert not (tmp_path / "b").exists()


def test_settings_check_raises_naming_the_value():
    with pytest.raises(ValueError, match="--draft-lengths=\\(0,\\)"):
        cycle.CycleSettings(draft_lengths=(0,)).check()
