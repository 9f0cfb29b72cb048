"""Typed dotted overrides (`a.b.c=value`) on trees of frozen dataclasses: the one override mechanism.

Every entry point owns one config tree (training: `train.config.RunConfig`; the quickstart and sweeps:
`zarya_jax.experiment.ExperimentConfig`; `generate`: `GenerationConfig`; `evaluate --knob`: one
`GenerationConfig` per mode) and every command-line `--set KEY=VALUE`, sweep key and preset file goes
through this module:

- `parse("a.b=1e-3")` splits a command-line item; values are YAML (`1e-3`, `true`, `[2,4,8]`; tuples
  also as `2,4,8`).
- `coerce(key, value, type)` turns a parsed value into the field's type, or raises `ConfigError`
  naming the key, the value and what was expected; numbers must be in range (`config.check_bounds`:
  floats finite, integers within their name's range, seeds uint32, step counts ≤ 10^9).
- `build(cls, mapping)` makes a dataclass from a nested mapping (a YAML file's sections);
  `apply(tree, overrides)` returns a copy of a tree with dotted overrides applied. An unknown key is an
  error that suggests the closest names (difflib), so a typo never runs the default silently.
- `keys(cls)` lists every (dotted key, type, default) for `--help`; `to_dict(tree)` is the inverse of
  `build` (JSON-ready, e.g. a run's `run_config.json` or a report's "config").

A field may publish another name with `dataclasses.field(metadata={"key": "spec-self"})` (a key that is
not a Python identifier), and a tree may hold "sparse" dataclasses (`sparse(cls)`: every field optional,
None = not set) for partial overrides of another config such as per-mode decoding knobs. A tree class
may list the keys it has moved (`MOVED_KEYS = {former key: key now}`): `apply` refuses a former key with an
error that names its new place, rather than aliasing it. A field typed
`dict[str, …]` is reached by dotted keys too (`frontier.grid.slotted.slot_size=[4,8]`): a mapping given
for it is merged into its current value, key by key (new keys last), and the class that holds it checks
and types what it receives (its `__post_init__`), storing it as a `FrozenMap` (`frozen`) so the config
stays hashable. A class may say what an unknown field of it is (`unknown_field(key, name)`, e.g. a mode's
knobs name the mode and its fields); the generic error suggests the closest keys.

Why not draccus or tyro: the configs must stay plain frozen, hashable dataclasses because they are jit
static arguments (one compile per config); values are YAML, as `--set` has always taken them; the
typo hints already existed here; and a library-made parser would bring its own CLI conventions and a
dependency for what is a hundred lines.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections import abc
import functools
import math
import re
import types
import typing
from typing import Any, Iterable, Mapping

import yaml

from .config import ConfigError, check_bounds

SPARSE = "__sparse_of__"  # attribute of a `sparse(cls)` dataclass: the class it overrides


class FrozenMap(Mapping):
    """An immutable mapping in insertion order, hashable when its values are (a config's `dict[...]` field,
    `frozen`): equal to a dict of the same items, written by `to_dict` as one."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping | Iterable = ()):
        object.__setattr__(self, "_items", dict(items))

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:  # order-free, as equality is
        return hash(frozenset(self._items.items()))

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __repr__(self) -> str:
        return repr(self._items)


def frozen(value: Any) -> Any:
    """`value` with every mapping a `FrozenMap` and every list a tuple, nested: the hashable form of a
    `dict[...]` config field (equal to the value it was made from, where that had no lists)."""
    if isinstance(value, Mapping):
        return FrozenMap((k, frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def parse(text: str, flag: str = "--set") -> tuple[str, Any]:
    """'a.b=value' -> ('a.b', YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"{flag} {text!r}: expected KEY=VALUE, e.g. optim.lr=1e-3")
    key, value = text.split("=", 1)
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def parse_all(items: Iterable[str] | Mapping[str, Any], flag: str = "--set") -> dict[str, Any]:
    """Command-line items (or an already parsed mapping) -> {dotted key: value}, later items winning."""
    if isinstance(items, Mapping):
        return dict(items)
    return dict(parse(item, flag) for item in items or ())


@functools.cache
def field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def external_name(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


@functools.cache
def _by_external_name(cls) -> dict[str, dataclasses.Field]:
    return {external_name(f): f for f in dataclasses.fields(cls)}


def _is_config(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_mapping(tp) -> bool:
    """A `dict[...]` / `Mapping[...]` field: its keys are data, reached by dotted keys and merged."""
    return tp in (dict, Mapping, abc.Mapping) or typing.get_origin(tp) in (dict, abc.Mapping)


def merged(base: Mapping, update: Mapping) -> dict:
    """`base` with `update` merged into it: nested mappings key by key (a new key last), other values replaced."""
    out = dict(base)
    for k, v in update.items():
        out[k] = merged(out[k], v) if isinstance(out.get(k), Mapping) and isinstance(v, Mapping) else v
    return out


def _leaves(mapping: Mapping, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, value) of every non-mapping value of a nested mapping."""
    out = []
    for k, v in mapping.items():
        out += _leaves(v, f"{prefix}{k}.") if isinstance(v, Mapping) else [(f"{prefix}{k}", v)]
    return out


def _optional_inner(tp):
    """(inner type, True) for `X | None`, else (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args:
            inner = [a for a in args if a is not type(None)]
            return inner[0], True
    return tp, False


def type_name(tp) -> str:
    return getattr(tp, "__name__", None) if not typing.get_args(tp) else str(tp).replace("typing.", "")


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Converts a parsed YAML value to a field type (tuples from lists or comma strings)."""
    inner, optional = _optional_inner(tp)
    if optional:
        return None if value is None else coerce(key, value, inner)
    tp = inner
    if _is_config(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r}: expected a mapping of {tp.__name__} fields")
        return build(tp, value, key + ".")
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v] if value else []
        if not isinstance(value, (list, tuple)):
            value = [value]
        return tuple(coerce(key, v, args[0]) for v in value)
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
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(value, float) and not math.isfinite(value)) or int(value) != value):
            raise ConfigError(f"{key}={value!r}: expected an integer")
        check_bounds(key, value, integer=True)  # before int(): 1e23 is refused as given, not as 99999…
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value!r}: expected a number")
        check_bounds(key, float(value))
        return float(value)
    if tp is str:
        if isinstance(value, (Mapping, list, tuple)):
            raise ConfigError(f"{key}={value!r}: expected a string")
        return str(value)
    return value


