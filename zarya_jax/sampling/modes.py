"""The decoding modes by name: one name per mode everywhere (CLI `--modes`, `--knob`, reports, sweeps,
frontier, lm-eval, bench), each a `mode.Mode` defined in its mode's file."""
from __future__ import annotations

import dataclasses

from .ar import AR
from .fused import FusedLora, FusedSelf
from .mdm import MDM
from .mode import Mode
from .slotted import Slotted
from .spec import SpecLora, SpecSelf
from .spec_model import SpecModel

MODES: dict[str, type[Mode]] = {cls.name: cls for cls in (AR, MDM, Slotted, SpecSelf, SpecLora, SpecModel, FusedSelf,
                                                          FusedLora)}


def mode(name: str, **knobs) -> Mode:
    """The mode called `name` with `knobs` (its fields) set, e.g. `mode("slotted", slot_size=4)`. An unknown
    name or knob: ValueError naming the valid ones. The values are checked by `GenerationConfig.validate`."""
    if name not in MODES:
        raise ValueError(f"mode {name!r}: unknown; expected one of {list(MODES)}")
    cls = MODES[name]
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in knobs if k not in fields]
    if unknown:
        raise ValueError(f"knob(s) {[f'{name}.{k}' for k in unknown]}: not field(s) of mode {name!r}; its fields are "
                         f"{fields or 'none'}")
    return cls(**knobs)
