"""What makes a workdir's checkpoints "the same run": the config, and the content of the files it names.

A resumed run must be the run that wrote the checkpoints: same config (logging and checkpoint intervals,
the mesh and the other `config.RESUMABLE_CHANGES` may differ; the global batch may not) and same data.
Files are compared by content, not by how their path is spelled: `./runs/b` and `$PWD/runs/b`, a
symlink, or a workdir moved with its data (the quickstart keeps its data inside the workdir) all resume. A file with the same path but new
content (regenerated data) does not, because the saved data-iterator position refers to the old one.

`WORKDIR/run_config.json` holds the config and `WORKDIR/fingerprint.json` the content fingerprints of
the files the config names (`data.train`, `data.eval`: crc32 and size per file; `data.tokenizer`: per
file of the directory) plus the caller's `extra` identity (e.g. the LoRA drafter's settings and the
content of its base checkpoint). Both are written by `record` only once the state has been restored or
initialised, so a refused or failed resume (even a forced one) leaves the workdir as it was.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ..config import ConfigError
from ..data.tokenizer import NAMED
from ..files import atomic_write_json
from ..nn.integrity import file_checksum
from . import config as rc

CONFIG_FILE = "run_config.json"
FINGERPRINT_FILE = "fingerprint.json"
PATH_KEYS = ("data.train", "data.eval", "data.tokenizer")


def _file(path: str) -> dict:
    return {"crc32": file_checksum(path), "bytes": os.path.getsize(path)}


def file_fingerprint(path: str) -> Any:
    """A file's (or every file of a directory's) content digest, whatever the path's spelling."""
    if os.path.isdir(path):
        return {os.path.relpath(os.path.join(root, n), path): _file(os.path.join(root, n))
                for root, _, names in sorted(os.walk(path)) for n in sorted(names)}
    return _file(path) if os.path.isfile(path) else None


def fingerprint(run: rc.RunConfig, extra: dict | None = None) -> dict:
    """{key: content digest} of every file the run config names, plus `extra`."""
    data = run.data
    out = {"data.train": [file_fingerprint(p) for p in data.train],
           "data.eval": [file_fingerprint(p) for p in data.eval],
           "data.tokenizer": data.tokenizer if data.tokenizer in NAMED else file_fingerprint(data.tokenizer)}
    return {**out, **(extra or {})}


def _read(path: str, what: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what} {path!r} is unreadable ({e}); refusing to resume "
                          "(use --force to resume anyway, or another --workdir)") from None


def _same_path(a: Any, b: Any) -> bool:
    norm = (lambda v: [os.path.realpath(p) if p != "byte" else p for p in ([v] if isinstance(v, str) else v)])
    return norm(a) == norm(b)


def differences(run: rc.RunConfig, workdir: str, extra: dict | None = None) -> list[str]:
    """How `run` differs from the run recorded in `workdir` ('key: old -> new' items)."""
    old = rc.from_dict(_read(os.path.join(workdir, CONFIG_FILE), "run config"))
    # A knob the objective of both runs never reads does not make them different runs.
    inert = {"zarya.sequential_convention"} if old.zarya.slotted_training and run.zarya.slotted_training else set()
    changes = rc.diff(old, run, ignore=rc.RESUMABLE_CHANGES | set(PATH_KEYS) | inert)
    file = os.path.join(workdir, FINGERPRINT_FILE)
    if os.path.exists(file):
        saved, now = _read(file, "fingerprint"), fingerprint(run, extra)
        changes += [f"{k}: the content differs from the recorded run's" for k in sorted(set(saved) | set(now))
                    if saved.get(k) != now.get(k)]
    else:  # a workdir written before fingerprints: compare the resolved paths
        old_d, new_d = old.to_dict()["data"], run.to_dict()["data"]
        changes += [f"data.{k}: {old_d[k]!r} -> {new_d[k]!r}" for k in ("train", "eval", "tokenizer")
                    if not _same_path(old_d[k], new_d[k])]
    return changes


def check_workdir(run: rc.RunConfig, workdir: str, force: bool, extra: dict | None = None) -> None:
    """Refuses to resume a workdir whose checkpoints belong to another run (config or data content)."""
    ckpt_dir = os.path.join(workdir, "checkpoints")
    has_ckpt = os.path.isdir(ckpt_dir) and any(name.isdigit() for name in os.listdir(ckpt_dir))
    if not has_ckpt or force:
        return
    if not os.path.exists(os.path.join(workdir, CONFIG_FILE)):
        raise ConfigError(f"workdir {workdir!r} holds checkpoints but no {CONFIG_FILE}: refusing to resume "
                          f"(use --force, or another --workdir)")
    changes = differences(run, workdir, extra)
    if any(c.startswith("data.batch_size:") for c in changes):
        changes.append("the global batch (data.batch_size) defines the run's data order and steps; a resumed run "
                       "may change its mesh, devices or hosts (mesh.*), not its global batch")
    if changes:
        raise ConfigError(f"workdir {workdir!r} holds a run with a different config; refusing to resume "
                          f"(use --force to resume anyway, or another --workdir). Differences: " + "; ".join(changes))


def record(run: rc.RunConfig, workdir: str, extra: dict | None = None) -> None:
    """Writes the run's config and fingerprint (after its state was restored or initialised)."""
    atomic_write_json(os.path.join(workdir, CONFIG_FILE), run.to_dict(), sort_keys=True)
    atomic_write_json(os.path.join(workdir, FINGERPRINT_FILE), fingerprint(run, extra), sort_keys=True)
