"""Faults a long run meets, through `python -m experiments.train` in-process on a real tiny run: damaged
run checkpoints, reruns of a finished run, a moved or respelled workdir, changed data, a forced resume
that cannot fit, and divergence (exit 3, nothing saved from the diverged state). Plus the checksum
itself: NumPy and on-device (sharded) sums agree, and the detector's thresholds on synthetic curves."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import train as train_cli
from zarya_jax.nn import integrity
from zarya_jax.train.divergence import DivergenceConfig, DivergenceDetector

from test_bad_inputs import flip_bytes, largest_file, snapshot

BASE = ["--config", "tiny", "--set", "model.num_layers=1", "--set", "data.max_length=24", "--set", "data.batch_size=4",
        "--set", "data.eval_fraction=0", "--set", "mesh.num_devices=1", "--set", "optim.warmup_steps=1",
        "--set", "train.steps=4", "--set", "train.save_every=2", "--set", "train.keep=2", "--set", "train.log_every=1",
        "--set", "train.eval_every=0", "--set", "train.async_checkpointing=false", "--set", "train.progress_bar=false",
        "--set", "zarya.slot_size_set=[2]", "--set", "zarya.slot_step_borders=[1.0]"]


def argv(workdir, data, *more):
    return BASE + ["--workdir", str(workdir), "--set", f"data.train={data}", *more]


def run(capsys, args):
    code = train_cli.main([str(a) for a in args])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out


def write_data(path):
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for _ in range(16):
            a, b = rng.integers(0, 50, 2)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run whose data lives inside its workdir (as the quickstart's does)."""
    workdir = tmp_path_factory.mktemp("faults") / "run"
    workdir.mkdir()
    write_data(workdir / "train.jsonl")
    code = train_cli.main(argv(workdir, workdir / "train.jsonl"))
    assert code == 0
    return workdir


def copy_run(finished, dest):
    shutil.copytree(finished, dest)
    return dest


def test_checksums_agree_on_host_and_device():
    """The NumPy sums (host arrays) and the jitted sums (device arrays, here sharded over 8 devices) are
    the same numbers, for every item size; a flipped bit changes them."""
    rng = np.random.default_rng(0)
    arrays = {"f32": rng.standard_normal((16, 24)).astype(np.float32),
              "bf16": rng.standard_normal((8, 5)).astype(jnp.bfloat16), "i8": rng.integers(-9, 9, 7).astype(np.int8),
              "bool": rng.integers(0, 2, (4, 4)).astype(bool), "scalar": np.int32(7)}
    host = integrity.array_checksums(arrays)
    mesh = jax.make_mesh((8,), ("x",))
    spec = (lambda v: jax.sharding.PartitionSpec("x") if np.ndim(v) and np.shape(v)[0] % 8 == 0
            else jax.sharding.PartitionSpec())
    sharded = {k: jax.device_put(v, jax.sharding.NamedSharding(mesh, spec(v))) for k, v in arrays.items()}
    device = jax.device_get(integrity._device_tree_sums(sharded))
    assert {k: integrity._format(v) for k, v in device.items()} == {k: host[f"['{k}']"]["sum"] for k in arrays}
    flipped = arrays["f32"].copy()
    flipped.reshape(-1).view(np.uint32)[37] ^= np.uint32(1 << 31)
    assert integrity.array_checksums({"f32": flipped})["['f32']"] != host["['f32']"]


def test_rerun_of_finished_run_keeps_its_numbers(finished, capsys):
    recorded = json.load(open(finished / "summary.json"))
    assert recorded["loss"] is not None and recorded["tokens_per_s"] is not None
    before = snapshot(str(finished / "final")) | {"metrics": os.stat(finished / "metrics.jsonl").st_mtime_ns}
    code, out = run(capsys, argv(finished, finished / "train.jsonl"))
    summary = json.loads(out.out[out.out.index("{\n"):])
    assert code == 0 and summary["start_step"] == summary["step"] == 4
    assert summary["loss"] == recorded["loss"] and summary["tokens_per_s"] == recorded["tokens_per_s"]
    assert json.load(open(finished / "summary.json")) == recorded   # not overwritten with nulls
    assert snapshot(str(finished / "final")) | {"metrics": os.stat(finished / "metrics.jsonl").st_mtime_ns} == before


