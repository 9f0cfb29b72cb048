"""Converters both ways on real (tiny, random) Hugging Face Qwen3 directories: bit-identical round
trips, sharded safetensors, the mask token (docs/algorithms.md §1), transformers loading the export, bad input."""
import contextlib
import copy
import glob
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen3ForCausalLM

from conversion import hf_to_jax, jax_to_hf
from test_model_parity import convert, hf_logits, make_hf_model
from zarya_jax import checkpoint
from zarya_jax.config import ZaryaConfig, from_hf_dict
from zarya_jax.data.tokenizer import HFTokenizer
from zarya_jax.nn import hf_params

REPO = Path(__file__).resolve().parents[1]
VOCAB, TOKENIZER_VOCAB = 96, 80  # like Qwen3, the model's vocab is larger than the tokenizer's


def make_tokenizer(directory) -> None:
    """A word-level tokenizer w0…w77, <unk>, <eos> (ids 0–79)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(TOKENIZER_VOCAB - 2)}
    vocab.update({"<unk>": TOKENIZER_VOCAB - 2, "<eos>": TOKENIZER_VOCAB - 1})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(directory)


def st_tensors(directory) -> dict[str, np.ndarray]:
    """Every tensor of every safetensors file in a directory, read by the safetensors library."""
    out = {}
    for file in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        out.update(safetensors.numpy.load_file(file))
    return out


def assert_same_bits(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


def export(ckpt, out, *flags) -> str:
    assert jax_to_hf.main(["--ckpt", str(ckpt), "--out", str(out), *flags]) == 0
    return str(out)


def loaded(path) -> dict:
    params, _ = checkpoint.load(path)
    return {"/".join(p): np.asarray(v) for p, v in hf_params.leaves(params)}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("conversion")


@pytest.fixture(scope="module")
def hf_model():
    return make_hf_model(11, vocab=VOCAB, tie=False, head_dim=10)


@pytest.fixture(scope="module")
def hf_dir(hf_model, work):
    directory = work / "hf"
    hf_model.save_pretrained(directory)
    make_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def ckpt(hf_dir, work):
    return convert(hf_dir, work / "ckpt")


def test_round_trip_is_bit_identical(hf_dir, ckpt, work):
    out = export(ckpt, work / "rt")
    assert_same_bits(st_tensors(out), st_tensors(hf_dir))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (Path(out) / name).read_bytes() == (hf_dir / name).read_bytes()


def test_bf16_round_trip_is_bit_identical(hf_model, work):
    hf = work / "hf_bf16"
    copy.deepcopy(hf_model).to(torch.bfloat16).save_pretrained(hf)
    ck = convert(hf, work / "ckpt_bf16")
    assert checkpoint.load_config(ck).param_dtype == "bfloat16"
    assert_same_bits(st_tensors(export(ck, work / "rt_bf16")), st_tensors(hf))


def test_export_loads_in_transformers_with_same_logits(hf_model, ckpt, work):
    params, config = checkpoint.load(ckpt)
    config = config.replace(mask_token_id=5, eos_token_id=95)
    zarya = ZaryaConfig(alpha0=0.5, slot_size_set=(4, 8), slot_step_borders=(0.5, 1.0))
    ck = checkpoint.save(work / "ckpt_zarya", params, config, zarya)
    out = export(ck, work / "hf_zarya")
    m = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")  # as the reference
    assert type(m) is Qwen3ForCausalLM
    tokens = np.random.default_rng(3).integers(0, VOCAB, (2, 11))
    np.testing.assert_array_equal(hf_logits(m.eval(), tokens), hf_logits(hf_model, tokens))
    hf_config = json.loads((Path(out) / "config.json").read_text())
    assert hf_config["mask_token_id"] == 5 and hf_config["zarya"]["alpha0"] == 0.5
    assert from_hf_dict(hf_config) == (config, zarya)
    assert json.loads((Path(out) / "generation_config.json").read_text())["eos_token_id"] == 95


def test_sharded_safetensors_read_and_written(hf_model, hf_dir, ckpt, work):
    sharded = work / "hf_sharded"
    hf_model.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists() and len(list(sharded.glob("*.safetensors"))) > 1
    ck = convert(sharded, work / "ckpt_sharded")
    a, b = loaded(ck), loaded(ckpt)
    assert_same_bits(a, b)

    out = Path(export(ckpt, work / "out_sharded", "--max-shard-size", "20KB"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(out.glob("*.safetensors"))
    assert len(files) > 1 and set(index["weight_map"].values()) == {f.name for f in files}
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in st_tensors(out).values())
    assert_same_bits(st_tensors(out), st_tensors(hf_dir))
    m = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")  # as the reference
    tokens = np.random.default_rng(4).integers(0, VOCAB, (1, 7))
    np.testing.assert_array_equal(hf_logits(m.eval(), tokens), hf_logits(hf_model, tokens))


def test_add_mask_token_takes_the_first_unused_row_untied(hf_model, hf_dir, work):
    """The embedding has 96 rows for 80 tokens: <mdm_mask> takes row 80, the vocabulary stays 96, and row
    80 (and the head's column 80) becomes the mean of the 80 tokens' rows; every other row is HF's."""
    mask = TOKENIZER_VOCAB
    ck = convert(hf_dir, work / "ckpt_mask", "--add-mask-token")
    params, config = checkpoint.load(ck)
    assert config.vocab_size == VOCAB and config.mask_token_id == mask
    embed_hf = hf_model.model.embed_tokens.weight.detach().numpy()
    head_hf = hf_model.lm_head.weight.detach().numpy()
    embed, head = np.asarray(params["embed"]), np.asarray(params["lm_head"])
    assert embed.shape == embed_hf.shape and head.shape == head_hf.T.shape
    others = np.arange(VOCAB) != mask
    np.testing.assert_array_equal(embed[others], embed_hf[others])
    np.testing.assert_array_equal(head[:, others], head_hf.T[:, others])
    np.testing.assert_allclose(embed[mask], embed_hf[:mask].astype(np.float64).mean(0), atol=1e-7, rtol=0)
    np.testing.assert_allclose(head[:, mask], head_hf[:mask].astype(np.float64).mean(0), atol=1e-7, rtol=0)
    # The tokenizer stored with the checkpoint knows the token under the same id.
    tok = HFTokenizer(checkpoint.tokenizer_dir(ck))
    assert tok.mask_id == mask
    assert tok.encode("w3 <mdm_mask> w4") == [3, mask, 4]
    # …and so does the exported directory, which transformers loads with the vocabulary unchanged.
    out = export(ck, work / "hf_mask")
    m = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")  # as the reference
    assert m.config.vocab_size == VOCAB and m.config.mask_token_id == mask
    assert AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("<mdm_mask>") == mask


def test_add_mask_token_appends_without_a_tokenizer_then_not_twice(work):
    """No tokenizer says which rows are unused: a row is appended (the mean of all rows)."""
    m = make_hf_model(12, vocab=VOCAB, tie=True)
    m.save_pretrained(work / "hf_tied")
    ck = convert(work / "hf_tied", work / "ckpt_tied_mask", "--add-mask-token")
    params, config = checkpoint.load(ck)
    assert "lm_head" not in params and config.mask_token_id == VOCAB and config.vocab_size == VOCAB + 1
    embed_hf = m.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(np.asarray(params["embed"])[:VOCAB], embed_hf)
    np.testing.assert_allclose(np.asarray(params["embed"])[VOCAB], embed_hf.astype(np.float64).mean(0),
                               atol=1e-7, rtol=0)
    # The export records mask_token_id, so converting it again adds no second row.
    again = convert(export(ck, work / "hf_tied_mask"), work / "ckpt_tied_again", "--add-mask-token")
    config_again = checkpoint.load_config(again)
    assert config_again.vocab_size == VOCAB + 1 and config_again.mask_token_id == VOCAB


def test_add_mask_token_appends_when_every_row_has_a_token(work):
    m = make_hf_model(13, vocab=TOKENIZER_VOCAB, tie=True)
    m.save_pretrained(work / "hf_full")
    make_tokenizer(work / "hf_full")
    config = checkpoint.load_config(convert(work / "hf_full", work / "ckpt_full_mask", "--add-mask-token"))
    assert config.vocab_size == TOKENIZER_VOCAB + 1 and config.mask_token_id == TOKENIZER_VOCAB


def test_add_mask_token_keeps_qwen3s_151936_rows(work, qwen3_tokenizer_dir):
    """A tiny random Qwen3 with Qwen3's embedding size and tokenizer (151669 tokens, added ones
    included): <mdm_mask> gets id 151669 = len(tokenizer), and the vocabulary stays 151936 = 2^7·1187,
    which every power-of-two tensor axis up to 128 divides (151937 is prime)."""
    from zarya_jax.data.tokenizer import load_tokenizer

    vocab, tokens = 151936, 151669
    hf = work / "hf_qwen3_vocab"
    make_hf_model(14, vocab=vocab, hidden=8, inter=8, layers=1, heads=2, kv_heads=1, head_dim=4,
                  tie=True).save_pretrained(hf)
    for name in os.listdir(qwen3_tokenizer_dir):
        shutil.copy(os.path.join(qwen3_tokenizer_dir, name), hf / name)
    ck = convert(hf, work / "ckpt_qwen3_vocab", "--add-mask-token")
    params, config = checkpoint.load(ck)
    assert (config.vocab_size, config.mask_token_id) == (vocab, tokens) and params["embed"].shape[0] == vocab
    hf_tok = AutoTokenizer.from_pretrained(checkpoint.tokenizer_dir(ck), local_files_only=True)
    assert len(hf_tok) == tokens + 1 and hf_tok.convert_tokens_to_ids("<mdm_mask>") == tokens  # len: 151669 before
    assert load_tokenizer(checkpoint.tokenizer_dir(ck)).mask_id == tokens
    # every other token keeps its id (Qwen3's added tokens 151643…151668 right below the mask), also after the
    # tokenizer is saved again (as a trained checkpoint saves it)
    want = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir, local_files_only=True).get_vocab()
    assert hf_tok.get_vocab() == {**want, "<mdm_mask>": tokens}
    chat = "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think><mdm_mask>"
    assert hf_tok.encode(chat) == [151644, 872, 198, 6023, 151645, 198, 151667, 271, 151668, tokens]
    hf_tok.save_pretrained(work / "tok_saved_again")
    again = AutoTokenizer.from_pretrained(work / "tok_saved_again", local_files_only=True)
    assert again.get_vocab() == hf_tok.get_vocab() and again.encode(chat) == hf_tok.encode(chat)


