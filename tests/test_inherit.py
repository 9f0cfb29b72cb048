"""A run takes its tokenizer from the checkpoint it starts from (`zarya_jax.train.inherit`): the README's
path at Qwen3's real vocabulary (151,936 rows) on a one-layer model — `hf_to_jax`, `train --init-from`
and `train_drafter --base RUN/final` without `data.tokenizer` — reads the checkpoint's tokenizer, the
drafter takes the base run's batch and length, and the byte tokenizer with that checkpoint is one error
line; the saved config's `param_dtype` is the dtype of the arrays saved."""
import json
import os

import jax
import numpy as np
import pytest

from conversion import hf_to_jax
from experiments import rehearse, train, train_draft_model, train_drafter
from zarya_jax import checkpoint
from zarya_jax.config import ConfigError
from zarya_jax.data.pipeline import DataConfig
from zarya_jax.data.tokenizer import ByteTokenizer
from zarya_jax.data.tokenizer import load_tokenizer
from zarya_jax.testing import TINY
from zarya_jax.train import config as rc
from zarya_jax.train import inherit
from zarya_jax.train.drafter import DrafterRunConfig

# The smallest run of the path: one step at 2 × 64 tokens, no evaluation or intermediate checkpoint.
RUN = ["data.max_length=64", "data.batch_size=2", "data.eval_fraction=0", "train.steps=1", "train.eval_every=0",
       "train.save_every=0", "train.log_every=1", "train.progress_bar=false", "train.async_checkpointing=false",
       "optim.warmup_steps=0", "mesh.num_devices=1"]
TRAIN = RUN + ["data.chat_template=true", "data.enable_thinking=false", "data.prompt_key=question",
               "zarya.slot_size_set=2,4", "zarya.slot_step_borders=0.5,1.0"]
# A side run's own section holds its steps, batch and optimizer (`drafter.*`, `draft_model.*`).
SIDE = ["data.eval_fraction=0", "train.eval_every=0", "train.save_every=0", "train.progress_bar=false",
        "train.async_checkpointing=false", "mesh.num_devices=1"]
DRAFTER = SIDE + ["drafter.steps=1", "drafter.optim.warmup_steps=0", "drafter.lora.rank=4", "drafter.lora.alpha=8",
                  "drafter.objective.block_sizes=2,4"]
DRAFT_MODEL = SIDE + ["draft_model.steps=1", "draft_model.optim.warmup_steps=0"]