class UnknownKey(ConfigError):
    """A key the tree does not have (`unknown`): its text names the key as typed and suggests other keys,
    so a command that renames keys to its flags in errors must leave this one as it is."""


def unknown(key: str, known: Iterable[str], what: str = "config key") -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=3)
    hint = f"; did you mean {close}?" if close else ""
    return UnknownKey(f"unknown {what} {key!r}{hint} (run with --help for the list)")


def keys(cls, prefix: str = "", defaults: Any = None) -> list[tuple[str, str, Any]]:
    """(dotted key, type name, default) of every leaf knob of a config class, nested sections
    flattened. `defaults`: an instance whose values are shown instead of the class defaults."""
    out = []
    types_ = field_types(cls)
    for f in dataclasses.fields(cls):
        name = prefix + external_name(f)
        tp, _ = _optional_inner(types_[f.name])
        default = getattr(defaults, f.name) if defaults is not None else _default(f, "(required)")
        if _is_config(tp) and hasattr(tp, SPARSE):  # one row for a partial override of another config
            set_ = set_fields(default) if dataclasses.is_dataclass(default) else {}
            out.append((name + ".FIELD", f"{getattr(tp, SPARSE).__name__} field", set_ or "-"))
        elif _is_config(tp):
            out += keys(tp, name + ".", default if dataclasses.is_dataclass(default) else None)
        elif _is_mapping(tp) and isinstance(default, Mapping) and default:  # one row per leaf of the default
            out += [(k, type(v).__name__, v) for k, v in _leaves(default, name + ".")]
        else:
            out.append((name, type_name(types_[f.name]), default))
    return out


def help_table(rows: Iterable[tuple[str, str, Any]], flag: str = "--set") -> str:
    """`keys()` rows as the `--help` listing of an entry point."""
    lines = [f"knobs ({flag} KEY=VALUE; default in brackets):"]
    lines += [f"  {key:34s} {tname:18s} [{default}]" for key, tname, default in rows]
    return "\n".join(lines)


def _nest(flat: Mapping[str, Any], cls) -> dict[str, Any]:
    """{'a.b.c': v} -> {'a': {'b': {'c': v}}}, descending through the config-typed fields of `cls`; at
    an unknown name the rest of the key stays whole, so `build` reports the key as it was given."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node, node_cls, path = out, cls, []
        parts = key.split(".")
        for i, part in enumerate(parts):
            path.append(part)
            f = _by_external_name(node_cls).get(part)
            sub = _optional_inner(field_types(node_cls)[f.name])[0] if f is not None else None
            last = i == len(parts) - 1
            if not last and f is not None and _is_mapping(sub):  # the rest of the key: keys of the mapping
                node = node.setdefault(part, {})
                for key_part in parts[i + 1:-1]:
                    node = node.setdefault(key_part, {})
                    if not isinstance(node, dict):
                        raise ConfigError(f"config key {key!r}: {key_part!r} holds a value, not a mapping")
                node[parts[-1]] = value
                break
            if last or not _is_config(sub):
                leaf = ".".join(parts[i:])
                if not last and f is not None:  # descending below a leaf field: unknown
                    raise unknown(key, [k for k, _, _ in keys(cls)])
                node[leaf if f is None else part] = value
                break
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config section {'.'.join(path)!r} must be a mapping")
            node_cls = sub
    return out


def build(cls, values: Mapping[str, Any], prefix: str = "", *, base: Any = None):
    """A `cls` instance from a nested mapping of its (external) field names; nested config fields take
    mappings. `base`: an instance whose values are the defaults (else the class defaults)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"config section {prefix.rstrip('.') or cls.__name__!r}: expected a mapping")
    fields = _by_external_name(cls)
    types_ = field_types(cls)
    kwargs = {}
    for name, value in values.items():
        key = f"{prefix}{name}"
        f = fields.get(name)
        if f is None:
            explain = getattr(cls, "unknown_field", None)
            raise explain(key, name) if explain else unknown(key, [prefix + k for k, _, _ in keys(cls)])
        tp, optional = _optional_inner(types_[f.name])
        if _is_config(tp) and isinstance(value, Mapping):
            current = getattr(base, f.name) if base is not None else _default(f)
            kwargs[f.name] = build(tp, value, key + ".", base=current)
        elif _is_mapping(tp) and isinstance(value, Mapping):
            current = getattr(base, f.name) if base is not None else _default(f)
            merge = getattr(cls, f"merge_{f.name}", merged)  # a class may say how its mapping merges
            kwargs[f.name] = merge(current if isinstance(current, Mapping) else {}, value)
        else:
            kwargs[f.name] = coerce(key, value, types_[f.name])
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"config section {prefix.rstrip('.') or cls.__name__!r}: {e}") from None
    except ConfigError as e:
        if not prefix or getattr(e, "keyed", False):
            raise
        raise _keyed(e, prefix, cls) from None


