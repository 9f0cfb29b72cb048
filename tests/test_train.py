"""The training loop: exact resume after SIGKILL (real subprocess) and after SIGTERM, overfitting in
slotted and non-slotted modes, the NaN/Inf guard, and the errors for bad input.

All runs of one config share a persistent compilation cache (the subprocess included), so the
step is compiled once; a resumed run still rebuilds and reloads everything else."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax.config import ConfigError
from zarya_jax.data.pipeline import DataError
from zarya_jax.objectives.base import Objective
from zarya_jax.objectives.zarya import zarya_objective
from zarya_jax.train import config as rc
from zarya_jax.train.hooks import OnStep
from zarya_jax.train.loop import train
from zarya_jax.train.metrics import read_metrics
from zarya_jax.train.step import NonFiniteError
from zarya_jax.testing import write_sum_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_sum_records(tmp_path_factory.mktemp("data") / "train.jsonl", 24)


# Same step as test_sharding.py's 8-device run (one compile for both through the cache).
COMMON = {"data.max_length": 24, "data.batch_size": 8, "optim.grad_accum_steps": 2, "optim.lr": 1e-2,
          "optim.eps": 1e-3, "optim.warmup_steps": 2, "optim.weight_decay": 0.1, "train.steps": 6,
          "train.log_every": 1, "train.keep_best": 0, "train.export_final": False, "train.progress_bar": False,
          "zarya.slot_size_set": [2], "zarya.slot_step_borders": [1.0]}


def resume_overrides(data_file):
    return {**COMMON, "data.train": data_file, "data.seed": 7, "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2,
            "train.save_every": 3}


KILLED_RUN = """
import sys, time
from zarya_jax.train import config as rc
from zarya_jax.train.hooks import OnStep
from zarya_jax.train.loop import train
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[3])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
overrides = __import__("json").loads(sys.argv[2])

def stall(event):  # wait to be killed once checkpoint 3 is on its way
    if event.saved and event.step == 3:
        time.sleep(600)

