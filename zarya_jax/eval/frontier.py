"""The decoding frontier of one checkpoint: accuracy against tokens per forward pass (and tokens/s) for
every decoding mode over a grid of its knobs, and the knobs of each mode chosen on a validation split.

Training and decoding are decoupled (docs/algorithms.md §4), so one checkpoint yields a whole frontier
without any retraining. The grid (`FrontierConfig.grid`) may name any field of any mode and lists none
itself: by default mode B over S × NB × τs × τt × the AR corrections (`sampling.slotted`), mode A over
T × α0 × order × sequential convention, speculative decoding over F (K × scenarios fused), AR as the reference
point. A mode's traced fields (`Mode.TRACED`: mode B's thresholds and corrections, mode A's α0, planned
order and sequential convention) are runtime values, so each (S, NB) compiles once and each T once,
twice with the confidence order (`sampling.generate`).

Choosing (`choose`): per mode, among the validation points that lose at most a fraction `tolerance` of the
examples to AR — answer wrongly an example AR answers correctly (with 0: none) — the one with the most
tokens per forward (ties: the more accurate); when none does, the most accurate point. The comparison is
paired, example by example, rather than of accuracies: on a split of 100 examples, a point that is a few
points worse than AR often ties AR's accuracy by gaining on some examples what it loses on others, and
then does worse on test; a point that loses no example is one that reproduces AR's answers. Knobs are
chosen on validation only; the caller then reports the chosen points on a disjoint test split.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

from .. import overrides as ov
from ..config import ConfigError
from ..inference import Inference
from ..sampling import GenerationConfig
from ..sampling import modes as modes_lib
from ..sampling.generate import static_key
from .evaluate import MODE_LABELS, EvalConfig, evaluate, generation_config, no_field
from .results import FrontierPoint

# The default grid, point for point the one the frontier has always swept: mode B over S × NB × τs × τt ×
# the AR corrections (ReFusion's rule, AR infill, both), mode A over T × α0 × order × sequential
# convention, F for the two-pass drafters and K for the fused ones (no K = 2: a fused window has
# (K+1)(K+2) or (K+1)² rows, which a CPU pays for in proportion, and it never wins on tokens per forward)
# with all K+1 scenario blocks or the 1 or 2 most likely (`scenarios`: a window of (K+1) + S·B rows; the
# full window always has the most tokens per forward, the smaller ones are there for the choice for time).
# Mode A beats AR's tokens per forward only when α0·M > T (≈ M / (1 + min(N_d, T) + (1 − α0)·M)), so
# there is no α0 = 0.25 point (≈ 0.85 by construction at T = 16) and no T = 16 point; T = 4 with the
# logical order decodes chunks of M / 4 left to right — a slot-sized query on a slotted checkpoint.
DEFAULT_GRID = {
    "ar": {},
    "mdm": {"steps": (0, 4, 8), "alpha0": (0.5, 1.0), "order": ("random", "logical", "confidence"),
            "sequential": ("mask", "ar")},
    "slotted": {"slot_size": (4, 8), "serial_num_blocks": (0, 1, 2), "slot_threshold": (0.9,),
                "token_threshold": (0.3, 0.5, 0.7, 0.9),
                "ar_infill,ar_first_token": ((False, False), (True, False), (True, True))},
    **{m: {"draft_length": (2, 4, 8, 16)} for m in ("spec-self", "spec-lora", "spec-model")},
    **{m: {"draft_length": (4, 8, 16), "scenarios": (0, 1, 2)} for m in ("spec-self-fused", "spec-lora-fused")},
}
CHECK_BUDGET = 1 << 16  # the generation budget each grid value is checked at when the config is built


@dataclasses.dataclass(frozen=True)
class FrontierConfig:
    """The grid of the decoding-only sweep and the choice rule.

    grid: {mode: {field or "field1,field2": [values]}} — per mode, the product over its keys in their
      order (a comma-joined key takes tuples: joint values, e.g. mode B's AR corrections), each value
      typed from the mode's field; points that decode alike (`Mode.canonical(max_new_tokens)`, e.g. mode
      B's `serial_num_blocks` 0 = one slot per block, NB = G // S) are kept once, and a point that cannot
      run at the budget is dropped (`grid_points`). A mode without a key is one point, its defaults.
      `--set frontier.grid.<mode>.<field>=[…]` (sweep files alike) replaces one key's values and keeps
      the others, but those it shares a field with (setting `ar_infill` alone replaces the joint
      `ar_infill,ar_first_token`); `frontier.grid.<mode>={}` leaves the mode one point, its defaults
      (`merge_grid`). Every point is checked against its mode when the config is built. Defaults: `DEFAULT_GRID`.
      Held as a `FrozenMap` of `FrozenMap`s of tuples, so the config is hashable.
    tolerance: the fraction of the validation examples a chosen point may lose to AR (answer wrongly where AR
      is right); 0 (the default) asks for every answer AR gets right — parallel decoding at AR quality, the
      papers' claim.
    enabled: false skips the sweep (the pipeline then decodes with `eval.knobs`).
    """

    grid: Mapping[str, Mapping[str, tuple]] = dataclasses.field(default_factory=lambda: DEFAULT_GRID)
    tolerance: float = 0.0
    enabled: bool = True

    @staticmethod
    def merge_grid(grid: Mapping, update: Mapping) -> dict:
        """`grid` with the overrides `update` ({mode: {key: values}}) merged as the class doc says: a mode
        given {} is emptied (the whole grid given {}: every mode), a given key replaces every key of its mode that shares a field with it."""
        if not isinstance(update, Mapping):
            return update  # refused with its message by __post_init__
        if not update:  # frontier.grid={}: every mode one point
            return {}
        out = {mode: dict(keys) for mode, keys in grid.items()}
        for mode, keys in update.items():
            if not isinstance(keys, Mapping) or not keys:
                out[mode] = keys if not isinstance(keys, Mapping) else {}
                continue
            current = out.get(mode, {})
            for key in keys:
                fields = set(str(key).split(","))
                current = {k: v for k, v in current.items() if k == key or not fields & set(k.split(","))}
            out[mode] = {**current, **keys}
        return out

    def __post_init__(self):
        if not isinstance(self.grid, Mapping):
            raise ConfigError(f"frontier.grid={self.grid!r}: expected a mapping {{mode: {{field: [values]}}}}")
        # frozen (hashable, a jit static argument like every config); read, compared and written as a dict
        object.__setattr__(self, "grid", ov.frozen({name: _mode_grid(name, keys) for name, keys in self.grid.items()}))
        if not 0.0 <= self.tolerance <= 1.0:
            raise ValueError(f"frontier.tolerance={self.tolerance}: expected a value in [0, 1]")


def _mode_grid(name: str, keys) -> dict[str, tuple]:
    """One mode's grid, typed from the mode's dataclass fields: {key: tuple of values (tuples for a joint key)};
    an unknown mode or field, a joint value of the wrong length or a value the mode refuses is a ConfigError
    naming `frontier.grid.<mode>.<key>`."""
    if name not in modes_lib.MODES:
        raise ConfigError(f"frontier.grid.{name}: unknown mode; expected some of {tuple(modes_lib.MODES)}")
    if not isinstance(keys, Mapping):
        raise ConfigError(f"frontier.grid.{name}={keys!r}: expected a mapping {{field: [values]}}")
    types = ov.field_types(modes_lib.MODES[name])
    out, seen = {}, set()
    for key, values in keys.items():
        where = f"frontier.grid.{name}.{key}"
        fields = key.split(",")
        for field in fields:
            if field not in types:
                raise ConfigError(no_field(where, name, field))
            if field in seen:
                raise ConfigError(f"{where}: {field!r} is in another key of frontier.grid.{name} too; expected "
                                  "each field in one key")
            seen.add(field)
        if len(fields) == 1:  # a list, a scalar or "a,b" (as `--set` gives tuples)
            typed = list(ov.coerce(where, values, tuple[types[key], ...]))
        else:
            typed = []
            for value in values if isinstance(values, (list, tuple)) else [values]:
                if not isinstance(value, (list, tuple)) or len(value) != len(fields):
                    raise ConfigError(f"{where}={value!r}: expected lists of {len(fields)} values, one for each of "
                                      f"{fields}")
                typed.append(tuple(ov.coerce(f"{where}[{f}]", v, types[f]) for f, v in zip(fields, value)))
        if not typed:
            raise ConfigError(f"{where}={values!r}: expected at least one value")
        out[key] = tuple(typed)
    for knobs in _products(out):  # every point against its mode's checks, at a budget that drops none
        try:
            point = modes_lib.mode(name, **knobs).canonical(CHECK_BUDGET)
            GenerationConfig(mode=point, max_new_tokens=CHECK_BUDGET).validate()
        except ValueError as e:
            raise ConfigError(f"frontier.grid.{name}: the point {knobs}: {e}") from None
    return out


def _products(keys: dict[str, tuple]):
    """The grid's points of one mode as {field: value}, in the grid's order."""
    for values in itertools.product(*keys.values()):
        knobs = {}
        for key, value in zip(keys, values):
            knobs.update(zip(key.split(","), value) if "," in key else [(key, value)])
        yield knobs


def grid_points(fc: FrontierConfig, modes, max_new_tokens: int) -> list[tuple[str, dict]]:
    """(mode, knobs) for every point of the grid, for the given evaluation modes, in the grid's order: the
    product over each mode's keys; points that decode alike (the same `Mode.canonical(max_new_tokens)`)
    are kept once, as the first of them, and one that cannot run at this budget (canonical None) is
    dropped. The kept point is the grid's own when it is a valid setting as written, else its canonical
    form (e.g. mode B's NB = 0 → G // S). knobs: the grid's fields of that point."""
    points = []
    for name in modes:
        keys = fc.grid.get(name, {})
        fields = [f for key in keys for f in key.split(",")]
        seen = set()
        for knobs in _products(keys):
            point = modes_lib.mode(name, **knobs)
            canonical = point.canonical(max_new_tokens)
            if canonical is None or canonical in seen:
                continue
            seen.add(canonical)
            point = point if _valid(point, max_new_tokens) else canonical
            points.append((name, {f: getattr(point, f) for f in fields}))
    return points


def _valid(point, max_new_tokens: int) -> bool:
    try:
        GenerationConfig(mode=point, max_new_tokens=max_new_tokens).validate()
    except ValueError:
        return False
    return True


def describe(mode: str, knobs: dict) -> str:
    """A short label of a point, as its mode writes it (`Mode.short`), e.g. 'S=8 NB=4 τs=0.9 τt=0.5 AR
    infill + first token', 'T=8 α0=0.5 confidence order', 'F=4'."""
    return modes_lib.mode(mode, **knobs).short()


def losses_to(reference: FrontierPoint, point: FrontierPoint) -> int:
    """How many examples `reference` answers correctly and `point` does not (their `correct`: one bool per
    example, the same examples in the same order)."""
    return sum(r and not c for r, c in zip(reference.correct, point.correct, strict=True))


def choose(points: list[FrontierPoint], tolerance: float) -> dict[str, FrontierPoint]:
    """Per mode, the chosen point (see the module docstring), with `within_tolerance` set; AR's point is
    the reference (without one, every point qualifies)."""
    ar = next((p for p in points if p.mode == "ar"), None)
    chosen = {}
    for mode in dict.fromkeys(p.mode for p in points):
        cands = [p for p in points if p.mode == mode]
        ok = [p for p in cands if ar is None or losses_to(ar, p) <= tolerance * len(p.correct) + 1e-9]
        if ok:
            best = max(ok, key=lambda p: (p.tokens_per_forward, p.accuracy))
        else:
            best = max(cands, key=lambda p: (p.accuracy, p.tokens_per_forward))
        chosen[mode] = dataclasses.replace(best, within_tolerance=bool(ok))
    return chosen


def pareto(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other point of the same mode beats on both accuracy and tokens per forward (of points
    with equal numbers, the first)."""
    out, seen = [], set()
    for p in points:
        key = (p.mode, p.accuracy, p.tokens_per_forward)
        beaten = any(o.mode == p.mode and o.accuracy >= p.accuracy and o.tokens_per_forward >= p.tokens_per_forward
                     and (o.accuracy, o.tokens_per_forward) != (p.accuracy, p.tokens_per_forward) for o in points)
        if not beaten and key not in seen:
            seen.add(key)
            out.append(p)
    return out


def sweep(model: Inference, records, points, ev: EvalConfig, progress=None) -> list[FrontierPoint]:
    """Evaluates every (mode, knobs) point on every record with `ev`'s budget, batch, answer extraction
    and seed; one `FrontierPoint` per point with its accuracy, tokens per forward, tokens/s and whether
    each example was answered correctly (a program shared by several points is compiled and warmed up
    once). progress(i, n) is called after each point."""
    out, compiled = [], set()
    for i, (mode, knobs) in enumerate(points):
        key = (mode, static_key(generation_config(mode, ev.max_new_tokens, {mode: knobs})))
        # one mode, timed once: `limit` is the test split's, and nothing takes turns with a lone mode
        one = dataclasses.replace(ev, modes=(mode,), batch1_examples=0, limit=0, repeats=1)
        (r,), predictions = evaluate(model, records, one, knobs={mode: knobs}, progress=False,
                                     warmup=key not in compiled)
        compiled.add(key)
        out.append(FrontierPoint(mode=mode, label=MODE_LABELS[mode], knobs=dict(knobs), point=describe(mode, knobs),
                                 accuracy=r.accuracy, tokens_per_forward=r.tokens_per_forward,
                                 tokens_per_s=r.tokens_per_s, examples=r.examples,
                                 correct=[p.correct for p in sorted(predictions, key=lambda p: p.index)]))
        if progress:
            progress(i + 1, len(points))
    return out