def test_mask_token_that_would_move_other_ids_is_not_added(work, qwen3_tokenizer_dir, capsys):
    """Past the first free id, <mdm_mask> would have to enter the BPE vocabulary, which moves Qwen3's added
    tokens by one: the tokenizer is left as it is, with a note."""
    from conversion.mask_token import register_mask_token

    tok = work / "qwen3_tok_copy"
    shutil.copytree(qwen3_tokenizer_dir, tok)
    before = {n: (tok / n).read_bytes() for n in os.listdir(tok)}
    capsys.readouterr()
    assert not register_mask_token(str(tok), 151700)
    assert "would change other ids" in capsys.readouterr().err
    assert {n: (tok / n).read_bytes() for n in os.listdir(tok)} == before


# ---------------------------------------------------------------- export like the source


def test_bf16_model_exports_bf16_and_loads_as_bf16(hf_model, ckpt, work, capsys):
    """A model computed in bfloat16 over float32 params (as training leaves it) exports bfloat16 by default:
    each weight is torch's own round-to-nearest-even of the float32 one, config.json says so, and transformers
    loads bfloat16 weights; --dtype float32 keeps the params exact."""
    params, config = checkpoint.load(ckpt)
    ck = checkpoint.save(work / "ckpt_bf16_compute", params, config.replace(dtype="bfloat16"),
                         tokenizer=checkpoint.tokenizer_dir(ckpt))
    capsys.readouterr()
    out = Path(export(ck, work / "hf_bf16_export"))
    assert "rounded to bfloat16" in capsys.readouterr().err
    tensors = st_tensors(out)
    assert {t.dtype.name for t in tensors.values()} == {"bfloat16"}
    reference = {k: v.to(torch.bfloat16).view(torch.int16).numpy() for k, v in hf_model.state_dict().items()}
    for name, t in tensors.items():  # bit for bit torch's cast
        np.testing.assert_array_equal(t.view(np.int16), reference[name], err_msg=name)
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["torch_dtype"] == hf_config["dtype"] == "bfloat16"
    assert os.path.getsize(out / "model.safetensors") < os.path.getsize(work / "hf" / "model.safetensors") * 0.6
    m = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16} and m.config.dtype == torch.bfloat16
    tokens = np.random.default_rng(5).integers(0, VOCAB, (1, 7))
    bf16_ref = AutoModelForCausalLM.from_pretrained(work / "hf", dtype=torch.bfloat16, attn_implementation="eager")
    np.testing.assert_array_equal(hf_logits(m.eval(), tokens), hf_logits(bf16_ref.eval(), tokens))
    exact = Path(export(ck, work / "hf_bf16_as_f32", "--dtype", "float32"))
    assert_same_bits(st_tensors(exact), st_tensors(work / "hf"))
    assert json.loads((exact / "config.json").read_text())["torch_dtype"] == "float32"


