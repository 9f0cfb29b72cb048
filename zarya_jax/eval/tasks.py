"""The embedded default task: multi-step arithmetic word problems with worked steps (GSM8K style).

Each record is `{"prompt": str, "answer": str}` — the same JSONL format as any user dataset — e.g.

    prompt: "Ann had 7 pens, got 5, gave away 3. How many now?\\n"
    answer: "7+5=12\\n12-3=9\\n#### 9"

Generation is deterministic from a seed (Python's `random.Random`, stable across platforms). The
held-out splits are generated first — test from `seed + 1`, then validation (for choosing decoding
knobs) from `seed + 2` without the test problems — and their problems are excluded from the training
split, so the three splits are disjoint. The command line is `python -m experiments.tasks`.

Two tasks (`TASKS`, `task_config(difficulty, task)`): `arith`, the default, with the terse answer above
(about 22 byte tokens at difficulty 1), and `long`, the same problems with more steps (3–6) and a
worked solution of one sentence per step, the running total in each (123–271 byte tokens), e.g.

    prompt: "Ann had 7 pens, got 5, gave away 3, found 2. How many now?\n"
    answer: "Ann had 7 pens.\nAnn got 5 pens: 7 + 5 = 12.\nAnn gave away 3 pens: 12 - 3 = 9.\n
             Ann found 2 pens: 9 + 2 = 11.\nSo Ann has 11 pens.\n#### 11"

It ends in the same `#### N` line (`answers.extract`), so it is scored alike; with answers that long a
batch-1 decode is mostly decoding rather than prefill, where a speculative mode's speed-up per cycle
shows (`zarya_jax.eval.length`).
"""
from __future__ import annotations

import dataclasses
import os
import random

from ..data.records import read_jsonl  # noqa: F401 - its old home, still imported from here
from ..files import atomic_write_jsonl

# Prompts are kept short on purpose: with the byte tokenizer every character is a token, and the
# prompt is unsupervised compute, so terse problems make CPU training several times cheaper.
NAMES = ("Ann", "Bob", "Cal", "Dee", "Eve", "Finn", "Gus", "Hana", "Ivy", "Jon")
ITEMS = ("pens", "apples", "cards", "coins", "books", "shells", "stamps", "marbles", "cups", "eggs")
# Clause templates per operation; `{n}` is the operand. The verb identifies the operation.
ADD_PHRASES = ("bought {n}", "found {n}", "got {n}")
SUB_PHRASES = ("gave away {n}", "lost {n}", "sold {n}")
MUL_PHRASES = ("then had {n} times as many",)
OP_SYMBOL = {"add": "+", "sub": "-", "mul": "*"}
SOLUTIONS = ("short", "worked")  # an answer's form: one `a+b=c` line per step, or a sentence per step


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Difficulty knobs: steps per problem, the starting amount and operand ranges, allowed ops."""

    min_steps: int = 2
    max_steps: int = 2
    max_start: int = 20
    max_operand: int = 9
    ops: tuple[str, ...] = ("add", "sub")
    max_multiplier: int = 3
    solution: str = "short"

    def __post_init__(self):
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"TaskConfig: expected 1 ≤ min_steps ≤ max_steps, got {self.min_steps}, {self.max_steps}")
        if self.max_start < 1 or self.max_operand < 1:
            raise ValueError(f"TaskConfig: max_start={self.max_start}, max_operand={self.max_operand}: expected ≥ 1")
        bad = set(self.ops) - set(OP_SYMBOL)
        if bad or not self.ops:
            raise ValueError(f"TaskConfig.ops={self.ops}: expected a non-empty subset of {sorted(OP_SYMBOL)}")
        if self.max_multiplier < 2:
            raise ValueError(f"TaskConfig.max_multiplier={self.max_multiplier}: expected ≥ 2")
        if self.solution not in SOLUTIONS:
            raise ValueError(f"TaskConfig.solution={self.solution!r}: expected one of {SOLUTIONS}")


# Difficulty presets: 1 is the quickstart default (sized so a tiny CPU model can learn it in minutes).
DIFFICULTY = {
    1: TaskConfig(min_steps=2, max_steps=2, max_start=20, max_operand=9, ops=("add", "sub")),
    2: TaskConfig(min_steps=2, max_steps=3, max_start=50, max_operand=20, ops=("add", "sub")),
    3: TaskConfig(min_steps=3, max_steps=4, max_start=100, max_operand=50, ops=("add", "sub", "mul")),
    4: TaskConfig(min_steps=4, max_steps=6, max_start=500, max_operand=200, ops=("add", "sub", "mul"),
                  max_multiplier=9),
}


# The long-answer task's presets: difficulty 1's numbers with 3–6 steps and a worked solution, 123–271
# byte tokens an answer, prompt + answer ≤ 376 (tests/test_tasks.py measures the range).
LONG_DIFFICULTY = {
    1: TaskConfig(min_steps=3, max_steps=6, max_start=20, max_operand=9, ops=("add", "sub"), solution="worked"),
}
TASKS = {"arith": DIFFICULTY, "long": LONG_DIFFICULTY}  # task name -> its difficulty presets


def task_config(difficulty: int | TaskConfig, task: str = "arith") -> TaskConfig:
    """The preset of `task` (a name of `TASKS`) at `difficulty`; a `TaskConfig` is taken as it is."""
    if isinstance(difficulty, TaskConfig):
        return difficulty
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: expected one of {sorted(TASKS)}")
    presets = TASKS[task]
    if difficulty not in presets:
        what = "difficulty" if task == "arith" else f"difficulty for task {task!r}"
        raise ValueError(f"unknown {what} {difficulty!r}: expected one of {sorted(presets)}")
    return presets[difficulty]


def make_problem(rng: random.Random, cfg: TaskConfig) -> dict:
    """One problem: {"prompt", "answer"} with one worked line per step and a final `#### N` line: `a+b=c`
    (`cfg.solution == "short"`), or a sentence with the step's equation (`"worked"`, module doc)."""
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    value = rng.randint(1, cfg.max_start)
    clauses = [f"{name} had {value} {item}"]
    lines = []
    sentences = [f"{name} had {value} {item}."]
    for _ in range(rng.randint(cfg.min_steps, cfg.max_steps)):
        op = rng.choice(cfg.ops)
        if op == "sub" and value == 0:  # keep every amount non-negative
            op = "add"
        if op == "mul":
            n = rng.randint(2, cfg.max_multiplier)
            new = value * n
            phrase = rng.choice(MUL_PHRASES)
        elif op == "sub":
            n = rng.randint(1, min(cfg.max_operand, value))
            new = value - n
            phrase = rng.choice(SUB_PHRASES)
        else:
            n = rng.randint(1, cfg.max_operand)
            new = value + n
            phrase = rng.choice(ADD_PHRASES)
        clauses.append(phrase.format(n=n))
        lines.append(f"{value}{OP_SYMBOL[op]}{n}={new}")
        what = phrase.format(n=n) if op == "mul" else f"{phrase.format(n=n)} {item}"
        sentences.append(f"{name} {what}: {value} {OP_SYMBOL[op]} {n} = {new}.")
        value = new
    if cfg.solution == "worked":
        lines = sentences + [f"So {name} has {value} {item}."]
    return {"prompt": ", ".join(clauses) + ". How many now?\n", "answer": "\n".join(lines) + f"\n#### {value}"}


