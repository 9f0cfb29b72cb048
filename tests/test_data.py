"""grain data pipelines: records, tokenization, over-length policy, padding/packing, shuffling, host
split and iterator state. References: plain Python/NumPy written here and `zarya_jax.data.batch.make_batch`."""
import json

import numpy as np
import pytest

from zarya_jax.data import pipeline as D
from zarya_jax.data.batch import make_batch
from zarya_jax.data.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def _write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def _records(n):
    return [{"prompt": f"q{i}:", "answer": "a" * (1 + i % 5)} for i in range(n)]


def _examples(n):
    cfg = D.DataConfig(train=("x.jsonl",), max_length=16)
    return D.tokenize(_records(n), TOK, cfg)[0]


def test_records_and_tokens(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"prompt": "hi ", "answer": "yo"},
                                          {"messages": [{"role": "user", "content": "x"},
                                                        {"role": "assistant", "content": "y"}]}])
    cfg = D.DataConfig(train=(path,), max_length=64)
    splits = D.load_splits(cfg, TOK)
    (p0, a0), (p1, a1) = splits.train
    assert p0.tolist() == list(b"hi ") and a0.tolist() == list(b"yo") + [TOK.eos_id]
    assert p1.tolist() == list(b"user: x\nassistant: ") and a1.tolist() == list(b"y") + [TOK.eos_id]
    assert splits.stats["truncated"] == 0 and splits.stats["dropped"] == 0


def test_malformed_fail_names_line_and_skip_counts(tmp_path):
    rows = [{"prompt": "a", "answer": "b"}, "{not json", {"prompt": "a"}, {"messages": [{"role": "user",
            "content": "x"}]}, {"prompt": "c", "answer": "d"}]
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(D.DataError, match=r"bad.jsonl:2: malformed"):
        D.read_records([path], "fail")
    recs, stats = D.read_records([path], "skip")
    assert len(recs) == 2 and stats["malformed_skipped"] == 3


def test_missing_file_and_empty():
    with pytest.raises(D.DataError, match="does not exist"):
        D.read_records(["/nonexistent/train.jsonl"])
    with pytest.raises(D.DataError, match="no data files"):
        D.read_records([])


def test_over_length_truncate_and_drop():
    recs = [{"prompt": p, "answer": a} for p, a in (("abcd", "0123456789"), ("p" * 9, "x"), ("ab", "cd"))]
    kept, stats = D.tokenize(recs, TOK, D.DataConfig(max_length=8))
    # 1st: answer cut to 8-4 = 4 tokens; 2nd: prompt leaves no room -> dropped; 3rd fits (2+3).
    assert [len(p) + len(a) for p, a in kept] == [8, 5]
    assert kept[0][1].tolist() == list(b"0123")
    assert stats == {"truncated": 1, "dropped": 1}
    kept, stats = D.tokenize(recs, TOK, D.DataConfig(max_length=8, over_length="drop"))
    assert len(kept) == 1 and stats == {"truncated": 0, "dropped": 2}


def test_padded_batches_match_make_batch():
    ex = _examples(6)
    cfg = D.DataConfig(max_length=16, batch_size=3, seed=1)
    ds = D.make_dataset(ex, cfg, local_batch=3, pad_id=TOK.pad_id, train=False)
    b = next(iter(ds))
    ref = make_batch(ex[:3], 16, TOK.pad_id)
    for k in ref:
        np.testing.assert_array_equal(b[k], ref[k])
    # hand-written expectation for row 0: "q0:" + "a" + EOS
    assert b["tokens"][0, :5].tolist() == list(b"q0:a") + [TOK.eos_id]
    assert b["segment_ids"][0].tolist() == [1] * 5 + [0] * 11
    assert b["answer_mask"][0, :6].tolist() == [False, False, False, True, True, False]


def _decode_rows(batch):
    """Examples (as token tuples) found in packed rows, checking positions restart per segment."""
    out = []
    for toks, seg, pos, ans in zip(batch["tokens"], batch["segment_ids"], batch["positions"], batch["answer_mask"]):
        for s in sorted(set(seg.tolist()) - {0}):
            idx = np.flatnonzero(seg == s)
            assert idx.tolist() == list(range(idx[0], idx[-1] + 1))  # contiguous
            assert pos[idx].tolist() == list(range(len(idx)))
            n_prompt = int((~ans[idx]).sum())
            assert not ans[idx][:n_prompt].any() and ans[idx][n_prompt:].all()  # prompt then answer
            out.append((tuple(toks[idx][:n_prompt].tolist()), tuple(toks[idx][n_prompt:].tolist())))
        assert (toks[seg == 0] == TOK.pad_id).all() and not ans[seg == 0].any()
    return out