def test_export_dtype_flag_float16(ckpt, work):
    out = Path(export(ckpt, work / "hf_f16", "--dtype", "float16"))
    assert {t.dtype.name for t in st_tensors(out).values()} == {"float16"}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
    m = AutoModelForCausalLM.from_pretrained(out)
    assert {p.dtype for p in m.parameters()} == {torch.float16}


def test_outputs_new_parents_and_empty_directories(hf_dir, ckpt, tmp_path):
    """`--out a/b/c` when a/ does not exist; an existing empty directory is taken (`mkdir -p` first is fine),
    a non-empty one refused naming it."""
    deep = tmp_path / "hf" / "q06"
    export(ckpt, deep)
    assert (deep / "config.json").is_file() and (deep / "tokenizer.json").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    export(ckpt, empty)
    assert (empty / "model.safetensors").is_file()
    empty_ckpt = tmp_path / "ckpts" / "empty"
    empty_ckpt.mkdir(parents=True)
    convert(hf_dir, empty_ckpt)
    assert checkpoint.load_config(empty_ckpt).vocab_size == VOCAB
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    assert_fails(jax_to_hf.main, ["--ckpt", ckpt, "--out", taken], str(taken), "not an empty directory")
    assert_fails(hf_to_jax.main, ["--hf-dir", hf_dir, "--out", taken], str(taken), "not an empty directory")
    assert os.listdir(taken) == ["keep.txt"]