# The splits are built in memory (about 150 bytes a problem in Python): a bound keeps a typo such as
# `--test 100000000` from filling the machine's memory.
MAX_PROBLEMS = 5_000_000


def generate(num: int, seed: int = 0, difficulty: int | TaskConfig = 1, exclude: set[str] | None = None,
             task: str = "arith") -> list[dict]:
    """`num` problems (0 … MAX_PROBLEMS) of `task` (`TASKS`), deterministic in (seed, task, difficulty);
    prompts in `exclude` are skipped."""
    if not 0 <= num <= MAX_PROBLEMS:
        raise ValueError(f"number of problems {num}: expected 0 … {MAX_PROBLEMS}")
    cfg = task_config(difficulty, task)
    rng = random.Random(seed)
    exclude = exclude or set()
    out, seen, tries = [], set(), 0
    while len(out) < num:
        tries += 1
        if tries > 100 * num + 1000:
            raise ValueError(f"could not generate {num} distinct problems at difficulty {difficulty}; "
                             f"got {len(out)}: the problem space is too small")
        record = make_problem(rng, cfg)
        if record["prompt"] in exclude:
            continue
        out.append(record)
        seen.add(record["prompt"])
    return out


def make_splits(num_train: int, num_test: int, seed: int = 0, difficulty: int | TaskConfig = 1,
                num_val: int = 0, task: str = "arith") -> dict[str, list[dict]]:
    """{'train', 'val', 'test'}: test drawn first from `seed + 1`, validation from `seed + 2` without the
    test prompts, train from `seed` without either (disjoint splits; the test split does not depend on
    `num_val` or `num_train`)."""
    test = generate(num_test, seed + 1, difficulty, task=task)
    held = {r["prompt"] for r in test}
    val = generate(num_val, seed + 2, difficulty, exclude=held, task=task)
    held |= {r["prompt"] for r in val}
    return {"train": generate(num_train, seed, difficulty, exclude=held, task=task), "val": val, "test": test}


def write_jsonl(path: str, records: list[dict]) -> None:
    """One record per line, written atomically."""
    atomic_write_jsonl(path, records)


def write_splits(out_dir: str, num_train: int, num_test: int, seed: int = 0,
                 difficulty: int | TaskConfig = 1, num_val: int = 0, task: str = "arith") -> dict[str, str]:
    """Writes `train.jsonl`, `test.jsonl` and (num_val > 0) `val.jsonl` of `task`; returns {split: path}."""
    paths = {}
    for split, records in make_splits(num_train, num_test, seed, difficulty, num_val, task).items():
        if split != "val" or num_val:
            paths[split] = os.path.join(out_dir, f"{split}.jsonl")
            write_jsonl(paths[split], records)
    return paths
