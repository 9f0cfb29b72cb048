"""One prompt rendering (`zarya_jax.data.render`): training, `evaluate` and `generate` send the same token ids,
checked against the chat template rendered and tokenized by hand; GSM8K-style `question`/`answer` records train
and evaluate through the field mapping; the byte tokenizer's rendering is the raw text."""
import json

import pytest

from experiments import evaluate as evaluate_cli
from experiments import generate as generate_cli
from experiments import train as train_cli
from zarya_jax import checkpoint
from zarya_jax.config import ConfigError, PromptFormat
from zarya_jax.data import pipeline as D
from zarya_jax.data import render
from zarya_jax.data.tokenizer import ByteTokenizer, load_tokenizer
from zarya_jax.testing import CHAT_SPECIALS, chat_tokenizer

GSM = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
       {"question": "A box holds 6 pens; 2 are lost. Left?", "answer": "6-2=4\n#### 4"}]
FORMAT = dict(prompt_key="question", system="Solve it.", prompt_template="Q: {prompt}", enable_thinking=False)


def hand_ids(text: str, vocab: dict[str, int]) -> list[int]:
    """Character-level ids with the special tokens matched first (what the tokenizer must do)."""
    ids, i = [], 0
    while i < len(text):
        special = next((s for s in CHAT_SPECIALS if text.startswith(s, i)), None)
        ids.append(vocab[special or text[i]])
        i += len(special) if special else 1
    return ids


def qwen_prompt(question: str) -> str:
    """The Qwen3 chat template of the system turn and the templated user turn, by hand."""
    return (f"<|im_start|>system\nSolve it.<|im_end|>\n<|im_start|>user\nQ: {question}<|im_end|>\n"
            f"<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One AR training step on GSM8K-style records through a chat-template tokenizer, via the CLI."""
    d = tmp_path_factory.mktemp("render")
    vocab = chat_tokenizer(str(d / "tok"))
    data = d / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM))
    sets = {"data.train": str(data), "data.tokenizer": str(d / "tok"), "data.prompt_key": "question",
            "data.system": "Solve it.", "data.prompt_template": '"Q: {prompt}"', "data.enable_thinking": "false",
            "data.max_length": 128, "data.batch_size": 2, "data.eval_fraction": 0, "mesh.num_devices": 1, "train.objective": "ar", "train.steps": 1,
            "model.num_layers": 1, "train.save_every": 0, "train.eval_every": 0, "train.log_every": 1,
            "train.progress_bar": "false", "train.async_checkpointing": "false"}
    argv = ["--config", "tiny", "--workdir", str(d / "run")]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    assert train_cli.main(argv) == 0
    return {"dir": d, "vocab": vocab, "data": str(data), "ckpt": str(d / "run" / "final")}


def test_training_evaluate_and_generate_send_the_same_ids(run, tmp_path):
    vocab, ckpt = run["vocab"], run["ckpt"]
    expected = [hand_ids(qwen_prompt(r["question"]), vocab) for r in GSM]
    assert checkpoint.load_prompt_format(ckpt) == PromptFormat(**FORMAT)  # recorded by the training run

    tok = load_tokenizer(run["dir"] / "tok")
    splits = D.load_splits(D.DataConfig(train=(run["data"],), tokenizer=str(run["dir"] / "tok"), max_length=128,
                                        **FORMAT), tok)
    assert [p.tolist() for p, _ in splits.train] == expected
    assert [a.tolist() for _, a in splits.train] == [hand_ids(r["answer"], vocab) + [vocab["<|im_end|>"]] for r in GSM]

    # evaluate: no flags, the checkpoint's recorded format (GSM8K's field names included)
    out = tmp_path / "eval"
    assert evaluate_cli.main(["--ckpt", ckpt, "--data", run["data"], "--modes", "ar", "--max-new-tokens", "2",
                              "--out", str(out)]) == 0
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["prompt_ids"] for p in preds] == expected
    assert [p["gold"] for p in preds] == ["7", "4"]  # the GSM8K `####` line of the answer field
    assert json.loads((out / "summary.json").read_text())["prompt_format"]["prompt_key"] == "question"

    # generate: a bare prompt goes through the same rendering
    gen = tmp_path / "gen.jsonl"
    assert generate_cli.main(["--ckpt", ckpt, "--prompt", GSM[0]["question"], "--mode", "ar",
                              "--max-new-tokens", "2", "--output", str(gen)]) == 0
    assert json.loads(gen.read_text().splitlines()[0])["prompt_ids"] == expected[0]

    # a --format field changes the recorded format: plain text (system line, then the templated prompt)
    plain = tmp_path / "plain"
    assert evaluate_cli.main(["--ckpt", ckpt, "--data", run["data"], "--modes", "ar", "--max-new-tokens", "2",
                              "--format", "chat_template=false", "--out", str(plain)]) == 0
    first = json.loads((plain / "predictions.jsonl").read_text().splitlines()[0])
    assert first["prompt_ids"] == hand_ids("Solve it.\nQ: " + GSM[0]["question"], vocab)


def test_wrong_field_names_are_one_error_line(run, tmp_path, capsys):
    rc = evaluate_cli.main(["--ckpt", run["ckpt"], "--data", run["data"], "--prompt-key", "prompt",
                            "--modes", "ar", "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert "gsm.jsonl:1: expected text fields 'prompt' and 'answer'" in err and "--prompt-key" in err
    assert not (tmp_path / "e").exists()
    with pytest.raises(D.DataError, match=r"gsm.jsonl:1: malformed record: expected text fields 'prompt'"):
        D.read_records([run["data"]])
    with pytest.raises(ConfigError, match="prompt_template='{question}'"):
        PromptFormat(prompt_template="{question}")


def test_byte_tokenizer_renders_the_raw_text():
    tok = ByteTokenizer()
    assert render.render({"prompt": "Dee had 5 cups. ", "answer": "#### 5"}, tok) == ("Dee had 5 cups. ", "#### 5")
    chat = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}
    assert render.render(chat, tok) == ("user: x\nassistant: ", "y")
    fmt = PromptFormat(prompt_key="q", answer_key="a", system="S", prompt_template="Question: {prompt}\nAnswer:")
    assert render.render({"q": "2+2?", "a": "4"}, tok, fmt) == ("S\nQuestion: 2+2?\nAnswer:", "4")
    with pytest.raises(ValueError, match=r"field 'a' is a number \(4\); expected text"):  # not read as "4"
        render.render({"q": "2+2?", "a": 4}, tok, fmt)
    assert render.render(chat, tok, fmt) == ("system: S\nuser: x\nassistant: ", "y")
    assert render.render_prompt("hi", tok) == "hi"


def test_drafter_run_renders_like_its_base(run, tmp_path):
    from zarya_jax.train import drafter as drafter_run

    cfg = drafter_run.load_config("tiny", {"data.train": run["data"], "data.tokenizer": str(run["dir"] / "tok"),
                                           "data.max_length": 128, "data.eval_fraction": 0, "drafter.batch_size": 3})
    # The run stops at the batch check, after its data were read: GSM8K's `question` field was found through
    # the base checkpoint's recorded format (with the default format the records would be malformed).
    with pytest.raises(ConfigError, match="not divisible by the data-parallel size"):
        drafter_run.train_drafter(cfg, run["ckpt"], str(tmp_path / "drafter"))