def test_failed_export_leaves_the_empty_directory(ckpt, tmp_path):
    """A failure while writing (here a param that does not match its recorded checksum) leaves the empty
    --out directory as it was, and nothing beside it."""
    damaged = tmp_path / "damaged"
    shutil.copytree(ckpt, damaged)
    sums = json.loads((damaged / "checksums.json").read_text())
    sums["arrays"]["['final_norm']['scale']"]["sum"] = "0" * 16
    (damaged / "checksums.json").write_text(json.dumps(sums))
    empty = tmp_path / "out" / "empty"
    empty.mkdir(parents=True)
    assert_fails(jax_to_hf.main, ["--ckpt", damaged, "--out", empty], "damaged")
    assert empty.is_dir() and os.listdir(empty) == [] and os.listdir(empty.parent) == ["empty"]


def test_bos_token_id_survives_the_round_trip(hf_dir, work):
    hf = work / "hf_bos"
    shutil.copytree(hf_dir, hf)
    config = json.loads((hf / "config.json").read_text())
    config["bos_token_id"] = 7
    (hf / "config.json").write_text(json.dumps(config))
    ck = convert(hf, work / "ckpt_bos")
    assert checkpoint.load_config(ck).bos_token_id == 7
    out = Path(export(ck, work / "hf_bos_back"))
    assert json.loads((out / "config.json").read_text())["bos_token_id"] == 7
    assert json.loads((out / "generation_config.json").read_text())["bos_token_id"] == 7
    assert AutoModelForCausalLM.from_pretrained(out).config.bos_token_id == 7


# ---------------------------------------------------------------- the tokenizer travels with the checkpoint


def test_export_registers_the_mask_token_in_a_tokenizer_without_it(ckpt, work):
    """A checkpoint with a mask id whose tokenizer lacks `<mdm_mask>` (trained with the Hugging Face folder
    as its tokenizer): the export's tokenizer has it at the model's id; the checkpoint is not modified."""
    params, config = checkpoint.load(ckpt)
    ck = checkpoint.save(work / "ckpt_mask_untold", params, config.replace(mask_token_id=90),
                         tokenizer=checkpoint.tokenizer_dir(ckpt))
    out = export(ck, work / "hf_mask_untold")
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids("<mdm_mask>") == 90 and tok.encode("w3 <mdm_mask>") == [3, 90]
    assert HFTokenizer(out).mask_id == 90
    assert HFTokenizer(checkpoint.tokenizer_dir(ck)).mask_id is None
    checkpoint.load(ck)  # still matches its checksums


