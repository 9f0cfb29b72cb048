"""Plots (matplotlib, headless): accuracy vs tokens per forward, the training loss curve, sweep results."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from zarya_jax.files import atomic_path  # noqa: E402


def _save(fig, path: str) -> None:
    """Atomic PNG write."""
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)


MODE_COLORS = {"ar": "black", "mdm": "tab:orange", "slotted": "tab:blue", "spec-self": "tab:green",
               "spec-lora": "tab:purple", "spec-model": "tab:brown", "spec-self-fused": "tab:olive",
               "spec-lora-fused": "tab:pink"}


def frontier_plot(points: list[dict], chosen: list[dict], loss_curve: list[tuple[int, float]] | None, path: str,
                  title: str = "") -> None:
    """Three panels: accuracy vs tokens per forward and vs tokens/s for every frontier point (small,
    validation split) and each mode's chosen point (large, test split); the training loss curve."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for ax, x, xlabel in ((axes[0], "tokens_per_forward", "tokens per forward pass"),
                          (axes[1], "tokens_per_s", "generated tokens / s (this machine)")):
        for mode in dict.fromkeys(p["mode"] for p in points):
            pts = [p for p in points if p["mode"] == mode]
            ax.scatter([p[x] for p in pts], [100 * p["accuracy"] for p in pts], s=12, alpha=0.45,
                       color=MODE_COLORS.get(mode), label=f"{pts[0].get('label', mode)} (validation)")
        for r in chosen:
            ax.scatter(r[x], 100 * r["accuracy"], s=90, marker="*", color=MODE_COLORS.get(r["mode"]),
                       edgecolors="black", linewidths=0.6, zorder=3)
            ax.annotate(r.get("label", r["mode"]), (r[x], 100 * r["accuracy"]), textcoords="offset points",
                        xytext=(5, 5), fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("exact match (%)")
        ax.grid(alpha=0.3)
    axes[0].set_title("frontier: accuracy vs parallelism (★ chosen, test split)")
    axes[1].set_title("accuracy vs wall clock")
    axes[1].set_xscale("log")
    if points:
        axes[0].legend(fontsize=7, loc="lower left")
    if loss_curve:
        steps, losses = zip(*loss_curve)
        axes[2].plot(steps, losses, lw=1)
        axes[2].set_yscale("log")
    axes[2].set_xlabel("step")
    axes[2].set_ylabel("training loss")
    axes[2].set_title("loss curve")
    axes[2].grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def sweep_plot(rows: list[dict], path: str, title: str = "") -> None:
    """Accuracy vs tokens per forward, one point per (run, decoding mode) of a sweep; when runs decoded
    speculatively, a second panel: acceptance by draft position, one line per (run, speculative mode)."""
    curves = [(f"{row['run']} [{k.split('/')[0]}]", json.loads(v)) for row in rows for k, v in row.items()
              if k.endswith("/acceptance_by_position") and v]
    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(13 if curves else 7, 4.5), squeeze=False)
    ax = axes[0, 0]
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
    if curves:
        ax = axes[0, 1]
        for label, by_position in curves:  # position 0 (c0, the AR row's own draw) is always accepted
            ax.plot(range(1, len(by_position)), [100 * x for x in by_position[1:]], marker="o", ms=3, label=label)
        ax.set_xlabel("draft position j")
        ax.set_ylabel("P(c_j accepted | reached) (%)")
        ax.set_title("acceptance by draft position")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    _save(fig, path)