def sets(items):
    return [a for s in items for a in ("--set", s)]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, qwen3_tokenizer_dir):
    """A one-layer random Qwen3 at the real vocabulary, converted in bfloat16 with `<mdm_mask>`, and
    GSM8K-format records."""
    root = tmp_path_factory.mktemp("qwen3")
    rehearse.write_hf_model(str(root / "hf"), qwen3_tokenizer_dir, hidden=64, layers=1)
    assert hf_to_jax.main(["--hf-dir", str(root / "hf"), "--out", str(root / "ckpt"), "--add-mask-token",
                           "--dtype", "bfloat16"]) == 0
    data = rehearse._write_jsonl(str(root / "train.jsonl"), rehearse.gsm8k_records(8))
    return {"root": root, "ckpt": str(root / "ckpt"), "data": data}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_train_then_drafter_read_the_checkpoints_tokenizer(qwen3, capsys):
    root, ckpt = qwen3["root"], qwen3["ckpt"]
    own = checkpoint.tokenizer_dir(ckpt)
    mask_id = checkpoint.load_config(ckpt).mask_token_id
    assert load_tokenizer(own).mask_id == mask_id == rehearse.QWEN3_MASK
    capsys.readouterr()

    # the byte tokenizer asked for with a Qwen3 checkpoint: one error line naming both and the remedy
    argv = ["--config", "qwen3-0.6b", "--workdir", str(root / "bytes"), "--init-from", ckpt,
            *sets([f"data.train={qwen3['data']}", "data.tokenizer=byte", *RUN])]
    assert train.main(argv) == 2
    err = one_error_line(capsys)
    assert "data.tokenizer='byte' (264 tokens)" in err and own in err and "151,670" in err
    assert "--set train.allow_tokenizer_mismatch=true" in err and not (root / "bytes").exists()

    # no data.tokenizer: the checkpoint's own, said in one line (the tiny preset's `tokenizer: byte` does not count)
    run = root / "run"
    assert train.main(["--config", "tiny", "--workdir", str(run), "--init-from", ckpt,
                       *sets([f"data.train={qwen3['data']}", *TRAIN])]) == 0
    out = capsys.readouterr().out
    assert f"tokenizer: {own} (the checkpoint's own" in out
    assert json.loads((run / "run_config.json").read_text())["data"]["tokenizer"] == own
    final = str(run / "final")
    assert load_tokenizer(checkpoint.tokenizer_dir(final)).mask_id == mask_id  # <mdm_mask> travelled on
    # the converted checkpoint is bfloat16; the run saves its float32 master weights, and says so
    assert checkpoint.load_config(ckpt).param_dtype == "bfloat16"
    assert checkpoint.load_config(final).param_dtype == "float32"
    assert {d.name for _, d in checkpoint.param_shapes(final).values()} == {"float32"}

    # the drafter on RUN/final: its tokenizer, and the base run's batch and length (not tiny's 16 × 128)
    assert train_drafter.main(["--base", final, "--workdir", str(root / "bytes_drafter"),
                               *sets([f"data.train={qwen3['data']}", "data.tokenizer=byte", *DRAFTER])]) == 2
    err = one_error_line(capsys)
    assert "data.tokenizer='byte'" in err and checkpoint.tokenizer_dir(final) in err
    assert train_draft_model.main(["--base", final, "--workdir", str(root / "bytes_draft"),
                                   *sets([f"data.train={qwen3['data']}", "data.tokenizer=byte", *DRAFT_MODEL])]) == 2
    assert "data.tokenizer='byte'" in one_error_line(capsys) and not (root / "bytes_draft").exists()
    drafter = root / "drafter"
    assert train_drafter.main(["--base", final, "--workdir", str(drafter),
                               *sets([f"data.train={qwen3['data']}", *DRAFTER])]) == 0
    out = capsys.readouterr().out
    assert f"from {final} and its run {run}: data.tokenizer={checkpoint.tokenizer_dir(final)}" in out
    recorded = json.loads((drafter / "run_config.json").read_text())["data"]
    assert (recorded["tokenizer"], recorded["batch_size"], recorded["max_length"]) == (
        checkpoint.tokenizer_dir(final), 2, 64)
    assert recorded["prompt_key"] == "question" and recorded["chat_template"] is True  # the base's format
    # --set still wins over the base run's values
    inherited, _ = inherit.from_base(final, {"data.batch_size": 4}, inherit.BASE_RUN_KEYS)
    assert "data.batch_size" not in inherited and inherited["data.max_length"] == 64
    # a side run takes the base run's batch as its section's (`drafter.batch_size`), below its own --set
    keys = DrafterRunConfig.base_keys(inherit.BASE_RUN_KEYS)
    assert inherit.from_base(final, {}, keys)[0]["drafter.batch_size"] == 2
    inherited, _ = inherit.from_base(final, {"drafter.batch_size": 4}, keys)
    assert "drafter.batch_size" not in inherited and "data.batch_size" not in inherited


def test_train_api_applies_the_same_rule(qwen3, tmp_path):
    """`train()` called from Python takes `train.init_from`'s tokenizer as the CLI does (one code path): the
    preset's default `byte` gives way to the checkpoint's own; the byte tokenizer named for the Qwen3
    checkpoint, or left as the tokenizer of a checkpoint without one whose rows it does not cover, is refused
    before anything is written, unless `train.allow_tokenizer_mismatch`."""
    from zarya_jax import overrides
    from zarya_jax.model import init_params
    from zarya_jax.train.loop import train as train_run

    def run(init, *extra):
        return rc.load("tiny", overrides.parse_all([*RUN, f"data.train={qwen3['data']}", f"train.init_from={init}",
                                                    *extra]))

    own = checkpoint.tokenizer_dir(qwen3["ckpt"])
    taken, note = inherit.init_tokenizer(run(qwen3["ckpt"]))
    assert taken.data.tokenizer == own and note.startswith(f"tokenizer: {own} (the checkpoint's own")
    with pytest.raises(ConfigError, match=r"data.tokenizer='byte' \(264 tokens\) is not the tokenizer of .*"
                                          r"--set train.allow_tokenizer_mismatch=true"):
        train_run(run(qwen3["ckpt"]), str(tmp_path / "named"), tokenizer="byte")
    allowed, _ = inherit.init_tokenizer(run(qwen3["ckpt"], "train.allow_tokenizer_mismatch=true"), "byte")
    assert allowed.data.tokenizer == "byte"

    wide = TINY.replace(vocab_size=1024)  # no tokenizer recorded, 1,024 rows: not the byte tokenizer's model
    bare = checkpoint.save(tmp_path / "bare", init_params(wide, jax.random.PRNGKey(0)), wide)
    assert checkpoint.tokenizer_dir(bare) is None
    with pytest.raises(ConfigError, match=r"'byte' \(264 tokens\) is not the tokenizer of .*1,024 vocabulary rows"):
        train_run(run(bare), str(tmp_path / "default"))
    assert not (tmp_path / "named").exists() and not (tmp_path / "default").exists()


