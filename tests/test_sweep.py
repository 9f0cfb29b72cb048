"""Sweeps through their command line: expansion, override validation, host shares, and a two-run sweep
interrupted by a failing run, then resumed without redoing the finished run."""
import csv
import json
import os

import pytest
import yaml

from experiments import sweep
from zarya_jax import checkpoint
from zarya_jax.eval import tasks
from zarya_jax.experiment import SMOKE


# The default config's stages, which each dry-run line ends with (`zarya_jax.experiment.plan`)
PLAN = " | data → train → records → drafter → frontier → test → speed → diagnostics → targets"


def _dry_run(tmp_path, capsys, spec: dict, *flags) -> tuple[int, list[str], str]:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    code = sweep.main([str(path), "--dry-run", *flags])
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err


def test_expand_grid_and_runs(tmp_path, capsys):
    spec = {"base": {"train.steps": 5}, "runs": [{"name": "a", "zarya.alpha0": 0.3}, {"name": "b"}],
            "grid": {"optim.lr": [1e-3, 2e-3]}}
    code, lines, _ = _dry_run(tmp_path, capsys, spec)
    assert code == 0
    assert [line.split(":")[0] for line in lines] == ["a,lr=0.001", "a,lr=0.002", "b,lr=0.001", "b,lr=0.002"]
    assert lines[1] == "a,lr=0.002: {'train.steps': 5, 'zarya.alpha0': 0.3, 'optim.lr': 0.002}" + PLAN
    code, share, _ = _dry_run(tmp_path, capsys, spec, "--host-index", "1", "--num-hosts", "2")
    assert code == 0 and share == [lines[1], lines[3]]
    code, _, err = _dry_run(tmp_path, capsys, spec, "--host-index", "2", "--num-hosts", "2")
    assert code == 2 and "host-index=2" in err


def test_overrides_are_validated(tmp_path, capsys):
    """Sweep keys are the quickstart config's dotted keys, typed by zarya_jax.overrides (values print as
    the typed config holds them); a typo fails the whole sweep up front, naming the closest keys."""
    ok = {"runs": [{"name": "r", "zarya.slot_size_set": [4], "zarya.slot_step_borders": [1],
                    "eval.knobs.slotted.slot_size": 8}]}
    code, lines, _ = _dry_run(tmp_path, capsys, ok)
    assert code == 0 and lines == ["r: {'eval.knobs.slotted.slot_size': 8, 'zarya.slot_size_set': (4,), "
                                   "'zarya.slot_step_borders': (1.0,)}" + PLAN]
    # whole sections are validated too: a slot curriculum needs one border per size
    code, _, err = _dry_run(tmp_path, capsys, {"runs": [{"name": "r", "zarya.slot_size_set": [4]}]})
    assert code == 2 and "one border per slot size" in err
    code, lines, _ = _dry_run(tmp_path, capsys, {"runs": [{"name": "r"}]}, "--set", "eval.knobs.slotted.slot_size=2")
    assert lines == ["r: {'eval.knobs.slotted.slot_size': 2}" + PLAN]  # --set reaches every run
    # each run's own stages: an AR-only run trains no drafter
    code, lines, _ = _dry_run(tmp_path, capsys, {"runs": [{"name": "r", "eval.modes": ["ar"]}]})
    assert lines == ["r: {'eval.modes': ('ar',)} | data → train → records → frontier → test → speed → diagnostics → "
                     "targets"]
    code, _, err = _dry_run(tmp_path, capsys, {"runs": [{"name": "r", "zarya.slot_sise": 4}]})
    assert code == 2 and "unknown config key 'zarya.slot_sise'" in err and "zarya.slot_size_set" in err
    code, _, err = _dry_run(tmp_path, capsys, {"runs": [{"name": "r", "zaria.alpha0": 0.1}]})
    assert code == 2 and "unknown config key 'zaria.alpha0'" in err
    code, _, err = _dry_run(tmp_path, capsys, {"runs": [{"name": "r", "eval.knobs.slotted.slot_size": "big"}]})
    assert code == 2 and "eval.knobs.slotted.slot_size='big': expected an integer" in err
    # the drafter's and the draft model's optimizers are keys of their own sections; a former flat key is an
    # error naming its new place (no alias)
    code, lines, _ = _dry_run(tmp_path, capsys, {"runs": [{"name": "r", "drafter.optim.weight_decay": 0.1,
                                                           "draft_model.optim.lr": 1e-4}]})
    assert code == 0 and lines == ["r: {'draft_model.optim.lr': 0.0001, 'drafter.optim.weight_decay': 0.1}" + PLAN]
    code, _, err = _dry_run(tmp_path, capsys, {"runs": [{"name": "r", "drafter.lr": 1e-3}]})
    assert code == 2 and "'drafter.lr' has moved: it is now 'drafter.optim.lr'" in err


