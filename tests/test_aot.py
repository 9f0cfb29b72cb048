"""Every program a pod run executes, compiled for a TPU on this CPU host (libtpu's compiler through a topology,
`zarya_jax.target`; `zarya_jax.bench.aot`, `python -m experiments.bench aot`), and the attention kernel chosen for
the mesh's chips."""
import json

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from experiments.bench.__main__ import main as bench_main
from zarya_jax import target
from zarya_jax.bench import aot
from zarya_jax.config import ConfigError
from zarya_jax.nn import attention
from zarya_jax.sampling import GenerationConfig, generate
from zarya_jax.train import sharding as shd


def test_attention_platform_follows_the_context_mesh():
    """A program traced for a TPU mesh on a CPU host asks for the TPU's kernel; without a mesh, the host's."""
    tpu = shd.make_mesh(shd.MeshConfig(data=1, fsdp=-1, tensor=1), target.devices("tpu:v5e:2x2"))
    cpu = shd.make_mesh(shd.MeshConfig(data=1, fsdp=-1, tensor=1), jax.devices()[:2])
    assert attention.platform() == jax.default_backend() == "cpu"
    with jax.sharding.use_abstract_mesh(tpu.abstract_mesh):
        assert attention.platform() == "tpu"
        assert attention.resolve("auto", attention.platform(), np.float32, 256, 64) == "splash"
    with jax.sharding.use_abstract_mesh(cpu.abstract_mesh):
        assert attention.platform() == "cpu"


def test_targets_are_validated():
    with pytest.raises(ConfigError, match="tpu:GENERATION:SHAPE"):
        target.parse("tpu:v9:4x4")
    with pytest.raises(ConfigError, match="tpu:v5e:4x4"):
        target.parse("gpu")
    assert bench_main(["--out", "/nonexistent-dir/x", "aot", "--target", "tpu:v5e"]) == 2
    with pytest.raises(ValueError, match="--programs 'zarya,beam'"):
        aot.AotSettings(programs=("zarya", "beam")).check()


def test_compile_rows_are_typed_and_written_as_today(tmp_path):
    """The library call a notebook makes: `compile_rows(AotSettings(...))` on this host's CPU devices -> one
    `AotRow` per program, whose JSON has the keys of `aot.json`'s rows (no HBM on a CPU: `fits` is None)."""
    s = aot.AotSettings(targets=("cpu",), presets=("tiny",), programs=("eval", "ar"), seq=64, batch=8,
                        decode_batch=8, prompt=16, new=4)
    rows = aot.compile_rows(s, log=lambda line: None)
    assert [(r.target, r.preset, r.program, r.status) for r in rows] == [("cpu", "tiny", "eval", "compiled"),
                                                                       ("cpu", "tiny", "ar", "compiled")]
    for r in rows:
        assert isinstance(r, aot.AotRow) and r.kernel == "dense" and r.hbm_gib is None and r.fits is None
        assert 0 < r.arguments_gib <= r.total_gib and r.error is None
        assert list(r.as_json()) == ["target", "preset", "program", "mesh", "shape", "hbm_gib", "kernel", "status",
                                     "compile_s", "arguments_gib", "outputs_gib", "temporaries_gib", "total_gib",
                                     "fits"]
    assert rows[0].shape == "8 × 64" and rows[1].shape == "8 × 16+4"
    refused = aot.AotRow("cpu", "tiny", "zarya", "1/1/1", "4 × 64", None, "error", 0.5, error="too big")
    assert list(refused.as_json()) == ["target", "preset", "program", "mesh", "shape", "hbm_gib", "status", "error",
                                       "compile_s"]
    assert "First error line" in aot.markdown(rows + [refused])


def test_every_program_compiles_for_a_tpu_and_fits(tmp_path):
    """The tiny preset's train steps (Zarya slotted and not, Uno's drafter, the draft model, GRPO, the eval
    forward) and every decoder `generate()` runs, compiled by the TPU compiler for 4 v5e chips on an FSDP
    mesh with `attention=auto`: all compile, fit the chip, and every causal pass runs splash per shard
    (the fused cycle's prefill and cycles attend with window masks, always dense)."""
    assert bench_main(["--out", str(tmp_path), "aot", "--target", "tpu:v5e:2x2", "--presets", "tiny", "--seq", "256",
                       "--batch", "8", "--decode-batch", "4", "--prompt", "128", "--new", "32", "--no-roofline"]) == 0
    rows = {r["program"]: r for r in json.loads((tmp_path / "aot.json").read_text())["rows"]}
    assert set(rows) == set(aot.PROGRAMS)
    for name, row in rows.items():
        assert row["status"] == "compiled", (name, row.get("error"))
        assert row["fits"] and 0 < row["total_gib"] < row["hbm_gib"] == 16, name
    dense = {"spec-self-fused", "spec-lora-fused"}
    assert {n for n, r in rows.items() if r["kernel"] == "splash"} == set(aot.PROGRAMS) - dense
    assert "| tpu:v5e:2x2 | tiny | zarya | 1/4/1 |" in (tmp_path / "aot.md").read_text()


def test_generate_runs_on_the_params_mesh(tiny_config, tiny_params):
    """Params placed on a mesh: `generate` traces under it (derived from the params) and decodes exactly what
    the single-device call decodes."""
    mesh = shd.make_mesh(shd.MeshConfig(data=1, fsdp=-1, tensor=1), jax.devices()[:4])
    placed = jax.device_put(tiny_params, shd.tree_shardings(tiny_params, mesh))
    gc = GenerationConfig(mode="ar", max_new_tokens=6)
    prompts = [[5, 6, 7], [8, 9]]
    one = generate(tiny_params, tiny_config, prompts, gc, jax.random.PRNGKey(0))
    sharded = generate(placed, tiny_config, prompts, gc, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(one.tokens, sharded.tokens)
    np.testing.assert_array_equal(one.lengths, sharded.lengths)
    assert isinstance(jax.tree.leaves(placed)[0].sharding, NamedSharding)
    assert jax.tree.leaves(placed)[0].sharding.spec != P()
