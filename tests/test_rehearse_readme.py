"""`experiments.rehearse_readme` reads the README's CPU-sized commands, runs them with only the HF folder's
path changed, and derives its spec-lora and Ctrl-C runs from them. The run itself (minutes, a model of Qwen3's
vocabulary through five processes) is not repeated here: `tests/test_rehearse.py` covers the same path in
one process; these tests check what ties the measurement to the README."""
import os
import sys

import pytest

from experiments import rehearse_readme as rr

README = os.path.join(rr.ROOT, "README.md")


@pytest.fixture(scope="module")
def commands():
    with open(README, encoding="utf-8") as f:
        return rr.readme_commands(f.read())


def test_the_readme_cpu_block_is_five_commands(commands):
    assert [c[2] for c in commands] == list(rr.MODULES)
    assert all(c[:2] == ["python", "-m"] for c in commands)
    assert all("#" not in a and "\\" not in a for c in commands for a in c)  # comments and continuations gone
    hf_to_jax, train, evaluate, drafter, jax_to_hf = commands
    assert rr.flag(hf_to_jax, "--hf-dir") == rr.HF_PATH
    assert rr.flag(train, "--init-from") == rr.flag(hf_to_jax, "--out")
    assert rr.flag(evaluate, "--ckpt") == rr.flag(drafter, "--base") == rr.flag(jax_to_hf, "--ckpt")


def test_commands_run_here_with_only_the_hf_folder_changed(commands):
    hf_to_jax = rr.localize(commands[0], "/w/models/Qwen3-0.6B")
    assert hf_to_jax[0] == sys.executable
    assert hf_to_jax[1:] == [a.replace(rr.HF_PATH, "/w/models/Qwen3-0.6B") for a in commands[0][1:]]
    assert all(rr.localize(c, "/w/x")[1:] == c[1:] for c in commands[1:])  # relative paths: the workdir's


def test_derived_runs(commands):
    _, train, evaluate, drafter, _ = commands
    spec = rr.spec_lora_command(evaluate, drafter)
    assert rr.flag(spec, "--modes") == "spec-lora"
    assert rr.flag(spec, "--lora") == os.path.join(rr.flag(drafter, "--workdir"), "adapter")
    assert [a for a in spec if a not in ("--modes", "spec-lora", "--lora", rr.flag(spec, "--lora"))] == \
        [a for a in evaluate if a not in ("--modes", rr.flag(evaluate, "--modes"))]
    stop = rr.interrupt_command(train, "runs/interrupted")
    assert rr.flag(stop, "--workdir") == "runs/interrupted"
    assert stop[-6:] == [a for s in rr.INTERRUPT_SETS for a in ("--set", s)]  # later --set wins


@pytest.mark.parametrize("text, message", [
    ("# x\n", "has no section"),
    (rr.SECTION + "\n```bash\npython -m conversion.hf_to_jax\n```\n", "1 bash block"),
    (rr.SECTION + "\n```bash\n```\n\n```bash\npython -m conversion.hf_to_jax --hf-dir a \\\n  --out b\n"
     "python -m experiments.train\n```\n", "expected ['conversion.hf_to_jax'"),
])
def test_a_readme_without_the_block_is_refused(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        rr.readme_commands(text)


def test_bad_input_exits_2(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "f").write_text("")
    assert rr.main(["--workdir", str(tmp_path / "old")]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert rr.main(["--workdir", str(tmp_path / "new"), "--shape", "tiny"]) == 2
    assert "expected a Qwen3 preset" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
