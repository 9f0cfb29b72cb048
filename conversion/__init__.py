"""Hugging Face ⇄ zarya_jax checkpoint converters (`python -m conversion.hf_to_jax` / `jax_to_hf`), and
LoRA drafter adapters ⇄ PEFT adapters (`lora_to_peft` / `peft_to_lora`, tensor names in `peft`).

The tensor-name table lives in `zarya_jax.nn.hf_params`; this package does file handling and CLIs.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
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


def check_new_output(out: str, inputs: dict | None = None, *, empty_ok: bool = False) -> str:
    """Absolute output path; refuses one that exists (nothing is ever overwritten; with `empty_ok` an
    empty directory is accepted, the output takes its place), that lies inside one of the `inputs`
    ({flag: path}: the converter's source directories) or cannot be written. Missing parent
    directories are fine: the output's are created."""
    check_output(out, inputs or {}, "--out")
    out = os.path.abspath(out)
    if os.path.lexists(out):
        if not empty_ok:
            raise ConversionError(f"output path {out!r} already exists: choose a new path or remove it")
        if not os.path.isdir(out) or os.path.islink(out) or os.listdir(out):
            raise ConversionError(f"output path {out!r} already exists and is not an empty directory: choose a new "
                                  "path or an empty directory")
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
def taking_over_empty(out: str) -> Iterator[None]:
    """Lets the output be renamed to `out` when `out` is an empty directory (`check_new_output(empty_ok=True)`):
    removes it (`rmdir`, which refuses a directory that is no longer empty) and puts it back if the block fails."""
    taken = os.path.isdir(out) and not os.path.islink(out)
    if taken:
        try:
            os.rmdir(out)
        except OSError as e:
            raise ConversionError(f"output path {out!r} is no longer an empty directory ({e.strerror}): choose a "
                                  "new path or an empty directory") from None
    try:
        yield
    except BaseException:
        if taken and not os.path.lexists(out):
            os.mkdir(out)
        raise


@contextmanager
def staging_dir(out: str) -> Iterator[str]:
    """A temp directory next to `out` (parent directories created), renamed to `out` on success and removed
    on any failure; an empty directory at `out` is replaced (`taking_over_empty`)."""
    with taking_over_empty(out), atomic_directory(out) as tmp:
        yield tmp


class Progress:
    """Progress of a long conversion on stderr, one line at a time (logs and pipes keep them readable):
    `LABEL: 120.0/596.0 MB (20%), 14/28 tensors, 9 s`, the first update, then at most one every `every`
    seconds, and the last (100%)."""

    def __init__(self, label: str, total_bytes: int, total_items: int, unit: str = "tensors", every: float = 3.0):
        self.label, self.unit, self.every = label, unit, every
        self.total_bytes, self.total_items = total_bytes, total_items
        self.bytes = self.items = 0
        self.start = time.monotonic()
        self.last: float | None = None

    def advance(self, nbytes: int, items: int = 1) -> None:
        self.bytes += nbytes
        self.items += items
        now = time.monotonic()
        done = self.items >= self.total_items
        if done or self.last is None or now - self.last >= self.every:
            self.last = now
            share = 100 * self.bytes // self.total_bytes if self.total_bytes else 100  # floored: 100 means done
            note(f"{self.label}: {self.bytes / 1e6:,.1f}/{self.total_bytes / 1e6:,.1f} MB ({share}%), "
                 f"{self.items}/{self.total_items} {self.unit}, {now - self.start:.0f} s")


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
