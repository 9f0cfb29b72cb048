"""`Mode`: one decoding mode's knobs, a small frozen dataclass per mode defined in that mode's file.

A mode owns its fields (their defaults are the mode's defaults), their checks (`check`, called by
`GenerationConfig.validate`), which of them are traced (`TRACED`) and the `decoder.Decoder` that
`generate()` runs (`decoder`). The eight modes are registered by name in `modes.MODES`.

Traced fields are passed to the compiled program as traced scalars, so sweeping them reuses one
program; every other field selects a program. To make that one rule, every subclass is registered as
a pytree whose children are its TRACED fields and whose other fields are static (part of the treedef),
and the compile key holds `static()`, the mode with its TRACED fields reset to their defaults. The
decoder receives the mode object itself, its traced fields as arrays (`arrays`), and reads
`knobs.slot_threshold` the same way whether it is traced or not. A traced `str` field travels as its
index in the mode's `CHOICES[field]` (compare with `choices.index(...)`).

Validation lives in `check()`, never in `__post_init__`: a pytree is rebuilt with tracers as its
fields, which must not be validated. Adding a traced knob to a mode: a field, its name in `TRACED`,
its check, and its use in the decoder, all in the mode's file.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .decoder import Decoder

_DTYPES = {int: jnp.int32, float: jnp.float32, bool: jnp.bool_, str: jnp.int32}


@dataclasses.dataclass(frozen=True)
class Mode:
    """One decoding mode's knobs (module doc). Subclasses: `@dataclasses.dataclass(frozen=True)`, every
    field with a default, and the class attributes below."""

    name: ClassVar[str]                                   # the mode's one name (`modes.MODES`)
    label: ClassVar[str]                                  # its name in reports, e.g. "mode B (slotted)"
    lossless: ClassVar[bool] = False                      # its outputs are the AR sampler's (held to AR's)
    TRACED: ClassVar[tuple[str, ...]] = ()                # fields passed as traced scalars (no recompile)
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}    # a str field's allowed values
    decoder: ClassVar[Decoder]                            # what generate() runs (set in the mode's file)
    needs_mask_token: ClassVar[bool] = False              # whether decoding reads the mask token

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # a concrete mode (not a shared base such as `spec.TwoPass`)
            _NAMED[cls.name] = cls
        # The fields exist only once the dataclass decorator has run (after this hook), so the pytree
        # functions look them up when called (`_split`) rather than here.
        jax.tree_util.register_pytree_with_keys(cls, _flatten_with_keys, functools.partial(_unflatten, cls),
                                                _flatten)

    def check(self, gc) -> None:
        """Raises ValueError "knobs.<name>.<field>=<value>: expected …" for a bad field; `gc` is the
        `GenerationConfig` holding this mode (for checks against the shared fields)."""

    def static(self) -> "Mode":
        """The mode as the compile key sees it: the TRACED fields reset to their defaults."""
        return dataclasses.replace(self, **{f: _default(type(self), f) for f in self.TRACED})

    def canonical(self, max_new_tokens: int) -> "Mode | None":
        """An equivalent point for a frontier grid (fields the decode would not read reset, derived
        fields resolved), or None where the point cannot run at this budget. Default: itself."""
        return self

    def describe(self) -> dict[str, Any]:
        """The fields that differ from the mode's defaults, for reports and frontier labels."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != _default(type(self), f.name)}

    def lookahead(self) -> int:
        """Positions a decode may reach past prompt + max_new_tokens (checked against the model's
        `max_position_embeddings`). Default 0."""
        return 0

    def lookahead_source(self) -> str:
        """The knob `lookahead` comes from, for the error that the positions run out (e.g. "spec-self's
        draft_length=8"): its rows are a mode's, not the prompt's or the budget's. Default "" (none)."""
        return ""

    def short(self) -> str:
        """A short label of the point's knobs for reports and frontier plots; default "field=value" of the
        non-default fields."""
        return " ".join(f"{k}={v}" for k, v in self.describe().items())

    def arrays(self) -> "Mode":
        """This mode with every TRACED field an array of its field's type (float → float32, int → int32,
        bool → bool, str → int32 index in `CHOICES[field]`): the form the decoder receives, so one field
        always traces alike (an int given for a float field compiles nothing new). Idempotent, and
        usable inside a trace. A host value becomes a NumPy scalar (what `generate` hands its program on
        every call: cheaper than a device array), a traced or device value stays a JAX array."""
        hints = _hints(type(self))
        out = {}
        for f in self.TRACED:
            value = getattr(self, f)
            if hints[f] is str and isinstance(value, str):
                value = self.CHOICES[f].index(value)
            dtype = _DTYPES[hints[f]]
            out[f] = jnp.asarray(value, dtype) if isinstance(value, jax.Array) else np.asarray(value, dtype)
        return dataclasses.replace(self, **out)

    def knob_name(self, field: str) -> str:
        """The knob's full name in messages, e.g. "knobs.slotted.slot_size"."""
        return f"knobs.{self.name}.{field}"