def test_packing_keeps_every_example_once():
    ex = _examples(12)
    cfg = D.DataConfig(max_length=16, batch_size=2, pack=True, num_epochs=1)
    ds = D.make_dataset(ex, cfg, local_batch=2, pad_id=TOK.pad_id, train=True)
    found = []
    for b in ds:
        assert b["tokens"].shape == (2, 16)
        found += _decode_rows(b)
    want = sorted((tuple(p.tolist()), tuple(a.tolist())) for p, a in ex)
    # drop_remainder may hold back at most one partial batch of rows
    assert set(found) <= set(want) and len(found) >= len(want) - 3
    assert max(np.bincount([want.index(f) for f in found])) == 1


def _epoch_order(ds_iter, n_batches):
    return [tuple(b["tokens"][:, 1].tolist()) for b in D.take(ds_iter, n_batches)]


def test_shuffle_deterministic_and_reshuffled_per_epoch():
    ex = _examples(8)
    cfg = D.DataConfig(max_length=16, batch_size=4, seed=3)
    run = lambda: [t for b in _epoch_order(iter(D.make_dataset(ex, cfg, local_batch=4, pad_id=TOK.pad_id)), 4)
                   for t in b]
    a, b = run(), run()
    assert a == b
    first, second = a[:8], a[8:]
    ids = sorted(int(p[1]) for p, _ in ex)  # second prompt byte is the digit of 'q<i>:'
    assert sorted(first) == ids and sorted(second) == ids and first != second


def test_hosts_get_disjoint_shards():
    ex = _examples(8)
    cfg = D.DataConfig(max_length=16, batch_size=2, num_epochs=1)
    seen = []
    for host in range(2):
        ds = D.make_dataset(ex, cfg, local_batch=2, pad_id=TOK.pad_id, process_index=host, process_count=2)
        seen.append({tuple(r.tolist()) for b in ds for r in b["tokens"]})
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 8


@pytest.mark.parametrize("pack", [False, True])
def test_iterator_state_restores_position(pack):
    ex = _examples(10)
    cfg = D.DataConfig(max_length=16, batch_size=2, seed=5, pack=pack)
    it = iter(D.make_dataset(ex, cfg, local_batch=2, pad_id=TOK.pad_id))
    D.take(it, 3)
    state = json.loads(json.dumps(it.get_state()))  # what the checkpoint stores
    expected = D.take(it, 7)
    it2 = iter(D.make_dataset(ex, cfg, local_batch=2, pad_id=TOK.pad_id))
    it2.set_state(state)
    for a, b in zip(expected, D.take(it2, 7)):
        np.testing.assert_array_equal(a["tokens"], b["tokens"])


def test_eval_fraction_split(tmp_path):
    path = _write(tmp_path / "d.jsonl", _records(20))
    s = D.load_splits(D.DataConfig(train=(path,), max_length=16, eval_fraction=0.25), TOK)
    assert len(s.train) == 15 and len(s.eval) == 5
    assert s.eval[0][0].tolist() == list(b"q15:")


def test_chat_template_of_hf_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<pad>", "<eos>", "<mdm_mask>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz:|> "))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    hf.chat_template = "{% for m in messages %}|{{ m['role'] }}>{{ m['content'] }}{% endfor %}" \
                       "{% if add_generation_prompt %}|assistant>{% endif %}"
    hf.save_pretrained(tmp_path / "tok")
    from zarya_jax.data.tokenizer import load_tokenizer
    tok = load_tokenizer(str(tmp_path / "tok"))
    path = _write(tmp_path / "d.jsonl", [{"prompt": "hi", "answer": "yo"}])
    (p, a), = D.load_splits(D.DataConfig(train=(path,), tokenizer=str(tmp_path / "tok"), max_length=64), tok).train
    assert p.tolist() == [vocab[c] for c in "|user>hi|assistant>"]
    assert a.tolist() == [vocab["y"], vocab["o"], vocab["<eos>"]]
