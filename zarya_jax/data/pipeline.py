"""Supervised data: JSONL records → tokenized (prompt, answer) examples → grain pipelines of fixed-shape
batches in the format of `zarya_jax.data.batch` (docs/algorithms.md §2–§3 train on prompt + answer, answer supervised).

Records, one JSON object per line: `{"prompt": str, "answer": str}` (other field names through
`prompt_key` / `answer_key`) or chat `{"messages": [{"role", "content"}, …]}` whose last message is the
assistant's answer, rendered by `zarya_jax.data.render` with the `PromptFormat` fields of `DataConfig`
(chat template, system message, prompt template): the same rendering evaluation and generation use.
EOS is appended to the answer.

Files are read, validated (line numbers in errors) and tokenized once at startup, so every error and
the over-length counts are known before any compute. Shuffling, epochs, host sharding, padding/packing
and batching are grain transformations; the grain iterator's state is saved in the checkpoint. The
global batches are the same whatever the number of hosts (`make_dataset`).

Batch (per host): tokens int32 [B, L]; segment_ids int32 [B, L] (1, 2, … per packed example, 0 = pad);
positions int32 [B, L] (logical, restarting at 0 in each example); answer_mask bool [B, L].
"""
from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

import grain
import numpy as np

from ..config import ConfigError, PromptFormat
from ..files import input_file_problem
from . import render
from .records import valid_records


class DataError(ValueError):
    """Bad data files or records."""


@dataclasses.dataclass(frozen=True)
class DataConfig(PromptFormat):
    """Where the data is and how it becomes batches. `batch_size` is global (all hosts). The fields of
    `PromptFormat` (`prompt_key`, `answer_key`, `prompt_template`, `chat_template`, `system`,
    `enable_thinking`) say how records are rendered; the trained checkpoint records them."""

    train: tuple[str, ...] = ()
    eval: tuple[str, ...] = ()
    eval_fraction: float = 0.0  # held out from the end of `train` when `eval` is empty
    tokenizer: str = "byte"  # 'byte', 'qwen3' (Qwen3's vocabulary, built offline) or a Hugging Face tokenizer directory
    add_eos: bool = True
    max_length: int = 256
    pack: bool = False
    over_length: str = "truncate"  # 'truncate' (cut the answer) or 'drop'
    on_malformed: str = "fail"  # 'fail' or 'skip'
    batch_size: int = 8
    seed: int = 0
    num_epochs: int = 0  # 0 = repeat forever
    read_threads: int = 2
    prefetch: int = 4

    def __post_init__(self):
        super().__post_init__()
        for name in ("train", "eval"):
            v = getattr(self, name)
            object.__setattr__(self, name, (v,) if isinstance(v, str) else tuple(v or ()))
        if self.over_length not in ("truncate", "drop"):
            raise ConfigError(f"data.over_length={self.over_length!r}: expected 'truncate' or 'drop'")
        if self.on_malformed not in ("fail", "skip"):
            raise ConfigError(f"data.on_malformed={self.on_malformed!r}: expected 'fail' or 'skip'")
        if self.max_length < 2:
            raise ConfigError(f"data.max_length={self.max_length}: expected ≥ 2")
        if self.batch_size < 1:
            raise ConfigError(f"data.batch_size={self.batch_size}: expected ≥ 1")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"data.eval_fraction={self.eval_fraction}: expected [0, 1)")
        if self.num_epochs < 0:
            raise ConfigError(f"data.num_epochs={self.num_epochs}: expected ≥ 0 (0 = forever)")


# ------------------------------------------------------------------ reading and tokenizing


def read_records(paths: Sequence[str], on_malformed: str = "fail",
                 fmt: PromptFormat = PromptFormat()) -> tuple[list[dict], dict]:
    """Parses JSONL files into records valid under `fmt` (`render.parse`). Returns (records,
    {'malformed_skipped': n}). Errors name file and line."""
    if not paths:
        raise DataError("no data files given (set data.train=PATH)")
    records, skipped = [], 0
    for path in paths:
        why = input_file_problem(path)
        if why:
            raise DataError(f"data file {path!r} {why} (expected a JSONL file of prompt/answer or messages records)")
        if not path.endswith((".jsonl", ".json")):
            raise DataError(f"data file {path!r}: expected a .jsonl file")
        for line_no, value in valid_records(path, fmt):
            if not isinstance(value, ValueError):
                records.append(value)
            elif on_malformed == "fail":
                raise DataError(f"{path}:{line_no}: malformed record: {value} "
                                f"(set data.on_malformed=skip to skip such lines)")
            else:
                skipped += 1
    if not records:
        raise DataError(f"no valid records in {list(paths)}")
    return records, {"malformed_skipped": skipped}


def tokenize(records, tokenizer, config: DataConfig) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    """(prompt_ids, answer_ids) int32 pairs fitting `max_length`, and counts of truncated / dropped ones.

    Over-length (prompt + answer > max_length): 'truncate' cuts the answer's tail; an example whose
    prompt leaves no room for one answer token is dropped under either policy.
    """
    out, truncated, dropped = [], 0, 0
    eos = tokenizer.eos_id
    L = config.max_length
    fmt = PromptFormat.of(config)
    for record in records:
        prompt, answer = render.render(record, tokenizer, fmt)
        p = tokenizer.encode(prompt)
        a = tokenizer.encode(answer) + ([eos] if config.add_eos and eos is not None else [])
        if len(p) + len(a) > L:
            if config.over_length == "drop" or len(p) >= L:
                dropped += 1
                continue
            a = a[: L - len(p)]
            truncated += 1
        if not a:
            dropped += 1
            continue
        out.append((np.asarray(p, np.int32), np.asarray(a, np.int32)))
    if not out:
        raise DataError(f"every example was dropped (max_length={L}, over_length={config.over_length!r})")
    return out, {"truncated": truncated, "dropped": dropped}


