"""A training run's whole configuration: model, zarya, optim, data, mesh and train sections.

Built from a preset name (`zarya_jax/configs/<name>.yaml`: tiny, small, 100m, qwen3-0.6b) or a
YAML/JSON file, then dotted `key=value` overrides (`zarya.alpha0=0.3`, `model.num_layers=2`,
`optim.lr=1e-3`, `data.train=x.jsonl`, `mesh.fsdp=2`) through `zarya_jax.overrides`. The `model` section
is a preset name or a dict of `ModelConfig` fields, optionally with `preset: NAME` as the base. Every
knob is a dataclass field; `knobs()` lists them for `--help`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, ClassVar

import yaml

from .. import overrides as ov
from ..config import MAX_STEPS, RUNTIME_FIELDS, ConfigError, ModelConfig, ZaryaConfig, preset
from ..data.pipeline import DataConfig
from .divergence import DivergenceConfig
from .optim import OptimConfig
from .sharding import MeshConfig
from .trackers import TRACKERS

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


OBJECTIVES = ("zarya", "ar")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Loop, checkpointing and logging knobs (intervals in optimizer steps; 0 disables)."""

    steps: int = 1000
    seed: int = 0
    objective: str = "zarya"  # zarya (the hybrid loss, docs/algorithms.md §2–§3) | ar (plain next-token baseline)
    log_every: int = 10
    eval_every: int = 200
    eval_batches: int = 4
    save_every: int = 500
    keep: int = 3  # most recent checkpoints kept
    keep_best: int = 1  # plus the best ones by eval loss
    async_checkpointing: bool = True
    export_final: bool = True  # final params via zarya_jax.checkpoint.save into WORKDIR/final
    init_from: str = ""  # a converted checkpoint (zarya_jax.checkpoint) to start from
    # train a checkpoint (init_from, a drafter's base) with a tokenizer that is not its own (`train.inherit`)
    allow_tokenizer_mismatch: bool = False
    distributed: str = "auto"  # jax.distributed.initialize(): auto | on | off
    peak_flops: float = 0.0  # per device, for MFU; 0 = from the device table, else measured (a matmul)
    progress_bar: bool = True
    tracker: str = "none"  # none | wandb | trackio: also log the metrics there (`train.trackers`)
    tracker_project: str = "zarya"
    tracker_group: str = ""  # runs compared together (a sweep sets its name)
    tracker_run: str = ""  # the run's name; "" = the workdir's name
    verify_checkpoints: bool = True  # check every checkpoint read (resume, init_from) against its checksums
    memory_check: bool = True  # refuse a step whose estimated memory exceeds the machine's (`train.memory`)
    divergence: DivergenceConfig = DivergenceConfig()  # when to stop a diverging run (train.divergence)

    def __post_init__(self):
        if not 1 <= self.steps <= MAX_STEPS:
            raise ConfigError(f"train.steps={self.steps}: expected 1 … {MAX_STEPS}")
        for name in ("log_every", "eval_every", "save_every", "eval_batches", "keep", "keep_best"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}={getattr(self, name)}: expected ≥ 0")
        if self.keep < 1:
            raise ConfigError(f"train.keep={self.keep}: expected ≥ 1 (the latest checkpoint is needed to resume)")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"train.objective={self.objective!r}: expected one of {OBJECTIVES}")
        if self.tracker not in TRACKERS:
            raise ConfigError(f"train.tracker={self.tracker!r}: expected one of {TRACKERS}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    zarya: ZaryaConfig = ZaryaConfig()
    optim: OptimConfig = OptimConfig()
    data: DataConfig = DataConfig()
    mesh: MeshConfig = MeshConfig()
    train: TrainConfig = TrainConfig()

    def to_dict(self) -> dict[str, Any]:
        return ov.to_dict(self)

    def replace(self, **sections) -> "RunConfig":
        return dataclasses.replace(self, **sections)


SECTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunConfig))


