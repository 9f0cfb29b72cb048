"""The JSONL record formats every reader of data shares (training, evaluation, prompts files).

A record is one JSON object per line: `{"prompt": str, "answer": str}` or a chat
`{"messages": [{"role": str, "content": str}, …]}` whose last message is the assistant's answer.
`jsonl_lines` reads a file line by line as bytes, so a line that is not UTF-8 is one malformed line
(named by file and line, skippable where the caller skips), not a crash of the whole read.
"""
from __future__ import annotations

import json
from typing import Any, Iterator


def check_record(rec: Any) -> tuple[str, Any]:
    """('pa', (prompt, answer)) or ('chat', messages); raises ValueError naming what is wrong."""
    if not isinstance(rec, dict):
        raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("'messages' must be a non-empty list")
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError("each message needs string 'role' and 'content'")
        if msgs[-1]["role"] != "assistant":
            raise ValueError("the last message must be the assistant's (the supervised answer)")
        return "chat", msgs
    if not isinstance(rec.get("prompt"), str) or not isinstance(rec.get("answer"), str):
        raise ValueError(f"expected string fields 'prompt' and 'answer' (or 'messages'), got keys {sorted(rec)}")
    return "pa", (rec["prompt"], rec["answer"])


def jsonl_lines(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON value or the ValueError that line raised) for every non-blank line."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield line_no, ValueError(f"not UTF-8 text (byte {e.start})")
                continue
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except ValueError as e:  # json.JSONDecodeError
                yield line_no, ValueError(f"not valid JSON ({getattr(e, 'msg', e)})")


