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


# The long-answer task (`task="long"`): worked solutions, one sentence per step.
WORKED_STEP = re.compile(r"[A-Z][a-z]+ (bought|found|got|gave away|lost|sold) (\d+) [a-z]+: (\d+) ([+-]) (\d+) = (\d+)\.")


def test_long_task_worked_solutions_recomputed_and_sized():
    from zarya_jax.data.tokenizer import load_tokenizer
    tok = load_tokenizer("byte")  # the quickstart's tokenizer
    cfg = tasks.LONG_DIFFICULTY[1]
    records = tasks.generate(400, seed=7, task="long")
    lengths = [len(tok.encode(r["answer"])) for r in records]
    assert 100 <= min(lengths) and max(lengths) <= 300  # 123–271 over 20k problems (the preset's comment)
    assert max(lengths) - min(lengths) > 80  # a spread of answer lengths, for speed-up against length
    for record in records:
        value, short_lines = recompute(record["prompt"])
        lines = record["answer"].split("\n")
        assert lines[-1] == f"#### {value}" and lines[-2].startswith("So ") and lines[-2].endswith(f" has {value} "
                                                                                                    f"{lines[0].split()[3]}")
        steps = [WORKED_STEP.fullmatch(line) for line in lines[1:-2]]
        assert all(steps) and cfg.min_steps <= len(steps) <= cfg.max_steps
        # each sentence's equation is the short task's line for that step, the running total carried on
        assert [f"{m[3]}{m[4]}{m[5]}={m[6]}" for m in steps] == short_lines
        assert answers.reference(record["answer"]) == str(value)
        assert answers.is_correct(record["answer"], record["answer"])
        assert not answers.is_correct(record["answer"].rsplit("####", 1)[0] + f"#### {value + 1}", record["answer"])
    assert max(len(tok.encode(r["prompt"] + r["answer"])) for r in records) + 1 <= 384  # --task long's data.max_length


def test_long_task_deterministic_and_splits_disjoint(tmp_path):
    a, b = tasks.generate(50, seed=3, task="long"), tasks.generate(50, seed=3, task="long")
    assert a == b and a != tasks.generate(50, seed=4, task="long")
    splits = tasks.make_splits(300, 40, seed=0, num_val=20, task="long")
    prompts = [{r["prompt"] for r in splits[k]} for k in ("train", "val", "test")]
    assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2] and not prompts[1] & prompts[2]
    paths = tasks.write_splits(str(tmp_path), 300, 40, seed=0, num_val=20, task="long")
    assert tasks.read_jsonl(paths["test"]) == splits["test"]
    assert tasks_cli.main(["--out", str(tmp_path / "cli"), "--task", "long", "--train", "300", "--test", "40",
                           "--val", "20"]) == 0
    assert open(tmp_path / "cli" / "train.jsonl").read() == open(paths["train"]).read()


def test_unknown_task_is_one_error_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        tasks.generate(1, task="nope")
    with pytest.raises(ValueError, match="unknown difficulty for task 'long' 4"):
        tasks.task_config(4, "long")
    assert tasks_cli.main(["--out", str(tmp_path / "x"), "--task", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "unknown task 'nope'" in err[0]
    assert not (tmp_path / "x" / "train.jsonl").exists()
    from experiments import quickstart
    assert quickstart.main(["--smoke", "--workdir", str(tmp_path / "q"), "--set", "task.name=nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "unknown task 'nope'" in err[0]
    assert not (tmp_path / "q").exists()


def test_quickstart_long_task_sizes_the_run():
    from experiments import quickstart
    config = quickstart.config_from_args(quickstart.build_parser().parse_args(["--task", "long"]))
    assert config.task.name == "long" and config.data.max_length >= 377 and config.eval.max_new_tokens >= 271
    lookahead = 16
    assert config.model.max_position_embeddings >= 98 + config.eval.max_new_tokens + lookahead
    smoke = quickstart.config_from_args(quickstart.build_parser().parse_args(["--task", "long", "--smoke"]))
    assert smoke.task.name == "long" and smoke.eval.max_new_tokens == 8  # --smoke still shrinks the budget
