"""The experiment as a library object (`zarya_jax.experiment`) and the one inference loader
(`zarya_jax.inference.load_for_inference`): the quickstart's pipeline run from Python returns a typed
report equal to the report.json it wrote; the LoRA drafter trains on the base checkpoint's tokenizer;
the loader's tokenizer precedence."""
import dataclasses
import json
import re
import os

import jax
import pytest

from experiments import evaluate as evaluate_cli
from zarya_jax import checkpoint, overrides
from zarya_jax.data.tokenizer import ByteTokenizer, HFTokenizer
from zarya_jax.eval import answers, tasks
from zarya_jax.eval.results import FrontierPoint, Prediction
from zarya_jax.experiment import (SMOKE, ExperimentConfig, GoalsSection, ModeResult, Report, default_config, describe,
                                  plan, run, stages)
from zarya_jax.inference import load_for_inference
from zarya_jax.model import init_params
from zarya_jax.testing import chat_tokenizer
from zarya_jax.testing import TINY


def test_run_from_python_returns_a_typed_report(tmp_path):
    config = overrides.apply(default_config(), {**SMOKE, "eval.modes": ["ar", "mdm"], "eval.batch1_examples": 2,
                                                 "frontier.grid.mdm.steps": [0, 2], "eval.limit": 3})
    assert isinstance(config, ExperimentConfig) and config.goals.ar_accuracy == 0.8
    workdir = str(tmp_path / "exp")
    # The plan is data, made before anything runs: nothing is written, and each stage's time is reported.
    planned = plan(config, workdir)
    assert describe(planned) == "data → train → records → frontier → test → speed → diagnostics → targets"
    assert not os.path.exists(workdir)
    report = run(config, workdir, progress=False)
    assert isinstance(report, Report) and all(isinstance(r, ModeResult) for r in report.modes)
    assert list(report.timings) == [f"{s.name}_s" for s in planned] and all(t >= 0 for t in report.timings.values())
    assert [r.mode for r in report.modes] == ["ar", "mdm"] and report.train.step == 4
    assert all(isinstance(p, FrontierPoint) for p in report.frontier.points)
    assert [p.mode for p in report.frontier.points] == ["ar", "mdm", "mdm"]
    # eval.limit is applied by the evaluation itself: 3 of the 4 test records (the frontier: every validation one)
    assert [r.examples for r in report.modes] == [3, 3] and report.frontier.points[0].examples == 4
    doc = json.load(open(os.path.join(workdir, "report.json")))
    assert json.loads(json.dumps(report.to_json(), default=str)) == doc
    # Each mode's AUP over its validation points reaches report.json and report.md; AR's is its accuracy.
    ar_point = next(p for p in report.frontier.points if p.mode == "ar")
    assert set(doc["frontier"]["aup"]) == {"ar", "mdm"} and doc["frontier"]["aup"]["ar"] == pytest.approx(
        100 * ar_point.accuracy)
    assert "Accuracy under parallelism" in open(os.path.join(workdir, "report.md")).read()
    # Every measured field of a result reaches report.json, the batch-1 compile time included.
    assert all(r["compile_s_batch1"] >= 0 and r["batch1_examples"] == 2 for r in doc["modes"])
    # Accuracy recomputed from the per-example file with the extraction rules, not from the report.
    preds = [Prediction.from_json(json.loads(line)) for line in open(os.path.join(workdir, "eval", "predictions.jsonl"))]
    for r in report.modes:
        rows = [p for p in preds if p.mode == r.mode]
        assert len(rows) == 3 and r.accuracy == sum(answers.is_correct(p.output, p.reference) for p in rows) / 3
        assert r.knobs == report.frontier.chosen[r.mode].knobs
    # The goals are data: a threshold at the measured accuracy is met, one just above it is not; the
    # measured value is the same under both.
    acc = report.mode("ar").accuracy
    met, missed = (next(t for t in stages.targets(GoalsSection(ar_accuracy=goal), report.modes, preds)
                        if t.target.startswith("AR exact match")) for goal in (acc, acc + 0.01))
    assert met.met and not missed.met and met.value == missed.value == acc and met.target != missed.target
    again = run(config, workdir, progress=False)          # up to date: read back, the same report
    assert again.to_json() == Report.from_json(doc).to_json() and again.modes == [
        ModeResult.from_json(r) for r in doc["modes"]]


@pytest.fixture(scope="module")
def hf_ckpt(tmp_path_factory):
    """A tiny checkpoint trained with a character-level Hugging Face tokenizer (ids unlike bytes)."""
    root = tmp_path_factory.mktemp("hf")
    vocab = chat_tokenizer(str(root / "tok"))
    config = TINY.replace(eos_token_id=vocab["<|im_end|>"], pad_token_id=vocab["<|endoftext|>"],
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
        "drafter.steps": 1, "drafter.batch_size": 8, "drafter.lora.rank": 2, "drafter.lora.alpha": 4.0,
        "drafter.objective.block_sizes": [2]})
    assert config.data.tokenizer == "byte"
    workdir = tmp_path / "exp"
    # A given checkpoint is loaded first (a damaged one fails before any write) and nothing is trained but
    # the drafter; spec-model would add its draft model after it.
    assert describe(plan(config, str(workdir))) == ("load → data → records → drafter → frontier → test → speed → "
                                                    "diagnostics → targets")
    assert describe(plan(config.replace(eval=dataclasses.replace(config.eval, modes=("ar", "spec-model"))), "w")).startswith(
        "load → data → records → draft_model → frontier")
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


