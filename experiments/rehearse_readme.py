"""The README's CPU-sized "Your own model, in five commands", run verbatim at a real Qwen3 shape and measured.

    python -m experiments.rehearse_readme --workdir DIR [--shape qwen3-0.6b] [--interrupt]
                                          [--train-records 32] [--test-records 8]

The commands are read from README.md (the second bash block of "Your own model, in five commands"), so
the README and this measurement cannot drift apart. Each runs as its own process with DIR as the working
directory: the README's relative paths (`my_train.jsonl`, `ckpt/`, `runs/`, `hf/`) land in DIR, and the
one absolute path, the Hugging Face folder `/models/Qwen3-0.6B`, becomes `DIR/models/Qwen3-0.6B`; `python`
is this interpreter. Nothing else in a command is changed.

Stages:
 1. setup      DIR/models/Qwen3-0.6B: a random `Qwen3ForCausalLM` at the `zarya_jax.config` preset's shape
               (`--shape`; for tests `--hidden-size`/`--num-layers` give a small one with Qwen3's vocabulary),
               saved in bfloat16 as Qwen3's own checkpoints are, with the project's offline tokenizer written
               beside it by `python -m conversion.qwen3_tokenizer --out` (a process of its own); the records
               `my_train.jsonl` / `my_test.jsonl` in the README's `{"prompt", "answer"}` format (GSM8K-style
               word problems, `experiments.rehearse.gsm8k_records`);
 2. the README's five commands in order (hf_to_jax, train, evaluate, train_drafter, jax_to_hf), then the
    evaluation the README's prose adds after the drafter: its evaluate command with `--modes spec-lora
    --lora <the drafter's --workdir>/adapter`;
 3. transformers  the export in `AutoModelForCausalLM` (`experiments.rehearse.check_export`): float32 logits
               within 1e-4 of the JAX model's, greedy text equal;
 4. interrupt  (`--interrupt`) Ctrl-C at this shape: the README's train command at batch 1 × 128 with a
               metrics row per step, into a workdir of its own; SIGINT as soon as step 1's row is written
               (step 2 is then running), timed to the exit; the same command again resumes and finishes;
               a third, uninterrupted run of it gives the params the resumed run's must equal bit for bit
               (every leaf, `np.array_equal`).

Every stage is a process of its own (the in-Python ones through `python -c`, `call_argv`); for each the
report gives its argv, wall time, exit status and peak resident memory (the child's `ru_maxrss` from
`os.wait4`, so each process is measured alone; its floor is this parent's ~160 MB, which Linux carries
across `exec`); each one's output is in DIR/logs/.
The report, DIR/readme_rehearsal.json and .md, carries the code's provenance (commit, dirty tree,
package versions). Exit status: 0 every command and check passed, 1 one failed (named; later stages
skipped), 2 bad input.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np

from . import cli
from .rehearse import RehearsalError, _check, _write_jsonl, gsm8k_records, write_hf_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "## Your own model, in five commands"
HF_PATH = "/models/Qwen3-0.6B"  # the README's Hugging Face folder: the one absolute path it names
MODULES = ("conversion.hf_to_jax", "experiments.train", "experiments.evaluate", "experiments.train_drafter",
           "conversion.jax_to_hf")
INTERRUPT_SETS = ("data.batch_size=1", "data.max_length=128", "train.log_every=1")


def readme_commands(text: str) -> list[list[str]]:
    """The argv of each command in the README's CPU-sized block (the section's second bash block):
    continuation lines joined, comments dropped; exactly the five commands of `MODULES`, in that order."""
    if SECTION not in text:
        raise ValueError(f"README.md has no section {SECTION!r}")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    if len(blocks) < 2:
        raise ValueError(f"README.md's {SECTION!r} has {len(blocks)} bash block(s): expected the commands and "
                         "their CPU-sized variant")
    commands = [shlex.split(line, comments=True) for line in blocks[1].replace("\\\n", " ").splitlines()]
    commands = [c for c in commands if c]
    modules = tuple(c[2] if c[:2] == ["python", "-m"] and len(c) > 2 else " ".join(c[:3]) for c in commands)
    if modules != MODULES:
        raise ValueError(f"README.md's CPU-sized block runs {list(modules)}: expected {list(MODULES)}")
    return commands


def localize(argv: list[str], hf_dir: str) -> list[str]:
    """A README command as run here: this interpreter for `python`, `hf_dir` for the README's HF folder."""
    return [sys.executable] + [a.replace(HF_PATH, hf_dir) for a in argv[1:]]