@dataclasses.dataclass(frozen=True)
class SideRunConfig:
    """A run trained beside a frozen base checkpoint (Uno's drafter, a draft model), composed as the
    experiment's: the trainer's sections it reads — `model` (its runtime fields only, `RUNTIME_FIELDS`: the
    structure is the base checkpoint's or its own section's), `data`, `mesh`, `train` — and, in a subclass,
    its own section (the field named `SECTION`: a `DrafterRun` or a `DraftModelRun`) with the run's `steps`,
    `batch_size` and `optim`. The same section is the experiment's (`drafter.*`, `draft_model.*`), so a key is
    spelled alike on both command lines; the trainer keys it holds (`train.steps`, `data.batch_size`,
    `optim.*`) and the keys of the former flat layout are errors naming theirs (`MOVED_KEYS`)."""

    model: ModelConfig
    data: DataConfig = DataConfig()
    mesh: MeshConfig = MeshConfig()
    train: TrainConfig = TrainConfig()

    SECTION: ClassVar[str] = ""
    MOVED_KEYS: ClassVar[dict[str, str]] = {}

    @property
    def section(self) -> Any:
        """The run's own section (`drafter`, `draft_model`)."""
        return getattr(self, self.SECTION)

    def run_config(self, model: ModelConfig, **train) -> RunConfig:
        """The `RunConfig` the training loop takes: `model` (the structure trained or read) run with this
        config's runtime fields, the section's steps, batch and optimizer, and the `train` fields given."""
        side = self.section
        return RunConfig(model=model.with_runtime_of(self.model), optim=side.optim, mesh=self.mesh,
                         data=dataclasses.replace(self.data, batch_size=side.batch_size),
                         train=dataclasses.replace(self.train, steps=side.steps, **train))

    @staticmethod
    def moved(section: str) -> dict[str, str]:
        """{trainer key: its key now} of the knobs a side run's section holds: steps, batch and optimizer."""
        return {"train.steps": f"{section}.steps", "data.batch_size": f"{section}.batch_size",
                **{f"optim.{f.name}": f"{section}.optim.{f.name}" for f in dataclasses.fields(OptimConfig)}}

    @classmethod
    def base_keys(cls, keys: tuple[str, ...]) -> dict[str, str]:
        """{key of the base run's config: this run's key} for the settings it takes from the run that trained
        its base (`train.inherit.from_base`): its batch and optimizer settings go to its section."""
        moved = cls.moved(cls.SECTION)
        return {key: moved.get(key, key) for key in keys}

    @classmethod
    def load(cls, name_or_path: str, overrides: list[str] | dict[str, Any] = (),
             defaults: dict[str, Any] | None = None):
        """The run from a preset or YAML/JSON file, `defaults` and the dotted overrides. A file may be a
        whole run config (a preset): of its sections this run reads `data`, `mesh`, `train` and the model's
        runtime fields, not the base run's `zarya`, `optim`, `train.steps` or `data.batch_size` (the
        section's `steps`, `batch_size`, `optim` are this run's). A moved key, or a structural `model.*`
        key, is an error naming the key to use."""
        flat = {**(defaults or {}), **ov.parse_all(overrides)}
        ov.check_moved(cls, flat)
        runtime = [f"model.{f}" for f in RUNTIME_FIELDS]
        structural = [k for k in flat if k.startswith("model.") and k not in runtime + ["model.preset"]]
        if structural:
            raise ConfigError(f"config key {structural[0]!r}: the model's structure is the base checkpoint's "
                              f"(--base); this run sets only its runtime fields {runtime}")
        raw = load_raw(name_or_path)
        names = {f.name for f in dataclasses.fields(cls)}
        raw = {k: v for k, v in raw.items() if k in names or k not in SECTIONS}  # unknown sections still refused
        for section, key in (("train", "steps"), ("data", "batch_size")):
            if isinstance(raw.get(section), dict):
                raw[section] = {k: v for k, v in raw[section].items() if k != key}
        return build(raw, flat, cls)


# The one definition of the knobs that do not change a run's results. PRESENTATION: how a run is shown or
# checked (two runs that differ only there are the same experiment, `experiment.config.comparable`);
# RESUMABLE_CHANGES: those and the loop's logging, evaluation, checkpoint and placement knobs, which a
# resumed run may change without being a different run (`train.identity`, `rl.config.diff`).
PRESENTATION = frozenset({
    "train.progress_bar", "train.verify_checkpoints",
    "train.allow_tokenizer_mismatch",  # a permission: the tokenizer itself is compared (data.tokenizer)
})
RESUMABLE_CHANGES = PRESENTATION | {
    "train.log_every", "train.eval_every", "train.eval_batches", "train.save_every", "train.keep",
    "train.keep_best", "train.async_checkpointing", "train.export_final", "train.init_from",
    "train.distributed", "train.peak_flops", "train.tracker", "train.tracker_project",
    "train.tracker_group", "train.tracker_run", "train.divergence", "train.memory_check",
    "data.read_threads", "data.prefetch",
    # The mesh: the run is defined by its global batch (data.batch_size, still compared), not by the devices
    # that compute it. Orbax restores the state onto the new mesh's shardings, the data iterator's position
    # is the same on every host whatever their number (`train.checkpoints`), and the step's math does not
    # depend on the layout (micro-batches are strided rows, random draws are sharding-independent), so the
    # losses continue as on the old mesh to float rounding (all-reduce order).
    *(f"mesh.{f.name}" for f in dataclasses.fields(MeshConfig)),
}


