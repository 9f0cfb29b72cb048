"""The report's files: `report.md` (Markdown, rendered from the typed `Report`, which any saved
`report.json` reads back into, so any saved report can be rendered again), `report.png` (the frontier
against tokens per forward and tokens/s, the loss curve) and `report.json`, each written atomically,
`report.json` last: a `report.json` means a complete report."""
from __future__ import annotations

import json
import os

from ..eval import diagnose, frontier, speed
from ..eval.evaluate import MODE_LABELS, summary_markdown
from ..files import atomic_write, atomic_write_json
from ..provenance import describe
from .results import Report, Target


def _pct(x):
    return "–" if x is None else f"{100 * x:.1f}%"


# The targets' measured values come in four units; each gets its own column, named with its unit, so a
# column never mixes shares and counts. Which unit is read off the target's wording (`stages.targets`).
TARGET_COLUMNS = {"accuracy": ("exact match (%)", lambda v: f"{100 * v:.1f}"),
                  "gap": ("exact match − AR's (points)", lambda v: f"{100 * v:+.1f}"),
                  "tokens_per_forward": ("tokens / forward", lambda v: f"{v:.2f}"),
                  "ratio": ("gain (×)", lambda v: f"{v:.2f}")}


def target_unit(target: str) -> str:
    """The unit (a `TARGET_COLUMNS` key) of a target's measured value, from its wording."""
    if "×" in target:
        return "ratio"          # fused against two-pass tokens per forward
    if "tokens per forward" in target:
        return "tokens_per_forward"
    if "exact match ≥" in target:
        return "accuracy"       # AR's own exact match
    return "gap"                # accuracy within … of AR, lossless: the difference to AR's exact match


def targets_markdown(targets: list[Target]) -> str:
    """The targets table: one column per unit in use (the others left out), a value in the column of its
    unit and – in the rest."""
    units = [u for u in TARGET_COLUMNS if any(target_unit(t.target) == u for t in targets)]
    lines = ["| target | " + " | ".join(TARGET_COLUMNS[u][0] for u in units) + " | met |",
             "|---|" + "---|" * len(units) + "---|"]
    for t in targets:
        unit = target_unit(t.target)
        cells = [TARGET_COLUMNS[u][1](t.value) if u == unit and t.value is not None else "–" for u in units]
        lines.append(f"| {t.target} | " + " | ".join(cells) + f" | {'yes' if t.met else 'no'} |")
    return "\n".join(lines)


def report_markdown(report: Report) -> str:
    """The Markdown report of a `Report` (`Report.from_json` reads any saved `report.json` back)."""
    lines = ["# Zarya quickstart report", ""]
    m = report.model
    lines.append(describe(report.provenance or {}))
    lines.append(f"Model: {m['params'] / 1e6:.2f}M parameters ({m['num_layers']} layers, hidden {m['hidden_size']}), "
                 f"checkpoint `{report.checkpoint}`.")
    if report.train:
        t = report.train
        tps = f"{t.tokens_per_s:.0f}" if t.tokens_per_s else "–"
        loss = f"{t.loss:.4f}" if t.loss is not None else "–"
        wall = f"{t.wall_s:.0f} s" if t.wall_s is not None else "– s"
        lines.append(f"Training: {t.step} steps, final loss {loss}, {wall}, {tps} tokens/s.")
    modes, front = report.modes, report.frontier
    tol = report.config["frontier"]["tolerance"]
    how = (f"knobs chosen per mode on {front.validation_examples} validation examples (the most tokens per "
           "forward among the points that answer correctly every example AR answers correctly there"
           f"{f', but for {100 * tol:g}% of the examples' if tol else ''}; else the most accurate point)"
           if front else "knobs from eval.knobs")
    lines += ["", f"Test split: {modes[0].examples if modes else 0} held-out examples, greedy decoding; {how}.",
              "", summary_markdown(modes)]
    if report.targets:
        lines.append(targets_markdown(report.targets))
    if report.speed:
        lines += ["", "## Fastest lossless configuration per batch size", "",
                  f"Chosen per batch size among AR and the lossless frontier points (`zarya_jax.eval.speed`): "
                  f"predicted from the pass-cost curve on {report.speed.device} and the points' tokens per forward, "
                  "the best predicted timed against AR on validation in rounds, AR kept unless a candidate beat it "
                  f"by at least {report.speed.margin:.0%} in every round; then timed side by side with AR on test "
                  "(`eval/speed.json`: every candidate, its speed-up per round, and the curve).", "",
                  speed.markdown(report.speed)]
    if report.diagnostics:
        lines += ["", "## Diagnostics (test split)", "", diagnose.markdown(report.diagnostics)]
    if front:
        lines += ["", "## Frontier (validation split)", "",
                  "| mode | knobs | exact match | examples lost to AR | tokens / forward | tokens / s |",
                  "|---|---|---|---|---|---|"]
        ar = next((p for p in front.points if p.mode == "ar"), None)
        for p in sorted(frontier.pareto(front.points), key=lambda p: (list(MODE_LABELS).index(p.mode),
                                                                       p.tokens_per_forward)):
            lost = frontier.losses_to(ar, p) if ar else "–"
            lines.append(f"| {p.label} | {p.point or '–'} | {_pct(p.accuracy)} | {lost} | "
                         f"{p.tokens_per_forward:.2f} | {p.tokens_per_s:.0f} |")
        lines.append(f"\n{len(front.points)} points in all (`report.json` → frontier.points); the table lists "
                     "those no other point of the same mode beats on both accuracy and tokens per forward. "
                     "Examples lost to AR: answered wrongly where AR answers correctly.")
        lines.append("\nAccuracy under parallelism (AUP, `zarya_jax.eval.aup`: the area under each mode's accuracy "
                     "vs tokens-per-forward curve, weighted down below the best accuracy; AR's is its accuracy): "
                     + ", ".join(f"{MODE_LABELS.get(m, m)} {v:.1f}" for m, v in front.aup.items()) + ".")
    lines += ["", f"Total wall time: {report.wall_s:.0f} s.", ""]
    return "\n".join(lines)


def render_report(workdir: str, report: Report | None = None) -> None:
    """report.md and report.png of `report` (by default the `report.json` in `workdir`, read back): a saved
    report drawn again with this code, no training or evaluation."""
    from .plots import frontier_plot  # matplotlib only when a report is written

    if report is None:
        with open(os.path.join(workdir, "report.json")) as f:
            report = Report.from_json(json.load(f))
    atomic_write(os.path.join(workdir, "report.md"), report_markdown(report))
    frontier_plot(report.frontier.points if report.frontier else [], report.modes, report.loss_curve,
                  os.path.join(workdir, "report.png"), "Zarya quickstart")


def write_report(workdir: str, report: Report) -> None:
    """report.md, report.png, then report.json (each atomically): a report.json means a complete report."""
    render_report(workdir, report)
    atomic_write_json(os.path.join(workdir, "report.json"), report.to_json(), default=str)
