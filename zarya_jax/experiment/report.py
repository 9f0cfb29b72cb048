"""The report's files: `report.md` (Markdown, rendered from the `report.json` document, so any saved
report can be rendered again), `report.png` (the frontier against tokens per forward and tokens/s, the
loss curve) and `report.json`, each written atomically, `report.json` last: a `report.json` means a
complete report."""
from __future__ import annotations

import os

from ..eval import diagnose, frontier
from ..eval.evaluate import MODE_LABELS, summary_markdown
from ..files import atomic_write, atomic_write_json
from ..provenance import describe
from .results import Report


def _pct(x):
    return "–" if x is None else f"{100 * x:.1f}%"


def report_markdown(report: dict) -> str:
    """The Markdown report of a `report.json` document (`Report.to_json()`)."""
    lines = ["# Zarya quickstart report", ""]
    m = report["model"]
    lines.append(describe(report.get("provenance") or {}))
    lines.append(f"Model: {m['params'] / 1e6:.2f}M parameters ({m['num_layers']} layers, hidden {m['hidden_size']}), "
                 f"checkpoint `{report['checkpoint']}`.")
    if report["train"]:
        t = report["train"]
        tps = f"{t['tokens_per_s']:.0f}" if t.get("tokens_per_s") else "–"
        loss = f"{t['loss']:.4f}" if t.get("loss") is not None else "–"
        wall = f"{t['wall_s']:.0f} s" if t.get("wall_s") is not None else "– s"
        lines.append(f"Training: {t['step']} steps, final loss {loss}, {wall}, {tps} tokens/s.")
    modes = report["modes"]
    front = report.get("frontier")
    tol = report["config"]["frontier"]["tolerance"]
    how = (f"knobs chosen per mode on {front['validation_examples']} validation examples (the most tokens per "
           "forward among the points that answer correctly every example AR answers correctly there"
           f"{f', but for {100 * tol:g}% of the examples' if tol else ''}; else the most accurate point)"
           if front else "knobs from eval.knobs")
    lines += ["", f"Test split: {modes[0]['examples'] if modes else 0} held-out examples, greedy decoding; {how}.",
              "", summary_markdown(modes)]
    if report["targets"]:
        lines += ["| target | measured | met |", "|---|---|---|"]
        for t in report["targets"]:
            v = t["value"]
            v = "–" if v is None else f"{v:.3g}"
            lines.append(f"| {t['target']} | {v} | {'yes' if t['met'] else 'no'} |")
    if report.get("diagnostics"):
        lines += ["", "## Diagnostics (test split)", "", diagnose.markdown(report["diagnostics"])]
    if front:
        lines += ["", "## Frontier (validation split)", "",
                  "| mode | knobs | exact match | examples lost to AR | tokens / forward | tokens / s |",
                  "|---|---|---|---|---|---|"]
        ar = next((p for p in front["points"] if p["mode"] == "ar" and "correct" in p), None)
        for r in sorted(frontier.pareto(front["points"]), key=lambda r: (list(MODE_LABELS).index(r["mode"]),
                                                                          r["tokens_per_forward"])):
            lost = frontier.losses_to(ar, r) if ar and "correct" in r else "–"
            lines.append(f"| {r['label']} | {r['point'] or '–'} | {_pct(r['accuracy'])} | {lost} | "
                         f"{r['tokens_per_forward']:.2f} | {r['tokens_per_s']:.0f} |")
        lines.append(f"\n{len(front['points'])} points in all (`report.json` → frontier.points); the table lists "
                     "those no other point of the same mode beats on both accuracy and tokens per forward. "
                     "Examples lost to AR: answered wrongly where AR answers correctly.")
    lines += ["", f"Total wall time: {report['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


def write_report(workdir: str, report: Report) -> None:
    """report.md, report.png, then report.json (each atomically): a report.json means a complete report."""
    from .plots import frontier_plot  # matplotlib only when a report is written

    doc = report.to_json()
    atomic_write(os.path.join(workdir, "report.md"), report_markdown(doc))
    points = doc["frontier"]["points"] if doc.get("frontier") else []
    frontier_plot(points, doc["modes"], doc["loss_curve"], os.path.join(workdir, "report.png"), "Zarya quickstart")
    atomic_write_json(os.path.join(workdir, "report.json"), doc, default=str)
