"""The decoding frontier of one checkpoint: accuracy against tokens per forward pass (and tokens/s) for
every decoding mode over a grid of its knobs, and the knobs of each mode chosen on a validation split.

Training and decoding are decoupled (docs/algorithms.md §4), so one checkpoint yields a whole frontier without any
retraining: mode B over τs × τt × S × NB × the AR corrections (`sampling.slotted`), mode A over T × α0 × order × sequential convention,
speculative decoding over F, AR as the reference point. Mode B's thresholds and corrections are
runtime values, so each (S, NB) compiles once, and so are mode A's α0, planned order and sequential
convention, so each T compiles once, twice with the confidence order (`sampling.generate`).

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

from ..inference import Inference
from ..sampling.config import MDM_ORDERS, MDM_SEQUENTIAL
from ..sampling.generate import static_key
from .evaluate import MODE_LABELS, EvalConfig, evaluate, generation_config

CORRECTIONS = {"refusion": (False, False), "infill": (True, False), "both": (True, True)}


@dataclasses.dataclass(frozen=True)
class FrontierConfig:
    """The grid of the decoding-only sweep and the choice rule.

    slotted_*: mode B's grid; `slotted_serial_num_blocks` 0 means one slot per block (NB = G // S).
    slotted_corrections: "refusion" (ReFusion's rule), "infill" (`ar_infill`), "both" (plus `ar_first_token`).
    mdm_steps × mdm_alpha0 × mdm_orders × mdm_sequential: mode A's grid (T = 0 ignores α0 and the
      sequential convention, α0 = 1 the convention). Mode A beats AR's tokens per forward only when
      α0·M > T (≈ M / (1 + min(N_d, T) + (1 − α0)·M)), so the default grid has no α0 = 0.25 point (≈ 0.85
      by construction at T = 16) and no T = 16 point. T = 4 with the logical order decodes chunks of M / 4
      left to right — a slot-sized query on a slotted checkpoint (its curriculum ends at slot size 8 for
      M = 32). draft_lengths: F of spec-self / spec-lora / spec-model.
    fused_draft_lengths: K of spec-self-fused / spec-lora-fused (one forward per cycle). A fused window
      has (K+1)(K+2) or (K+1)² rows, which a CPU pays for in proportion (an accelerator at small batch
      barely does), so the grid has no K = 2 point, which never wins on tokens per forward.
    tolerance: the fraction of the validation examples a chosen point may lose to AR (answer wrongly where AR
      is right); 0 (the default) asks for every answer AR gets right — parallel decoding at AR quality, the
      papers' claim.
    enabled: false skips the sweep (the pipeline then decodes with `eval.knobs`).
    """

    slotted_slot_size: tuple[int, ...] = (4, 8)
    slotted_serial_num_blocks: tuple[int, ...] = (0, 1, 2)
    slotted_slot_threshold: tuple[float, ...] = (0.9,)
    slotted_token_threshold: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)
    slotted_corrections: tuple[str, ...] = ("refusion", "infill", "both")
    mdm_steps: tuple[int, ...] = (0, 4, 8)
    mdm_alpha0: tuple[float, ...] = (0.5, 1.0)
    mdm_orders: tuple[str, ...] = ("random", "logical", "confidence")
    mdm_sequential: tuple[str, ...] = ("mask", "ar")
    draft_lengths: tuple[int, ...] = (2, 4, 8, 16)
    fused_draft_lengths: tuple[int, ...] = (4, 8, 16)
    tolerance: float = 0.0
    enabled: bool = True

    def __post_init__(self):
        bad = set(self.slotted_corrections) - set(CORRECTIONS)
        if bad:
            raise ValueError(f"frontier.slotted_corrections: unknown {sorted(bad)}; expected {sorted(CORRECTIONS)}")
        for name in ("slotted_slot_size", "draft_lengths", "fused_draft_lengths"):
            if any(v < 1 for v in getattr(self, name)):
                raise ValueError(f"frontier.{name}={getattr(self, name)}: expected values ≥ 1")
        if any(v < 0 for v in self.slotted_serial_num_blocks + self.mdm_steps):
            raise ValueError("frontier.slotted_serial_num_blocks / mdm_steps: expected values ≥ 0")
        bad = (set(self.mdm_orders) - set(MDM_ORDERS)) | (set(self.mdm_sequential) - set(MDM_SEQUENTIAL))
        if bad:
            raise ValueError(f"frontier.mdm_orders / mdm_sequential: unknown {sorted(bad)}; expected orders "
                             f"{list(MDM_ORDERS)} and conventions {list(MDM_SEQUENTIAL)}")
        if not 0.0 <= self.tolerance <= 1.0:
            raise ValueError(f"frontier.tolerance={self.tolerance}: expected a value in [0, 1]")


def grid_points(fc: FrontierConfig, modes, max_new_tokens: int) -> list[tuple[str, dict]]:
    """(mode, knobs) for every point of the grid, for the given evaluation modes (AR: one point)."""
    points = []
    for mode in modes:
        if mode == "ar":
            points.append(("ar", {}))
        elif mode == "slotted":
            seen = set()
            for s, nb, ts, tt, corr in itertools.product(
                    fc.slotted_slot_size, fc.slotted_serial_num_blocks, fc.slotted_slot_threshold,
                    fc.slotted_token_threshold, fc.slotted_corrections):
                if s > max_new_tokens:
                    continue
                nb = nb or max_new_tokens // s
                infill, first = CORRECTIONS[corr]
                knobs = {"slot_size": s, "serial_num_blocks": nb, "slot_threshold": ts, "token_threshold": tt,
                         "ar_infill": infill, "ar_first_token": first}
                key = tuple(sorted(knobs.items()))
                if key not in seen:
                    seen.add(key)
                    points.append(("slotted", knobs))
        elif mode == "mdm":
            points += [("mdm", k) for k in mdm_points(fc)]
        elif mode in ("spec-self", "spec-lora", "spec-model"):
            points += [(mode, {"draft_length": f}) for f in fc.draft_lengths]
        elif mode in ("spec-self-fused", "spec-lora-fused"):
            points += [(mode, {"draft_length": k}) for k in fc.fused_draft_lengths]
    return points


def mdm_points(fc: FrontierConfig) -> list[dict]:
    """Mode A's knobs, without the points a knob cannot change; the paper's defaults are left out of
    each dict (so a paper point reads as before)."""
    points, seen = [], set()
    for t, a, order, seq in itertools.product(fc.mdm_steps, fc.mdm_alpha0, fc.mdm_orders, fc.mdm_sequential):
        a = fc.mdm_alpha0[0] if t == 0 else a
        seq = "mask" if t == 0 or a == 1.0 else seq  # no sequential phase
        knobs = {"steps": t, "alpha0": a}
        if order != "random":
            knobs["mdm_order"] = order
        if seq != "mask":
            knobs["mdm_sequential"] = seq
        key = tuple(sorted(knobs.items()))
        if key not in seen:
            seen.add(key)
            points.append(knobs)
    return points


def describe(mode: str, knobs: dict) -> str:
    """A short label of a point's knobs, e.g. 'S=8 NB=4 τs=0.9 τt=0.5 AR-corrected'."""
    if mode == "slotted":
        corr = {v: k for k, v in CORRECTIONS.items()}.get((knobs.get("ar_infill", False),
                                                             knobs.get("ar_first_token", False)), "custom")
        corr = {"refusion": "ReFusion rule", "infill": "AR infill", "both": "AR infill + first token"}.get(corr, corr)
        return (f"S={knobs['slot_size']} NB={knobs['serial_num_blocks']} τs={knobs['slot_threshold']:g} "
                f"τt={knobs['token_threshold']:g} {corr}")
    if mode == "mdm":
        base = f"T={knobs['steps']} α0={knobs['alpha0']:g}" if knobs["steps"] else "T=0"
        extra = [f"{knobs['mdm_order']} order"] if knobs.get("mdm_order", "random") != "random" else []
        extra += ["AR-row sequential"] if knobs.get("mdm_sequential", "mask") == "ar" else []
        return " ".join([base] + extra)
    if mode.endswith("-fused"):
        return f"K={knobs['draft_length']}"
    if mode.startswith("spec"):
        return f"F={knobs['draft_length']}"
    return ""


