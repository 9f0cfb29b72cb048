"""Accuracy under parallelism (AUP; hao-ai-lab's d3LLM): one number for a decoding mode's whole
accuracy-vs-tokens-per-forward curve, so mode A and mode B (and the lossless modes beside them) compare
across checkpoints and sweeps without choosing one knob setting each.

For a mode's points sorted by tokens per forward ρ_1 < … < ρ_m with accuracies y_i in percent, kept
while y_i ≥ y_1 − `offset` (a point that loses more than `offset` points of accuracy against the mode's
least parallel one earns nothing):

    AUP = ρ_1·y_1 + Σ_{i≥2} (ρ_i − ρ_{i−1}) · (y_i·W(y_i) + y_{i−1}·W(y_{i−1})) / 2,
    W(y) = min(1, exp(−α·(1 − y / y_max)))

— the area under the curve from ρ = 0, each accuracy weighted down exponentially by how far it falls
below `y_max` (the best accuracy of every mode compared). A mode is its own upper envelope: of points at
the same ρ only the most accurate counts, and a point another one beats on both axes is left out.
AR decodes one token per forward, so its AUP is its accuracy.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .results import FrontierPoint

ALPHA = 3.0     # d3LLM's penalty for accuracy below the best
OFFSET = 5.0    # percentage points below the least parallel point's accuracy that still count


def weight(y: float, y_max: float, alpha: float = ALPHA) -> float:
    """W(y): 1 at the best accuracy, exp(−α) at accuracy 0 (`y`, `y_max` in percent)."""
    if y_max <= 0:
        return 1.0
    return min(1.0, math.exp(-alpha * (1.0 - y / y_max)))


def envelope(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (ρ, y) points no other point beats on both, sorted by ρ."""
    pts = sorted(set(points), key=lambda p: (p[0], -p[1]))
    return [p for p in pts if not any(o[0] >= p[0] and o[1] >= p[1] and o != p for o in pts)]


def aup(points: Sequence[tuple[float, float]], y_max: float, *, alpha: float = ALPHA,
        offset: float = OFFSET) -> float:
    """AUP of one mode's (tokens per forward, accuracy in percent) points, against the best accuracy
    `y_max` of all the modes compared."""
    curve = envelope(points)
    if not curve:
        raise ValueError("aup: no points")
    if any(r <= 0 for r, _ in curve):
        raise ValueError(f"aup: tokens per forward must be positive, got {[r for r, _ in curve]}")
    y_1 = curve[0][1]
    curve = [(r, y) for r, y in curve if y >= y_1 - offset]
    total = curve[0][0] * curve[0][1]
    for (r0, y0), (r1, y1) in zip(curve, curve[1:]):
        total += (r1 - r0) * (y1 * weight(y1, y_max, alpha) + y0 * weight(y0, y_max, alpha)) / 2
    return total


def by_mode(points: Sequence[FrontierPoint]) -> dict[str, float]:
    """Each mode's AUP over a frontier's points (accuracy as a fraction in the points, percent in AUP),
    against the best accuracy of any point. A point that decoded no token (0 tokens per forward) adds no
    area; a mode with only such points scores 0."""
    if not points:
        return {}
    y_max = 100.0 * max(p.accuracy for p in points)
    curves = {m: [(p.tokens_per_forward, 100.0 * p.accuracy) for p in points if p.mode == m and p.tokens_per_forward > 0]
              for m in dict.fromkeys(p.mode for p in points)}
    return {m: aup(c, y_max) if c else 0.0 for m, c in curves.items()}