def test_no_hugging_face_tokenizer_is_said(work, ckpt, capsys):
    from zarya_jax.data.tokenizer import ByteTokenizer

    params, config = checkpoint.load(ckpt)
    ck = checkpoint.save(work / "ckpt_byte_tok", params, config, tokenizer=ByteTokenizer())
    capsys.readouterr()
    out = Path(export(ck, work / "hf_byte_tok"))
    assert "no Hugging Face tokenizer" in capsys.readouterr().err
    assert not any((out / n).exists() for n in ("tokenizer.json", "zarya_tokenizer.json"))
    bare = work / "hf_no_tok"
    make_hf_model(15, vocab=VOCAB).save_pretrained(bare)
    convert(bare, work / "ckpt_no_tok")
    assert "has no tokenizer files" in capsys.readouterr().err
    assert checkpoint.tokenizer_dir(work / "ckpt_no_tok") is None


def test_converters_report_progress(hf_dir, ckpt, tmp_path, capsys):
    """Lines on stderr, not silence: what is converted, then bytes done / total, the last at 100%."""
    capsys.readouterr()
    convert(hf_dir, tmp_path / "c")
    export(ckpt, tmp_path / "h")
    err = capsys.readouterr().err.splitlines()
    for label, unit in (("hf_to_jax", "params"), ("jax_to_hf", "tensors")):
        lines = [line for line in err if line.startswith(f"{label}: ")]
        assert "params (" in lines[0] and " into " in lines[0], lines
        assert "(100%)" in lines[-1] and f" {unit}, " in lines[-1], lines
        assert len(lines) <= 4, lines  # a tiny model: the first update and the last, nothing per tensor


def test_missing_mask_token_errors_name_the_remedy(ckpt):
    """Every refusal of a model without a mask token says how to get one: re-convert with --add-mask-token
    (the objectives, the decoders and their checks, the adapters' mask noise, evaluation)."""
    import jax

    from zarya_jax.config import ConfigError, LoraConfig
    from zarya_jax.eval.diagnose import teacher_forced
    from zarya_jax.eval.evaluate import check_mask_token
    from zarya_jax.lora import noise_tokens
    from zarya_jax.objectives.dcd import DcdConfig, dcd_objective
    from zarya_jax.objectives.drafter import DrafterConfig, drafter_objective
    from zarya_jax.objectives.losses import mask_id_of
    from zarya_jax.sampling import spec
    from zarya_jax.sampling.config import GenerationConfig

    config = checkpoint.load_config(ckpt)
    assert config.mask_token_id is None
    remedy = "python -m conversion.hf_to_jax --hf-dir HF_DIR --out CKPT --add-mask-token"
    mask_noise = LoraConfig(noise="mask")
    refusals = {
        "zarya objective": lambda: mask_id_of(config),
        "teacher-forced accuracy": lambda: teacher_forced(None, config, [([1, 2], [3])], slot_size=1),
        "drafter objective": lambda: drafter_objective(config, mask_noise, DrafterConfig()),
        "dcd objective": lambda: dcd_objective(config, mask_noise, DrafterConfig(), DcdConfig(), 10),
        "mask noise": lambda: noise_tokens(jax.random.PRNGKey(0), (2,), config.vocab_size, None, "mask"),
        "mask-noise adapter": lambda: spec.check(config, GenerationConfig(mode="spec-lora"), {}, mask_noise),
        "evaluate": lambda: check_mask_token({"mdm": GenerationConfig(mode="mdm")}, config, str(ckpt)),
        **{f"mode {mode}": (lambda mode=mode: GenerationConfig(mode=mode).validate(config))
           for mode in ("mdm", "slotted")},
        "self drafter": lambda: GenerationConfig(mode="spec-self").validate(config),
        "self drafter, fused": lambda: GenerationConfig(mode="spec-self-fused").validate(config),
    }
    for what, refuse in refusals.items():
        with pytest.raises(ValueError, match="mask_token_id is None") as e:
            refuse()
        assert remedy in str(e.value), what
    # decoders that read no mask token pass
    for gen in (GenerationConfig(mode="ar"), GenerationConfig(mode="spec-lora")):
        assert not gen.needs_mask_token
        gen.validate(config)
    check_mask_token({"ar": GenerationConfig(mode="ar")}, config, str(ckpt))
    with pytest.raises(ConfigError, match=f"modes mdm, slotted need a mask token, but the checkpoint '{ckpt}'"):
        check_mask_token({m: GenerationConfig(mode=m) for m in ("ar", "mdm", "slotted")}, config, str(ckpt))


# ---------------------------------------------------------------- bad input