# Every concrete mode by name, as its file defines it: `GenerationConfig(mode="slotted")` looks names up
# here, below the modes' files, which import `GenerationConfig` (`modes.MODES` is the ordered registry).
_NAMED: dict[str, type[Mode]] = {}


def named(name: str) -> Mode:
    """The mode called `name` with its default knobs; ValueError naming the known modes."""
    if name not in _NAMED:
        raise ValueError(f"mode {name!r}: unknown; expected one of {sorted(_NAMED)}")
    return _NAMED[name]()


# ------------------------------------------------------------------ checks shared by the modes' `check`

def expect_int(mode: Mode, field: str, low: int) -> None:
    value = getattr(mode, field)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{mode.knob_name(field)}={value!r}: expected an integer ≥ {low}")


def expect_fraction(mode: Mode, field: str, what: str = "a value in [0, 1]") -> None:
    value = getattr(mode, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{mode.knob_name(field)}={value!r}: expected {what}")


def expect_bool(mode: Mode, field: str) -> None:
    value = getattr(mode, field)
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{mode.knob_name(field)}={value!r}: expected true or false")


def expect_choice(mode: Mode, field: str) -> None:
    value = getattr(mode, field)
    if value not in mode.CHOICES[field]:
        raise ValueError(f"{mode.knob_name(field)}={value!r}: expected one of {mode.CHOICES[field]}")


def expect_at_least_zero(mode: Mode, field: str, what: str) -> None:
    value = getattr(mode, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ValueError(f"{mode.knob_name(field)}={value!r}: expected {what}")


# ------------------------------------------------------------------ the pytree registration

@functools.cache
def _hints(cls) -> dict[str, type]:
    return typing.get_type_hints(cls)


@functools.cache
def _split(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(traced field names in `TRACED` order, the other field names) of a mode class."""
    names = tuple(f.name for f in dataclasses.fields(cls))
    unknown = [f for f in cls.TRACED if f not in names]
    if unknown:
        raise TypeError(f"{cls.__name__}.TRACED names {unknown}, which are not fields of it ({list(names)})")
    return tuple(cls.TRACED), tuple(n for n in names if n not in cls.TRACED)


def _default(cls, field: str):
    return next(f.default for f in dataclasses.fields(cls) if f.name == field)


def _flatten(mode: Mode):
    traced, static = _split(type(mode))
    return tuple(getattr(mode, f) for f in traced), tuple((f, getattr(mode, f)) for f in static)


def _flatten_with_keys(mode: Mode):
    traced, static = _split(type(mode))
    children = tuple((jax.tree_util.GetAttrKey(f), getattr(mode, f)) for f in traced)
    return children, tuple((f, getattr(mode, f)) for f in static)


def _unflatten(cls, static, children):
    traced, _ = _split(cls)
    return cls(**dict(static), **dict(zip(traced, children)))
