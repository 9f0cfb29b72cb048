"""What makes two evaluations "the same evaluation", so that no evaluation replaces another's results.

An evaluation is identified by its resolved settings (`settings`): the content of what it reads (the
checkpoint, the records, the LoRA adapter and the draft model where a mode uses them, an explicit
tokenizer) and how it decodes and scores (the `eval` section less its knobs, each mode's resolved
`GenerationConfig`, the prompt format, the diagnostics' slot sizes). Files are compared by content, not
by how their path is spelled: a checkpoint by its recorded checksums file (which covers its arrays and
its side files), anything else by the crc32 of every file. The code's version is not part of it.

`evaluation_id` hashes the settings; `experiments.evaluate` names its default output directory after it
(`default_out`) and records it in summary.json (`record`), so a rerun finds what it wrote (`recorded`): the
same evaluation is kept, another one in the same directory is refused unless `--force`, and `differences`
says which settings differ.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from .. import overrides as ov
from ..config import PromptFormat
from ..checkpoint import CHECKSUMS_FILE
from ..nn.integrity import file_checksum
from .evaluate import ADAPTER_MODES, EvalConfig, generation_config

# The settings that are the content of an input (compared whole, not field by field).
CONTENT_KEYS = ("ckpt", "data", "lora", "draft_ckpt", "tokenizer")
SUMMARY = "summary.json"


def content(path: str | None) -> Any:
    """A path's content digest, whatever its spelling: a file's crc32 and size; a checkpoint directory's
    checksums file; any other directory's files, each by crc32. A name that is no path ('byte') is
    itself; None is None."""
    if not path:
        return None
    if os.path.isdir(path):
        sums = os.path.join(path, CHECKSUMS_FILE)
        if os.path.isfile(sums):
            return {CHECKSUMS_FILE: file_checksum(sums)}
        return {os.path.relpath(os.path.join(root, n), path): file_checksum(os.path.join(root, n))
                for root, _, names in sorted(os.walk(path)) for n in sorted(names)}
    if os.path.isfile(path):
        return {"crc32": file_checksum(path), "bytes": os.path.getsize(path)}
    return path


def settings(ev: EvalConfig, knobs: dict[str, dict], *, ckpt: str, data: str, prompt_format: PromptFormat,
             lora: str | None = None, draft_ckpt: str | None = None, tokenizer: str | None = None,
             diagnose: list[int] | None = None) -> dict:
    """The evaluation's resolved settings (the module docstring), JSON-ready. `knobs`: {mode or "*":
    {field: value}}, as `evaluate` takes them; only what a mode reads counts (its resolved config)."""
    section = {k: v for k, v in ov.to_dict(ev).items() if k not in ("ckpt", "knobs")}
    return {"ckpt": content(ckpt), "data": content(data),
            "lora": content(lora) if any(m in ADAPTER_MODES for m in ev.modes) else None,
            "draft_ckpt": content(draft_ckpt) if "spec-model" in ev.modes else None,
            "tokenizer": content(tokenizer), "eval": section,
            "generation": {m: generation_config(m, ev.max_new_tokens, knobs).as_dict() for m in ev.modes},
            "prompt_format": ov.to_dict(prompt_format), "diagnose": list(diagnose) if diagnose else None}


def evaluation_id(s: dict) -> str:
    """12 hex digits of the settings' canonical JSON's SHA-256."""
    return hashlib.sha256(json.dumps(s, sort_keys=True, default=str).encode()).hexdigest()[:12]


def record(s: dict) -> dict:
    """What summary.json records under `evaluation`: the id and the settings it hashes."""
    return {"id": evaluation_id(s), "settings": s}


def default_out(ckpt: str, data: str, modes, eid: str) -> str:
    """`<ckpt>_eval/<data name>-<modes>-<id>`: one directory per evaluation beside the checkpoint, named
    so that a listing says which is which (e.g. `final_eval/test-ar+mdm-3fa9c01b5e2d`)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.splitext(os.path.basename(data))[0])[:40] or "data"
    return os.path.join(os.path.normpath(ckpt) + "_eval", f"{stem}-{'+'.join(modes)}-{eid}")


def recorded(out: str, outputs) -> tuple[dict | None, str]:
    """The evaluation `out` holds: (its `record`, "") when complete; (None, "") when `out` holds none (no
    summary.json: it is written last, so nothing complete is there); ({}, why) when there is a summary
    that cannot be compared (unreadable, written without a record, or with one of `outputs` missing)."""
    path = os.path.join(out, SUMMARY)
    if not os.path.isfile(path):
        return None, ""
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f).get("evaluation")
    except (OSError, ValueError, AttributeError) as e:
        return {}, f"its {SUMMARY} is unreadable ({e})"
    if not isinstance(rec, dict) or not isinstance(rec.get("settings"), dict):
        return {}, f"its {SUMMARY} records no evaluation settings (an older evaluate's or another tool's)"
    missing = [name for name in outputs if not os.path.isfile(os.path.join(out, name))]
    if missing:
        return {}, f"its {', '.join(missing)} is missing"
    return rec, ""


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two settings (an input's content counts as one key)."""
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict) and (prefix or k not in CONTENT_KEYS):
            keys += differences(a, b, f"{prefix}{k}.")
        else:
            keys.append(prefix + k)
    return keys
