"""Speed-up against answer length (`zarya_jax.eval.length`, `python -m experiments.bench length`): run in
process on a smoke long-task quickstart; its lossless rows must decode AR's tokens (timings never asserted)."""
import json

import pytest

from experiments import quickstart
from experiments.bench.__main__ import main as bench_main
from zarya_jax.eval import length


@pytest.fixture(scope="module")
def long_smoke(tmp_path_factory):
    """A --smoke quickstart of the long task (4 training steps), AR and the self-drafting lossless modes."""
    workdir = str(tmp_path_factory.mktemp("long") / "run")
    assert quickstart.main(["--smoke", "--task", "long", "--workdir", workdir, "--modes", "ar,spec-self,spec-self-fused",
                            "--set", "frontier.enabled=false", "--set", "eval.batch1_examples=0",
                            "--no-progress"]) == 0
    return workdir


def test_length_table_rows_are_ar_equal(long_smoke, tmp_path, capsys):
    out = tmp_path / "bench"
    assert bench_main(["--out", str(out), "length", "--workdir", long_smoke, "--caps", "4,12", "--examples", "2",
                       "--repeats", "1", "--no-progress"]) == 0
    doc = json.loads((out / "length.json").read_text())
    rows = doc["rows"]
    assert doc["task"] == "long" and [(r["max_new_tokens"], r["mode"]) for r in rows] == [
        (cap, m) for cap in (4, 12) for m in ("ar", "spec-self", "spec-self-fused")]
    for r in rows:
        assert r["ar_equal"] is (None if r["mode"] == "ar" else True)
        assert 0 < r["mean_tokens"] <= r["max_new_tokens"] and r["examples"] == 2
    printed = capsys.readouterr().out
    assert "| max new tokens |" in printed and (out / "length.md").read_text().strip() in printed


def test_bad_input_is_one_error_line(long_smoke, tmp_path, capsys):
    for argv in (["--modes", "slotted"], ["--modes", "spec-lora"], ["--examples", "0"], ["--modes", "nope"]):
        capsys.readouterr()
        assert bench_main(["--out", str(tmp_path / "b"), "length", "--workdir", long_smoke, *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:"), (argv, err)
    assert bench_main(["--out", str(tmp_path / "b"), "length", "--workdir", str(tmp_path / "none")]) == 2
    with pytest.raises(SystemExit) as e:  # a malformed flag: argparse's own error line, exit 2
        bench_main(["--out", str(tmp_path / "b"), "length", "--workdir", long_smoke, "--caps", "0"])
    assert e.value.code == 2
    with pytest.raises(ValueError, match="not lossless"):
        length.check_modes({"mdm": {}})
