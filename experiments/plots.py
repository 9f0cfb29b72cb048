"""Plots (matplotlib, headless): accuracy vs tokens per forward, the training loss curve, sweep results."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from zarya_jax.files import atomic_path  # noqa: E402


def _save(fig, path: str) -> None:
    """Atomic PNG write."""
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)


def report_plot(modes: list[dict], loss_curve: list[tuple[int, float]] | None, path: str, title: str = "") -> None:
    """Two panels: exact match vs tokens per forward (one point per decoding mode), loss vs step."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in modes:
        ax1.scatter(r["tokens_per_forward"], 100 * r["accuracy"], s=60)
        ax1.annotate(r.get("label", r["mode"]), (r["tokens_per_forward"], 100 * r["accuracy"]),
                     textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax1.set_xlabel("tokens per forward pass")
    ax1.set_ylabel("exact match (%)")
    ax1.set_title("accuracy vs parallelism")
    ax1.grid(alpha=0.3)
    if loss_curve:
        steps, losses = zip(*loss_curve)
        ax2.plot(steps, losses, lw=1)
        ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_ylabel("training loss")
    ax2.set_title("loss curve")
    ax2.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def sweep_plot(rows: list[dict], path: str, title: str = "") -> None:
    """Accuracy vs tokens per forward, one point per (run, decoding mode) of a sweep."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        modes = sorted({k.split("/")[0] for k in row if k.endswith("/accuracy")})
        for mode in modes:
            acc, tpf = row.get(f"{mode}/accuracy"), row.get(f"{mode}/tokens_per_forward")
            if acc is None or tpf is None:
                continue
            ax.scatter(tpf, 100 * acc, s=40)
            ax.annotate(f"{row['run']} [{mode}]", (tpf, 100 * acc), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.set_xlabel("tokens per forward pass")
    ax.set_ylabel("exact match (%)")
    ax.set_title(title or "sweep")
    ax.grid(alpha=0.3)
    _save(fig, path)
