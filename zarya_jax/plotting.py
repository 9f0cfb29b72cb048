"""Matplotlib (headless) and the axes every report plot shares: an accuracy axis of 0–100 %, counts and
times from 0, whole-number step ticks, and an atomic PNG write. Below the experiment and RL reports
(`experiment.plots`, `rl.plots`), so neither imports the other's."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator, PercentFormatter  # noqa: E402

from .files import atomic_path  # noqa: E402

__all__ = ["plt", "save_figure", "accuracy_axis", "from_zero", "integer_axis"]


def save_figure(fig, path: str) -> None:
    """Atomic PNG write; the figure is closed."""
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)


def accuracy_axis(ax, label: str = "exact match") -> None:
    """Accuracy is a share: the axis is 0–100 % whatever the data (an all-zero run must not get a
    ±0.04 axis); markers on the bounds are drawn unclipped (`clip_on=False` where they are plotted)."""
    ax.set_ylim(0, 100)
    ax.yaxis.set_major_formatter(PercentFormatter(100, decimals=0))
    ax.set_ylabel(label)


def from_zero(ax, values, label: str) -> None:
    """A count, rate or time (never negative): the axis starts at 0 and fits the largest value, with room
    above it; all zero (or none) gives 0–1, not a ±0.05 axis around nothing."""
    top = max([v for v in values if v is not None] + [0.0])
    ax.set_ylim(0, 1.1 * top if top > 0 else 1.0)
    ax.set_ylabel(label)


def integer_axis(axis) -> None:
    """Whole-number ticks (steps, draft positions): no 2.5 steps on a 4-step run."""
    axis.set_major_locator(MaxNLocator(integer=True))