def test_shipped_sweep_parses(tmp_path, capsys):
    path = os.path.join(os.path.dirname(sweep.__file__), "sweeps", "paper_ablations.yaml")
    assert sweep.main([path, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["zarya-curriculum", "ar-only", "slotted-fixed8", "nonslotted",
                                                     "nonslotted-reconstruction", "nonslotted-reconstruction-sorted",
                                                     "nonslotted-both"]
    for line in lines:
        assert "'eval.modes': ('ar', 'mdm', 'slotted', 'spec-self')" in line
    assert "'train.objective': 'ar'" in lines[1]
    # the commands its comments document are valid too
    documented = [line.split("python -m experiments.sweep ", 1)[1].split("#")[0].split()
                  for line in open(path) if "python -m experiments.sweep" in line]
    for argv in documented:
        assert sweep.main([path if a.endswith("paper_ablations.yaml") else a for a in argv] + ["--dry-run"]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nrunz: []\n")
    assert sweep.main([str(bad), "--dry-run"]) == 2
    assert "unknown top-level keys" in capsys.readouterr().err


def test_sweep_resumes_after_a_failed_run(tmp_path, tiny_config, tiny_params, capsys):
    """Two eval-only runs on one checkpoint; the second fails (its data file is missing), the rerun
    skips the finished first run and completes the second."""
    ckpt = str(tmp_path / "ckpt")
    checkpoint.save(ckpt, tiny_params, tiny_config)
    data = tmp_path / "data"
    tasks.write_splits(str(data), 8, 3, seed=0)
    late_test = tmp_path / "late" / "test.jsonl"
    common = {"eval.ckpt": ckpt, "eval.modes": ["ar"], "eval.max_new_tokens": 6, "eval.batch_size": 3,
              "frontier.enabled": False,
              "task.train_file": str(data / "train.jsonl")}
    spec = {"name": "t", "base": common,
            "runs": [{"name": "first", "task.test_file": str(data / "test.jsonl")},
                     {"name": "second", "task.test_file": str(late_test)}]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    workdir = str(tmp_path / "sweep")
    argv = [str(path), "--workdir", workdir]

    assert sweep.main(argv) == 1                      # the second run raised
    done_first = os.path.join(workdir, "first", sweep.DONE)
    assert os.path.exists(done_first)
    assert not os.path.exists(os.path.join(workdir, "second", sweep.DONE))
    assert "FileNotFoundError" in open(os.path.join(workdir, "second", "error.txt")).read()
    stamp = os.stat(done_first).st_mtime_ns
    preds_first = os.path.join(workdir, "first", "eval", "predictions.jsonl")
    preds_stamp = os.stat(preds_first).st_mtime_ns

    tasks.write_jsonl(str(late_test), tasks.generate(3, seed=5))
    capsys.readouterr()
    assert sweep.main(argv) == 0
    logs = capsys.readouterr().out
    assert "[sweep] first: finished earlier, skipped" in logs and "[sweep] second: done" in logs
    assert os.stat(done_first).st_mtime_ns == stamp            # not redone
    assert os.stat(preds_first).st_mtime_ns == preds_stamp
    assert not os.path.exists(os.path.join(workdir, "second", "error.txt"))
    assert sweep.main(argv + ["--collect-only"]) == 0
    rows = list(csv.DictReader(open(os.path.join(workdir, "results.csv"))))
    assert [r["run"] for r in rows] == ["first", "second"]
    for r in rows:
        acc = float(r["ar/accuracy"])
        assert 0.0 <= acc <= 1.0 and float(r["ar/tokens_per_forward"]) == pytest.approx(1.0)
        record = json.load(open(os.path.join(workdir, r["run"], sweep.DONE)))
        assert record["metrics"]["modes"][0]["accuracy"] == acc
    assert os.path.getsize(os.path.join(workdir, "results.png")) > 0
    assert "| first |" in open(os.path.join(workdir, "results.md")).read()
    # a run record of another schema is named, and no table is written over the good one
    done_second = os.path.join(workdir, "second", sweep.DONE)
    json.dump({**json.load(open(done_second)), "metrics": {"accuracy": 1.0}}, open(done_second, "w"))
    table = open(os.path.join(workdir, "results.csv")).read()
    capsys.readouterr()
    assert sweep.main(argv + ["--collect-only"]) == 2
    assert done_second in capsys.readouterr().err
    assert open(os.path.join(workdir, "results.csv")).read() == table


def test_uno_sweep_smoke_one_frozen_base(tmp_path, capsys):
    """The shipped Uno sweep's shape at smoke size: the first run trains the AR base, the next trains a
    drafter on shifted data (another difficulty) on that same checkpoint through `{sweep}` and is
    evaluated on the base's own test split; the shipped file itself parses, with every run but the base
    and the fine-tuned base reading the base checkpoint."""
    path = os.path.join(os.path.dirname(sweep.__file__), "sweeps", "uno_ablations.yaml")
    workdir = str(tmp_path / "uno")
    assert sweep.main([path, "--dry-run", "--workdir", workdir]) == 0
    lines = capsys.readouterr().out.splitlines()
    base_ckpt = os.path.join(os.path.abspath(workdir), "base", "train", "final")
    assert lines[0].startswith("base:")
    finetuned = [line for line in lines if line.startswith("shifted-finetuned-base:")]
    assert len(finetuned) == 1 and f"'train.init_from': '{base_ckpt}'" in finetuned[0]
    assert all(f"'eval.ckpt': '{base_ckpt}'" in line for line in lines[1:] if line not in finetuned)
    assert any("'drafter.objective.objective': 'dcd'" in line for line in lines)
    assert any("'eval.modes': ('ar', 'spec-model')" in line for line in lines)
    smoke = {k: v for k, v in SMOKE.items() if not k.startswith(("eval.knobs", "frontier"))}
    spec = {"name": "uno-smoke",
            "base": {**smoke, "train.objective": "ar", "eval.ckpt": "{sweep}/base/train/final",
                     "eval.modes": ["ar", "spec-lora"], "eval.batch1_examples": 0, "frontier.enabled": False,
                     "eval.knobs.spec-lora.draft_length": 4},
            "runs": [{"name": "base", "eval.ckpt": ""}, {"name": "shifted", "drafter.task_difficulty": 2}]}
    spec_path = tmp_path / "uno.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    assert sweep.main([str(spec_path), "--workdir", workdir]) == 0
    shifted = os.path.join(workdir, "shifted")
    assert not os.path.exists(os.path.join(shifted, "train"))          # the frozen base, not a new one
    report = json.load(open(os.path.join(shifted, "report.json")))
    assert report["checkpoint"] == base_ckpt
    drafter_train = tasks.read_jsonl(os.path.join(shifted, "drafter_data", "train.jsonl"))
    test = tasks.read_jsonl(os.path.join(shifted, "data", "test.jsonl"))
    assert len(drafter_train) == SMOKE["task.num_train"] and drafter_train != tasks.read_jsonl(
        os.path.join(shifted, "data", "train.jsonl"))
    assert not {r["prompt"] for r in drafter_train} & {r["prompt"] for r in test}
    assert json.load(open(os.path.join(shifted, "drafter", "run_config.json")))["data"]["train"] == [
        os.path.join(shifted, "drafter_data", "train.jsonl")]
    rows = list(csv.DictReader(open(os.path.join(workdir, "results.csv"))))
    assert [r["run"] for r in rows] == ["base", "shifted"]
    assert all(float(r["spec-lora/accepted_per_cycle"]) >= 1.0 for r in rows)
    assert len(json.loads(rows[1]["spec-lora/acceptance_by_position"])) == 4
