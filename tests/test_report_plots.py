"""The report's figures and tables are readable at every size of run: accuracy axes span 0–100 % (never
negative), the frontier figure draws the typed results (`FrontierPoint`, `ModeResult`) its callers hold,
short runs get linear loss axes with whole-number steps, no two texts of a figure overlap
once drawn (coincident or close points, long labels, neighbouring panels), and the targets table keeps
one unit per column. Cheap: figures from hand-made results, no training."""
import pytest
from matplotlib.text import Text

from zarya_jax.eval.results import FrontierPoint, ModeResult
from zarya_jax.experiment import plots
from zarya_jax.experiment.report import targets_markdown
from zarya_jax.experiment.results import Target

LABELS = {"ar": "AR", "mdm": "mode A (MDM)", "slotted": "mode B (slotted)", "spec-self": "spec, self drafter",
          "spec-lora": "spec, LoRA drafter", "spec-self-fused": "spec, self drafter, fused",
          "spec-lora-fused": "spec, LoRA drafter, fused"}


def _point(mode, accuracy, tpf, tps):
    """A frontier point (validation), as `frontier.sweep` makes them."""
    return FrontierPoint(mode=mode, label=LABELS[mode], knobs={}, point="", accuracy=accuracy,
                         tokens_per_forward=tpf, tokens_per_s=tps, examples=4, correct=[False] * 4)


def _result(mode, accuracy, tpf, tps):
    """A mode's result on test, as `evaluate` makes them."""
    return ModeResult(mode=mode, label=LABELS[mode], examples=4, accuracy=accuracy, tokens_per_forward=tpf,
                      tokens_per_s=tps, generated_tokens=32, wall_s=1.0, compile_s=1.0, batch_size=4,
                      generation_config={})


# A --smoke run: every accuracy 0, several modes at the same tokens per forward, 4 logged steps.
SMOKE = [("ar", 0.0, 1.0, 36808.9), ("mdm", 0.0, 2.667, 31492.5), ("slotted", 0.0, 0.533, 22809.4),
         ("spec-self", 0.0, 0.889, 32270.8), ("spec-lora", 0.0, 0.889, 12769.7),
         ("spec-self-fused", 0.0, 0.889, 23574.9), ("spec-lora-fused", 0.0, 1.0, 20366.3)]
SMOKE_CHOSEN = [_result(*row) for row in SMOKE]
SMOKE_POINTS = [_point(*row) for row in SMOKE] + [_point("mdm", 0.0, 1.24, 13901.3),
                                                   _point("slotted", 0.0, 0.47, 13001.1)]
SMOKE_LOSS = [[1, 6.417], [2, 5.639], [3, 4.869], [4, 5.488]]
# A trained model: every mode's chosen point within a few points of accuracy and a few hundredths of
# tokens per forward of the next.
CLOSE_CHOSEN = [_result(m, 0.95 + 0.005 * i, 1.5 + 0.03 * i, 300 + 5 * i) for i, m in enumerate(LABELS)]
LONG_LOSS = [[s, 10 * 1000 ** (-s / 2000)] for s in range(1, 2001, 10)]  # 10 → 0.01 over 2000 steps


def _drawn_texts(fig) -> list:
    """Every non-empty text the figure draws, tick labels only for ticks inside the view."""
    fig.canvas.draw()
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not lo - 1e-9 * abs(hi - lo) <= tick.get_loc() <= hi + 1e-9 * abs(hi - lo):
                    hidden |= {id(tick.label1), id(tick.label2)}
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in hidden]


def _overlaps(fig) -> list[tuple[str, str]]:
    renderer = fig.canvas.get_renderer()
    texts = _drawn_texts(fig)
    boxes = [Text.get_window_extent(t, renderer) for t in texts]  # the text alone, not an annotation's leader
    return [(texts[i].get_text(), texts[j].get_text()) for i in range(len(texts)) for j in range(i + 1, len(texts))
            if boxes[i].overlaps(boxes[j])]


def _accuracy_limits_ok(ax):
    lo, hi = ax.get_ylim()
    assert lo == 0 and hi >= 100, (lo, hi)  # a share: the whole 0–100 % range, never below 0


@pytest.mark.parametrize("points, chosen, loss",
                         [(SMOKE_POINTS, SMOKE_CHOSEN, SMOKE_LOSS), ([], CLOSE_CHOSEN, LONG_LOSS)],
                         ids=["smoke", "close-points-long-run"])
def test_frontier_figure_readable(points, chosen, loss):
    fig = plots.frontier_figure(points, chosen, loss, "Zarya quickstart")
    acc_axes = fig.axes[:2]
    for ax in acc_axes:
        _accuracy_limits_ok(ax)
    assert _overlaps(fig) == []
    # Every chosen mode is named: by a label beside its star or, where none fits, in the legend.
    legend = {t.get_text() for lg in fig.legends for t in lg.get_texts()}
    assert set(LABELS.values()) <= legend
    for ax in acc_axes:
        labelled = [line for t in ax.texts for line in t.get_text().split("\n")]
        assert len(labelled) == len(set(labelled)) and set(labelled) <= set(LABELS.values())
    plots.plt.close(fig)


def test_loss_axis_short_run_linear_with_whole_steps():
    fig = plots.frontier_figure(SMOKE_POINTS, SMOKE_CHOSEN, SMOKE_LOSS)
    fig.canvas.draw()
    ax = fig.axes[2]
    assert ax.get_yscale() == "linear" and ax.get_xscale() == "linear"
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert ticks and all(t == int(t) for t in ticks), ticks
    plots.plt.close(fig)


