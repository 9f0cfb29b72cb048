"""`experiments.evaluate` never loses a result and says what it is doing: each evaluation writes a
directory of its own, a rerun of the same one is kept, an `--out` holding another is refused unless
`--force`, writes are atomic, a mode's compile is announced and timed and the bar moves per batch,
`--set eval.ckpt` is the checkpoint, and a missing mask token names the checkpoint and the remedy."""
import json
import os
import re

import pytest

from experiments import evaluate as evaluate_cli
from zarya_jax import checkpoint
from zarya_jax.data.tokenizer import ByteTokenizer
from zarya_jax.eval import identity, tasks
from zarya_jax.eval.evaluate import write_outputs
from zarya_jax.eval.results import ModeResult, Prediction


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_config, tiny_params):
    root = tmp_path_factory.mktemp("evaluate_outputs")
    ckpt = checkpoint.save(root / "ckpt", tiny_params, tiny_config, tokenizer=ByteTokenizer())
    nomask = checkpoint.save(root / "nomask", tiny_params, tiny_config.replace(mask_token_id=None))
    data = str(root / "test.jsonl")
    tasks.write_jsonl(data, tasks.generate(3, seed=0))
    return {"root": str(root), "ckpt": str(ckpt), "nomask": str(nomask), "data": data}


def run(inputs, *flags, ckpt=True):
    argv = (["--ckpt", inputs["ckpt"]] if ckpt else []) + ["--data", inputs["data"], "--modes", "ar",
                                                          "--max-new-tokens", "3", "--batch-size", "1", *flags]
    return evaluate_cli.main(argv)


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error:" in line]


def tree(path: str) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(r, n), path): open(os.path.join(r, n), "rb").read()
            for r, _, names in os.walk(path) for n in names}


def test_each_evaluation_has_its_own_directory_and_a_rerun_is_kept(inputs, capsys):
    evals = inputs["ckpt"] + "_eval"
    assert run(inputs) == 0
    out = capsys.readouterr()
    first = os.path.join(evals, os.listdir(evals)[0])
    assert os.listdir(evals) == [os.path.basename(first)] and os.path.basename(first).startswith("test-ar-")
    assert f"wrote {first}/summary.json" in out.out
    # progress on stderr: the compile announced and timed, the bar at every batch; compile time in the table
    assert re.search(r"compiling mode ar( \(\d prompt lengths\))?… \d+\.\d s\n", out.err), out.err
    assert all(f"{k}/3" in out.err for k in range(4)), out.err
    assert "compile s |" in out.out and "compile s |" in open(os.path.join(first, "summary.md")).read()
    written = tree(first)
    summary = json.loads(written["summary.json"])
    assert summary["evaluation"]["id"] in first and summary["evaluation"]["settings"]["eval"]["limit"] == 0

    # another evaluation of the same checkpoint: a second directory, the first untouched
    assert run(inputs, "--limit", "2") == 0
    capsys.readouterr()
    assert len(os.listdir(evals)) == 2 and tree(first) == written

    # the same evaluation again (the checkpoint given as --set eval.ckpt, or spelled another way): kept,
    # nothing decoded or written
    for flags, ckpt in ((["--set", f"eval.ckpt={inputs['ckpt']}"], False), ([], True)):
        assert run(inputs, *flags, ckpt=ckpt) == 0
        out = capsys.readouterr()
        assert f"kept {first}" in out.out and "compiling" not in out.err and "| AR |" in out.out
        assert len(os.listdir(evals)) == 2 and tree(first) == written

    # --force computes it again, in the same directory
    assert run(inputs, "--force") == 0
    out = capsys.readouterr()
    assert "compiling mode ar" in out.err and f"wrote {first}" in out.out and len(os.listdir(evals)) == 2


