"""`<mdm_mask>` in a Hugging Face tokenizer directory: where its free ids start, whether it has the token,
and registering it under the model's `mask_token_id` (docs/algorithms.md §1.1), so the tokenizer that
travels with a checkpoint (`CKPT/tokenizer/`, an exported folder) and the model agree on the id.
"""
from __future__ import annotations

import json
import os

from . import ConversionError, note, read_json

MASK_TOKEN = "<mdm_mask>"


def _ids(file: str) -> dict[str, int]:
    """token → id of a tokenizer.json as the tokenizers library loads it, added tokens included."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(file).get_vocab(with_added_tokens=True)
    except Exception as e:  # the tokenizers library raises its own exception type for a malformed file
        raise ConversionError(f"cannot read the tokenizer {file!r}: {e}") from e


def tokenizer_length(tok_dir: str) -> int | None:
    """1 + the highest token id of a tokenizer.json, added tokens included (Qwen3: 151669, its
    `len(tokenizer)`): the embedding rows from there on belong to no token. None without a tokenizer."""
    file = os.path.join(tok_dir, "tokenizer.json")
    if not os.path.isfile(file):
        return None
    ids = _ids(file).values()
    return max(ids) + 1 if ids else 0


def tokenizer_mask_id(tok_dir: str) -> int | None:
    """The id of `<mdm_mask>` in a tokenizer.json, if it has one."""
    file = os.path.join(tok_dir, "tokenizer.json")
    if not os.path.isfile(file):
        return None
    for token in read_json(file, "tokenizer").get("added_tokens", []):
        if token.get("content") == MASK_TOKEN:
            return int(token["id"])
    return None


class MaskIdError(ConversionError):
    """`<mdm_mask>` cannot take the requested id in this tokenizer without moving other tokens' ids."""


def add_mask_to_tokenizer(tok_dir: str, mask_id: int) -> None:
    """Registers `<mdm_mask>` as a special token with id `mask_id` (the model's row for it, `mask_row`),
    every other token keeping its id.

    When it loads the file, the tokenizers library gives an added token that its model's vocabulary lacks
    the next free id (one past the highest added id, or the vocabulary's size), whatever id the file
    records. At `mask_id` = `tokenizer_length` (the first id no token uses, which `--add-mask-token`
    picks: Qwen3's 151669) the token is appended to the added tokens. A higher id (the model's mask row
    lies further on) also needs the token in the model's vocabulary under that id, which moves every added
    token outside that vocabulary by one (Qwen3's `<|endoftext|>` … `</think>`): then MaskIdError. Every
    id is checked after writing; on any failure the files are left as they were.
    """
    spec = {"content": MASK_TOKEN, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}
    file = os.path.join(tok_dir, "tokenizer.json")
    if not os.path.isfile(file):
        raise ConversionError(f"cannot add {MASK_TOKEN} to the tokenizer in {tok_dir!r}: it has no tokenizer.json")
    before = _ids(file)
    used = max(before.values()) + 1 if before else 0
    if mask_id < used:
        raise MaskIdError(f"cannot add {MASK_TOKEN} at id {mask_id} to {file!r}: a token of the tokenizer has it")
    tok = read_json(file, "tokenizer")
    if mask_id > used:
        vocab = tok.get("model", {}).get("vocab")
        if not isinstance(vocab, dict):
            raise MaskIdError(f"cannot add {MASK_TOKEN} at id {mask_id} to {file!r}: past its {used} ids, and its "
                              "model has no token → id vocab to put it in")
        vocab[MASK_TOKEN] = mask_id
    tok.setdefault("added_tokens", []).append({"id": mask_id, **spec})
    config_file = os.path.join(tok_dir, "tokenizer_config.json")
    originals = {f: open(f, "rb").read() for f in (file, config_file) if os.path.isfile(f)}
    try:
        with open(file, "w") as f:
            json.dump(tok, f, ensure_ascii=False)
        if os.path.isfile(config_file):
            tok_config = read_json(config_file, "tokenizer config")
            tok_config.setdefault("added_tokens_decoder", {})[str(mask_id)] = spec
            with open(config_file, "w") as f:
                json.dump(tok_config, f, indent=2, ensure_ascii=False)
        after = _ids(file)
        if after != {**before, MASK_TOKEN: mask_id}:
            moved = [f"{t!r} {before[t]} → {after.get(t)}" for t in before if after.get(t) != before[t]]
            raise MaskIdError(f"{MASK_TOKEN} at id {mask_id} in {file!r} would change other ids "
                              f"({', '.join(moved[:3]) or f'{MASK_TOKEN} → {after.get(MASK_TOKEN)}'}): the "
                              f"tokenizer has {used} ids, and only id {used} can be added without that")
    except BaseException:
        for f, data in originals.items():
            with open(f, "wb") as out:
                out.write(data)
        raise


def register_mask_token(tok_dir: str, mask_id: int) -> bool:
    """Adds `<mdm_mask>` at `mask_id` to the tokenizer in `tok_dir` unless it has it; returns whether the
    tokenizer now has it there. A tokenizer it cannot be added to (no tokenizer.json, the id taken by a
    token, the token under another id) is left as it is, with a note on stderr saying why."""
    existing = tokenizer_mask_id(tok_dir)
    if existing is not None:
        if existing != mask_id:
            note(f"note: the tokenizer has {MASK_TOKEN} at id {existing} but the model's mask_token_id is {mask_id}; "
                 "the tokenizer is left as it is")
        return existing == mask_id
    used = tokenizer_length(tok_dir)
    if used is None:
        note(f"note: the tokenizer in {tok_dir!r} has no tokenizer.json: {MASK_TOKEN} (id {mask_id}) not added to it")
        return False
    if mask_id < used:
        note(f"note: id {mask_id} (the model's mask_token_id) belongs to a token of the tokenizer: {MASK_TOKEN} not "
             "added to it")
        return False
    try:
        add_mask_to_tokenizer(tok_dir, mask_id)
    except MaskIdError as e:
        note(f"note: {e}; {MASK_TOKEN} not added to the tokenizer")
        return False
    return True
