"""Plots (matplotlib, headless): accuracy vs tokens per forward, the training loss curve, sweep results.

Readable at every size of run: accuracy axes always span 0–100 % (a share, never negative), step axes
are linear with integer ticks, a log axis only where the values span orders of magnitude, per-point
labels only where they fit (the legend names every colour and marker, so a label left out loses
nothing), and constrained layout so no panel's labels run into its neighbour's."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from zarya_jax.plotting import accuracy_axis as _accuracy_axis  # noqa: E402  (the axes shared with rl.plots)
from zarya_jax.plotting import integer_axis as _integer_axis  # noqa: E402
from zarya_jax.plotting import save_figure as _save  # noqa: E402
from zarya_jax.eval.results import FrontierPoint, ModeResult  # noqa: E402


MODE_COLORS = {"ar": "black", "mdm": "tab:orange", "slotted": "tab:blue", "spec-self": "tab:green",
               "spec-lora": "tab:purple", "spec-model": "tab:brown", "spec-self-fused": "tab:olive",
               "spec-lora-fused": "tab:pink"}

LOG_DECADES = 2      # a log axis only for values spanning at least this many orders of magnitude …
LOG_MIN_STEPS = 100  # … and, for the loss, a run of at least this many steps
# Where a point's label may go, in points from the point, tried in order: beside it, then further out
# above and below (with a leader line back to the point); mirrored for points in the right half.
LABEL_OFFSETS = [(dx, sign * dy) for dy in (4, 16, 30, 46, 64, 84) for sign in (1, -1)
                 for dx in (6, -6, 30, -30, 60, -60) if dy > 4 or abs(dx) == 6]
LEADER_FROM = 10  # offsets at least this far (points) draw a line from the label to its point


def _spans_decades(values) -> bool:
    """Whether the values are all positive and span at least `LOG_DECADES` orders of magnitude."""
    values = [v for v in values if v is not None]
    return bool(values) and min(values) > 0 and max(values) / min(values) >= 10 ** LOG_DECADES


def _marker_box(ax, x: float, y: float, radius_pt: float) -> Bbox:
    """The display box of a marker of `radius_pt` points at data (x, y)."""
    cx, cy = ax.transData.transform((x, y))
    r = radius_pt * ax.figure.dpi / 72
    return Bbox.from_extents(cx - r, cy - r, cx + r, cy + r)


def _leader(start, end, skip: Bbox, samples: int = 24) -> list[tuple[float, float]]:
    """Points along a leader line (display coordinates), less those inside its own marker."""
    (x0, y0), (x1, y1) = start, end
    pts = [(x0 + (x1 - x0) * i / samples, y0 + (y1 - y0) * i / samples) for i in range(samples + 1)]
    return [p for p in pts if not skip.contains(*p)]


def place_labels(ax, labels: list[tuple[float, float, str]], fontsize: float = 8, marker_pt: float = 5) -> list:
    """Per-point text where it fits. Points at (nearly) the same place share one label (their texts one
    per line); each label takes the first of `LABEL_OFFSETS` whose box lies inside the axes and meets no
    marker, label or leader line placed before it, nor its own leader another marker or label; one that
    fits nowhere is left out (the legend still names it). Draws the figure first, so the layout and the
    limits are final: call it last. Returns the texts placed."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    groups: list[tuple[float, float, list[str], Bbox]] = []
    for x, y, text in labels:  # coincident points (same accuracy and speed) get one label, not a pile
        box = _marker_box(ax, x, y, marker_pt)
        near = next((g for g in groups if g[3].overlaps(box)), None)
        if near is None:
            groups.append((x, y, [text], box))
        elif text not in near[2]:
            near[2].append(text)
    boxes = [g[3] for g in groups]     # what a new label or leader may not cross: markers, then labels
    leaders: list[tuple[float, float]] = []
    placed = []
    for x, y, texts, marker in sorted(groups, key=lambda g: -len(g[2])):  # the bulkiest first: hardest to fit
        others = [b for b in boxes if b is not marker]
        inward = -1 if marker.x0 > (frame.x0 + frame.x1) / 2 else 1  # right half: try the left side first
        for dx, dy in ((inward * dx, dy) for dx, dy in LABEL_OFFSETS):
            far = abs(dy) >= LEADER_FROM
            t = ax.annotate("\n".join(texts), (x, y), xytext=(dx, dy), textcoords="offset points",
                            fontsize=fontsize, ha="left" if dx > 0 else "right", va="bottom" if dy > 0 else "top",
                            annotation_clip=False, arrowprops=dict(arrowstyle="-", lw=0.5, color="0.45", shrinkA=0,
                                                                   shrinkB=marker_pt) if far else None)
            t.update_positions(renderer)
            box = Text.get_window_extent(t, renderer)  # the text alone; its leader is checked below
            anchor = (box.x0 if dx > 0 else box.x1, box.y0 if dy > 0 else box.y1)
            line = _leader(ax.transData.transform((x, y)), anchor, marker) if far else []
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if (inside and not any(box.overlaps(b) for b in others) and not any(box.contains(*p) for p in leaders)
                    and not any(b.contains(*p) for b in others for p in line)):
                boxes.append(box)
                leaders += line
                placed.append(t)
                break
            t.remove()
    fig.set_layout_engine("none")  # the layout was fitted without the labels; keep it as placed
    return placed


def _loss_panel(ax, loss_curve) -> None:
    """The training loss against the step: linear with integer step ticks; log loss only for a long run
    whose loss spans orders of magnitude; markers when there are few points."""
    ax.set_title("loss curve")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    if not loss_curve:
        ax.text(0.5, 0.5, "no training in this run", transform=ax.transAxes, ha="center", va="center")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    steps, losses = zip(*loss_curve)
    ax.plot(steps, losses, lw=1, marker="o" if len(steps) <= 30 else None, ms=3)
    _integer_axis(ax.xaxis)
    if max(steps) >= LOG_MIN_STEPS and _spans_decades(losses):
        ax.set_yscale("log")