def test_results_read_back_strictly():
    """`from_json` is the inverse of `to_json` and refuses a key its type does not have, naming both (a
    metric of another schema is never dropped in silence)."""
    row = ModeResult(mode="spec-lora", label="spec, LoRA drafter", examples=2, accuracy=0.5, tokens_per_forward=2.5,
                     tokens_per_s=10.0, generated_tokens=20, wall_s=2.0, compile_s=1.0, batch_size=2,
                     generation_config={"max_new_tokens": 8, "mode": "spec-lora", "draft_length": 4}, tokens_per_s_batch1=5.0,
                     batch1_examples=1, compile_s_batch1=0.5, speedup_vs_ar=1.5, speedup_vs_ar_batch1=1.2,
                     knobs={"draft_length": 4}, point="F=4", validation_accuracy=1.0, accepted_per_cycle=1.5,
                     acceptance_by_position=[1.0, 0.5, 0.25, 0.0])
    assert ModeResult.from_json(row.to_json()) == row and row.knob("draft_length") == 4
    assert row.knob("max_new_tokens") == 8 and row.knob("slot_size") is None
    for cls, doc in ((ModeResult, row.to_json()),
                     (FrontierPoint, {"mode": "ar", "label": "AR", "knobs": {}, "point": "", "accuracy": 1.0,
                                      "tokens_per_forward": 1.0, "tokens_per_s": 1.0, "examples": 1, "correct": [True]}),
                     (Prediction, {"index": 0, "mode": "ar", "prompt": "1+1=", "reference": "2", "prompt_ids": [1],
                                   "output": "2", "output_ids": [2], "prediction": "2", "gold": "2", "correct": True,
                                   "num_tokens": 1, "forward_passes": 1})):
        assert cls.from_json(doc).to_json() == doc
        with pytest.raises(ValueError, match=f"{cls.__name__}.from_json: unknown key 'new_metric'"):
            cls.from_json({**doc, "new_metric": 1.0})
    with pytest.raises(ValueError, match="Report.from_json: unknown key 'extra'"):
        Report.from_json({"extra": 1})


def test_composed_sections_reach_the_side_runs():
    """The drafter's and the draft model's optimizers are `--set` keys of their sections (their defaults:
    Uno's AdamW at 2e-3 / 3e-3, 20 warmup steps, cosine, no weight decay, whatever the base's `optim`),
    the trainer's sections are one RunConfig, and a former flat key is an error naming its new place."""
    import types

    from zarya_jax.config import ConfigError, PromptFormat
    from zarya_jax.train.optim import OptimConfig

    base = types.SimpleNamespace(tokenizer_spec="byte", prompt_format=PromptFormat(), config=TINY)
    config = default_config()
    drafter = stages.drafter_config(config.drafter, config.trainer, base, "train.jsonl")
    run = drafter.run_config(TINY)  # what the loop trains: the section's steps, batch and optimizer
    assert run.optim == OptimConfig(lr=2e-3, warmup_steps=20, schedule="cosine", weight_decay=0.0) != config.optim
    assert (drafter.drafter.lora.rank, drafter.drafter.lora.alpha, drafter.drafter.objective.ce_weight) == (16, 32.0, 1.0)
    assert (run.train.steps, run.data.batch_size, run.data.train) == (400, 8, ("train.jsonl",))
    assert config.trainer.optim is config.optim and config.trainer.model is config.model
    changed = overrides.apply(config, {"drafter.optim.weight_decay": 0.1, "draft_model.optim.lr": 1e-4,
                                       "draft_model.objective.loss": "ntp", "optim.weight_decay": 0.2})
    drafter = stages.drafter_config(changed.drafter, changed.trainer, base, "train.jsonl")
    assert drafter.run_config(TINY).optim.weight_decay == 0.1 and drafter.drafter.optim.lr == 2e-3
    draft = stages.draft_model_config(changed.draft_model, changed.trainer, base, "t.jsonl")
    model = draft.draft_model.size(TINY, changed.drafter.lora)
    run = draft.run_config(model, objective="ar")
    assert run.optim.lr == 1e-4 and run.optim.weight_decay == 0.0 and draft.draft_model.objective.loss == "ntp"
    assert run.train.objective == "ar" and run.train.export_final and run.model.num_layers <= TINY.num_layers
    # the sections are the command lines' own: one class each, hashable, equal configs hash equal
    assert hash(changed) == hash(overrides.apply(default_config(), {
        "drafter.optim.weight_decay": 0.1, "draft_model.optim.lr": 1e-4, "draft_model.objective.loss": "ntp",
        "optim.weight_decay": 0.2})) and hash(changed) != hash(config)
    assert {config: 1}[default_config()] == 1  # a dict key, e.g. a cache of one compile per config
    # a composed section's own check names the key the user wrote, not the section's local name
    for key, value, says in (("drafter.optim.lr", -1, "drafter.optim.lr=-1.0"), ("drafter.lora.rank", 0, "drafter.lora.rank=0"),
                             ("draft_model.objective.ce_weight", -1, "draft_model.objective.ce_weight=-1.0"),
                             ("drafter.dcd.passes", 1, "drafter.dcd.passes=1")):
        with pytest.raises(ConfigError, match="^" + re.escape(says)):
            overrides.apply(config, {key: value})
    # a config as report.json records it reads back as the same config (every default settable)
    for c in (config, overrides.apply(changed, {"drafter.task_seed": 5}), overrides.apply(config, ["drafter.task_seed=null"])):
        assert overrides.build(ExperimentConfig, json.loads(json.dumps(overrides.to_dict(c)))) == c
    for old, new in (("drafter.lr", "drafter.optim.lr"), ("drafter.rank", "drafter.lora.rank"),
                     ("drafter.objective", "drafter.objective.objective"), ("draft_model.loss", "draft_model.objective.loss")):
        with pytest.raises(ConfigError, match=f"'{old}' has moved: it is now '{new}'"):
            overrides.apply(config, {old: "dcd" if old.endswith("objective") else 1})
