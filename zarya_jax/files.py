"""Atomic file and directory writes: the one implementation every writer in the project uses.

A failed command must leave no half-written output (DESIGN: errors): each writer builds its result
under a temporary name in the destination's own directory (so the final rename stays on one file
system and is atomic) and renames it into place only when it is complete; on any error the
temporary file or directory is removed and the destination is left as it was.

And no command should find out only after its compute that it cannot write its results:
`check_writable_dir` / `check_writable_file` check an output location up front, without creating it.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator


class OutputPathError(ValueError):
    """An output location that is not a writable directory (or file path)."""


def _probe(directory: str, what: str) -> None:
    """Creates and removes a file in `directory` (permission bits do not tell: root, read-only mounts)."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".probe-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise OutputPathError(f"{what}: cannot write in {directory!r} ({e.strerror or e})") from None


def check_writable_dir(path: str | os.PathLike, what: str = "output directory") -> None:
    """Raises OutputPathError unless `path` is a writable directory or could be created as one. Creates
    nothing."""
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise OutputPathError(f"{what} {path!r} exists and is not a directory")
        _probe(path, f"{what} {path!r}")
        return
    ancestor = os.path.dirname(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise OutputPathError(f"{what} {path!r} cannot be created: {ancestor!r} is a file, not a directory")
    _probe(ancestor, f"{what} {path!r}")


def check_writable_file(path: str | os.PathLike, what: str = "output file") -> None:
    """Raises OutputPathError unless `path` can be written as a file (its folder checked as above)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        raise OutputPathError(f"{what} {path!r} is a directory, expected a file path")
    check_writable_dir(os.path.dirname(path), f"{what} {path!r}: its folder")


def _parent(path: str | os.PathLike) -> str:
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    os.makedirs(directory, exist_ok=True)
    return directory


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[str]:
    """A temporary file name next to `path` for a writer that wants a path (e.g. `savefig`); renamed
    to `path` when the block ends without error, removed otherwise. Creates the parent directories."""
    fd, tmp = tempfile.mkstemp(dir=_parent(path), prefix=".tmp-", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, os.fspath(path))
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, **dumps_kwargs) -> None:
    """`json.dumps(obj, **dumps_kwargs)` written atomically (`indent=2` unless given)."""
    dumps_kwargs.setdefault("indent", 2)
    atomic_write(path, json.dumps(obj, **dumps_kwargs))


def atomic_write_jsonl(path: str | os.PathLike, records) -> None:
    """One JSON object per line, written atomically."""
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in records))


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[str]:
    """A temporary directory next to `path`, renamed to `path` when the block ends without error and
    removed otherwise. An existing `path` raises FileExistsError, or with `overwrite` is replaced
    (the old directory is removed only after the new one is in place)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(f"output path {path!r} already exists")
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=_parent(path))
    try:
        yield tmp
        replace_directory(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_directory(src: str, dst: str) -> None:
    """Renames directory `src` to `dst`; an existing `dst` is moved aside first and removed after."""
    old = None
    if os.path.lexists(dst):
        if not os.path.isdir(dst):
            raise FileExistsError(f"{dst!r} exists and is not a directory")
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.", suffix=".old", dir=os.path.dirname(dst))
        os.rmdir(old)
        os.rename(dst, old)
    os.rename(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