def losses_to(reference: dict, row: dict) -> int:
    """How many examples `reference` answers correctly and `row` does not (rows' 'correct': one bool per
    example, the same examples in the same order)."""
    return sum(r and not c for r, c in zip(reference["correct"], row["correct"], strict=True))


def choose(rows: list[dict], tolerance: float) -> dict[str, dict]:
    """Per mode, the chosen frontier row (see the module docstring). rows: {'mode', 'accuracy',
    'tokens_per_forward', 'correct', ...}; AR's row is the reference (without one, every point qualifies)."""
    ar = next((r for r in rows if r["mode"] == "ar"), None)
    chosen = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        cands = [r for r in rows if r["mode"] == mode]
        ok = [r for r in cands if ar is None or losses_to(ar, r) <= tolerance * len(r["correct"]) + 1e-9]
        if ok:
            best = max(ok, key=lambda r: (r["tokens_per_forward"], r["accuracy"]))
        else:
            best = max(cands, key=lambda r: (r["accuracy"], r["tokens_per_forward"]))
        chosen[mode] = {**best, "within_tolerance": bool(ok)}
    return chosen


def pareto(rows: list[dict]) -> list[dict]:
    """The rows no other row of the same mode beats on both accuracy and tokens per forward (of rows
    with equal numbers, the first)."""
    out, seen = [], set()
    for r in rows:
        key = (r["mode"], r["accuracy"], r["tokens_per_forward"])
        beaten = any(o["mode"] == r["mode"] and o["accuracy"] >= r["accuracy"]
                     and o["tokens_per_forward"] >= r["tokens_per_forward"]
                     and (o["accuracy"], o["tokens_per_forward"]) != (r["accuracy"], r["tokens_per_forward"])
                     for o in rows)
        if not beaten and key not in seen:
            seen.add(key)
            out.append(r)
    return out


def sweep(model: Inference, records, points, ev: EvalConfig, progress=None) -> list[dict]:
    """Evaluates every (mode, knobs) point on `records` with `ev`'s budget, batch, answer extraction and
    seed; one row per point with its accuracy, tokens per forward, tokens/s and whether each example was
    answered correctly (a program shared by several points is compiled and warmed up once).
    progress(i, n) is called after each point."""
    rows, compiled = [], set()
    for i, (mode, knobs) in enumerate(points):
        key = (mode, static_key(generation_config(mode, ev.max_new_tokens, {mode: knobs})))
        one = dataclasses.replace(ev, modes=(mode,), batch1_examples=0)
        summary, predictions = evaluate(model, records, one, knobs={mode: knobs}, progress=False,
                                        warmup=key not in compiled)
        compiled.add(key)
        r = summary[0]
        rows.append({"mode": mode, "label": MODE_LABELS[mode], "knobs": dict(knobs), "point": describe(mode, knobs),
                     "accuracy": r["accuracy"], "tokens_per_forward": r["tokens_per_forward"],
                     "tokens_per_s": r["tokens_per_s"], "examples": r["examples"],
                     "correct": [p["correct"] for p in sorted(predictions, key=lambda p: p["index"])]})
        if progress:
            progress(i + 1, len(points))
    return rows
