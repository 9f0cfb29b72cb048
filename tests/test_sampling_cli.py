"""`python -m experiments.generate` on a real (tiny, random) Orbax checkpoint with the byte tokenizer."""
import json
import os

import pytest

from experiments import generate as cli
from zarya_jax import checkpoint
from zarya_jax.data.tokenizer import ByteTokenizer
from zarya_jax.sampling import GenerationConfig, modes


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_config, tiny_params):
    path = str(tmp_path_factory.mktemp("gen") / "ckpt")
    checkpoint.save(path, tiny_params, tiny_config, tokenizer=ByteTokenizer())
    return path


def test_generate_from_file_streams_rows(ckpt, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["hi there", "abc", "zarya"]) + "\n")
    out = tmp_path / "out" / "gen.jsonl"
    rc = cli.main(["--ckpt", ckpt, "--prompts-file", str(prompts), "--mode", "ar", "--max-new-tokens", "5",
                   "--batch-size", "2", "--set", "prompt_bucket=8", "--output", str(out)])
    assert rc == 0
    stdout = capsys.readouterr().out
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for i, p in enumerate(["hi there", "abc", "zarya"]):  # the prompt and its completion, each labelled
        r = records[i]
        assert (f"=== [{i}] prompt\n{p}\n--- completion ({r['tokens']} tokens, {r['forward_passes']} passes)\n"
                f"{r['text']}\n") in stdout
    assert [r["index"] for r in records] == [0, 1, 2]
    assert all(1 <= r["tokens"] <= 5 and r["forward_passes"] == r["tokens"] for r in records)


@pytest.mark.parametrize("argv,match", [
    (["--ckpt", "/nonexistent/ckpt", "--prompt", "x"], "is not a directory"),
    (["--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens=0"),
    (["--prompt", "x", "--mode", "slotted", "--set", "token_threshold=2"], "token_threshold=2.0"),
    (["--prompt", "x", "--set", "temprature=1"], "did you mean ['temperature']"),
    (["--prompt", "x", "--set", "top_k=many"], "top_k='many': expected an integer"),
    (["--prompt", "x", "--mode", "ar", "--set", "slot_size=4"], "mode 'ar' has no field 'slot_size'"),
    (["--prompt", "x", "--mode", "spec-lora"], "--mode spec-lora needs --lora DIR"),
    (["--prompt", "x", "--mode", "spec-model"], "--mode spec-model needs --draft-ckpt DIR"),
    (["--prompt", ""], "prompt 0 is empty"),
    (["--prompts-file", "/nonexistent.txt"], "does not exist"),
    (["--prompt", "x", "--batch-size", "0"], "--batch-size=0"),
])
def test_bad_input_exits_nonzero(ckpt, tmp_path, capsys, argv, match):
    if "--ckpt" not in argv:
        argv = ["--ckpt", ckpt] + argv
    out = tmp_path / "never.jsonl"
    assert cli.main(argv + ["--output", str(out)]) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()


def test_help_explains_every_flag():
    """Every flag has a help string, and the continued example of the description reads as two lines."""
    parser = cli.build_parser()
    assert all(action.help for action in parser._actions), [a.dest for a in parser._actions if not a.help]
    assert "--batch-size 8 \\\n        --set temperature=0.7" in parser.format_help()


def test_bad_mode_is_an_argparse_error(ckpt):
    with pytest.raises(SystemExit) as e:
        cli.main(["--ckpt", ckpt, "--prompt", "x", "--mode", "beam"])
    assert e.value.code == 2
    assert not os.path.exists("never")


def test_mode_knobs_typed_from_the_mode(ckpt):
    """`--mode NAME --set FIELD=VALUE`: a field of the mode's dataclass or a shared one, typed from it."""
    args = cli.build_parser().parse_args(["--ckpt", ckpt, "--prompt", "x", "--mode", "spec-self-fused",
                                          "--max-new-tokens", "12", "--set", "draft_length=3", "--set", "top_k=5"])
    assert cli.generation_config(args) == GenerationConfig(mode=modes.mode("spec-self-fused", draft_length=3),
                                                           max_new_tokens=12, top_k=5)
    default = cli.build_parser().parse_args(["--ckpt", ckpt, "--prompt", "x"])
    assert cli.generation_config(default).mode == modes.mode("ar")  # lossless, and reads no mask token
    assert "--mode slotted knobs" in cli.build_parser().epilog and "token_threshold" in cli.build_parser().epilog


def test_the_commands_read_the_checkpoint_onto_every_device(ckpt, tiny_config):
    """On a host with several devices (8 virtual CPU devices here) `generate` and `evaluate` read each param
    straight into its shard of an FSDP mesh over them (`cli.decode_mesh`), and decode on it what one device
    decodes."""
    import jax
    import numpy as np

    from experiments.cli import decode_mesh
    from zarya_jax.inference import load_for_inference
    from zarya_jax.sampling import GenerationConfig, generate

    mesh = decode_mesh()
    assert dict(mesh.shape) == {"data": 1, "fsdp": len(jax.devices()), "tensor": 1} and len(jax.devices()) == 8
    sharded, whole = load_for_inference(ckpt, mesh=mesh), load_for_inference(ckpt)
    embed = sharded.params["embed"]
    assert embed.sharding.mesh == mesh and len(embed.sharding.device_set) == 8
    assert {s.data.shape for s in embed.addressable_shards} == {(tiny_config.vocab_size, tiny_config.hidden_size // 8)}
    assert len(whole.params["embed"].sharding.device_set) == 1
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9], [10]]
    gc = GenerationConfig(mode="ar", max_new_tokens=8, temperature=0.0)
    outs = [generate(m.params, tiny_config, prompts, gc, jax.random.PRNGKey(0)) for m in (sharded, whole)]
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_array_equal(outs[0].lengths, outs[1].lengths)
