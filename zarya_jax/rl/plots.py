"""The RL experiment's plot: held-out exact match and accepted draft tokens per cycle against the RL
step per arm, and each arm's rollout tokens per forward and wall time."""
from __future__ import annotations

from ..experiment.plots import _save, plt

ARM_COLORS = {"ar": "black", "frozen": "tab:purple", "refreshed": "tab:red", "self": "tab:green"}


def rl_plot(rows: list[dict], path: str, title: str = "") -> None:
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.4))
    for r in rows:
        color = ARM_COLORS.get(r["arm"])
        for ax, key, scale in ((axes[0], "exact_match", 100.0), (axes[1], "accepted_per_cycle", 1.0)):
            curve = r["curves"][key]
            if curve:
                steps, values = zip(*curve)
                ax.plot(steps, [scale * v for v in values], marker="o", ms=3, color=color, label=r["arm"])
    axes[0].set_ylabel("held-out greedy exact match (%)")
    axes[1].set_ylabel("accepted draft tokens per cycle")
    for ax in axes[:2]:
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # the AR arm alone draws no acceptance curve
            ax.legend(fontsize=8)
    arms = [r["arm"] for r in rows]
    colors = [ARM_COLORS.get(a) for a in arms]
    for ax, key, label in ((axes[2], "tokens_per_forward", "rollout tokens per forward"),
                           (axes[3], "rollout_s", "rollout wall time per RL step (s)")):
        ax.bar(arms, [r[key] or 0.0 for r in rows], color=colors)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_title("exact match vs RL step")
    axes[1].set_title("drafter acceptance vs RL step")
    axes[2].set_title("speculation per forward")
    axes[3].set_title("rollout time")
    if title:
        fig.suptitle(title)
    _save(fig, path)
