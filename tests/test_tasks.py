"""The embedded task generator: determinism, disjoint splits, and answers recomputed independently
by parsing the prompt text (not by reading the generator's own bookkeeping)."""
import json
import re

import pytest

from experiments import tasks as tasks_cli
from zarya_jax.eval import answers, tasks

# Independent reading of the prompt: the verb decides the operation.
VERBS = {"bought": "+", "found": "+", "got": "+", "gave": "-", "lost": "-", "sold": "-", "then": "*"}


def recompute(prompt: str) -> tuple[int, list[str]]:
    """Parses 'X had N items, got K, lost J. How many now?' and returns (final value, worked lines)."""
    assert prompt.endswith(". How many now?\n")
    clauses = [c.strip() for c in prompt[: -len(". How many now?\n")].split(",")]
    value = int(re.fullmatch(r"[A-Z][a-z]+ had (\d+) [a-z]+", clauses[0]).group(1))
    lines = []
    for s in clauses[1:]:
        verb = s.split()[0]
        n = int(re.search(r"(\d+)", s).group(1))
        op = VERBS[verb]
        new = value + n if op == "+" else value - n if op == "-" else value * n
        lines.append(f"{value}{op}{n}={new}")
        value = new
    return value, lines


@pytest.mark.parametrize("difficulty", sorted(tasks.DIFFICULTY))
def test_answers_recomputed_from_prompt(difficulty):
    cfg = tasks.DIFFICULTY[difficulty]
    for record in tasks.generate(300, seed=difficulty, difficulty=difficulty):
        value, lines = recompute(record["prompt"])
        assert value >= 0
        assert cfg.min_steps <= len(lines) <= cfg.max_steps
        assert record["answer"] == "\n".join(lines) + f"\n#### {value}"
        assert answers.reference(record["answer"]) == str(value)


def test_deterministic_and_seed_dependent():
    a = tasks.generate(50, seed=3)
    b = tasks.generate(50, seed=3)
    c = tasks.generate(50, seed=4)
    assert a == b
    assert a != c


def test_splits_disjoint_and_written_as_jsonl(tmp_path):
    paths = tasks.write_splits(str(tmp_path), 400, 50, seed=0, difficulty=1, num_val=30)
    train_path, test_path = paths["train"], paths["test"]
    train, val, test = ([json.loads(l) for l in open(paths[k])] for k in ("train", "val", "test"))
    assert len(train) == 400 and len(val) == 30 and len(test) == 50
    assert all(set(r) == {"prompt", "answer"} for r in train + val + test)
    prompts = [{r["prompt"] for r in split} for split in (train, val, test)]
    assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2] and not prompts[1] & prompts[2]
    assert tasks.read_jsonl(test_path) == test
    # the test split does not depend on the other splits' sizes
    assert tasks.make_splits(10, 50, seed=0)["test"] == test
    # Re-generating gives byte-identical files.
    again = tmp_path / "again"
    tasks.write_splits(str(again), 400, 50, seed=0, difficulty=1)
    assert open(again / "train.jsonl").read() == open(train_path).read()


def test_bad_input_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown difficulty 9"):
        tasks.generate(1, difficulty=9)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "a"\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        tasks.read_jsonl(str(bad))
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        tasks.read_jsonl(str(tmp_path / "missing.jsonl"))
    assert tasks_cli.main(["--out", str(tmp_path / "x"), "--train", "-1"]) == 2  # python -m experiments.tasks
    assert not (tmp_path / "x" / "train.jsonl").exists()