def frontier_figure(points: list[FrontierPoint], chosen: list[ModeResult],
                    loss_curve: list[tuple[int, float]] | None, title: str = ""):
    """Three panels: accuracy vs tokens per forward and vs tokens/s for every frontier point (small,
    validation split) and each mode's result at its chosen knobs (star, test split); the training loss
    curve. One legend under the panels names each mode's colour."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2), layout="constrained")
    modes = list(dict.fromkeys([p.mode for p in points] + [r.mode for r in chosen]))
    labels = {m: next((p.label for p in [*points, *chosen] if p.mode == m), m) for m in modes}
    for ax, x, xlabel in ((axes[0], "tokens_per_forward", "tokens per forward pass"),
                          (axes[1], "tokens_per_s", "generated tokens / s (this machine)")):
        for mode in modes:
            pts = [p for p in points if p.mode == mode]
            ax.scatter([getattr(p, x) for p in pts], [100 * p.accuracy for p in pts], s=14, alpha=0.45,
                       color=MODE_COLORS.get(mode), clip_on=False)
        for r in chosen:
            ax.scatter(getattr(r, x), 100 * r.accuracy, s=90, marker="*", color=MODE_COLORS.get(r.mode),
                       edgecolors="black", linewidths=0.6, zorder=3, clip_on=False)
        ax.set_xlabel(xlabel)
        _accuracy_axis(ax)
        ax.grid(alpha=0.3)
        if _spans_decades([getattr(p, x) for p in [*points, *chosen]]):
            ax.set_xscale("log")
    axes[0].set_title("frontier: accuracy vs parallelism")
    axes[1].set_title("accuracy vs wall clock")
    _loss_panel(axes[2], loss_curve)
    handles = [Line2D([], [], ls="", marker="o", color=MODE_COLORS.get(m), label=labels[m]) for m in modes]
    if modes:
        handles += [Line2D([], [], ls="", marker="o", ms=4, color="grey", alpha=0.5, label="knob point (validation)"),
                    Line2D([], [], ls="", marker="*", ms=10, color="grey", mec="black", label="chosen (test split)")]
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), fontsize=8,
                   frameon=False)
    if title:
        fig.suptitle(title)
    for ax, x in ((axes[0], "tokens_per_forward"), (axes[1], "tokens_per_s")):
        place_labels(ax, [(getattr(r, x), 100 * r.accuracy, r.label) for r in chosen])
    return fig


def frontier_plot(points: list[FrontierPoint], chosen: list[ModeResult], loss_curve: list[tuple[int, float]] | None,
                  path: str, title: str = "") -> None:
    """`frontier_figure`, written to `path` (PNG)."""
    _save(frontier_figure(points, chosen, loss_curve, title), path)


SWEEP_MARKERS = "osD^vP*Xh<>"


def sweep_figure(rows: list[dict], title: str = ""):
    """Accuracy vs tokens per forward, one point per (run, decoding mode) of a sweep (colour: the run,
    marker: the mode); when runs decoded speculatively, a second panel: acceptance by draft position,
    one line per (run, speculative mode)."""
    curves = [(f"{row['run']} [{k.split('/')[0]}]", json.loads(v)) for row in rows for k, v in row.items()
              if k.endswith("/acceptance_by_position") and v]
    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(14 if curves else 8, 5), squeeze=False,
                             layout="constrained")
    ax = axes[0, 0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    modes = sorted({k.split("/")[0] for row in rows for k in row if k.endswith("/accuracy")})
    marker = {m: SWEEP_MARKERS[i % len(SWEEP_MARKERS)] for i, m in enumerate(modes)}
    labels, handles = [], []
    for i, row in enumerate(rows):
        color = colors[i % len(colors)]
        drawn = [(m, row.get(f"{m}/accuracy"), row.get(f"{m}/tokens_per_forward")) for m in modes]
        drawn = [(m, acc, tpf) for m, acc, tpf in drawn if acc is not None and tpf is not None]
        for mode, acc, tpf in drawn:
            ax.scatter(tpf, 100 * acc, s=40, color=color, marker=marker[mode], clip_on=False)
            labels.append((tpf, 100 * acc, f"{row['run']} [{mode}]"))
        if drawn:  # a run that measured nothing (it failed) has no point to name
            handles.append(Line2D([], [], ls="", marker="o", color=color, label=str(row["run"])))
    handles += [Line2D([], [], ls="", marker=marker[m], color="grey", label=m) for m in modes]
    ax.set_xlabel("tokens per forward pass")
    _accuracy_axis(ax)
    ax.set_title(title or "sweep")
    ax.grid(alpha=0.3)
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    if curves:
        ax = axes[0, 1]
        for label, by_position in curves:  # position 0 (c0, the AR row's own draw) is always accepted
            ax.plot(range(1, len(by_position)), [100 * x for x in by_position[1:]], marker="o", ms=3, label=label)
        ax.set_xlabel("draft position j")
        _accuracy_axis(ax, "P(c_j accepted | reached)")
        _integer_axis(ax.xaxis)
        ax.set_title("acceptance by draft position")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    place_labels(axes[0, 0], labels, fontsize=7, marker_pt=4)
    return fig


def sweep_plot(rows: list[dict], path: str, title: str = "") -> None:
    """`sweep_figure`, written to `path` (PNG)."""
    _save(sweep_figure(rows, title), path)
