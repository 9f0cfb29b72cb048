"""One run per workdir: a lock file in the workdir naming its holder (pid, host, start time, command).

    with workdir_lock(workdir, "experiments.train"):
        ...  # train, write metrics, export

A second run on the same workdir is refused (`WorkdirLocked`, a ValueError: exit 2) with the holder's
pid, host and start time, instead of both runs writing every step twice. A lock whose holder died on
this host (its pid no longer runs: a SIGKILL, a power cut) is stale and is broken; a lock held on
another host is never broken automatically, since its pid cannot be checked from here (remove the file
when that run is known to be gone).

Taking the lock is atomic: the lock file is written complete under a temporary name and hard-linked to
its name, which fails if a lock is already there; inspecting and breaking a stale lock happens under an
exclusive `flock` of the workdir, so two runs that find the same stale lock cannot both take it. The lock
is released (its file removed) when the block ends, however it ends; directories the lock had to create
are removed again when nothing else was written into them (a refused run leaves nothing behind).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import tempfile
import time
from typing import Iterator

from .files import check_writable_dir

LOCK_NAME = ".lock"


def host_lock_name(host_index: int, num_hosts: int) -> str:
    """The lock of one host of a multi-host run: the hosts of a pod share the workdir by design (each runs
    its own share), so each holds a lock of its own; a single-host run holds the workdir's lock."""
    return LOCK_NAME if num_hosts == 1 else f"{LOCK_NAME}.host-{host_index}"


class WorkdirLocked(ValueError):
    """The workdir is in use by another run."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            holder = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict) -> str:
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')!r}, started {holder.get('started', '?')}"
            + (f" ({holder['command']})" if holder.get("command") else ""))


def is_stale(holder: dict) -> bool:
    """A lock whose holder ran on this host and whose pid no longer runs."""
    pid = holder.get("pid")
    return (holder.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0
            and pid != os.getpid() and not _alive(pid))


@contextlib.contextmanager
def _flocked(directory: str) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def _makedirs(path: str) -> list[str]:
    """Creates `path` and its missing parents; returns the directories it created, deepest first."""
    created = []
    p = path
    while not os.path.isdir(p):
        created.append(p)
        p = os.path.dirname(p)
    os.makedirs(path, exist_ok=True)
    return created


def acquire(workdir: str, command: str = "", name: str = LOCK_NAME) -> str:
    """Takes the lock `name` of `workdir` (which must exist); returns the lock file's path. Raises
    WorkdirLocked when a live run holds it."""
    path = os.path.join(workdir, name)
    holder = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command}
    fd, tmp = tempfile.mkstemp(dir=workdir, prefix=LOCK_NAME + ".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(holder, f)
        with _flocked(workdir):
            current = _read(path)
            if current is not None and is_stale(current):
                os.remove(path)  # its holder is gone; under the flock no other run can be taking it now
            try:
                os.link(tmp, path)
            except FileExistsError:
                current = _read(path) or {}
                raise WorkdirLocked(
                    f"workdir {workdir!r} is in use by another run: {_describe(current)}; wait for it to end, or "
                    f"remove {path!r} if that run is gone") from None
    finally:
        os.remove(tmp)
    return path


def _is_lock(name: str) -> bool:
    return name == LOCK_NAME or name.startswith(LOCK_NAME + ".")


def is_new(workdir: str) -> bool:
    """A workdir that is missing or holds nothing but locks: a run starting there for the first time."""
    return not os.path.exists(workdir) or all(_is_lock(n) for n in os.listdir(workdir))


def clear(workdir: str) -> None:
    """Undoes a failed first run (`is_new` before it): removes everything but the lock, and the workdir
    itself when no lock holds it (the lock's owner removes it when releasing)."""
    if not os.path.isdir(workdir):
        return
    for name in os.listdir(workdir):
        if not _is_lock(name):
            path = os.path.join(workdir, name)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    if not any(_is_lock(n) for n in os.listdir(workdir)):
        os.rmdir(workdir)


def release(path: str) -> None:
    """Removes the lock file at `path` if this process holds it."""
    holder = _read(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        os.remove(path)


@contextlib.contextmanager
def workdir_lock(workdir: str | os.PathLike, command: str = "", what: str = "--workdir",
                 name: str = LOCK_NAME) -> Iterator[str]:
    """Holds the lock `name` of `workdir` for the block (creating the workdir); see the module doc. The
    workdir is checked writable first (OutputPathError naming `what`). Runs that share a workdir by
    design (a sweep's hosts) each take a lock of their own name (`.lock.host-1`)."""
    workdir = os.path.abspath(os.fspath(workdir))
    check_writable_dir(workdir, what)
    created = _makedirs(workdir)
    try:
        path = acquire(workdir, command, name)
        try:
            yield path
        finally:
            release(path)
    finally:
        for directory in created:  # deepest first; stops at the first one the run wrote into
            try:
                os.rmdir(directory)
            except OSError:
                break