def test_rl_checks_the_bases_tokenizer(qwen3, tmp_path, capsys):
    """`experiments.rl --base CKPT` rolls out with the base's tokenizer and refuses another as training does:
    the byte tokenizer named for the Qwen3 checkpoint is one error line, nothing written."""
    from experiments import rl

    argv = ["--base", qwen3["ckpt"], "--workdir", str(tmp_path / "rl"), "--set", f"data.train={qwen3['data']}"]
    capsys.readouterr()
    assert rl.main([*argv, "--set", "data.tokenizer=byte"]) == 2
    err = one_error_line(capsys)
    assert "data.tokenizer='byte' (264 tokens) is not the tokenizer of --base" in err
    assert "--set train.allow_tokenizer_mismatch=true" in err and not (tmp_path / "rl").exists()


def test_base_run_defaults(tmp_path, tiny_params):
    """RUN/final takes RUN/run_config.json's batch, length and accumulation, under the command line's; a run
    config of another model (or none) gives nothing but the tokenizer."""
    final = checkpoint.save(tmp_path / "run" / "final", tiny_params, TINY, tokenizer=ByteTokenizer())
    recorded = rc.RunConfig(model=TINY, data=DataConfig(batch_size=6, max_length=48)).to_dict()
    (tmp_path / "run" / "run_config.json").write_text(json.dumps(recorded))
    got, note = inherit.from_base(final, {"data.max_length": 32}, inherit.BASE_RUN_KEYS)
    assert got == {"data.tokenizer": checkpoint.tokenizer_dir(final), "data.batch_size": 6,
                   "optim.grad_accum_steps": 1}
    assert note.startswith(f"from {final} and its run {tmp_path / 'run'}: data.tokenizer=")
    recorded["model"]["num_layers"] += 1  # another model's run
    (tmp_path / "run" / "run_config.json").write_text(json.dumps(recorded))
    assert inherit.from_base(final, {}, inherit.BASE_RUN_KEYS)[0] == {"data.tokenizer": checkpoint.tokenizer_dir(final)}
    assert inherit.from_base(final, {"data.tokenizer": "byte"}, inherit.BASE_RUN_KEYS) == ({}, None)


def test_tokenizer_check_without_a_recorded_tokenizer(tmp_path):
    """A checkpoint without CKPT/tokenizer/: a tokenizer whose ids cover under half its rows is refused."""
    inherit.check_tokenizer("byte", str(tmp_path), TINY, False, "--base")  # 264 of 264 rows
    with pytest.raises(ConfigError, match=r"'byte' \(264 tokens\) is not the tokenizer of --base .*1,024 vocabulary "
                                          r"rows.*train.allow_tokenizer_mismatch=true"):
        inherit.check_tokenizer("byte", str(tmp_path), TINY.replace(vocab_size=1024), False, "--base")
    inherit.check_tokenizer("byte", str(tmp_path), TINY.replace(vocab_size=1024), True, "--base")


def test_saved_config_names_the_arrays_dtype(tmp_path, tiny_params):
    """float32 arrays saved with a bfloat16 config are recorded as float32; bfloat16 ones as bfloat16."""
    f32 = checkpoint.save(tmp_path / "f32", tiny_params, TINY.replace(param_dtype="bfloat16"))
    assert checkpoint.load_config(f32).param_dtype == "float32"
    bf16 = jax.tree.map(lambda x: np.asarray(x).astype(jax.numpy.bfloat16), tiny_params)
    path = checkpoint.save(tmp_path / "bf16", bf16, TINY)
    assert checkpoint.load_config(path).param_dtype == "bfloat16"
    assert os.path.isdir(os.path.join(path, "params"))
