"""The experiment's typed results: one `ModeResult` per decoding mode (test split), the validation
`Frontier` of `FrontierPoint`s, the `Target`s measured against the goals, the training's `TrainSummary`,
and the `Report` that holds them all. `Report.to_json()` is the `report.json` schema;
`Report.from_json` reads one back (a rerun of an up-to-date workdir returns it)."""
from __future__ import annotations

import dataclasses



def _optional(default=None):
    return dataclasses.field(default=default, metadata={"optional": True})


def _to_json(value) -> dict:
    """A result dataclass as a JSON-ready dict in field order; optional fields that are None are left out."""
    out = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if v is None and f.metadata.get("optional"):
            continue
        out[f.name] = v.to_json() if hasattr(v, "to_json") else v
    return out


def _from_json(cls, data: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclasses.dataclass(frozen=True)
class ModeResult:
    """One decoding mode on the test split (`zarya_jax.eval.evaluate`'s summary row): exact-match
    accuracy, tokens per forward pass, tokens/s and the speed-up over AR at the evaluation batch (and at
    batch 1 when measured), the `GenerationConfig` it decoded with, and the knobs chosen for it (`point`
    describes them; `validation_accuracy`: their accuracy on the validation frontier)."""

    mode: str
    label: str
    examples: int
    accuracy: float
    tokens_per_forward: float
    tokens_per_s: float
    generated_tokens: int
    wall_s: float
    compile_s: float
    batch_size: int
    generation_config: dict
    tokens_per_s_batch1: float | None = _optional()
    batch1_examples: int | None = _optional()
    speedup_vs_ar: float | None = None
    speedup_vs_ar_batch1: float | None = None
    knobs: dict = dataclasses.field(default_factory=dict)
    point: str = ""
    validation_accuracy: float | None = _optional()
    accepted_per_cycle: float | None = _optional()
    acceptance_by_position: list | None = _optional()

    def to_json(self) -> dict:
        out = _to_json(self)
        if self.batch1_examples is None:  # measured at batch 1 or not at all: the three keys go together
            out.pop("speedup_vs_ar_batch1")
        return out

    @classmethod
    def from_json(cls, data: dict) -> "ModeResult":
        return _from_json(cls, data)


@dataclasses.dataclass(frozen=True)
class FrontierPoint:
    """One (mode, knobs) point decoded on the validation split (`zarya_jax.eval.frontier.sweep`'s row):
    `correct` holds one bool per example; `within_tolerance` is set on a chosen point only (whether it
    loses at most the tolerated examples to AR)."""

    mode: str
    label: str
    knobs: dict
    point: str
    accuracy: float
    tokens_per_forward: float
    tokens_per_s: float
    examples: int
    correct: list
    within_tolerance: bool | None = _optional()

    def to_json(self) -> dict:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> "FrontierPoint":
        return _from_json(cls, data)


@dataclasses.dataclass(frozen=True)
class Frontier:
    """Every validation point and, per mode, the chosen one."""

    points: list[FrontierPoint]
    chosen: dict[str, FrontierPoint]
    validation_examples: int

    def to_json(self) -> dict:
        return {"points": [p.to_json() for p in self.points],
                "chosen": {m: p.to_json() for m, p in self.chosen.items()},
                "validation_examples": self.validation_examples}

    @classmethod
    def from_json(cls, data: dict) -> "Frontier":
        return cls(points=[FrontierPoint.from_json(p) for p in data["points"]],
                   chosen={m: FrontierPoint.from_json(p) for m, p in data["chosen"].items()},
                   validation_examples=data["validation_examples"])


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal, its measured value on the test split and whether it is met."""

    target: str
    value: float | None
    met: bool

    def to_json(self) -> dict:
        return _to_json(self)


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
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> "TrainSummary":
        return _from_json(cls, data)


@dataclasses.dataclass(frozen=True)
class Report:
    """An experiment's results: the code's provenance, the checkpoint evaluated, the model, the training
    (None when a checkpoint was given), one `ModeResult` per mode, the targets, the frontier (None when
    off), the diagnostics (`zarya_jax.eval.diagnose.analyse`), the loss curve, the config as JSON, the
    stages' timings and the total wall time."""

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

    def mode(self, name: str) -> ModeResult | None:
        return next((r for r in self.modes if r.mode == name), None)

    def to_json(self) -> dict:
        """The `report.json` document."""
        return {"provenance": self.provenance, "checkpoint": self.checkpoint, "model": self.model,
                "train": None if self.train is None else self.train.to_json(),
                "modes": [r.to_json() for r in self.modes], "targets": [t.to_json() for t in self.targets],
                "frontier": None if self.frontier is None else self.frontier.to_json(),
                "diagnostics": self.diagnostics, "loss_curve": self.loss_curve, "config": self.config,
                "timings": self.timings, "wall_s": self.wall_s}

    @classmethod
    def from_json(cls, data: dict) -> "Report":
        return cls(provenance=data["provenance"], checkpoint=data["checkpoint"], model=data["model"],
                   train=None if data["train"] is None else TrainSummary.from_json(data["train"]),
                   modes=[ModeResult.from_json(r) for r in data["modes"]],
                   targets=[Target(**t) for t in data["targets"]],
                   frontier=None if data["frontier"] is None else Frontier.from_json(data["frontier"]),
                   diagnostics=data["diagnostics"], loss_curve=data["loss_curve"], config=data["config"],
                   timings=data["timings"], wall_s=data["wall_s"])