def test_loss_axis_log_only_for_long_runs_spanning_decades():
    for loss, scale in ((LONG_LOSS, "log"),
                        ([[s, 3 - s / 1000] for s in range(1, 2001, 10)], "linear"),   # long, one decade at most
                        ([[1, 10.0], [2, 1.0], [3, 0.01]], "linear")):                  # spans decades, 3 steps
        fig = plots.frontier_figure([], CLOSE_CHOSEN, loss)
        assert fig.axes[2].get_yscale() == scale, (loss[:2], scale)
        plots.plt.close(fig)


def test_no_training_panel_says_so():
    fig = plots.frontier_figure([], CLOSE_CHOSEN, [])
    assert [t.get_text() for t in fig.axes[2].texts] == ["no training in this run"]
    plots.plt.close(fig)


def test_sweep_figure_readable():
    modes = ("ar", "slotted")
    rows = [{"run": f"lr={lr:g}", **{f"{m}/accuracy": 0.9 + 0.01 * j + 0.001 * k for k, m in enumerate(modes)},
             **{f"{m}/tokens_per_forward": 1 + 0.05 * j + 0.1 * k for k, m in enumerate(modes)},
             "spec-self/acceptance_by_position": "[1.0, 0.8, 0.6, 0.5]"}
            for j, lr in enumerate((1e-3, 2e-3, 3e-3, 4e-3))]
    rows[0]["ar/accuracy"] = 0.0
    fig = plots.sweep_figure(rows, "sweep")
    for ax in fig.axes:
        _accuracy_limits_ok(ax)
    assert _overlaps(fig) == []
    lo, hi = fig.axes[1].get_xlim()
    assert all(t == int(t) for t in fig.axes[1].get_xticks() if lo <= t <= hi)  # draft positions
    plots.plt.close(fig)


def test_targets_table_one_unit_per_column():
    targets = [Target("AR exact match ≥ 80% (stretch 90%)", 0.85, True),
               Target("mode B (chosen on validation): ≥ 2.0 tokens per forward", 0.5333, False),
               Target("mode B: accuracy within 3 points of AR", -0.025, True),
               Target("spec, self drafter: outputs identical to AR token for token (lossless)", 0.0, True),
               Target("spec, self drafter, fused: ≥ 1.7× the tokens per forward of spec, self drafter", 1.13, False)]
    lines = targets_markdown(targets).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == ["target", "exact match (%)", "exact match − AR's (points)", "tokens / forward", "gain (×)",
                    "met"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    values = {row[0]: [c for c in row[1:-1]] for row in rows}
    assert values[targets[0].target] == ["85.0", "–", "–", "–"]
    assert values[targets[1].target] == ["–", "–", "0.53", "–"]
    assert values[targets[2].target] == ["–", "-2.5", "–", "–"]
    assert values[targets[3].target] == ["–", "+0.0", "–", "–"]
    assert values[targets[4].target] == ["–", "–", "–", "1.13"]
    assert all(not any(u in c for u in "%×") for row in rows for c in row[1:-1])  # units in the header only
    assert [row[-1] for row in rows] == ["yes", "no", "yes", "yes", "no"]
    only_tpf = targets_markdown(targets[1:2]).splitlines()[0]
    assert only_tpf == "| target | tokens / forward | met |"  # columns of units not in use are left out


def _rl_row(arm, exact, accepted, tpf, seconds):
    return {"arm": arm, "tokens_per_forward": tpf, "rollout_s": seconds,
            "curves": {"exact_match": [(s, exact) for s in (0, 2, 4)],
                       "accepted_per_cycle": [(s, a) for s, a in zip((1, 2, 3, 4), accepted)]}}


@pytest.mark.parametrize("rows", [
    # a --demo --smoke run: every exact match 0, 4 RL steps, arms that accept next to nothing
    [_rl_row("ar", 0.0, [], 1.0, 0.8), _rl_row("frozen", 0.0, [0.0, 0.0, 0.1, 0.0], 1.05, 1.2),
     _rl_row("refreshed", 0.0, [0.0, 0.2, 0.1, 0.3], 1.1, 1.3), _rl_row("self", 0.0, [0.5, 0.5, 0.6, 0.4], 1.4, 0.9)],
    [_rl_row("ar", 0.0, [], 1.0, 0.0)],  # the AR arm alone: no acceptance curve, no time measured
], ids=["smoke", "ar-only"])
def test_rl_figure_readable(rows):
    """The RL report's plot: exact match 0–100 %, acceptance and the bars from 0 fitting their values,
    whole RL steps, the arms named once in a legend, no text over another."""
    from zarya_jax.rl.plots import rl_figure

    fig = rl_figure(rows, "GRPO per arm")
    fig.canvas.draw()
    exact, acceptance, per_forward, seconds = fig.axes
    _accuracy_limits_ok(exact)
    accepted = [a for r in rows for _, a in r["curves"]["accepted_per_cycle"]]
    for ax, values in ((acceptance, accepted), (per_forward, [r["tokens_per_forward"] for r in rows]),
                       (seconds, [r["rollout_s"] for r in rows])):
        lo, hi = ax.get_ylim()
        assert lo == 0 and max(values + [0]) < hi <= max(1.0, 1.1 * max(values + [0])) + 1e-9, (ax.get_ylabel(), lo, hi)
    for ax in (exact, acceptance):
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(t == int(t) for t in ticks), ticks
    assert _overlaps(fig) == []
    assert [t.get_text() for lg in fig.legends for t in lg.get_texts()] == [r["arm"] for r in rows]
    plots.plt.close(fig)