def flag(argv: list[str], name: str) -> str:
    """The value after `name` in `argv`."""
    if name not in argv[:-1]:
        raise ValueError(f"{' '.join(argv[:3])} has no {name}")
    return argv[argv.index(name) + 1]


def with_flag(argv: list[str], name: str, value: str) -> list[str]:
    """`argv` with `name`'s value replaced (`name` must be there)."""
    flag(argv, name)
    i = argv.index(name) + 1
    return argv[:i] + [value] + argv[i + 1:]


def spec_lora_command(evaluate: list[str], drafter: list[str]) -> list[str]:
    """The README's evaluate command for its drafter: `--modes spec-lora --lora <drafter --workdir>/adapter`."""
    return with_flag(evaluate, "--modes", "spec-lora") + ["--lora", os.path.join(flag(drafter, "--workdir"), "adapter")]


def interrupt_command(train: list[str], workdir: str) -> list[str]:
    """The README's train command at batch 1 × 128 with a metrics row per step, into `workdir`."""
    return with_flag(train, "--workdir", workdir) + [a for s in INTERRUPT_SETS for a in ("--set", s)]


def call_argv(function: str, **kwargs) -> list[str]:
    """A child process's argv that calls `function` (dotted) with JSON `kwargs` and prints `RESULT <json>`.
    The measuring work runs in children too: Linux keeps a process's peak RSS across `exec`, so a child
    forked from a parent that held a model would report the parent's memory as its own floor."""
    module, name = function.rsplit(".", 1)
    code = f"import json, sys; from {module} import {name}; print('RESULT', json.dumps({name}(**json.loads(sys.argv[1]))))"
    return [sys.executable, "-c", code, json.dumps(kwargs)]


def write_model(directory: str, shape: dict) -> None:
    """The README's Hugging Face folder: a random Qwen3 of `shape` (`ModelConfig` fields), in bfloat16."""
    from zarya_jax.config import ModelConfig

    write_hf_model(directory, None, shape=ModelConfig(**shape), dtype="bfloat16")


def same_params(a: str, b: str) -> dict:
    """{leaves, differing: the leaves of checkpoint `a` not bit-equal to `b`'s}."""
    import jax

    from zarya_jax import checkpoint

    got = dict(jax.tree_util.tree_leaves_with_path(checkpoint.load(a)[0]))
    want = dict(jax.tree_util.tree_leaves_with_path(checkpoint.load(b)[0]))
    differ = [jax.tree_util.keystr(k) for k in got.keys() | want.keys()
              if k not in got or k not in want or not np.array_equal(np.asarray(got[k]), np.asarray(want[k]))]
    return {"leaves": len(got), "differing": sorted(differ)}


