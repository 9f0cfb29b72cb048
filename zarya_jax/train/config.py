"""A training run's whole configuration: model, zarya, optim, data, mesh and train sections.

Built from a preset name (`experiments/configs/<name>.yaml`) or a YAML/JSON file, then dotted
`key=value` overrides (`zarya.alpha0=0.3`, `model.num_layers=2`, `optim.lr=1e-3`, `data.train=x.jsonl`,
`mesh.fsdp=2`). The `model` section is a preset name or a dict of `ModelConfig` fields, optionally with
`preset: NAME` as the base. Every knob is a dataclass field; `knobs()` lists them for `--help`.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import typing
from typing import Any

import yaml

from .config import ConfigError, ModelConfig, ZaryaConfig, preset
from .data import DataConfig
from .optim import OptimConfig
from .sharding import MeshConfig

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Loop, checkpointing and logging knobs (intervals in optimizer steps; 0 disables)."""

    steps: int = 1000
    seed: int = 0
    objective: str = "zarya"
    log_every: int = 10
    eval_every: int = 200
    eval_batches: int = 4
    save_every: int = 500
    keep: int = 3  # most recent checkpoints kept
    keep_best: int = 1  # plus the best ones by eval loss
    async_checkpointing: bool = True
    export_final: bool = True  # final params via zarya_jax.checkpoint.save into WORKDIR/final
    init_from: str = ""  # a converted checkpoint (zarya_jax.checkpoint) to start from
    distributed: str = "auto"  # jax.distributed.initialize(): auto | on | off
    peak_flops: float = 0.0  # per device, for MFU; 0 = from the device table (CPU: an assumed peak)
    progress_bar: bool = True

    def __post_init__(self):
        if self.steps < 1:
            raise ConfigError(f"train.steps={self.steps}: expected ≥ 1")
        for name in ("log_every", "eval_every", "save_every", "eval_batches", "keep", "keep_best"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}={getattr(self, name)}: expected ≥ 0")
        if self.keep < 1:
            raise ConfigError(f"train.keep={self.keep}: expected ≥ 1 (the latest checkpoint is needed to resume)")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    zarya: ZaryaConfig = ZaryaConfig()
    optim: OptimConfig = OptimConfig()
    data: DataConfig = DataConfig()
    mesh: MeshConfig = MeshConfig()
    train: TrainConfig = TrainConfig()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **sections) -> "RunConfig":
        return dataclasses.replace(self, **sections)


SECTIONS: dict[str, type] = {"model": ModelConfig, "zarya": ZaryaConfig, "optim": OptimConfig,
                             "data": DataConfig, "mesh": MeshConfig, "train": TrainConfig}

# Fields a resumed run may change without being a different run.
RESUMABLE_CHANGES = {
    "train.log_every", "train.eval_every", "train.eval_batches", "train.save_every", "train.keep",
    "train.keep_best", "train.async_checkpointing", "train.export_final", "train.init_from",
    "train.distributed", "train.peak_flops", "train.progress_bar", "data.read_threads", "data.prefetch",
}


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Converts a parsed YAML value to a field type (tuples from lists or comma strings)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v] if value else []
        if not isinstance(value, (list, tuple)):
            value = [value]
        return tuple(_coerce(key, v, args[0]) for v in value)
    if tp in (int, float) and isinstance(value, str):
        # YAML 1.1 reads `1e-3` (no dot) as a string, and `2,4` splits into strings
        try:
            value = float(value)
        except ValueError:
            pass
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}={value!r}: expected true or false")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(f"{key}={value!r}: expected an integer")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value!r}: expected a number")
        return float(value)
    if tp is str:
        return str(value)
    return value


def _unknown(key: str, known) -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=3)
    hint = f"; did you mean {close}?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint} (run with --help for the list)")


def knobs() -> list[tuple[str, str, Any]]:
    """(dotted key, type, default) of every overridable knob; `model.*` defaults come from the preset."""
    out = [("model.preset", "str", "-")]
    for section, cls in SECTIONS.items():
        types = _field_types(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else "(preset)"
            tname = getattr(types[f.name], "__name__", None) or str(types[f.name]).replace("typing.", "")
            out.append((f"{section}.{f.name}", tname, default))
    return out


def resolve_config_path(name_or_path: str) -> str:
    """A preset name in experiments/configs/ or a path to a YAML/JSON file."""
    if os.path.isfile(name_or_path):
        return name_or_path
    for ext in (".yaml", ".yml", ".json"):
        cand = os.path.join(CONFIG_DIR, name_or_path + ext)
        if os.path.isfile(cand):
            return cand
    available = sorted(os.path.splitext(f)[0] for f in os.listdir(CONFIG_DIR)) if os.path.isdir(CONFIG_DIR) else []
    raise ConfigError(f"--config {name_or_path!r} is neither a file nor a preset; presets: {available}")


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


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=value' -> ('a.b', YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. optim.lr=1e-3")
    key, value = text.split("=", 1)
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def build(raw: dict[str, Any], overrides: list[str] | dict[str, Any] = ()) -> RunConfig:
    """RunConfig from a raw nested dict plus dotted overrides."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        raise ConfigError(f"unknown config sections {sorted(unknown)}: expected {list(SECTIONS)}")
    if isinstance(raw.get("model"), str):
        raw["model"] = {"preset": raw["model"]}
    items = overrides.items() if isinstance(overrides, dict) else (parse_override(o) for o in overrides)
    for key, value in items:
        section, _, field = key.partition(".")
        if section not in SECTIONS or not field:
            raise _unknown(key, [k for k, _, _ in knobs()])
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise ConfigError(f"config section {section!r} must be a mapping")
        raw[section][field] = value
    sections = {}
    for name, cls in SECTIONS.items():
        values = dict(raw.get(name) or {})
        types = _field_types(cls)
        base = None
        if name == "model":
            preset_name = values.pop("preset", None)
            if preset_name is not None:
                base = preset(str(preset_name))
            elif "vocab_size" not in values:
                raise ConfigError("the model section needs a preset (model.preset=tiny) or full ModelConfig fields")
        for k in values:
            if k not in types:
                raise _unknown(f"{name}.{k}", [kk for kk, _, _ in knobs()])
        kwargs = {k: _coerce(f"{name}.{k}", v, types[k]) for k, v in values.items()}
        try:
            sections[name] = dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
        except TypeError as e:
            raise ConfigError(f"config section {name!r}: {e}") from None
    return RunConfig(**sections)


def load(name_or_path: str, overrides: list[str] | dict[str, Any] = ()) -> RunConfig:
    return build(load_raw(name_or_path), overrides)


def from_dict(d: dict[str, Any]) -> RunConfig:
    """Inverse of `RunConfig.to_dict` (the workdir's run_config.json)."""
    return build({k: dict(v) for k, v in d.items()})


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
