"""Sweeps: expansion, override validation, host shares, and a two-run sweep interrupted by a
failing run, then resumed without redoing the finished run."""
import csv
import json
import os

import pytest
import yaml

from experiments import quickstart, sweep


def test_expand_grid_and_runs():
    spec = {"base": {"train.steps": 5}, "runs": [{"name": "a", "zarya.alpha0": 0.3}, {"name": "b"}],
            "grid": {"optim.lr": [1e-3, 2e-3]}}
    runs = sweep.expand(spec)
    assert [n for n, _ in runs] == ["a,lr=0.001", "a,lr=0.002", "b,lr=0.001", "b,lr=0.002"]
    assert runs[1][1] == {"train.steps": 5, "zarya.alpha0": 0.3, "optim.lr": 2e-3}
    assert sweep.my_share(runs, 1, 2) == [runs[1], runs[3]]
    with pytest.raises(sweep.SweepError, match="host-index=2"):
        sweep.my_share(runs, 2, 2)


def test_overrides_are_validated():
    base = quickstart.default_run_config()
    cfg = sweep.apply_overrides(base, {"zarya.slot_size_set": [4], "eval.knobs.slotted.slot_size": 8})
    assert cfg["zarya"]["slot_size_set"] == [4] and cfg["eval"]["knobs"]["slotted"]["slot_size"] == 8
    assert base["eval"]["knobs"]["slotted"]["slot_size"] == 4  # the base is not mutated
    with pytest.raises(sweep.SweepError, match="unknown key 'slot_sise'"):
        sweep.apply_overrides(base, {"zarya.slot_sise": 4})
    with pytest.raises(sweep.SweepError, match="unknown section 'zaria'"):
        sweep.apply_overrides(base, {"zaria.alpha0": 0.1})


def test_shipped_sweep_parses(tmp_path):
    path = os.path.join(os.path.dirname(sweep.__file__), "sweeps", "paper_ablations.yaml")
    spec = sweep.load_spec(path)
    runs = sweep.expand(spec)
    assert [n for n, _ in runs] == ["slotted-curriculum", "slotted-fixed8", "nonslotted"]
    base = quickstart.default_run_config()
    for _, ov in runs:
        cfg = sweep.apply_overrides(base, ov)
        assert {"mdm", "slotted"} <= set(cfg["eval"]["modes"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nrunz: []\n")
    with pytest.raises(sweep.SweepError, match="unknown top-level keys"):
        sweep.load_spec(str(bad))


def test_sweep_resumes_after_a_failed_run(tmp_path, tiny_config, tiny_params):
    """Two eval-only runs on one checkpoint; the second fails (its data file is missing), the rerun
    skips the finished first run and completes the second."""
    from zarya_jax import checkpoint

    from experiments import tasks

    ckpt = str(tmp_path / "ckpt")
    checkpoint.save(ckpt, tiny_params, tiny_config)
    data = tmp_path / "data"
    tasks.write_splits(str(data), 8, 3, seed=0)
    late_test = tmp_path / "late" / "test.jsonl"
    common = {"eval.ckpt": ckpt, "eval.modes": ["ar"], "eval.max_new_tokens": 6, "eval.batch_size": 3,
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
    logs = []
    status = sweep.run_sweep(sweep.load_spec(str(path)), workdir, log=logs.append)
    assert status == {"done": ["second"], "skipped": ["first"], "failed": []}
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
