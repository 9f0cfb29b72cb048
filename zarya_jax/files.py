"""Atomic file and directory writes: the one implementation every writer in the project uses.

A failed command must leave no half-written output (DESIGN: errors): each writer builds its result
under a temporary name in the destination's own directory (so the final rename stays on one file
system and is atomic) and renames it into place only when it is complete; on any error the
temporary file or directory is removed and the destination is left as it was.

And no command should find out only after its compute that it cannot write its results:
`check_writable_dir` / `check_writable_file` check an output location up front, without creating it,
and `check_output` that it cannot destroy what the command reads: an output may not be, contain or sit
inside one of the command's inputs, nor be a filesystem root, the home directory or this repository.
`input_file_problem` says why a path given as an input file cannot be read as one.

Files are created with the permissions the umask gives (`tempfile` makes them 0600; a shared sweep
folder must stay readable to the group that shares it).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from typing import Any, Iterable, Iterator, Mapping

# The repository this package was imported from (its pyproject.toml sits next to the package).
_REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


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


def _is_within(path: str, folder: str) -> bool:
    """Whether real path `path` is `folder` or lies inside it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _paths(value) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    return [os.fspath(v) for v in value if v]


def check_output(output: str | os.PathLike, inputs: Mapping[str, Any], what: str = "output", *,
                 writes: Iterable[str] | None = None) -> None:
    """Raises OutputPathError when writing `output` could destroy an input or a directory that is never
    an output. `inputs`: {flag or key: a path, a list of paths, or None}. `writes`: None when the output
    is one file or a directory written whole; else the names of the entries the command writes inside
    the directory `output` (a run's workdir may hold its own data: only those entries are guarded).

    Refused: a filesystem root, the home directory, this repository; an output that is an input or
    lies inside one (a folder of a checkpoint); an input that the output contains — anywhere inside it
    when it is written whole, else at or under one of the `writes` entries. Paths are compared after
    resolving symbolic links. Creates nothing."""
    out = os.path.realpath(os.fspath(output))
    shown = os.fspath(output)
    if os.path.dirname(out) == out:
        raise OutputPathError(f"{what} {shown!r} is a filesystem root: expected a directory of its own")
    if out == os.path.realpath(os.path.expanduser("~")):
        raise OutputPathError(f"{what} {shown!r} is your home directory: expected a directory of its own")
    if out == _REPO and os.path.isfile(os.path.join(_REPO, "pyproject.toml")):
        raise OutputPathError(f"{what} {shown!r} is the zarya_jax repository {_REPO!r}: expected a directory "
                              "of its own (e.g. runs/NAME)")
    entries = None if writes is None else [os.path.join(out, w) for w in writes]
    for key, value in inputs.items():
        for given in filter(os.path.lexists, _paths(value)):  # a name that is no path (a hub id) guards nothing
            source = os.path.realpath(given)
            if out == source:
                raise OutputPathError(f"{what} {shown!r} is the input {key} {given!r}: writing it would destroy "
                                      "the input; choose another path")
            if _is_within(out, source):
                raise OutputPathError(f"{what} {shown!r} lies inside the input {key} {given!r}: choose a path "
                                      "outside it")
            if any(_is_within(source, e) for e in ([out] if entries is None else entries)):
                raise OutputPathError(f"{what} {shown!r} contains the input {key} {given!r}, which writing it "
                                      "would replace; choose another path")


def input_file_problem(path: str | os.PathLike) -> str | None:
    """None when `path` is a readable regular file (symbolic links followed); else why not, to follow
    the path in a message: 'does not exist', 'is a directory, expected a file', 'is a symbolic link
    loop', 'is not a regular file'."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return "does not exist"
        return f"cannot be read ({e.strerror or e})"
    if stat.S_ISDIR(mode):
        return "is a directory, expected a file"
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    return None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from the group
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
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700, as for files
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
