"""The train step's memory, before and after compiling: the estimate (`train.memory`) against XLA's own
buffer assignment for the compiled step; a step that cannot fit refused before anything is compiled or
written; an out-of-memory that happens anyway one clean error that leaves the workdir as it was."""
import os
import resource

import jax
import jax.numpy as jnp
import pytest

from experiments import train as train_cli
from zarya_jax import target
from zarya_jax.objectives.zarya import zarya_objective
from zarya_jax.train import config as rc
from zarya_jax.train import memory
from zarya_jax.train import sharding as shd
from zarya_jax.train.loop import BATCH_KEYS
from zarya_jax.train.checkpoints import abstract_like
from zarya_jax.train.step import build_steps
from zarya_jax import model as model_lib
from zarya_jax.testing import write_sum_records

# Bounds of estimate / compiled peak asserted below (measured 1.0–1.3 on XLA:CPU); see train.memory's doc.
LOW, HIGH = 0.9, 2.0


def planned(overrides: dict):
    """(run config, mesh, objective, the run's `TrainSteps`: optimizer, abstract train state, its shardings and
    the step cache) of a tiny run, built as the loop builds them (`train.step.build_steps`); nothing allocated."""
    run = rc.build({"model": "tiny"}, {"model.mask_token_id": 259, **overrides})
    mesh, objective = shd.make_mesh(run.mesh), zarya_objective(run.model, run.zarya)
    steps = build_steps(objective, run.optim, 10, lambda k: model_lib.init_params(run.model, k), mesh, BATCH_KEYS,
                        jax.random.PRNGKey(0))
    return run, mesh, objective, steps


def estimate_of(overrides: dict) -> memory.Estimate:
    run, mesh, objective, steps = planned(overrides)
    return memory.estimate_train_step(run.model, steps.abstract_state, steps.shardings, mesh,
                                      batch_size=run.data.batch_size, max_length=run.data.max_length,
                                      grad_accum=run.optim.grad_accum_steps, forward_passes=objective.forward_passes,
                                      async_checkpointing=False)


def compiled_peak(overrides: dict) -> int:
    """The compiled train step's per-device peak: arguments + outputs − donated + temporaries."""
    run, mesh, objective, steps = planned(overrides)
    b, length = run.data.batch_size, run.data.max_length
    batch = {k: jax.ShapeDtypeStruct((b, length), bool if k == "answer_mask" else jnp.int32,
                                     sharding=shd.batch_sharding(mesh)) for k in BATCH_KEYS}
    state = abstract_like(steps.abstract_state, steps.shardings)
    return target.memory(steps.cache.train(objective.static_at(0, 10)).lower(state, None, batch).compile())["total"]


@pytest.mark.parametrize("overrides", [
    {"mesh.num_devices": 1, "data.batch_size": 8, "data.max_length": 128, "optim.grad_accum_steps": 2},
    {"mesh.num_devices": 1, "data.batch_size": 4, "data.max_length": 256, "model.remat": True,
     "model.dtype": "bfloat16"},
    {"mesh.num_devices": 1, "data.batch_size": 4, "data.max_length": 64, "zarya.slotted_training": False},
    {"mesh.num_devices": 1, "data.batch_size": 2, "data.max_length": 512, "model.vocab_size": 151936,
     "model.remat": True, "model.remat_policy": "dots"},
    {"mesh.num_devices": 4, "mesh.data": 1, "mesh.fsdp": 4, "data.batch_size": 8, "data.max_length": 128},
], ids=["accum", "remat-bf16", "non-slotted", "real-vocab-dots", "fsdp4"])
def test_estimate_brackets_the_compiled_step(overrides):
    """Conservative but not absurd: between LOW and HIGH times the compiled program's per-device peak
    (arguments + outputs − donated + temporaries)."""
    compiled, estimate = compiled_peak(overrides), estimate_of(overrides)
    assert LOW * compiled <= estimate.per_device <= HIGH * compiled, (estimate.describe(), compiled)


def estimated(**overrides) -> int:
    return estimate_of({"mesh.num_devices": 1, **overrides}).per_device


