"""Experiment trackers: the metrics log's rows also go to Weights & Biases or trackio (`train.tracker`).

`train.tracker=wandb` or `trackio` (optional extras: `pip install -e ".[wandb]"` / `".[trackio]"`) opens one
tracker run per training run, on process 0 only (`metrics.MetricsLog`), with the whole run config, a
group (`train.tracker_group`; a sweep sets its name, so its runs land together) and a name
(`train.tracker_run`, default the workdir's name), and logs every row of `metrics.jsonl` at its step.
A resumed run continues the same tracker run: its id is derived from the workdir.

Where the runs land is each tracker's own setting: `WANDB_MODE=offline` / `WANDB_DIR` for W&B (then
`wandb sync`), `TRACKIO_DIR` for trackio's local database (`trackio show`), or their hosted services.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from typing import Any, Protocol

from ..config import ConfigError

TRACKERS = ("none", "wandb", "trackio")


class Tracker(Protocol):
    def log(self, step: int, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def check(kind: str) -> None:
    """Raises ConfigError when `kind` is unknown or its package is not installed (before any compute)."""
    if kind not in TRACKERS:
        raise ConfigError(f"train.tracker={kind!r}: expected one of {TRACKERS}")
    if kind != "none" and importlib.util.find_spec(kind) is None:
        raise ConfigError(f"train.tracker={kind} needs the {kind} package: pip install -e \".[{kind}]\"")


def run_id(workdir: str) -> str:
    """A stable id per workdir, so a resumed run logs into the same tracker run."""
    return hashlib.sha1(os.path.abspath(workdir).encode()).hexdigest()[:16]


class WandbTracker:
    def __init__(self, project: str, group: str, name: str, config: dict, workdir: str):
        import wandb  # optional extra, loaded only when asked for

        self.run = wandb.init(project=project, group=group or None, name=name, config=config, dir=workdir,
                              id=run_id(workdir), resume="allow")

    def log(self, step: int, row: dict[str, Any]) -> None:
        self.run.log(row, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    def __init__(self, project: str, group: str, name: str, config: dict, workdir: str):
        import trackio  # optional extra, loaded only when asked for

        self.trackio = trackio
        trackio.init(project=project, name=name, group=group or None, config=config, resume="allow")

    def log(self, step: int, row: dict[str, Any]) -> None:
        self.trackio.log(row, step=step)

    def close(self) -> None:
        self.trackio.finish()


def open_tracker(kind: str, *, project: str, group: str, name: str, config: dict, workdir: str) -> Tracker | None:
    """The tracker run of `kind` ("none": None)."""
    check(kind)
    if kind == "none":
        return None
    name = name or os.path.basename(os.path.abspath(workdir))
    cls = WandbTracker if kind == "wandb" else TrackioTracker
    return cls(project, group, name, config, workdir)
