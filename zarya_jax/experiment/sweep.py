"""The sweep engine: a grid or a list of config overrides of the experiment, run one after another,
resumably, then tabulated (`python -m experiments.sweep` is its command line; the file format is in
docs/experiments.md).

A sweep spec (a YAML/JSON mapping) has `name`, `description`, `base` (overrides of every run), `runs` (a
list of override mappings, `name` optional) and `grid` (a cartesian product, crossed with `runs`). Each
run's config is `default_config()` with its overrides, typed and checked by `zarya_jax.overrides` for
every run before anything runs. A finished run leaves `<workdir>/<run>/DONE.json` (written atomically,
so a killed run never looks finished) and is skipped next time; a failed run is recorded in its
`error.txt` and retried next time; a finished run whose config changed since is refused unless `force`.
Run names are single folder names. For pods, each host takes runs i with i % num_hosts == host_index;
`collect` reads every finished run (from any host, via the shared workdir).
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import io
import itertools
import json
import os
import re
import time
import traceback

import yaml

from .. import overrides
from ..files import atomic_write, atomic_write_json, check_writable_dir, input_file_problem
from ..overrides import to_dict
from ..provenance import provenance
from .config import ExperimentConfig, comparable, default_config
from .plan import describe, plan
from ..eval.results import ModeResult, metrics as metric_fields
from .results import Report
from .run import run as run_experiment


def _run_report(config: ExperimentConfig, run_dir: str, force: bool = False) -> Report:
    return run_experiment(config, run_dir, force=force)


DONE = "DONE.json"


class SweepError(ValueError):
    """A malformed sweep file or flag."""


def load_spec(path: str) -> dict:
    why = input_file_problem(path)
    if why:
        raise SweepError(f"sweep file {path!r} {why}")
    with open(path) as f:
        text = f.read()
    try:
        spec = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise SweepError(f"sweep file {path!r} does not parse: {e}") from None
    if not isinstance(spec, dict):
        raise SweepError(f"sweep file {path!r}: expected a mapping with 'runs' and/or 'grid'")
    unknown = set(spec) - {"name", "base", "runs", "grid", "description"}
    if unknown:
        raise SweepError(f"sweep file {path!r}: unknown top-level keys {sorted(unknown)}; "
                         "expected name, description, base, runs, grid")
    if not spec.get("runs") and not spec.get("grid"):
        raise SweepError(f"sweep file {path!r}: expected a non-empty 'runs' list or 'grid' mapping")
    if spec.get("runs") is not None and not (isinstance(spec["runs"], list)
                                             and all(isinstance(r, dict) for r in spec["runs"])):
        raise SweepError(f"sweep file {path!r}: 'runs' must be a list of mappings")
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or any(not isinstance(v, list) or not v for v in grid.values()):
        raise SweepError(f"sweep file {path!r}: 'grid' must map each key to a non-empty list of values")
    spec.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    return spec


def _slug(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-")


def check_run_name(name: str) -> None:
    """A run's folder is `<workdir>/<name>`: the name must be one plain folder name."""
    if (not name or name in (".", "..") or name.startswith(".") or any(c in name for c in "/\\\0")
            or len(name) > 200):
        raise SweepError(f"run name {name!r}: expected one folder name (no '/', '\\', leading '.', or '..'; "
                         "at most 200 characters)")


def expand(spec: dict) -> list[tuple[str, dict]]:
    """[(run name, overrides)] in a fixed order: runs × grid, base overrides first."""
    base = dict(spec.get("base") or {})
    runs = spec.get("runs") or [{}]
    grid = spec.get("grid") or {}
    keys = list(grid)
    out, names = [], set()
    for run in runs:
        run = dict(run)
        run_name = run.pop("name", None)
        for combo in itertools.product(*(grid[k] for k in keys)) if keys else [()]:
            items = {**base, **run, **dict(zip(keys, combo))}
            parts = ([run_name] if run_name else [f"{k.split('.')[-1]}={_slug(v)}" for k, v in run.items()])
            parts += [f"{k.split('.')[-1]}={_slug(v)}" for k, v in zip(keys, combo)]
            name = ",".join(parts) or "base"
            check_run_name(name)
            if name in names:
                raise SweepError(f"two runs share the name {name!r}: give the runs distinct 'name' fields")
            names.add(name)
            out.append((name, items))
    return out


SWEEP_DIR = "{sweep}"


def in_workdir(runs: list[tuple[str, dict]], workdir: str) -> list[tuple[str, dict]]:
    """`{sweep}` in a string value (or in a list's strings) replaced by the sweep's workdir (absolute), so one
    run can read what an earlier run wrote, e.g. `eval.ckpt: "{sweep}/base/train/final"` (the runs run in
    file order on one host; with several hosts, run the producing run first)."""
    root = os.path.abspath(workdir)

    def sub(v):
        if isinstance(v, str):
            return v.replace(SWEEP_DIR, root)
        return [sub(x) for x in v] if isinstance(v, list) else v

    return [(name, {k: sub(v) for k, v in items.items()}) for name, items in runs]


