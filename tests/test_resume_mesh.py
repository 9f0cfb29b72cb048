"""A run resumes on another mesh or device count with the same global batch: interrupted (SIGTERM) on 8
devices, resumed on 4 and on 1, it logs the same data order and the losses of the uninterrupted 8-device
run (to the rounding of a different reduction order). A changed global batch is refused. The data
iterator of a checkpoint written by several hosts restores on another host count (the two-process run
of `test_multihost.py` resumed on one process covers it end to end)."""
import json
import os
import shutil
import signal

import jax
import numpy as np
import pytest
from etils import epath

from zarya_jax.config import ConfigError
from zarya_jax.data import pipeline as D
from zarya_jax.nn.integrity import CheckpointError
from zarya_jax.train import config as rc
from zarya_jax.train.checkpoints import shared_data_state
from zarya_jax.train.hooks import OnStep
from zarya_jax.train.loop import train
from zarya_jax.train.metrics import read_metrics
from zarya_jax.testing import write_sum_records

STEPS, STOP = 4, 2
MESHES = {8: {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2},
          4: {"mesh.data": 1, "mesh.fsdp": 2, "mesh.tensor": 2, "mesh.num_devices": 4},
          1: {"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1, "mesh.num_devices": 1}}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_sum_records(tmp_path_factory.mktemp("data") / "train.jsonl", 24)


def _config(data_file, devices: int, **more):
    overrides = {"data.train": data_file, "data.max_length": 16, "data.batch_size": 8, "data.seed": 7,
                 "optim.grad_accum_steps": 2, "optim.lr": 1e-2, "optim.warmup_steps": 1, "train.steps": STEPS,
                 "train.log_every": 1, "train.save_every": 0, "train.keep_best": 0, "train.export_final": False,
                 "train.progress_bar": False, "zarya.slot_size_set": [2], "zarya.slot_step_borders": [1.0],
                 **MESHES[devices], **more}
    return rc.build({"model": "tiny"}, overrides)


def test_resume_on_fewer_devices_continues_the_run(tmp_path, data_file):
    assert jax.device_count() >= 8
    straight = train(_config(data_file, 8), str(tmp_path / "straight"), return_state=True)

    def preempt(event):
        if event.step == STOP:
            os.kill(os.getpid(), signal.SIGTERM)

    stopped = tmp_path / "stopped"
    term = train(_config(data_file, 8), str(stopped), hooks=[OnStep(preempt)])
    assert term["status"] == "interrupted" and term["step"] == STOP

    # the global batch defines the run: another one is refused, naming it
    with pytest.raises(ConfigError, match=r"data.batch_size: 8 -> 4.*not its global batch"):
        train(_config(data_file, 4, **{"data.batch_size": 4}), str(stopped))

    want = read_metrics(tmp_path / "straight")
    assert [r["step"] for r in want] == list(range(1, STEPS + 1)) and len({r["data_crc"] for r in want}) > 1
    for devices in (4, 1):
        workdir = tmp_path / f"on{devices}"
        shutil.copytree(stopped, workdir)
        resumed = train(_config(data_file, devices), str(workdir), return_state=True)
        assert resumed["start_step"] == STOP and resumed["step"] == STEPS
        assert jax.tree.leaves(resumed["state"]["params"])[0].sharding.mesh.size == devices
        got = read_metrics(workdir)
        assert [r["step"] for r in got] == [r["step"] for r in want]
        assert [r["data_crc"] for r in got] == [r["data_crc"] for r in want]  # the same batches, in order
        np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], rtol=1e-5)
        for a, b in zip(jax.tree.leaves(straight["state"]["params"]), jax.tree.leaves(resumed["state"]["params"])):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-4, atol=1e-5)


def test_data_state_of_several_hosts_restores_on_another_count(tmp_path):
    """The pipeline's iterator state after k global batches is the same on every host of any host count,
    so the state two hosts saved sets a one-host iterator to the batch the run would take next."""
    rng = np.random.default_rng(1)
    examples = [(rng.integers(97, 123, rng.integers(1, 4)).astype(np.int32),
                 rng.integers(97, 123, rng.integers(1, 6)).astype(np.int32)) for _ in range(30)]
    for pack in (False, True):
        cfg = D.DataConfig(max_length=12, batch_size=4, seed=3, pack=pack)
        directory = epath.Path(tmp_path / f"pack{pack}")
        directory.mkdir()
        for p in range(2):  # what each of two hosts writes after 3 steps (grain's file names)
            it = iter(D.make_dataset(examples, cfg, local_batch=2, pad_id=0, process_index=p, process_count=2))
            D.take(it, 3)
            (directory / f"process_{p}-of-2.json").write_text(json.dumps(it.get_state()))
        one = iter(D.make_dataset(examples, cfg, local_batch=4, pad_id=0))
        one.set_state(json.loads(shared_data_state(directory)))
        want = D.take(iter(D.make_dataset(examples, cfg, local_batch=4, pad_id=0)), 4)[3]
        for key, value in next(one).items():
            np.testing.assert_array_equal(value, want[key])
        (directory / "process_1-of-2.json").write_text(json.dumps({"next_index": 99}))
        with pytest.raises(CheckpointError, match="different positions"):
            shared_data_state(directory)