# ------------------------------------------------------------------ rows and batches


def pad_row(example, length: int, pad_id: int) -> dict[str, np.ndarray]:
    """One example → a padded row of the batch format (segment 1, positions 0…n−1)."""
    p, a = example
    n = len(p) + len(a)
    tokens = np.full(length, pad_id, np.int32)
    tokens[:n] = np.concatenate([p, a])
    seg = np.zeros(length, np.int32)
    seg[:n] = 1
    pos = np.zeros(length, np.int32)
    pos[:n] = np.arange(n)
    ans = np.zeros(length, bool)
    ans[len(p):n] = True
    return {"tokens": tokens, "segment_ids": seg, "positions": pos, "answer_mask": ans}


def _features(example) -> dict[str, np.ndarray]:
    p, a = example
    return {"tokens": np.concatenate([p, a]).astype(np.int32),
            "answer_mask": np.concatenate([np.zeros(len(p), np.int32), np.ones(len(a), np.int32)])}


def _packed_row(row) -> dict[str, np.ndarray]:
    return {"tokens": row["tokens"].astype(np.int32), "segment_ids": row["tokens_segment_ids"].astype(np.int32),
            "positions": row["tokens_positions"].astype(np.int32), "answer_mask": row["answer_mask"].astype(bool)}


def _stack(rows) -> dict[str, np.ndarray]:
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def make_dataset(examples, config: DataConfig, *, local_batch: int, pad_id: int, train: bool = True,
                 process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
    """grain pipeline of this host's rows of the global batches: (train: per-epoch shuffle, repeat; eval:
    file order, repeated, so every evaluation sees the same batches) → pad or pack → batch.

    The global batches do not depend on the number of hosts (a run on 1 or N hosts, or resumed on
    another count, sees the same data): every host orders the same example list, and host p of P takes
    rows [p·local_batch, (p+1)·local_batch) of each global batch of P·local_batch rows. Padded rows:
    host p reads only its own examples (local batches p, p + P, … of the stream). Packed rows: packing
    depends on the whole stream, so every host packs it all and keeps its rows (cheap next to a step).
    """
    if not examples:
        raise DataError("no examples to batch")
    ds = grain.MapDataset.source(list(examples))
    if train:
        ds = ds.shuffle(seed=config.seed).repeat(config.num_epochs or None)
    else:
        ds = ds.repeat()
    opts = grain.ReadOptions(num_threads=config.read_threads, prefetch_buffer_size=config.prefetch)
    if not config.pack:
        ds = ds.map(lambda ex: pad_row(ex, config.max_length, pad_id))
        ds = ds.batch(local_batch, drop_remainder=True, batch_fn=_stack)
        return ds[process_index::process_count].to_iter_dataset(opts)
    L, global_batch = config.max_length, local_batch * process_count
    packed = grain.experimental.FirstFitPackIterDataset(
        ds.map(_features).to_iter_dataset(opts), length_struct={"tokens": L, "answer_mask": L},
        num_packing_bins=global_batch, shuffle_bins=False, padding_struct={"tokens": pad_id, "answer_mask": 0})
    mine = slice(process_index * local_batch, (process_index + 1) * local_batch)
    return (packed.map(_packed_row).batch(global_batch, drop_remainder=True, batch_fn=_stack)
            .map(lambda rows: {k: v[mine] for k, v in rows.items()}))


@dataclasses.dataclass
class Splits:
    """Tokenized train / eval examples plus the counts worth logging."""

    train: list
    eval: list
    stats: dict


def load_splits(config: DataConfig, tokenizer) -> Splits:
    """Reads, validates and tokenizes the train (and eval) files; all data errors surface here."""
    fmt = PromptFormat.of(config)
    records, stats = read_records(config.train, config.on_malformed, fmt)
    examples, tstats = tokenize(records, tokenizer, config)
    stats = {**stats, **tstats}
    if config.eval:
        erecords, estats = read_records(config.eval, config.on_malformed, fmt)
        eval_examples, etstats = tokenize(erecords, tokenizer, config)
        stats.update({f"eval_{k}": v for k, v in {**estats, **etstats}.items()})
    elif config.eval_fraction > 0:
        n_eval = max(1, int(round(len(examples) * config.eval_fraction)))
        if n_eval >= len(examples):
            raise DataError(f"data.eval_fraction={config.eval_fraction} leaves no training examples "
                            f"out of {len(examples)}")
        examples, eval_examples = examples[:-n_eval], examples[-n_eval:]
    else:
        eval_examples = []
    stats["train_examples"], stats["eval_examples"] = len(examples), len(eval_examples)
    return Splits(examples, eval_examples, stats)


def take(iterator: Iterator, n: int) -> list:
    return [next(iterator) for _ in range(n)]
