"""The evaluation's typed results, from the decoding loop to `report.json`:

- `Decoded`: one mode's decoding of a list of prompts (`evaluate.evaluate_mode`): texts, ids, passes,
  timings;
- `Prediction`: one example decoded in one mode, a line of `predictions.jsonl`;
- `ModeResult`: one mode on a split, a row of `summary.json` and of `report.json`'s `modes`;
- `FrontierPoint`: one (mode, knobs) point on the validation split (`frontier.sweep`).

`evaluate`, `frontier.sweep`, `diagnose`, the Markdown tables, `write_outputs` and the experiment's report
pass these values, never their dicts: a field added here (and measured where the mode is decoded)
reaches `summary.json` and `report.json` through `to_json`, and, marked `metric()`, a sweep's
`results.csv`. `from_json` reads a document back and refuses a key the type does not have (a
`ValueError` naming the key and the type), so a document of another schema is never read half.
"""
from __future__ import annotations

import dataclasses


def optional(default=None):
    """A field left out of `to_json` while it is None."""
    return dataclasses.field(default=default, metadata={"optional": True})


def metric(default=dataclasses.MISSING, *, optional_: bool = False):
    """A field a sweep tabulates per mode (`<mode>/<field>` columns of `results.csv`)."""
    return dataclasses.field(default=default, metadata={"metric": True, "optional": optional_})


def to_json(value) -> dict:
    """A result dataclass as a JSON-ready dict in field order; optional fields that are None are left out."""
    out = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if v is None and f.metadata.get("optional"):
            continue
        out[f.name] = v.to_json() if hasattr(v, "to_json") else v
    return out


def from_json(cls, data: dict):
    """`cls` from its `to_json` document: an unknown key, a missing required one or a non-mapping is a
    ValueError naming it and the type."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}.from_json: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise ValueError(f"{cls.__name__}.from_json: unknown key {unknown[0]!r} (a {cls.__name__} has "
                         f"{list(fields)})")
    missing = [n for n, f in fields.items() if n not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{cls.__name__}.from_json: missing key {missing[0]!r}")
    return cls(**data)


def metrics(cls) -> tuple[str, ...]:
    """The fields of `cls` marked `metric()`, in order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("metric"))


class _Json:
    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, data: dict):
        return from_json(cls, data)


@dataclasses.dataclass(frozen=True)
class Decoded:
    """One mode's decoding of a list of prompts (`evaluate_mode`): per prompt the text, the generated ids,
    their number and the forward passes (mode A also: the offsets its diffusion phase decoded); the wall
    time of the timed pass and of the untimed compile pass, the totals, and for the speculative modes the
    pooled acceptance (`accepted_per_cycle`, `acceptance_by_position`)."""

    texts: list[str]
    ids: list[list[int]]
    lengths: list[int]
    forward_passes: list[int]
    wall_s: float
    compile_s: float
    tokens: int
    tokens_per_s: float
    tokens_per_forward: float
    diffusion_offsets: list[list[int]] | None = None
    acceptance: dict | None = None


@dataclasses.dataclass(frozen=True)
class Prediction(_Json):
    """One example decoded in one mode (a line of `predictions.jsonl`): the rendered prompt and reference,
    the prompt and output ids, the output text, the extracted `prediction` against the reference's `gold`
    answer, and the decoding's tokens and forward passes (mode A: the offsets its diffusion phase decoded)."""

    index: int
    mode: str
    prompt: str
    reference: str
    prompt_ids: list[int]
    output: str
    output_ids: list[int]
    prediction: str | None
    gold: str | None
    correct: bool
    num_tokens: int
    forward_passes: int
    diffusion_offsets: list[int] | None = optional()


@dataclasses.dataclass(frozen=True)
class ModeResult(_Json):
    """One decoding mode on a split (`evaluate`): exact-match accuracy, tokens per forward pass, tokens/s
    and the speed-up over AR at the evaluation batch (and at batch 1 when measured: `tokens_per_s_batch1`,
    `batch1_examples`, `compile_s_batch1` and `speedup_vs_ar_batch1` go together), the `GenerationConfig`
    it decoded with (as JSON), the knobs it decoded with (`point` describes them when a frontier chose them;
    `validation_accuracy`: their accuracy on the validation frontier) and, for the speculative modes, the
    drafts accepted per cycle and by draft position."""

    mode: str
    label: str
    examples: int
    accuracy: float = metric()
    tokens_per_forward: float = metric()
    tokens_per_s: float = metric()
    generated_tokens: int
    wall_s: float
    compile_s: float
    batch_size: int
    generation_config: dict
    tokens_per_s_batch1: float | None = optional()
    batch1_examples: int | None = optional()
    compile_s_batch1: float | None = optional()
    speedup_vs_ar: float | None = metric(None)
    speedup_vs_ar_batch1: float | None = None
    knobs: dict = dataclasses.field(default_factory=dict)
    point: str = ""
    validation_accuracy: float | None = optional()
    accepted_per_cycle: float | None = metric(None, optional_=True)
    acceptance_by_position: list | None = metric(None, optional_=True)

    def to_json(self) -> dict:
        out = to_json(self)
        if self.batch1_examples is None:  # measured at batch 1 or not at all: the batch-1 keys go together
            out.pop("speedup_vs_ar_batch1")
        return out

    def knob(self, name: str):
        """A field of the generation config it decoded with (a mode's own field or a shared one: the
        record is flat, `GenerationConfig.as_dict`); None when it has none of that name."""
        return self.generation_config.get(name)


@dataclasses.dataclass(frozen=True)
class FrontierPoint(_Json):
    """One (mode, knobs) point decoded on the validation split (`frontier.sweep`): `correct` holds one
    bool per example; `within_tolerance` is set on a chosen point only (whether it loses at most the
    tolerated examples to AR)."""

    mode: str
    label: str
    knobs: dict
    point: str
    accuracy: float
    tokens_per_forward: float
    tokens_per_s: float
    examples: int
    correct: list
    within_tolerance: bool | None = optional()