def configs(runs: list[tuple[str, dict]], extra: dict | None = None, group: str = "") -> dict[str, ExperimentConfig]:
    """Every run's config: the pipeline defaults with the run's overrides (then `extra`) applied; a typo
    or a badly typed value is a `ConfigError` naming the key, before anything runs. Unless set, the
    experiment tracker's group is `group` (the sweep's name) and its run name the run's."""
    base = default_config()
    out = {}
    for name, items in runs:
        cfg = overrides.apply(base, {**items, **(extra or {})})
        t = cfg.train
        out[name] = cfg.replace(train=dataclasses.replace(t, tracker_group=t.tracker_group or group,
                                                          tracker_run=t.tracker_run or name))
    return out


def my_share(runs: list, host_index: int, num_hosts: int) -> list:
    if num_hosts < 1 or not 0 <= host_index < num_hosts:
        raise SweepError(f"--host-index={host_index} --num-hosts={num_hosts}: expected 0 ≤ host-index < num-hosts")
    return [r for i, r in enumerate(runs) if i % num_hosts == host_index]


def changed_runs(workdir: str, run_configs: dict) -> list[str]:
    """Finished runs (DONE.json) whose recorded config differs from the one they would run with now."""
    out = []
    for name, config in run_configs.items():
        path = os.path.join(workdir, name, DONE)
        if not os.path.exists(path):
            continue
        try:
            with open(path) as f:
                recorded = json.load(f).get("config")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if not isinstance(recorded, dict) or comparable(recorded) != comparable(to_dict(config)):
            out.append(name)
    return out


def run_sweep(spec: dict, workdir: str, run_fn=None, host_index: int = 0, num_hosts: int = 1,
              extra_overrides: dict | None = None, log=print, force: bool = False) -> dict:
    """Runs this host's unfinished runs; returns {"done": [...], "skipped": [...], "failed": [...]}.

    `run_fn(run_config, run_dir) -> Report` defaults to the quickstart pipeline; DONE.json keeps its
    `report.json` document as the run's metrics. A finished run
    whose config changed is refused (SweepError, before anything runs) unless `force` reruns it.
    """
    run_fn = run_fn or functools.partial(_run_report, force=force)
    runs = in_workdir(expand(spec), workdir)
    # Validate every run's overrides before any compute, so a typo fails the sweep up front.
    run_configs = configs(runs, extra_overrides, spec.get("name", ""))
    mine = my_share(runs, host_index, num_hosts)
    check_writable_dir(workdir, "--workdir")
    changed = changed_runs(workdir, {name: run_configs[name] for name, _ in mine})
    if changed and not force:
        raise SweepError(f"finished run(s) {changed} in {workdir!r} were made with another config than they would "
                         "run with now; use --force to rerun them, or another --workdir")
    os.makedirs(workdir, exist_ok=True)
    atomic_write_json(os.path.join(workdir, "sweep.json"), {"spec": spec, "runs": [n for n, _ in runs]}, default=str)
    status = {"done": [], "skipped": [], "failed": []}
    for name, run_overrides in mine:
        run_overrides = {**run_overrides, **(extra_overrides or {})}
        run_dir = os.path.join(workdir, name)
        if os.path.exists(os.path.join(run_dir, DONE)) and name not in changed:
            log(f"[sweep] {name}: finished earlier, skipped")
            status["skipped"].append(name)
            continue
        os.makedirs(run_dir, exist_ok=True)
        log(f"[sweep] {name}: running {run_overrides}")
        t0 = time.time()
        try:
            metrics = run_fn(run_configs[name], run_dir).to_json()
        except Exception as e:  # a failed run must not stop the others; it is retried on the next call.
            # (A signal is not a failure: KeyboardInterrupt, a BaseException, stops the whole sweep.)
            atomic_write(os.path.join(run_dir, "error.txt"), traceback.format_exc())
            log(f"[sweep] {name}: FAILED ({type(e).__name__}: {e}); see {run_dir}/error.txt")
            status["failed"].append(name)
            continue
        record = {"name": name, "overrides": run_overrides, "metrics": metrics, "wall_s": time.time() - t0,
                  "config": to_dict(run_configs[name]), "provenance": provenance()}
        atomic_write_json(os.path.join(run_dir, DONE), record, default=str)
        if os.path.exists(os.path.join(run_dir, "error.txt")):
            os.remove(os.path.join(run_dir, "error.txt"))
        status["done"].append(name)
        log(f"[sweep] {name}: done in {record['wall_s']:.0f}s")
    return status