def assert_fails(main, argv, *fragments):
    """The CLI exits with status 2 and one line 'error: …' naming the problem, and leaves no output behind."""
    out = Path(argv[argv.index("--out") + 1])
    before = set(os.listdir(out.parent)) if out.parent.exists() else set()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1, err.getvalue()
    message = errors[0]
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    if out.parent.exists():
        assert set(os.listdir(out.parent)) == before  # no output, no temp dir left


@pytest.fixture()
def bad(hf_dir, tmp_path):
    """A fresh copy of the good HF directory to break."""
    shutil.copytree(hf_dir, tmp_path / "hf")
    return tmp_path / "hf"


def test_missing_directory_and_config(bad, tmp_path):
    assert_fails(hf_to_jax.main, ["--hf-dir", tmp_path / "nope", "--out", tmp_path / "o"], "is not a directory")
    (bad / "config.json").unlink()
    assert_fails(hf_to_jax.main, ["--hf-dir", bad, "--out", tmp_path / "o"], "config.json", "not found")


def test_unreadable_config_and_weights(bad, tmp_path):
    config = (bad / "config.json").read_text()
    (bad / "config.json").write_text(config[: len(config) // 2])
    assert_fails(hf_to_jax.main, ["--hf-dir", bad, "--out", tmp_path / "o"], "cannot read model config")
    (bad / "config.json").write_text(config)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_fails(hf_to_jax.main, ["--hf-dir", bad, "--out", tmp_path / "o"], "cannot read safetensors file")
    weights.unlink()
    assert_fails(hf_to_jax.main, ["--hf-dir", bad, "--out", tmp_path / "o"], "no weights in")


def test_other_architecture_lists_supported(bad, tmp_path):
    config = json.loads((bad / "config.json").read_text())
    config.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (bad / "config.json").write_text(json.dumps(config))
    assert_fails(hf_to_jax.main, ["--hf-dir", bad, "--out", tmp_path / "o"],
                 "unsupported architecture", "LlamaForCausalLM", "Qwen3ForCausalLM")


def test_shape_mismatch_names_tensor(bad, tmp_path):
    config = json.loads((bad / "config.json").read_text())
    config["intermediate_size"] = 40
    (bad / "config.json").write_text(json.dumps(config))
    assert_fails(hf_to_jax.main, ["--hf-dir", bad, "--out", tmp_path / "o"],
                 "model.layers.0.mlp.gate_proj.weight", "(48, 32)", "(40, 32)")


def test_pickle_only_refused_unless_allowed(hf_model, ckpt, bad, tmp_path):
    (bad / "model.safetensors").unlink()
    torch.save(hf_model.state_dict(), bad / "pytorch_model.bin")
    assert_fails(hf_to_jax.main, ["--hf-dir", bad, "--out", tmp_path / "o"], "pytorch_model.bin", "--allow-pickle")
    allowed = convert(bad, tmp_path / "o", "--allow-pickle")
    assert_same_bits(loaded(allowed), loaded(ckpt))


def test_existing_output_is_untouched(hf_dir, ckpt, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    assert_fails(hf_to_jax.main, ["--hf-dir", hf_dir, "--out", taken], "already exists")
    assert_fails(jax_to_hf.main, ["--ckpt", ckpt, "--out", taken], "already exists")
    assert os.listdir(taken) == ["keep.txt"] and (taken / "keep.txt").read_text() == "mine"
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    assert_fails(jax_to_hf.main, ["--ckpt", ckpt, "--out", a_file], "not an empty directory")
    assert a_file.read_text() == "mine"


def test_jax_to_hf_bad_checkpoint_and_size(hf_dir, ckpt, tmp_path):
    assert_fails(jax_to_hf.main, ["--ckpt", tmp_path / "nope", "--out", tmp_path / "o"], "is not a directory")
    assert_fails(jax_to_hf.main, ["--ckpt", hf_dir, "--out", tmp_path / "o"], "is not a zarya_jax checkpoint")
    assert_fails(jax_to_hf.main, ["--ckpt", ckpt, "--out", tmp_path / "o", "--max-shard-size", "lots"],
                 "--max-shard-size 'lots'")


def test_cli_subprocess_exit_code(tmp_path):
    result = subprocess.run([sys.executable, "-m", "conversion.hf_to_jax", "--hf-dir", str(tmp_path / "nope"),
                             "--out", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --hf-dir")
    assert not (tmp_path / "o").exists()
