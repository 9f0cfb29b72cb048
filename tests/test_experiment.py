"""The experiment as a library object (`zarya_jax.experiment`) and the one inference loader
(`zarya_jax.inference.load_for_inference`): the quickstart's pipeline run from Python returns a typed
report equal to the report.json it wrote; the LoRA drafter trains on the base checkpoint's tokenizer;
the loader's tokenizer precedence."""
import json
import os

import jax
import pytest

from experiments import evaluate as evaluate_cli
from zarya_jax import checkpoint, overrides
from zarya_jax.data.tokenizer import ByteTokenizer, HFTokenizer
from zarya_jax.eval import answers, tasks
from zarya_jax.experiment import SMOKE, ExperimentConfig, ModeResult, Report, default_config, run
from zarya_jax.inference import load_for_inference
from zarya_jax.model import init_params
from zarya_jax.testing import chat_tokenizer
from zarya_jax.testing import tiny_config as model_config


def test_run_from_python_returns_a_typed_report(tmp_path):
    config = overrides.apply(default_config(), {**SMOKE, "eval.modes": ["ar", "mdm"], "eval.batch1_examples": 0,
                                                 "frontier.mdm_steps": [0, 2]})
    assert isinstance(config, ExperimentConfig) and config.goals.ar_accuracy == 0.8
    workdir = str(tmp_path / "exp")
    report = run(config, workdir, progress=False)
    assert isinstance(report, Report) and all(isinstance(r, ModeResult) for r in report.modes)
    assert [r.mode for r in report.modes] == ["ar", "mdm"] and report.train.step == 4
    assert [p.mode for p in report.frontier.points] == ["ar", "mdm", "mdm"]
    doc = json.load(open(os.path.join(workdir, "report.json")))
    assert json.loads(json.dumps(report.to_json(), default=str)) == doc
    # Accuracy recomputed from the per-example file with the extraction rules, not from the report.
    preds = [json.loads(line) for line in open(os.path.join(workdir, "eval", "predictions.jsonl"))]
    for r in report.modes:
        rows = [p for p in preds if p["mode"] == r.mode]
        assert r.accuracy == sum(answers.is_correct(p["output"], p["reference"]) for p in rows) / len(rows)
        assert r.knobs == report.frontier.chosen[r.mode].knobs
    # The goals are data: another threshold changes the target, not the numbers.
    target = next(t for t in report.targets if t.target.startswith("AR exact match"))
    assert target.met == (report.mode("ar").accuracy >= 0.8)
    again = run(config, workdir, progress=False)          # up to date: read back, the same report
    assert again.to_json() == Report.from_json(doc).to_json() and again.modes == [
        ModeResult.from_json(r) for r in doc["modes"]]


@pytest.fixture(scope="module")
def hf_ckpt(tmp_path_factory):
    """A tiny checkpoint trained with a character-level Hugging Face tokenizer (ids unlike bytes)."""
    root = tmp_path_factory.mktemp("hf")
    vocab = chat_tokenizer(str(root / "tok"))
    config = model_config(eos_token_id=vocab["<|im_end|>"], pad_token_id=vocab["<|endoftext|>"],
                         mask_token_id=vocab["<mdm_mask>"])
    path = str(root / "ckpt")
    checkpoint.save(path, init_params(config, jax.random.PRNGKey(0)), config, tokenizer=str(root / "tok"))
    return path, vocab


def test_load_for_inference_tokenizer_precedence(hf_ckpt, tmp_path, tiny_config, tiny_params):
    path, vocab = hf_ckpt
    model = load_for_inference(path)
    assert isinstance(model.tokenizer, HFTokenizer) and model.tokenizer_spec == checkpoint.tokenizer_dir(path)
    assert model.tokenizer.encode("a") == [vocab["a"]] != ByteTokenizer().encode("a")
    assert isinstance(load_for_inference(path, tokenizer="byte").tokenizer, ByteTokenizer)  # explicit wins
    assert isinstance(load_for_inference(path, default_tokenizer="byte").tokenizer, HFTokenizer)  # recorded > default
    bare = str(tmp_path / "bare")
    checkpoint.save(bare, tiny_params, tiny_config)
    assert load_for_inference(bare).tokenizer_spec == "byte"
    assert load_for_inference(bare, format_overrides=["prompt_key=question"]).prompt_format.prompt_key == "question"
    assert load_for_inference(bare).lora_kwargs == {}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_for_inference(str(tmp_path / "missing"))


def test_drafter_trains_on_the_checkpoint_tokenizer(hf_ckpt, tmp_path):
    """The experiment's data section says `byte` (the quickstart default); the base checkpoint was trained
    with a Hugging Face tokenizer: the drafter's run reads the checkpoint's tokenizer, as evaluation does."""
    path, vocab = hf_ckpt
    data = tmp_path / "data"
    tasks.write_splits(str(data), 8, 2, seed=0)
    config = overrides.apply(default_config(), {
        **SMOKE, "eval.ckpt": path, "eval.modes": ["spec-lora"], "eval.batch1_examples": 0, "frontier.enabled": False,
        "task.train_file": str(data / "train.jsonl"), "task.test_file": str(data / "test.jsonl"),
        "drafter.steps": 1, "drafter.batch_size": 8, "drafter.rank": 2, "drafter.alpha": 4.0,
        "drafter.block_sizes": [2]})
    assert config.data.tokenizer == "byte"
    workdir = tmp_path / "exp"
    report = run(config, str(workdir), progress=False)
    recorded = json.load(open(workdir / "drafter" / "run_config.json"))
    assert recorded["data"]["tokenizer"] == checkpoint.tokenizer_dir(path)
    assert HFTokenizer(recorded["data"]["tokenizer"]).encode("+") == [vocab["+"]]
    assert [r.mode for r in report.modes] == ["spec-lora"] and report.mode("spec-lora").examples == 2


def test_evaluate_limit_zero_means_every_record(tmp_path, tiny_config, tiny_params):
    """`--limit 0` and `--set eval.limit=0` mean the same: every record; N > 0 the first N."""
    ckpt = str(tmp_path / "ckpt")
    checkpoint.save(ckpt, tiny_params, tiny_config)
    data = str(tmp_path / "test.jsonl")
    tasks.write_jsonl(data, tasks.generate(3, seed=0))
    common = ["--ckpt", ckpt, "--data", data, "--modes", "ar", "--max-new-tokens", "4", "--batch-size", "3"]
    for flags, n in ((["--limit", "0"], 3), (["--set", "eval.limit=0"], 3), (["--set", "eval.limit=2"], 2),
                     (["--limit", "1"], 1)):
        out = str(tmp_path / f"out{len(os.listdir(tmp_path))}")
        assert evaluate_cli.main(common + flags + ["--out", out]) == 0
        assert json.load(open(os.path.join(out, "summary.json")))["modes"][0]["examples"] == n