TRAIN_COLUMNS = ("step", "loss", "wall_s", "tokens_per_s")  # of the TrainSummary, as train_<field>


def _flatten_metrics(report: Report) -> dict:
    """A run's report as flat columns: its wall time, the training's `TRAIN_COLUMNS` and, per decoding mode,
    `<mode>/<field>` for every field `ModeResult` marks as a metric (`eval.results.metric`; a list as JSON
    with 3 decimals; an optional metric the mode has none of, left out) and, when a frontier was swept,
    `<mode>/aup` (its accuracy under parallelism on validation)."""
    row = {"wall_s": report.wall_s}
    if report.train is not None:
        row.update({f"train_{k}": getattr(report.train, k) for k in TRAIN_COLUMNS})
    optional = {f.name for f in dataclasses.fields(ModeResult) if f.metadata.get("optional")}
    for r in report.modes:
        for k in metric_fields(ModeResult):
            v = getattr(r, k)
            if v is None and k in optional:
                continue
            row[f"{r.mode}/{k}"] = json.dumps([round(x, 3) for x in v]) if isinstance(v, list) else v
    for mode, value in (report.frontier.aup if report.frontier else {}).items():
        row[f"{mode}/aup"] = value
    return row


def collect(spec: dict, workdir: str) -> list[dict]:
    """One row per finished run, in sweep order: run name, its overrides, its flattened metrics."""
    rows = []
    for name, _ in expand(spec):
        path = os.path.join(workdir, name, DONE)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            record = json.load(f)
        try:
            report = Report.from_json(record["metrics"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: not a run record of this sweep ({type(e).__name__}: {e})") from e
        row = {"run": name}
        row.update({k: json.dumps(v) if isinstance(v, (list, dict)) else v
                    for k, v in record.get("overrides", {}).items()})
        row.update(_flatten_metrics(report))
        rows.append(row)
    return rows


def write_tables(rows: list[dict], workdir: str, title: str) -> list[str]:
    """results.csv, results.md and results.png (accuracy vs tokens per forward for each run × mode)."""
    columns = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(os.path.join(workdir, "results.csv"), buf.getvalue())

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    # The Markdown table keeps the settings that vary across runs (plus every metric); the ones
    # shared by all runs are listed once above it. The CSV keeps everything.
    metrics = {c for c in columns if "/" in c or c.startswith("train_") or c == "wall_s"}
    varying = [c for c in columns if c == "run" or c in metrics or len({fmt(r.get(c)) for r in rows}) > 1]
    common = [c for c in columns if c not in varying]
    md = [f"# {title}\n"]
    if common and rows:
        md += ["Common settings: " + ", ".join(f"`{c}={fmt(rows[0].get(c))}`" for c in common) + "\n"]
    md += ["| " + " | ".join(varying) + " |", "|" + "---|" * len(varying)]
    md += ["| " + " | ".join(fmt(r.get(c)) for c in varying) + " |" for r in rows]
    atomic_write(os.path.join(workdir, "results.md"), "\n".join(md) + "\n")
    written = [os.path.join(workdir, "results.csv"), os.path.join(workdir, "results.md")]
    if rows:
        png = os.path.join(workdir, "results.png")
        from .plots import sweep_plot  # matplotlib only when tables are written
        sweep_plot(rows, png, title)
        written.append(png)
    return written


def default_workdir(spec: dict) -> str:
    """Where a sweep runs unless told otherwise: runs/sweeps/<name>."""
    return os.path.join("runs", "sweeps", spec["name"])


def dry_run(spec: dict, extra: dict | None = None, host_index: int = 0, num_hosts: int = 1,
            workdir: str | None = None) -> list[str]:
    """Every run's config built and checked, nothing run: one line per run of this host's share, with
    its overrides as the typed config holds them and the stages it would run (`plan.describe`)."""
    root = workdir or default_workdir(spec)
    runs = in_workdir(expand(spec), root)
    run_configs = configs(runs, extra)
    return [f"{name}: { {k: overrides.get(run_configs[name], k) for k in {**items, **(extra or {})}} } | "
            f"{describe(plan(run_configs[name], os.path.join(root, name)))}"
            for name, items in my_share(runs, host_index, num_hosts)]


def sweep(spec: dict, workdir: str, *, extra: dict | None = None, host_index: int = 0, num_hosts: int = 1,
          force: bool = False, collect_only: bool = False, log=print) -> tuple[dict, list[str]]:
    """This host's runs (unless `collect_only`), then the results tables of every finished run:
    (run_sweep's status, the files written)."""
    status = {"done": [], "skipped": [], "failed": []}
    if not collect_only:
        status = run_sweep(spec, workdir, host_index=host_index, num_hosts=num_hosts, extra_overrides=extra,
                           force=force, log=log)
    return status, write_tables(collect(spec, workdir), workdir, spec["name"])
