"""Reading JSONL files, for every reader of data (training, evaluation, prompts files).

`jsonl_lines` reads a file line by line as bytes, so a line that is not UTF-8 is one malformed line
(named by file and line, skippable where the caller skips), not a crash of the whole read; a UTF-8
byte-order mark at the start of the file is dropped.
`valid_records` adds what a valid record is (`{"prompt", "answer"}` under the prompt format's field names,
or chat `messages`: `zarya_jax.data.render.parse`); each caller decides whether a bad line stops the read
or is skipped; `read_jsonl` is the strict reader (a bad line stops it). Its records are `Record`s: dicts
that know their "FILE:LINE", so an error found only once a tokenizer renders them names the line too.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from ..config import PromptFormat
from ..files import input_file_problem
from . import render


class Record(dict):
    """A record as `read_jsonl` read it: a plain dict, and `origin`, its "FILE:LINE" (1-based)."""

    origin: str = ""


def where(record: Any, index: int) -> str:
    """How an error names a record: its "FILE:LINE" when `read_jsonl` read it, else "record INDEX" (its
    0-based place in a list built in memory)."""
    return getattr(record, "origin", "") or f"record {index}"


def jsonl_lines(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON value or the ValueError that line raised) for every non-blank line."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:  # a UTF-8 byte-order mark (some editors write one) is not part of the first record
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as e:
                yield line_no, ValueError(f"not UTF-8 text (byte {e.start})")
                continue
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except ValueError as e:  # json.JSONDecodeError
                yield line_no, ValueError(f"not valid JSON ({getattr(e, 'msg', e)})")


def valid_records(path: str, fmt: PromptFormat = PromptFormat(), *, need_answer: bool = True
                  ) -> Iterator[tuple[int, Any]]:
    """(line number, a record valid under `fmt`, or the ValueError saying why the line is not one) for
    every non-blank line."""
    for line_no, value in jsonl_lines(path):
        if not isinstance(value, ValueError):
            try:
                render.parse(value, fmt, need_answer=need_answer)
            except ValueError as e:
                value = e
        yield line_no, value


def read_jsonl(path: str, fmt: PromptFormat = PromptFormat(), *, need_answer: bool = True) -> list[dict]:
    """Reads records valid under `fmt` (`zarya_jax.data.render.parse`: the prompt/answer fields, e.g.
    GSM8K's `question`/`answer` with `prompt_key="question"`, or chat `messages`); errors name the file and
    line (a line that is not UTF-8 or not JSON included). need_answer=False accepts prompt-only records."""
    why = input_file_problem(path)
    if why:
        raise FileNotFoundError(f"data file {path!r} {why}")
    records = []
    for i, record in valid_records(path, fmt, need_answer=need_answer):
        if isinstance(record, ValueError):
            raise ValueError(f"{path}:{i}: {record}")
        records.append(Record(record))
        records[-1].origin = f"{path}:{i}"
    if not records:
        raise ValueError(f"data file {path!r} holds no records")
    return records
