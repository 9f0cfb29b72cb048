"""Multi-host without a pod: two processes on this machine, each with 2 CPU devices, one mesh over all 4
(`jax.distributed` over localhost, JAX's gloo CPU collectives) running `experiments.train` — per-host data,
the sharded step, Orbax saves and restores from both processes — against the single-process run on 4
devices with the same global batches. The first launch is stopped by a SIGTERM that reaches only one
process; both must stop after the same step and save it together; a plain rerun resumes and must end
exactly where the uninterrupted single-process run ends (every logged loss, the final params).
The same stopped run also resumes on one process with the 4 devices (another host count: the same data
order and losses). Also: the data pipeline's global batches do not depend on the number of hosts, and an
adapter sharded over both processes saves from them (`lora.save`)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import train as train_cli
from zarya_jax import checkpoint
from zarya_jax.data import pipeline as D
from zarya_jax.eval.tasks import write_jsonl
from zarya_jax.train.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "multihost_worker.py")
STEPS, SIGNAL_AT = 10, 2


def _args(data: str, workdir: str) -> list[str]:
    sets = {"data.train": data, "data.max_length": 32, "data.batch_size": 8, "data.pack": "true",
            "data.eval_fraction": 0, "mesh.data": 1, "mesh.fsdp": -1, "train.steps": STEPS,
            "train.log_every": 1, "train.save_every": 0, "train.keep_best": 0, "train.progress_bar": "false",
            "optim.lr": 1e-2, "optim.warmup_steps": 1, "zarya.slot_size_set": "[2]", "zarya.slot_step_borders": "[1.0]"}
    return ["--config", "tiny", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")], "--workdir", workdir]


def _launch(commands: list[list[str]], cache: str) -> list[tuple[int, str, str]]:
    """Runs one command per process as processes 0 … N-1 of one distributed run; (rc, stdout, stderr) each."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    procs = []
    for i, cmd in enumerate(commands):
        env = dict(os.environ, JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES=str(len(commands)),
                   JAX_PROCESS_ID=str(i), XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
                   PYTHONPATH=REPO, JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        procs.append(subprocess.Popen([sys.executable, *cmd], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:  # a crashed peer leaves the other waiting in a collective
            if p.poll() is None:
                p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mh") / "train.jsonl")
    pairs = np.random.default_rng(0).integers(0, 500, (48, 2))
    write_jsonl(path, [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs])
    return path


def test_two_processes_match_one_and_stop_together(tmp_path, data_file, compile_cache):
    ref, multi = str(tmp_path / "one"), str(tmp_path / "two")
    assert train_cli.main(_args(data_file, ref) + ["--set", "mesh.num_devices=4"]) == 0

    stopped = _launch([[WORKER, "--signal-at", str(SIGNAL_AT), "--signal-process", "1", "--", *_args(data_file, multi)]
                       for _ in range(2)], compile_cache)
    summaries = []
    for code, out, err in stopped:
        assert code == 128 + signal.SIGTERM, err[-3000:]
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    stop = summaries[0]["step"]
    assert summaries[1]["step"] == stop and SIGNAL_AT <= stop < STEPS, summaries  # the same step on both hosts
    assert sorted(os.listdir(os.path.join(multi, "checkpoints"))) == [str(stop)]
    one_host = str(tmp_path / "two_then_one")  # the same preempted run, continued on one host
    shutil.copytree(multi, one_host)

    resumed = _launch([["-m", "experiments.train", *_args(data_file, multi)] for _ in range(2)], compile_cache)
    for code, out, err in resumed:
        assert code == 0, err[-3000:]
    one, two = read_metrics(ref), read_metrics(multi)
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-6)
    # resumed on one host with the 4 devices the two had: the data position and the state carry over
    assert train_cli.main(_args(data_file, one_host) + ["--set", "mesh.num_devices=4"]) == 0
    three = read_metrics(one_host)
    assert [r["step"] for r in three] == list(range(1, STEPS + 1))
    assert [r["data_crc"] for r in three[stop:]] == [r["data_crc"] for r in one[stop:]]
    np.testing.assert_allclose([r["loss"] for r in three], [r["loss"] for r in one], rtol=1e-6)
    p_one, _ = checkpoint.load(os.path.join(ref, "final"))
    p_two, _ = checkpoint.load(os.path.join(multi, "final"))
    for a, b in zip(jax.tree.leaves(p_one), jax.tree.leaves(p_two)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)  # all-reduce order


@pytest.mark.parametrize("pack", [False, True])
def test_global_batches_do_not_depend_on_the_host_count(pack):
    rng = np.random.default_rng(1)
    examples = [(rng.integers(97, 123, rng.integers(1, 4)).astype(np.int32),
                 rng.integers(97, 123, rng.integers(1, 6)).astype(np.int32)) for _ in range(30)]
    cfg = D.DataConfig(max_length=12, batch_size=4, seed=3, pack=pack)
    one = D.take(iter(D.make_dataset(examples, cfg, local_batch=4, pad_id=0)), 6)
    hosts = [D.take(iter(D.make_dataset(examples, cfg, local_batch=2, pad_id=0, process_index=p, process_count=2)), 6)
             for p in range(2)]
    for i, batch in enumerate(one):
        for key, value in batch.items():
            np.testing.assert_array_equal(np.concatenate([hosts[0][i][key], hosts[1][i][key]]), value)


LORA_SAVE = """
import sys
import jax
import numpy as np
from zarya_jax.train import sharding as shd
shd.maybe_initialize_distributed("auto")
from zarya_jax import lora
sys.path.insert(0, sys.argv[2])
from test_multihost import lora_arrays
cfg, host = lora_arrays()
mesh = shd.make_mesh(shd.MeshConfig(data=1, fsdp=-1))  # 4 devices, 2 on each process
sh = shd.tree_shardings(host, mesh)
spanning = jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]), host, sh)
assert not any(x.is_fully_addressable for x in jax.tree.leaves(spanning))
lora.save(sys.argv[1], spanning, cfg)
"""


def lora_arrays():
    """A LoRA config and a non-trivial adapter of the tiny model as host arrays (the same in every process)."""
    from zarya_jax import lora
    from zarya_jax.config import LoraConfig
    from zarya_jax.testing import TINY

    cfg = LoraConfig(rank=4, alpha=8.0)
    shapes = jax.eval_shape(lambda: lora.init_lora(TINY, cfg, jax.random.PRNGKey(0)))
    rng = np.random.default_rng(3)
    return cfg, jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(s.dtype), shapes)


def test_adapter_saves_from_arrays_spanning_hosts(tmp_path, compile_cache):
    """Both processes call `lora.save` on arrays no process holds whole: one file, written once, equal
    to the adapter."""
    from zarya_jax import lora

    out = str(tmp_path / "adapter")
    for code, _, err in _launch([["-c", LORA_SAVE, out, os.path.join(REPO, "tests")] for _ in range(2)],
                                compile_cache):
        assert code == 0, err[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["adapter"]  # no temporary directory of a second writer left
    cfg, want = lora_arrays()
    got, got_cfg = lora.load(out)
    assert got_cfg == cfg
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), b)