train(rc.build({"model": "tiny"}, overrides), sys.argv[1], hooks=[OnStep(stall)])
"""


def test_a_knob_the_objective_never_reads_keeps_the_run(tmp_path, data_file):
    """The sequential convention is read by the non-slotted objective only: a slotted workdir resumes
    whatever it says (a changed default must not orphan existing runs), a non-slotted one refuses."""
    from zarya_jax.train import identity
    for slotted in (True, False):
        base = {**COMMON, "data.train": data_file, "zarya.slotted_training": slotted}
        workdir = str(tmp_path / str(slotted))
        identity.record(rc.build({"model": "tiny"}, {**base, "zarya.sequential_convention": "both"}), workdir)
        changes = identity.differences(rc.build({"model": "tiny"}, {**base, "zarya.sequential_convention": "ar"}),
                                       workdir)
        assert changes == ([] if slotted else ["zarya.sequential_convention: 'both' -> 'ar'"])


def _params(summary):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(summary["state"]["params"]))]


def test_exact_resume_after_sigkill_and_sigterm(tmp_path, data_file, compile_cache):
    overrides = resume_overrides(data_file)
    cfg = rc.build({"model": "tiny"}, overrides)

    # 1) a real process, SIGKILLed after checkpoint 3 is complete
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(killed), json.dumps(overrides), compile_cache],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 480
    while not (killed / "checkpoints" / "3" / "state").is_dir():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "no checkpoint 3 within 480 s"
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert sorted(os.listdir(killed / "checkpoints")) == ["3"]
    resumed = train(cfg, str(killed), return_state=True)
    assert resumed["start_step"] == 3 and resumed["step"] == 6

    # 2) the same run straight through
    straight = train(cfg, str(tmp_path / "straight"), return_state=True)

    # 3) SIGTERM (preemption) at step 2: a checkpoint is saved there, then resumed
    def preempt(event):
        if event.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    term = train(cfg, str(tmp_path / "term"), hooks=[OnStep(preempt)])
    assert term["status"] == "interrupted" and term["step"] == 2 and term["signal"] == signal.SIGTERM
    assert "2" in os.listdir(tmp_path / "term" / "checkpoints")
    term_resumed = train(cfg, str(tmp_path / "term"), return_state=True)
    assert term_resumed["start_step"] == 2

    want = _params(straight)
    for run in (resumed, term_resumed):
        for a, b in zip(want, _params(run)):
            np.testing.assert_array_equal(a, b)
    order = [r["data_crc"] for r in read_metrics(tmp_path / "straight")]
    assert len(order) == 6 and len(set(order)) > 1
    for name in ("killed", "term"):
        rows = read_metrics(tmp_path / name)
        assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
        assert [r["data_crc"] for r in rows] == order
        assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(tmp_path / "straight")]

    # 4) the finished workdir refuses a different config unless forced
    with pytest.raises(ConfigError, match=r"different config.*optim.lr"):
        train(rc.build({"model": "tiny"}, {**overrides, "optim.lr": 1e-3}), str(killed))

    # 5) the NaN guard: a loss that turns NaN in the 5th step (index 4) stops the run; steps 1-4 are
    # logged and checkpointed, nothing after
    base = zarya_objective(cfg.model.replace(mask_token_id=259, eos_token_id=258, pad_token_id=256), cfg.zarya)

    def poisoned(params, frozen, batch, key, info):
        loss, metrics = base.loss_fn(params, frozen, batch, key, info)
        return jnp.where(info.step == 4, jnp.nan, loss), metrics

    nan_dir = tmp_path / "nan"
    nan_cfg = rc.build({"model": "tiny"}, {**overrides, "train.save_every": 1})
    with pytest.raises(NonFiniteError, match="non-finite at step 5"):
        train(nan_cfg, str(nan_dir), objective=Objective(poisoned, base.static_at, 1.0, "zarya-poisoned"))
    assert sorted(os.listdir(nan_dir / "checkpoints"), key=int)[-1] == "4"
    assert max(r["step"] for r in read_metrics(nan_dir)) == 4


@pytest.mark.parametrize("slotted", [True, False])
def test_overfit_handful_of_examples(tmp_path, slotted, compile_cache):
    path = tmp_path / "few.jsonl"
    with open(path, "w") as f:
        for p, a in [("cat", "meow!"), ("dog", "woof"), ("cow", "moo"), ("owl", "hoot")]:
            f.write(json.dumps({"prompt": p + ":", "answer": a}) + "\n")
    cfg = rc.build({"model": "tiny"}, {
        "data.train": str(path), "data.max_length": 12, "data.batch_size": 4, "mesh.num_devices": 1,
        "optim.lr": 1e-2, "optim.warmup_steps": 10, "optim.schedule": "cosine", "optim.weight_decay": 0.0,
        "train.steps": 200, "train.log_every": 10, "train.save_every": 0, "train.keep_best": 0,
        "train.export_final": False, "train.progress_bar": False, "zarya.slotted_training": slotted,
        "zarya.slot_size_set": [2], "zarya.slot_step_borders": [1.0]})
    out = train(cfg, str(tmp_path / "run"))
    rows = read_metrics(tmp_path / "run")
    assert rows[0]["loss"] > 1.0
    assert out["loss"] < 0.05 and rows[-1]["loss"] < 0.05, [r["loss"] for r in rows]


def test_bad_inputs_fail_before_compute(tmp_path, data_file):
    ok = resume_overrides(data_file)
    with pytest.raises(ConfigError, match="not divisible by the data-parallel size 4"):
        train(rc.build({"model": "tiny"}, {**ok, "data.batch_size": 6}), str(tmp_path / "a"))
    with pytest.raises(ConfigError, match="grad_accum_steps=4"):
        train(rc.build({"model": "tiny"}, {**ok, "optim.grad_accum_steps": 4, "data.batch_size": 8}),
              str(tmp_path / "b"))
    with pytest.raises(DataError, match="missing.jsonl' does not exist"):
        train(rc.build({"model": "tiny"}, {**ok, "data.train": str(tmp_path / "missing.jsonl")}), str(tmp_path / "c"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": 3}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: malformed"):
        train(rc.build({"model": "tiny"}, {**ok, "data.train": str(bad)}), str(tmp_path / "d"))
    long = tmp_path / "long.jsonl"
    long.write_text('{"prompt": "' + "p" * 30 + '", "answer": "b"}\n')
    with pytest.raises(DataError, match="every example was dropped"):
        train(rc.build({"model": "tiny"}, {**ok, "data.train": str(long)}), str(tmp_path / "e"))
    with pytest.raises(ConfigError, match="unknown config key 'optim.learning_rate'"):
        rc.build({"model": "tiny"}, {"optim.learning_rate": 1.0})
    with pytest.raises(ConfigError, match="mesh.fsdp=0"):
        rc.build({"model": "tiny"}, {"mesh.fsdp": 0})
    for d in "abcde":  # nothing was written for a failed run but the directory itself
        assert not os.path.exists(tmp_path / d / "checkpoints")


def test_cli_help_and_error_exit(tmp_path, data_file):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-m", "experiments.train", "--help"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for key in ("zarya.alpha0", "model.num_layers", "optim.lr", "data.train", "mesh.fsdp", "train.steps"):
        assert key in out.stdout
    # over-length records are truncated and counted; a too-large batch errors before compute
    long = tmp_path / "long.jsonl"
    long.write_text('{"prompt": "ab", "answer": "' + "x" * 40 + '"}\n{"prompt": "ab", "answer": "c"}\n')
    err = subprocess.run([sys.executable, "-m", "experiments.train", "--config", "tiny", "--workdir",
                          str(tmp_path / "w"), "--set", f"data.train={long}", "--set", "data.max_length=16",
                          "--set", "data.batch_size=3"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert err.returncode == 2, err.stderr
    assert "'truncated': 1" in err.stdout
    assert "data.batch_size=3" in err.stderr and "data-parallel size" in err.stderr


def test_checkpoints_keep_latest_and_best(tmp_path):
    import grain

    from zarya_jax.train.checkpoints import RunCheckpointer

    it = iter(grain.MapDataset.range(100).to_iter_dataset())
    ck = RunCheckpointer(str(tmp_path), keep=2, keep_best=1, async_save=False)
    for step, loss in zip(range(1, 6), [3.0, 1.0, 4.0, None, 6.0]):
        next(it)
        ck.save(step, {"w": np.full(3, step, np.float32)}, it, {"step": step}, loss)
    ck.wait()
    assert sorted(ck.manager.all_steps()) == [2, 4, 5]  # best eval loss (step 2) + the latest two
    it2 = iter(grain.MapDataset.range(100).to_iter_dataset())
    state, meta = ck.restore(5, {"w": jax.ShapeDtypeStruct((3,), np.float32)}, it2)
    ck.close()
    assert meta == {"step": 5} and np.asarray(state["w"]).tolist() == [5.0] * 3 and next(it2) == 5


def test_init_from_checkpoint_and_final_export(tmp_path, tiny_config, tiny_params, data_file, capsys):
    """--init-from loads a converted checkpoint; with lr=0 the exported final params are exactly it (and
    the run warns, once, that nothing will change; and that it ends during warmup)."""
    from zarya_jax import checkpoint

    src = checkpoint.save(str(tmp_path / "init"), tiny_params, tiny_config)
    cfg = rc.build({"model": "tiny"}, {
        "data.train": data_file, "data.max_length": 12, "data.batch_size": 4, "mesh.num_devices": 1,
        "optim.lr": 0.0, "train.steps": 2, "train.save_every": 0, "train.keep_best": 0,
        "train.progress_bar": False, "train.init_from": src, "model.num_layers": 1})
    out = train(cfg, str(tmp_path / "run"))
    assert out["status"] == "completed" and out["final_params"]
    err = capsys.readouterr().err
    assert err.count("warning: optim.lr=0:") == 1 and err.count("the run ends during warmup") == 1, err
    params, config = checkpoint.load(out["final_params"])
    assert config.num_layers == tiny_config.num_layers  # structure from the checkpoint, not the config
    for a, b in zip(jax.tree.leaves(tiny_params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_overrides_parse_yaml_numbers():
    run = rc.load("tiny", ["optim.lr=1e-2", "optim.warmup_steps=3", "zarya.slot_size_set=2,4",
                           "zarya.slot_step_borders=0.5,1"])
    assert run.optim.lr == 0.01 and run.optim.warmup_steps == 3 and run.zarya.slot_size_set == (2, 4)
    with pytest.raises(ConfigError, match="optim.lr"):
        rc.load("tiny", ["optim.lr=fast"])
