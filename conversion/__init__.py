"""Hugging Face ⇄ zarya_jax checkpoint converters (`python -m conversion.hf_to_jax` / `jax_to_hf`), and
LoRA drafter adapters ⇄ PEFT adapters (`lora_to_peft` / `peft_to_lora`, tensor names in `peft`).

The tensor-name table lives in `zarya_jax.nn.hf_params`; this package does file handling and CLIs.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from safetensors import SafetensorError

from zarya_jax.config import ConfigError
from zarya_jax.data.qwen3_tokenizer import TokenizerBuildError
from zarya_jax.files import OutputPathError, atomic_directory, check_output, check_writable_dir
from zarya_jax.train.preemption import signals_interrupt
from zarya_jax.nn.hf_params import ShapeError
from zarya_jax.nn.integrity import CheckpointError

# Tokenizer files a Hugging Face model directory may carry; copied both ways unchanged.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


class ConversionError(Exception):
    """Bad converter input (paths, files, architectures, shapes); the CLI prints it on one line."""


# Errors that mean "the input is wrong", not "the converter is broken": reported, not traced.
EXPECTED_ERRORS = (ConversionError, TokenizerBuildError, ConfigError, ShapeError, CheckpointError, OutputPathError, SafetensorError,
                   FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


def run_cli(fn: Callable[[list[str] | None], object], argv: list[str] | None) -> int:
    """Runs `fn(argv)`; an expected error prints one line `error: ...` on stderr and returns 2 (bad
    input, as every command of the project); a signal returns 128 + its number (SIGINT 130, SIGTERM 143),
    after the staging directory is removed."""
    try:
        with signals_interrupt():
            fn(argv)
    except EXPECTED_ERRORS as e:
        message = " ".join(str(e).split())  # one line, whatever the exception text looked like
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"interrupted: {' '.join(str(e).split()) or 'KeyboardInterrupt'}", file=sys.stderr)
        return 128 + getattr(e, "signum", 2)
    return 0


def check_new_output(out: str, inputs: dict | None = None) -> str:
    """Absolute output path; refuses one that exists (nothing is ever overwritten), that lies inside one
    of the `inputs` ({flag: path}: the converter's source directories) or cannot be written."""
    check_output(out, inputs or {}, "--out")
    out = os.path.abspath(out)
    if os.path.lexists(out):
        raise ConversionError(f"output path {out!r} already exists: choose a new path or remove it")
    check_writable_dir(out, "--out")
    return out


def read_json(file: str, what: str) -> dict:
    if not os.path.isfile(file):
        raise ConversionError(f"{what} {file!r} not found")
    try:
        with open(file) as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"cannot read {what} {file!r}: {e}") from e
    if not isinstance(data, dict):
        raise ConversionError(f"{what} {file!r}: expected a JSON object, found {type(data).__name__}")
    return data


def copy_tokenizer_files(src: str, dst: str) -> list[str]:
    """Copies the tokenizer files present in `src` into `dst`; returns their names."""
    names = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(src, n))]
    os.makedirs(dst, exist_ok=True)
    for n in names:
        shutil.copyfile(os.path.join(src, n), os.path.join(dst, n))
    return names


@contextmanager
def staging_dir(out: str) -> Iterator[str]:
    """A temp directory next to `out`, renamed to `out` on success and removed on any failure."""
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise ConversionError(f"parent directory {parent!r} of the output does not exist")
    with atomic_directory(out) as tmp:
        yield tmp


def note(message: str) -> None:
    print(message, file=sys.stderr)