def _keyed(error: ConfigError, prefix: str, cls) -> ConfigError:
    """A section's own check (`__post_init__`) names its field in the section's words (`optim.lr`,
    `LoraConfig.rank`); composed under `prefix` the same class is reached by another key
    (`drafter.optim.lr`, `rl.refresh_optim.lr`), so the message is given the key the user wrote."""
    message = str(error)
    head = re.match(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*\.([A-Za-z_]\w*)(?=[=:\s])", message)
    if head and head.group(1) in _by_external_name(cls):
        message = prefix + head.group(1) + message[head.end():]
    else:
        message = f"{prefix.rstrip('.')}: {message}"
    keyed = ConfigError(message)
    keyed.keyed = True
    return keyed


def _default(f: dataclasses.Field, missing: Any = None):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return missing


def apply(tree: Any, overrides: Iterable[str] | Mapping[str, Any], flag: str = "--set"):
    """A copy of the dataclass tree with dotted overrides (command-line items or a mapping) applied,
    each value coerced to its field's type; unknown keys raise `ConfigError` with suggestions."""
    flat = parse_all(overrides, flag)
    if not flat:
        return tree
    check_moved(type(tree), flat)
    return build(type(tree), _nest(flat, type(tree)), base=tree)


def check_moved(cls, flat: Mapping[str, Any]) -> None:
    """A ConfigError for the first key of `flat` that `cls` lists as moved (`MOVED_KEYS`: {former key: its key
    now}), naming the key to use: a clear error, never an alias. A mapping value is a section's (a former
    key may now be a section: `drafter.objective`)."""
    moved = getattr(cls, "MOVED_KEYS", {})
    for key, value in flat.items():
        if key in moved and not isinstance(value, Mapping):
            raise ConfigError(f"config key {key!r} has moved: it is now {moved[key]!r} (e.g. {moved[key]}={value!r})")


def get(tree: Any, key: str) -> Any:
    """The value at a dotted key (external names) of a dataclass tree."""
    node = tree
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
            continue
        f = _by_external_name(type(node)).get(part) if dataclasses.is_dataclass(node) else None
        if f is None:
            raise unknown(key, [k for k, _, _ in keys(type(tree))])
        node = getattr(node, f.name)
    return node


def to_dict(tree: Any) -> Any:
    """The tree as plain JSON-ready data (external names; a sparse node keeps only its set fields)."""
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        sparse_ = hasattr(type(tree), SPARSE)
        out = {}
        for f in dataclasses.fields(tree):
            value = getattr(tree, f.name)
            if sparse_ and value is None:
                continue
            out[external_name(f)] = to_dict(value)
        return out
    if isinstance(tree, (list, tuple)):
        return [to_dict(v) for v in tree]
    if isinstance(tree, Mapping):
        return {k: to_dict(v) for k, v in tree.items()}
    return tree


@functools.cache
def sparse(cls):
    """A frozen dataclass with the fields of `cls`, each optional and None (= not set) by default:
    a typed partial override of `cls` (e.g. the decoding knobs of one evaluation mode)."""
    types_ = field_types(cls)
    fields = [(f.name, typing.Optional[_optional_inner(types_[f.name])[0]], dataclasses.field(default=None))
              for f in dataclasses.fields(cls)]
    sparse_cls = dataclasses.make_dataclass(f"Sparse{cls.__name__}", fields, frozen=True,
                                            namespace={SPARSE: cls, "__module__": cls.__module__,
                                                       **({"unknown_field": cls.unknown_field}
                                                          if hasattr(cls, "unknown_field") else {})})
    return sparse_cls


def set_fields(partial: Any) -> dict[str, Any]:
    """{field: value} of the fields a sparse dataclass sets."""
    return {f.name: getattr(partial, f.name) for f in dataclasses.fields(partial) if getattr(partial, f.name) is not None}