class Runner:
    """Runs commands as child processes in `cwd`, recording each one's wall time, exit status and peak RSS
    (the parent holds no model, so a child's floor is the parent's ~160 MB; see `call_argv`)."""

    def __init__(self, cwd: str):
        self.cwd = cwd
        self.rows: list[dict] = []
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
        os.makedirs(os.path.join(cwd, "logs"), exist_ok=True)

    def start(self, name: str, argv: list[str]) -> tuple[subprocess.Popen, float]:
        print(f"[readme] {name}: {shlex.join(argv)}", flush=True)
        log = open(os.path.join(self.cwd, "logs", f"{name}.log"), "w")
        proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return proc, time.perf_counter()

    def finish(self, name: str, argv: list[str], proc: subprocess.Popen, t0: float, waited=None) -> dict:
        """Waits for `proc` (unless `waited` holds its `os.wait4` result) and records it."""
        _, status, usage = waited or os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        row = {"stage": name, "argv": [os.path.relpath(a, self.cwd) if a.startswith(self.cwd) else a for a in argv],
               "wall_s": round(time.perf_counter() - t0, 1), "exit": proc.returncode,
               "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}  # ru_maxrss: KiB on Linux
        self.rows.append(row)
        print(f"[readme] {name}: exit {row['exit']}, {row['wall_s']} s, peak RSS {row['peak_rss_mb']} MB", flush=True)
        return row

    def run(self, name: str, argv: list[str], expect: int = 0) -> dict:
        row = self.finish(name, argv, *self.start(name, argv))
        _check(row["exit"] == expect, f"{name} exited with status {row['exit']} (expected {expect}); see "
               f"{os.path.join(self.cwd, 'logs', name + '.log')}")
        return row

    def log(self, name: str) -> str:
        with open(os.path.join(self.cwd, "logs", f"{name}.log"), errors="replace") as f:
            return f.read()

    def call(self, name: str, function: str, **kwargs):
        """`function(**kwargs)` in a child process (`call_argv`), measured like a command; its result."""
        self.run(name, call_argv(function, **kwargs))
        lines = [line for line in self.log(name).splitlines() if line.startswith("RESULT ")]
        return json.loads(lines[-1][len("RESULT "):])


def _metrics_steps(workdir: str) -> list[int]:
    try:
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            return [json.loads(line)["step"] for line in f if line.strip()]
    except (OSError, ValueError, KeyError):
        return []


def interrupt_stage(runner: Runner, train: list[str], poll_s: float = 0.2) -> dict:
    """Ctrl-C while step 2 runs: the time to exit, the step saved; the resumed run bit-exact vs an uninterrupted one."""
    argv = interrupt_command(train, "runs/interrupted")
    where = os.path.join(runner.cwd, "runs", "interrupted")
    proc, t0 = runner.start("interrupt", argv)
    while not (waited := os.wait4(proc.pid, os.WNOHANG))[0] and 1 not in _metrics_steps(where):
        time.sleep(poll_s)  # step 1's row is written once step 2 is dispatched
    if waited[0]:
        row = runner.finish("interrupt", argv, proc, t0, waited)
        _check(False, f"the run to interrupt exited with status {row['exit']} before step 2 began; see "
               f"{os.path.join(runner.cwd, 'logs', 'interrupt.log')}")
    proc.send_signal(signal.SIGINT)
    sent = time.perf_counter()
    row = runner.finish("interrupt", argv, proc, t0)
    exit_s = round(time.perf_counter() - sent, 1)
    saved = re.findall(r"signal \d+: saved checkpoint (\d+)", runner.log("interrupt"))
    with open(os.path.join(where, "metrics.jsonl")) as f:
        step_s = [round(json.loads(line).get("step_time_s", float("nan")), 1) for line in f if line.strip()]
    row.update(signal_to_exit_s=exit_s, saved_step=int(saved[-1]) if saved else None, step_time_s=step_s)
    _check(row["exit"] == 130, f"the interrupted run exited with status {row['exit']} (expected 130)")
    _check(row["saved_step"] == 2, f"the interrupted run saved step {row['saved_step']} (expected 2, the step running)")
    runner.run("interrupt_resume", argv)
    runner.run("interrupt_reference", interrupt_command(train, "runs/uninterrupted"))
    same = runner.call("compare_params", "experiments.rehearse_readme.same_params", a="runs/interrupted/final",
                       b="runs/uninterrupted/final")
    differ = same["differing"]
    result = {"signal_to_exit_s": exit_s, "exit": row["exit"], "saved_step": row["saved_step"],
              "step_time_s": step_s, "leaves": same["leaves"], "leaves_differing": differ, "bit_exact": not differ}
    _check(result["bit_exact"], f"the resumed run's params differ from the uninterrupted run's at {differ[:5]}")
    return result


def rehearse_readme(workdir: str, *, shape, readme: str, interrupt: bool = False, train_records: int = 32,
                    test_records: int = 8) -> dict:
    """Every stage into `workdir` (new or empty); returns the report (also written there)."""
    from zarya_jax.files import atomic_write, atomic_write_json
    from zarya_jax.provenance import provenance

    with open(readme, encoding="utf-8") as f:
        commands = readme_commands(f.read())
    if os.path.isdir(workdir) and os.listdir(workdir):
        raise ValueError(f"--workdir {workdir!r} is not empty: choose a new directory")
    if train_records < 2 or test_records < 1:
        raise ValueError(f"--train-records {train_records} (≥ 2), --test-records {test_records} (≥ 1): out of range")
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    hf_dir = os.path.join(workdir, HF_PATH.lstrip("/"))
    runner = Runner(workdir)
    report: dict = {"shape": {k: getattr(shape, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                               "num_layers", "num_heads", "num_kv_heads", "head_dim")},
                    "readme": os.path.relpath(readme, ROOT), "stages": runner.rows, "checks": {}}
    try:
        runner.call("hf_model", "experiments.rehearse_readme.write_model", directory=hf_dir,
                    shape=dataclasses.asdict(shape))
        runner.run("qwen3_tokenizer", [sys.executable, "-m", "conversion.qwen3_tokenizer", "--out", hf_dir])
        records = [{"prompt": r["question"], "answer": r["answer"]} for r in gsm8k_records(train_records + test_records)]
        _write_jsonl(os.path.join(workdir, "my_train.jsonl"), records[:train_records])
        _write_jsonl(os.path.join(workdir, "my_test.jsonl"), records[train_records:])
        hf_to_jax, train, evaluate, drafter, jax_to_hf = (localize(c, hf_dir) for c in commands)
        for name, argv in zip(("hf_to_jax", "train", "evaluate", "train_drafter"), (hf_to_jax, train, evaluate, drafter)):
            runner.run(name, argv)
        runner.run("evaluate_spec_lora", spec_lora_command(evaluate, drafter))
        runner.run("jax_to_hf", jax_to_hf)
        prompt = "<|im_start|>user\n" + records[0]["prompt"] + "<|im_end|>\n<|im_start|>assistant\n"
        report["checks"]["transformers"] = runner.call("transformers", "experiments.rehearse.check_export",
                                                       ckpt=flag(jax_to_hf, "--ckpt"), hf_dir=flag(jax_to_hf, "--out"),
                                                       prompt=prompt)
        if interrupt:
            report["checks"]["interrupt"] = interrupt_stage(runner, train)
        report["status"] = "passed"
    except RehearsalError as e:
        report["status"] = f"failed: {e}"
    report["provenance"] = provenance()
    atomic_write_json(os.path.join(workdir, "readme_rehearsal.json"), report)
    atomic_write(os.path.join(workdir, "readme_rehearsal.md"), report_markdown(report))
    return report


def report_markdown(report: dict) -> str:
    from zarya_jax.provenance import describe

    s = report["shape"]
    lines = [f"README rehearsal ({report['readme']}'s CPU-sized commands): vocab {s['vocab_size']}, hidden "
             f"{s['hidden_size']}, intermediate {s['intermediate_size']}, {s['num_layers']} layers, {s['num_heads']} "
             f"heads ({s['num_kv_heads']} kv) of {s['head_dim']}; {report['status']}.",
             describe(report["provenance"]), "",
             "| stage | wall s | exit | peak RSS MB | command |", "|---|---:|---:|---:|---|"]
    for r in report["stages"]:
        cmd = ("`" + r["argv"][2].split("; ")[1] + "`" if r["argv"][1] == "-c"  # `call_argv`: the function
               else "`" + shlex.join(r["argv"][1:]) + "`")
        lines.append(f"| {r['stage']} | {r['wall_s']} | {r['exit']} | {r.get('peak_rss_mb', '')} | {cmd} |")
    t = report["checks"].get("transformers")
    if t:
        lines += ["", f"Export in transformers ({t['export_dtype']} weights, float32 logits): max |Δlogit| "
                      f"{t['max_abs_logit_diff']:.2e} vs the checkpoint rounded to {t['export_dtype']}, "
                      f"{t['max_abs_logit_diff_unrounded']:.2e} vs it unrounded; greedy text equal."]
    i = report["checks"].get("interrupt")
    if i:
        lines += ["", f"Ctrl-C while step 2 ran: exit {i['exit']} {i['signal_to_exit_s']} s after the signal, "
                      f"checkpoint {i['saved_step']} saved (steps took {i['step_time_s']} s); the resumed run's "
                      f"{i['leaves']} param leaves " + ("equal the uninterrupted run's bit for bit." if i["bit_exact"]
                                                          else f"differ at {i['leaves_differing']}.")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.rehearse_readme", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="a new (or empty) directory: the commands' working directory")
    parser.add_argument("--shape", default="qwen3-0.6b", help="the zarya_jax.config preset whose shape the HF folder has")
    parser.add_argument("--hidden-size", type=int, help="instead of --shape: a small model of this width (tests)")
    parser.add_argument("--num-layers", type=int, default=1, help="with --hidden-size: its depth")
    parser.add_argument("--interrupt", action="store_true", help="also measure Ctrl-C and the resume (three more runs)")
    parser.add_argument("--train-records", type=int, default=32)
    parser.add_argument("--test-records", type=int, default=8)
    parser.add_argument("--readme", default=os.path.join(ROOT, "README.md"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    def body() -> int:
        from zarya_jax.config import preset

        from .rehearse import QWEN3_VOCAB, tiny_shape

        shape = tiny_shape(args.hidden_size, args.num_layers) if args.hidden_size else preset(args.shape)
        if shape.vocab_size != QWEN3_VOCAB:
            raise ValueError(f"--shape {args.shape!r} has vocab {shape.vocab_size}: expected a Qwen3 preset "
                             f"({QWEN3_VOCAB} rows, the tokenizer's)")
        report = rehearse_readme(args.workdir, shape=shape, readme=args.readme, interrupt=args.interrupt,
                                 train_records=args.train_records, test_records=args.test_records)
        print(report_markdown(report))
        print(f"wrote {os.path.join(os.path.abspath(args.workdir), 'readme_rehearsal.json')} and .md")
        return 0 if report["status"] == "passed" else 1

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())