def test_damaged_run_checkpoint_is_one_clean_error(finished, tmp_path, capsys):
    for damage in ("flip", "truncate"):
        workdir = copy_run(finished, tmp_path / damage)
        state = largest_file(str(workdir / "checkpoints" / "4" / "state"))
        flip_bytes(state) if damage == "flip" else os.truncate(state, os.path.getsize(state) // 2)
        before = snapshot(str(workdir))
        code, out = run(capsys, argv(workdir, workdir / "train.jsonl"))
        errors = [line for line in out.err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and f"{workdir}/checkpoints/4" in errors[0], out.err
        assert "is damaged" in errors[0]
        assert snapshot(str(workdir)) == before


def test_moved_or_respelled_workdir_resumes_changed_data_does_not(finished, tmp_path, capsys, monkeypatch):
    moved = copy_run(finished, tmp_path / "elsewhere" / "moved")
    code, out = run(capsys, argv(moved, moved / "train.jsonl"))
    assert code == 0, out.err
    monkeypatch.chdir(tmp_path)                                  # the same run, spelled relative
    code, out = run(capsys, argv("./elsewhere/moved", "elsewhere/../elsewhere/moved/train.jsonl"))
    assert code == 0, out.err
    with open(moved / "train.jsonl", "a") as f:                  # same path, new content: another run
        f.write(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    before = snapshot(str(moved))
    code, out = run(capsys, argv(moved, moved / "train.jsonl"))
    assert code == 2 and "data.train: the content differs" in out.err and "--force" in out.err
    assert snapshot(str(moved)) == before


def test_failed_forced_restore_changes_nothing(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path / "forced")
    before = {name: open(workdir / name, "rb").read() for name in ("run_config.json", "fingerprint.json")}
    snap = snapshot(str(workdir))
    code, out = run(capsys, argv(workdir, workdir / "train.jsonl", "--set", "model.hidden_size=32"))
    assert code == 2 and "different config" in out.err and "model.hidden_size" in out.err and "--force" in out.err
    code, out = run(capsys, argv(workdir, workdir / "train.jsonl", "--set", "model.hidden_size=32", "--force"))
    errors = [line for line in out.err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "does not fit this run's config" in errors[0], out.err
    assert snapshot(str(workdir)) == snap
    assert {name: open(workdir / name, "rb").read() for name in before} == before
    code, out = run(capsys, argv(workdir, workdir / "train.jsonl"))   # the original still resumes
    assert code == 0, out.err


@pytest.mark.parametrize("lr", ["1e6", "1e30"])
def test_divergence_stops_before_its_state_is_saved(tmp_path, capsys, lr):
    """lr=1e6 blows the weights up with finite numbers, lr=1e30 makes them non-finite. The warmup's first
    step has lr 0, so step 1 is healthy and checkpointed; step 2 diverges: exit 3, and no checkpoint or
    export of it (the message names the healthy checkpoint)."""
    write_data(tmp_path / "train.jsonl")
    workdir = tmp_path / "run"
    code, out = run(capsys, argv(workdir, tmp_path / "train.jsonl", "--set", f"optim.lr={lr}",
                                 "--set", "train.save_every=1"))
    errors = [line for line in out.err.splitlines() if line.startswith("error:")]
    assert code == 3 and len(errors) == 1, out.err
    assert "at step 2" in errors[0] and f"{workdir}/checkpoints/1, was written from a healthy state" in errors[0]
    assert ("params' norm grew" if lr == "1e6" else "non-finite") in errors[0]
    assert [n for n in os.listdir(workdir / "checkpoints") if n.isdigit()] == ["1"]
    assert not os.path.exists(workdir / "final")


def test_detector_thresholds():
    healthy = DivergenceDetector(DivergenceConfig(), param_norm0=10.0)
    rng = np.random.default_rng(0)
    # a falling loss with noise, a curriculum bump and slowly growing weights: never trips
    for step in range(1, 2001):
        loss = 5.0 * np.exp(-step / 150) + 0.02 + 0.3 * (800 <= step < 820) + abs(rng.normal(0, 0.02))
        metrics = {"loss": loss, "grad_norm": 1.0 + rng.random(), "param_norm": 10.0 + step / 200}
        assert healthy.check(step, metrics) is None, step
    spike = DivergenceDetector(DivergenceConfig())
    for step in range(1, 21):
        assert spike.check(step, {"loss": 1.0, "grad_norm": 1.0}) is None
    assert "far above its running median" in spike.check(21, {"loss": 11.0, "grad_norm": 1.0})
    dead = DivergenceDetector(DivergenceConfig(zero_grad_steps=3))
    assert [dead.check(s, {"loss": 1.0, "grad_norm": 0.0}) is None for s in (1, 2, 3)] == [True, True, False]
    off = DivergenceDetector(DivergenceConfig(zero_grad_steps=0, loss_spike_factor=0, param_growth=0), 1.0)
    assert all(off.check(s, {"loss": 1e9 * s, "grad_norm": 0.0, "param_norm": 1e9}) is None for s in range(1, 30))