def test_the_knobs_the_error_names_lower_the_estimate():
    base = {"data.batch_size": 8, "data.max_length": 128}
    more = estimated(**base)
    assert estimated(**{**base, "data.batch_size": 4}) < more
    assert estimated(**{**base, "data.max_length": 64}) < more
    assert estimated(**base, **{"optim.grad_accum_steps": 4}) < more
    assert estimated(**base, **{"model.remat": True}) < more
    assert estimated(**base, **{"model.remat": True, "model.remat_policy": "full"}) < estimated(
        **base, **{"model.remat": True, "model.remat_policy": "dots"})


def test_a_save_counts_the_state_and_its_host_copy():
    """Saving copies the state into host memory: asynchronously beside the next steps (a part of the step's
    estimate), synchronously between steps (the peak is the larger of the step and twice the state)."""
    # Qwen3's vocabulary on a tiny model at one short row: the state outweighs the step's temporaries.
    run, mesh, objective, steps = planned({"mesh.num_devices": 1, "data.batch_size": 1, "data.max_length": 4,
                                           "model.vocab_size": 151936, "model.dtype": "bfloat16"})
    of = lambda asynchronous: memory.estimate_train_step(  # noqa: E731
        run.model, steps.abstract_state, steps.shardings, mesh, batch_size=1, max_length=4, grad_accum=1,
        forward_passes=objective.forward_passes, async_checkpointing=asynchronous)
    sync, asynchronous = of(False), of(True)
    state = sync.parts["state"]
    assert sync.save == 2 * state > sync.per_device and sync.peak == sync.pool == 2 * state, sync.describe()
    assert "host copy" in sync.describe()
    assert asynchronous.parts[memory.CHECKPOINT_COPY] == state and asynchronous.save == 0
    assert asynchronous.peak == asynchronous.per_device == sync.per_device + state


# ---- through the command line

@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_sum_records(tmp_path_factory.mktemp("data") / "train.jsonl", 16)


def args(workdir, data, *more):
    base = ["--config", "tiny", "--workdir", workdir, "--set", f"data.train={data}", "--set", "mesh.num_devices=1",
            "--set", "train.steps=2", "--set", "train.progress_bar=false", "--set", "data.eval_fraction=0",
            "--set", "model.max_position_embeddings=16384"]
    return [str(a) for a in base + list(more)]


def listing(path) -> dict:
    return {os.path.relpath(os.path.join(r, n), path): os.path.getsize(os.path.join(r, n))
            for r, _, names in os.walk(path) for n in names}


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def test_a_step_that_cannot_fit_is_refused_before_anything_is_written(tmp_path, data_file, capsys):
    new = tmp_path / "new"
    code = train_cli.main(args(new, data_file, "--set", "data.batch_size=64", "--set", "data.max_length=8192"))
    line = error_line(capsys.readouterr().err)
    assert code == 2 and not new.exists()
    for part in ("the train step needs an estimated", "GiB", "host memory available", "data.batch_size",
                 "data.max_length", "optim.grad_accum_steps", "model.remat=true", "train.memory_check=false"):
        assert part in line, line
    # a workdir that holds something (the quickstart keeps its data there) is left as it was
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    code = train_cli.main(args(kept, data_file, "--set", "data.batch_size=64", "--set", "data.max_length=8192"))
    error_line(capsys.readouterr().err)
    assert code == 2 and listing(kept) == {"notes.txt": 4}


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_AS"), reason="needs an address-space limit (Linux)")
def test_an_out_of_memory_step_is_one_error_and_leaves_the_workdir(tmp_path, data_file, capsys):
    """With the check off, a step whose buffers cannot be allocated (this process's address space capped a
    few GiB above its size, so XLA's allocation of ~60 GiB fails before any page is touched) ends in one
    `error:` line, exit 2, and the workdir as it was: its data file only."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    data = write_sum_records(workdir / "train.jsonl", 16)
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + (4 << 30), hard))
    try:
        code = train_cli.main(args(workdir, data, "--set", "data.batch_size=8", "--set", "data.max_length=8192",
                                   "--set", "train.memory_check=false"))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    line = error_line(capsys.readouterr().err)
    assert code == 2 and "out of memory" in line and "data.batch_size" in line, line
    assert sorted(listing(workdir)) == ["train.jsonl"]
