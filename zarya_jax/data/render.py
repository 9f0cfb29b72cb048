"""Prompt rendering: the one function that turns a data record into the text the model sees.

Training (`data.pipeline`), evaluation (`eval.evaluate`), generation (`experiments.generate`), the
quickstart and the lm-evaluation-harness adapter (`eval.harness`) all call `render` / `render_prompt`
with a `PromptFormat` (`zarya_jax.config`), and a trained checkpoint records the format it was trained
with, so the token ids a model is evaluated on are exactly those it was trained on.

Records (one JSON object per JSONL line):
- prompt/answer: `{PROMPT_KEY: str, ANSWER_KEY: str}` (a number or any other non-text value is refused,
  not read as its text: `3` and `3.0` would be two answers), the keys set by
  `prompt_key` / `answer_key` (GSM8K: `question` / `answer`); other fields are ignored. The prompt
  field, placed into `prompt_template`, is one user turn.
- chat: `{"messages": [{"role", "content"}, …]}` whose last message is the assistant's answer.

The prompt text, from the user turn (plus `system`, when set and the record has no system message):
- with `chat_template` and a tokenizer that has one: the tokenizer's chat template with the generation
  prompt (`enable_thinking` passed to templates that take it), e.g. Qwen3's
  `<|im_start|>user\\nQ: 1+2?<|im_end|>\\n<|im_start|>assistant\\n`;
- otherwise plain text: a prompt/answer record is its user turn as it is (after the system line), a chat
  record becomes `role: content` lines followed by `assistant: `.
The answer is the answer field (or the last message) as it is; the caller appends EOS when training.
"""
from __future__ import annotations

import json
from typing import Any

from ..config import PromptFormat

__all__ = ["PromptFormat", "parse", "render", "render_prompt", "prompt_messages", "prompt_text"]


def _text(record: dict, key: str) -> str | None:
    """Field `key` of a prompt/answer record: its text, None when absent (or null); any other JSON value is
    a ValueError naming its kind (a number stringified is text the file never held: 2.50 reads "2.5")."""
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    kind = ("a boolean" if isinstance(value, bool) else "a number" if isinstance(value, (int, float))
            else "a list" if isinstance(value, list) else "an object")
    raise ValueError(f"field {key!r} is {kind} ({json.dumps(value)[:40]}); expected text")


def parse(record: Any, fmt: PromptFormat = PromptFormat(), *, need_answer: bool = True) -> tuple[list[dict], str, bool]:
    """(prompt messages, answer text, is_chat) of one record; ValueError saying what is wrong.

    need_answer=False accepts a prompt-only record (the answer is then "")."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        msgs = record["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("'messages' must be a non-empty list")
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError("each message needs string 'role' and 'content'")
        if msgs[-1]["role"] != "assistant":
            raise ValueError("the last message must be the assistant's (the supervised answer)")
        if len(msgs) < 2:
            raise ValueError("a chat record needs at least one message before the assistant's answer")
        return [dict(role=m["role"], content=m["content"]) for m in msgs[:-1]], msgs[-1]["content"], True
    prompt, answer = _text(record, fmt.prompt_key), _text(record, fmt.answer_key)
    if prompt is None or (need_answer and answer is None):
        want = f"{fmt.prompt_key!r} and {fmt.answer_key!r}" if need_answer else repr(fmt.prompt_key)
        raise ValueError(f"expected text fields {want} (or 'messages'), got keys {sorted(record)}; other field "
                         f"names are mapped with prompt_key / answer_key (--prompt-key, data.prompt_key=...)")
    return prompt_messages(prompt, fmt), answer or "", False


def prompt_messages(prompt: str, fmt: PromptFormat = PromptFormat()) -> list[dict]:
    """The messages of a bare prompt: one user turn, the prompt placed into `prompt_template`."""
    return [{"role": "user", "content": fmt.prompt_template.format(prompt=prompt)}]


def _with_system(messages: list[dict], fmt: PromptFormat) -> list[dict]:
    if fmt.system and not (messages and messages[0]["role"] == "system"):
        return [{"role": "system", "content": fmt.system}] + messages
    return messages


def prompt_text(messages: list[dict], tokenizer, fmt: PromptFormat = PromptFormat(), *, chat: bool = False) -> str:
    """The prompt text of `messages` (user/system/assistant turns before the answer); `chat`: the messages
    came from a chat record (plain text then uses `role: content` lines)."""
    messages = _with_system(messages, fmt)
    if fmt.chat_template and getattr(tokenizer, "chat_template", None):
        kwargs = {} if fmt.enable_thinking is None else {"enable_thinking": fmt.enable_thinking}
        return tokenizer.chat_prompt(messages, **kwargs)
    if chat:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return "".join(m["content"] + "\n" for m in messages[:-1]) + messages[-1]["content"]


def render(record: Any, tokenizer, fmt: PromptFormat = PromptFormat(), *, need_answer: bool = True) -> tuple[str, str]:
    """(prompt text, answer text) of one record, as training and every evaluation see it."""
    messages, answer, chat = parse(record, fmt, need_answer=need_answer)
    return prompt_text(messages, tokenizer, fmt, chat=chat), answer


def render_prompt(prompt: str, tokenizer, fmt: PromptFormat = PromptFormat()) -> str:
    """The text the model sees for a bare prompt string (generation, lm-evaluation-harness contexts)."""
    return prompt_text(prompt_messages(prompt, fmt), tokenizer, fmt)