def degenerate(run: RunConfig) -> list[str]:
    """Settings that run but cannot train as meant, each as a warning (the loop prints them once): a zero
    learning rate (the parameters never change; kept for runs that export their initial weights) and
    a warmup longer than the run (the learning rate never reaches `optim.lr`)."""
    out = []
    if run.optim.lr == 0:
        out.append("optim.lr=0: the parameters will not change during this run")
    if run.optim.warmup_steps >= run.train.steps > 1:
        out.append(f"optim.warmup_steps={run.optim.warmup_steps} ≥ train.steps={run.train.steps}: the run ends "
                   f"during warmup, so the learning rate never reaches optim.lr={run.optim.lr}")
    return out


def knobs(cls: type = RunConfig) -> list[tuple[str, str, Any]]:
    """(dotted key, type, default) of every overridable knob of a run config class (`RunConfig` or a
    `SideRunConfig`: its model's runtime fields, not the keys it has moved); `model.*` defaults come from
    the preset."""
    side = issubclass(cls, SideRunConfig)  # the model's runtime fields only, none of the keys it moved
    return [("model.preset", "str", "-")] + [
        (key, tname, "(preset)" if default == "(required)" else default) for key, tname, default in ov.keys(cls)
        if not side or (key not in cls.MOVED_KEYS and (not key.startswith("model.") or key[6:] in RUNTIME_FIELDS))]


def presets() -> list[str]:
    return sorted(os.path.splitext(f)[0] for f in os.listdir(CONFIG_DIR)) if os.path.isdir(CONFIG_DIR) else []


def resolve_config_path(name_or_path: str) -> str:
    """A preset name in zarya_jax/configs/ or a path to a YAML/JSON file."""
    if os.path.isfile(name_or_path):
        return name_or_path
    for ext in (".yaml", ".yml", ".json"):
        cand = os.path.join(CONFIG_DIR, name_or_path + ext)
        if os.path.isfile(cand):
            return cand
    raise ConfigError(f"--config {name_or_path!r} is neither a file nor a preset; presets: {presets()}")


def load_raw(name_or_path: str) -> dict[str, Any]:
    path = resolve_config_path(name_or_path)
    with open(path) as f:
        try:
            raw = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
        except (ValueError, yaml.YAMLError) as e:
            raise ConfigError(f"config file {path!r} could not be parsed: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path!r}: expected a mapping of sections {list(SECTIONS)}")
    return raw


def build(raw: dict[str, Any], overrides: list[str] | dict[str, Any] = (), cls: type = RunConfig) -> RunConfig:
    """A run config (`cls`: RunConfig or a `SideRunConfig`: sections, `model` first) from a raw nested dict
    (a config file's sections) plus dotted overrides."""
    sections = tuple(f.name for f in dataclasses.fields(cls))
    flat = ov.parse_all(overrides)
    ov.check_moved(cls, flat)  # before the model's keys are taken out below
    unknown = set(raw) - set(sections)
    if unknown:
        raise ConfigError(f"unknown config sections {sorted(unknown)}: expected {list(sections)}")
    model = raw.get("model") or {}
    model = {"preset": model} if isinstance(model, str) else dict(model)
    for key in [k for k in flat if k.startswith("model.")]:
        model[key.partition(".")[2]] = flat.pop(key)
    preset_name = model.pop("preset", None)
    if preset_name is None and "vocab_size" not in model:
        raise ConfigError("the model section needs a preset (model.preset=tiny) or full ModelConfig fields")
    base = preset(str(preset_name)) if preset_name is not None else None
    built = {"model": ov.build(ModelConfig, model, "model.", base=base)}
    for name in sections[1:]:
        section = raw.get(name) or {}
        if not isinstance(section, dict):
            raise ConfigError(f"config section {name!r} must be a mapping")
        built[name] = ov.build(ov.field_types(cls)[name], section, name + ".")
    return ov.apply(cls(**built), flat)


def load(name_or_path: str, overrides: list[str] | dict[str, Any] = (), cls: type = RunConfig) -> RunConfig:
    return build(load_raw(name_or_path), overrides, cls)


def from_dict(d: dict[str, Any]) -> RunConfig:
    """Inverse of `RunConfig.to_dict` (the workdir's run_config.json)."""
    return build(d)


def diff(a: RunConfig, b: RunConfig, ignore=RESUMABLE_CHANGES) -> list[str]:
    """Dotted keys whose values differ (beyond the harmless ones), as 'key: a -> b'."""
    out = []
    da, db = a.to_dict(), b.to_dict()
    for section in SECTIONS:
        for k in sorted(set(da[section]) | set(db[section])):
            key = f"{section}.{k}"
            va, vb = da[section].get(k), db[section].get(k)
            if isinstance(va, list):
                va = tuple(va)
            if isinstance(vb, list):
                vb = tuple(vb)
            if key not in ignore and va != vb:
                out.append(f"{key}: {va!r} -> {vb!r}")
    return out
