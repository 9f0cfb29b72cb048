"""The RL experiment's plot: held-out exact match and accepted draft tokens per cycle against the RL
step per arm, and each arm's rollout tokens per forward and wall time.

Readable at every size of run, with the reports' shared axes (`zarya_jax.plotting`): exact match on a 0–100 %
axis, counts and times on axes from 0 that fit the data (an all-zero panel included), RL steps linear with
whole-number ticks, one legend under the panels naming each arm's colour, and constrained layout so no
panel's labels run into its neighbour's."""
from __future__ import annotations

from matplotlib.lines import Line2D

from ..plotting import accuracy_axis, from_zero, integer_axis, plt, save_figure

ARM_COLORS = {"ar": "black", "frozen": "tab:purple", "refreshed": "tab:red", "self": "tab:green"}


def rl_figure(rows: list[dict], title: str = ""):
    """Four panels for the arms' result rows (`experiment.rl_demo.arm_result`): exact match and acceptance against
    the RL step (curves), tokens per forward and rollout time per arm (bars)."""
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.8), layout="constrained")
    accepted = []
    for r in rows:
        color = ARM_COLORS.get(r["arm"])
        for ax, key, scale in ((axes[0], "exact_match", 100.0), (axes[1], "accepted_per_cycle", 1.0)):
            curve = r["curves"][key]
            if curve:
                steps, values = zip(*curve)
                ax.plot(steps, [scale * v for v in values], marker="o", ms=3, color=color, clip_on=False)
                if key == "accepted_per_cycle":
                    accepted += values
    accuracy_axis(axes[0], "held-out greedy exact match")
    from_zero(axes[1], accepted, "accepted draft tokens per cycle")
    for ax in axes[:2]:
        ax.set_xlabel("RL step")
        integer_axis(ax.xaxis)
        ax.grid(alpha=0.3)
    if not accepted:  # the AR arm alone drafts nothing
        axes[1].text(0.5, 0.5, "no arm drafts", transform=axes[1].transAxes, ha="center", va="center")
    arms = [r["arm"] for r in rows]
    colors = [ARM_COLORS.get(a) for a in arms]
    for ax, key, label in ((axes[2], "tokens_per_forward", "rollout tokens per forward"),
                           (axes[3], "rollout_s", "rollout wall time per RL step (s)")):
        values = [r[key] or 0.0 for r in rows]
        ax.bar(arms, values, color=colors)
        from_zero(ax, values, label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_title("exact match vs RL step")
    axes[1].set_title("drafter acceptance vs RL step")
    axes[2].set_title("speculation per forward")
    axes[3].set_title("rollout time")
    if arms:
        handles = [Line2D([], [], marker="o", ms=4, color=ARM_COLORS.get(a), label=a) for a in arms]
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def rl_plot(rows: list[dict], path: str, title: str = "") -> None:
    """`rl_figure`, written to `path` (PNG)."""
    save_figure(rl_figure(rows, title), path)
