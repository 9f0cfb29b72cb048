"""The experiment's typed results: one `ModeResult` per decoding mode (test split), the validation
`Frontier` of `FrontierPoint`s (both defined with the evaluation, `zarya_jax.eval.results`), the `Target`s
measured against the goals, the training's `TrainSummary`, and the `Report` that holds them all.
`Report.to_json()` is the `report.json` schema; `Report.from_json` reads one back (a rerun of an
up-to-date workdir returns it), refusing a key no result type has (a `ValueError` naming it)."""
from __future__ import annotations

import dataclasses

from ..eval import aup
from ..eval.results import FrontierPoint, ModeResult, Prediction, from_json, to_json
from ..eval.speed import SpeedChoice

__all__ = ["Frontier", "FrontierPoint", "ModeResult", "Prediction", "Report", "Target", "TrainSummary"]


@dataclasses.dataclass(frozen=True)
class Frontier:
    """Every validation point and, per mode, the chosen one; `aup` is each mode's accuracy under
    parallelism over its points (`eval.aup`), derived from the points: written to the JSON for its
    readers, computed again when read back."""

    points: list[FrontierPoint]
    chosen: dict[str, FrontierPoint]
    validation_examples: int

    @property
    def aup(self) -> dict[str, float]:
        return aup.by_mode(self.points)

    def to_json(self) -> dict:
        return {"points": [p.to_json() for p in self.points],
                "chosen": {m: p.to_json() for m, p in self.chosen.items()},
                "validation_examples": self.validation_examples, "aup": self.aup}

    @classmethod
    def from_json(cls, data: dict) -> "Frontier":
        if not isinstance(data, dict):
            raise ValueError(f"Frontier.from_json: expected a mapping, got {type(data).__name__}")
        data = {k: v for k, v in data.items() if k != "aup"}
        nested = {"points": lambda v: [FrontierPoint.from_json(p) for p in v],
                  "chosen": lambda v: {m: FrontierPoint.from_json(p) for m, p in v.items()}}
        return from_json(cls, {k: nested[k](v) if k in nested else v for k, v in data.items()})


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal, its measured value on the test split and whether it is met."""

    target: str
    value: float | None
    met: bool

    def to_json(self) -> dict:
        return to_json(self)


@dataclasses.dataclass(frozen=True)
class TrainSummary:
    """What the report keeps of a training run (`zarya_jax.train.loop.train`'s summary)."""

    status: str | None = None
    step: int | None = None
    loss: float | None = None
    eval_loss: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    wall_s: float | None = None

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> "TrainSummary":
        return from_json(cls, data)

    @classmethod
    def of(cls, summary: dict) -> "TrainSummary":
        """What the report keeps of the loop's summary (whose other keys, such as the exported checkpoint's
        path, are the loop's own)."""
        return cls(**{f.name: summary.get(f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Report:
    """An experiment's results: the code's provenance, the checkpoint evaluated, the model, the training
    (None when a checkpoint was given), one `ModeResult` per mode, the targets, the frontier (None when
    off), the diagnostics (`zarya_jax.eval.diagnose.analyse`), the loss curve, the config as JSON, the
    stages' timings, the total wall time and the fastest lossless configuration per batch size (`speed`,
    `zarya_jax.eval.speed`; None when not chosen)."""

    provenance: dict
    checkpoint: str
    model: dict
    train: TrainSummary | None
    modes: list[ModeResult]
    targets: list[Target]
    frontier: Frontier | None
    diagnostics: dict | None
    loss_curve: list
    config: dict
    timings: dict
    wall_s: float
    speed: SpeedChoice | None = None

    def mode(self, name: str) -> ModeResult | None:
        return next((r for r in self.modes if r.mode == name), None)

    def to_json(self) -> dict:
        """The `report.json` document."""
        return {"provenance": self.provenance, "checkpoint": self.checkpoint, "model": self.model,
                "train": None if self.train is None else self.train.to_json(),
                "modes": [r.to_json() for r in self.modes], "targets": [t.to_json() for t in self.targets],
                "frontier": None if self.frontier is None else self.frontier.to_json(),
                "diagnostics": self.diagnostics, "loss_curve": self.loss_curve, "config": self.config,
                "timings": self.timings, "wall_s": self.wall_s,
                "speed": None if self.speed is None else self.speed.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> "Report":
        nested = {"train": lambda v: None if v is None else TrainSummary.from_json(v),
                  "modes": lambda v: [ModeResult.from_json(r) for r in v],
                  "targets": lambda v: [from_json(Target, t) for t in v],
                  "frontier": lambda v: None if v is None else Frontier.from_json(v),
                  "speed": lambda v: None if v is None else SpeedChoice.from_json(v)}
        if not isinstance(data, dict):
            raise ValueError(f"Report.from_json: expected a mapping, got {type(data).__name__}")
        return from_json(cls, {k: nested[k](v) if k in nested else v for k, v in data.items()})
