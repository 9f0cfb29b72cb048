"""The embedded default task: multi-step arithmetic word problems with worked steps (GSM8K style).

Each record is `{"prompt": str, "answer": str}` — the same JSONL format as any user dataset — e.g.

    prompt: "Ann had 7 pens, got 5, gave away 3. How many now?\\n"
    answer: "7+5=12\\n12-3=9\\n#### 9"

Generation is deterministic from a seed (Python's `random.Random`, stable across platforms). The
held-out splits are generated first — test from `seed + 1`, then validation (for choosing decoding
knobs) from `seed + 2` without the test problems — and their problems are excluded from the training
split, so the three splits are disjoint. The command line is `python -m experiments.tasks`.
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


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Difficulty knobs: steps per problem, the starting amount and operand ranges, allowed ops."""

    min_steps: int = 2
    max_steps: int = 2
    max_start: int = 20
    max_operand: int = 9
    ops: tuple[str, ...] = ("add", "sub")
    max_multiplier: int = 3

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


# Difficulty presets: 1 is the quickstart default (sized so a tiny CPU model can learn it in minutes).
DIFFICULTY = {
    1: TaskConfig(min_steps=2, max_steps=2, max_start=20, max_operand=9, ops=("add", "sub")),
    2: TaskConfig(min_steps=2, max_steps=3, max_start=50, max_operand=20, ops=("add", "sub")),
    3: TaskConfig(min_steps=3, max_steps=4, max_start=100, max_operand=50, ops=("add", "sub", "mul")),
    4: TaskConfig(min_steps=4, max_steps=6, max_start=500, max_operand=200, ops=("add", "sub", "mul"),
                  max_multiplier=9),
}


def task_config(difficulty: int | TaskConfig) -> TaskConfig:
    if isinstance(difficulty, TaskConfig):
        return difficulty
    if difficulty not in DIFFICULTY:
        raise ValueError(f"unknown difficulty {difficulty!r}: expected one of {sorted(DIFFICULTY)}")
    return DIFFICULTY[difficulty]


def make_problem(rng: random.Random, cfg: TaskConfig) -> dict:
    """One problem: {"prompt", "answer"} with one worked line per step and a final `#### N` line."""
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    value = rng.randint(1, cfg.max_start)
    clauses = [f"{name} had {value} {item}"]
    lines = []
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
        value = new
    return {"prompt": ", ".join(clauses) + ". How many now?\n", "answer": "\n".join(lines) + f"\n#### {value}"}


# The splits are built in memory (about 150 bytes a problem in Python): a bound keeps a typo such as
# `--test 100000000` from filling the machine's memory.
MAX_PROBLEMS = 5_000_000


def generate(num: int, seed: int = 0, difficulty: int | TaskConfig = 1, exclude: set[str] | None = None) -> list[dict]:
    """`num` problems (0 … MAX_PROBLEMS), deterministic in (seed, difficulty); prompts in `exclude` are skipped."""
    if not 0 <= num <= MAX_PROBLEMS:
        raise ValueError(f"number of problems {num}: expected 0 … {MAX_PROBLEMS}")
    cfg = task_config(difficulty)
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
                num_val: int = 0) -> dict[str, list[dict]]:
    """{'train', 'val', 'test'}: test drawn first from `seed + 1`, validation from `seed + 2` without the
    test prompts, train from `seed` without either (disjoint splits; the test split does not depend on
    `num_val` or `num_train`)."""
    test = generate(num_test, seed + 1, difficulty)
    held = {r["prompt"] for r in test}
    val = generate(num_val, seed + 2, difficulty, exclude=held)
    held |= {r["prompt"] for r in val}
    return {"train": generate(num_train, seed, difficulty, exclude=held), "val": val, "test": test}


def write_jsonl(path: str, records: list[dict]) -> None:
    """One record per line, written atomically."""
    atomic_write_jsonl(path, records)


def write_splits(out_dir: str, num_train: int, num_test: int, seed: int = 0,
                 difficulty: int | TaskConfig = 1, num_val: int = 0) -> dict[str, str]:
    """Writes `train.jsonl`, `test.jsonl` and (num_val > 0) `val.jsonl`; returns {split: path}."""
    paths = {}
    for split, records in make_splits(num_train, num_test, seed, difficulty, num_val).items():
        if split != "val" or num_val:
            paths[split] = os.path.join(out_dir, f"{split}.jsonl")
            write_jsonl(paths[split], records)
    return paths