def test_an_out_holding_another_evaluation_is_refused_unless_forced(inputs, tmp_path, capsys):
    out_dir = str(tmp_path / "e")
    assert run(inputs, "--out", out_dir) == 0
    capsys.readouterr()
    before = tree(out_dir)
    assert run(inputs, "--out", out_dir, "--limit", "2") == 2
    errors = error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and out_dir in errors[0] and "eval.limit" in errors[0]
    assert "--force" in errors[0] and "--out" in errors[0]
    assert tree(out_dir) == before
    assert run(inputs, "--out", out_dir, "--limit", "2", "--force") == 0
    assert json.load(open(os.path.join(out_dir, "summary.json")))["modes"][0]["examples"] == 2
    capsys.readouterr()

    # a summary.json that records no settings (an older evaluate's) is another evaluation too; a folder
    # without one is written into, its other files kept
    foreign = tmp_path / "old"
    foreign.mkdir()
    (foreign / "summary.json").write_text(json.dumps({"modes": []}))
    assert run(inputs, "--out", str(foreign)) == 2
    assert "records no evaluation settings" in error_lines(capsys.readouterr().err)[0]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert run(inputs, "--out", str(mine)) == 0
    assert sorted(os.listdir(mine)) == ["notes.txt", "predictions.jsonl", "summary.json", "summary.md"]


def test_writes_are_atomic(tmp_path):
    """An error while writing (here a value JSON cannot hold) leaves no new directory, and an existing
    evaluation as it was."""
    rows = [ModeResult(mode="ar", label="AR", examples=1, accuracy=1.0, tokens_per_forward=1.0, tokens_per_s=1.0,
                       generated_tokens=1, wall_s=1.0, compile_s=0.5, batch_size=1, generation_config={})]

    def predictions(index):
        return [Prediction(index=index, mode="ar", prompt="1+1=", reference="2", prompt_ids=[1], output="2",
                           output_ids=[2], prediction="2", gold="2", correct=True, num_tokens=1, forward_passes=1)]

    new = tmp_path / "new"
    with pytest.raises(TypeError):
        write_outputs(str(new), rows, predictions(0), {"bad": object()})
    assert os.listdir(tmp_path) == []
    write_outputs(str(new), rows, predictions(0), {"evaluation": {"id": "a"}})
    before = tree(str(new))
    assert [ModeResult.from_json(r) for r in json.loads(before["summary.json"])["modes"]] == rows
    assert [Prediction.from_json(json.loads(line)) for line in before["predictions.jsonl"].splitlines()] == predictions(0)
    with pytest.raises(TypeError):
        write_outputs(str(new), rows, predictions(1), {"bad": object()})
    assert tree(str(new)) == before and os.listdir(tmp_path) == ["new"]


def test_a_missing_mask_token_names_the_checkpoint_and_the_remedy(inputs, capsys):
    for modes, named in (("ar,mdm", "mode mdm needs"), ("slotted,spec-self", "modes slotted, spec-self need")):
        assert evaluate_cli.main(["--ckpt", inputs["nomask"], "--data", inputs["data"], "--modes", modes]) == 2
        errors = error_lines(capsys.readouterr().err)
        assert len(errors) == 1 and named in errors[0] and "a mask token" in errors[0]
        assert inputs["nomask"] in errors[0] and "python -m conversion.hf_to_jax" in errors[0]
        assert "--add-mask-token" in errors[0]
    assert not os.path.exists(inputs["nomask"] + "_eval")


def test_no_checkpoint_is_one_error(inputs, capsys):
    assert run(inputs, ckpt=False) == 2
    errors = error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and "--ckpt" in errors[0] and "eval.ckpt" in errors[0]


def test_identity_names_and_differences():
    assert identity.default_out("runs/q/final/", "data/my test.jsonl", ["ar", "spec-lora"], "abc") \
        == os.path.join("runs/q/final_eval", "my_test-ar+spec-lora-abc")
    old = {"ckpt": {"checksums.json": "1"}, "eval": {"limit": 0, "seed": 0}, "generation": {"ar": {"top_k": 0}}}
    new = {"ckpt": {"checksums.json": "2"}, "eval": {"limit": 2, "seed": 0}, "generation": {"ar": {"top_k": 5}}}
    assert identity.differences(old, new) == ["ckpt", "eval.limit", "generation.ar.top_k"]
    assert identity.evaluation_id(old) == identity.evaluation_id(json.loads(json.dumps(old)))
    assert identity.evaluation_id(old) != identity.evaluation_id(new)
