"""GPU compile targets (`zarya_jax.target`, `gpu:MODEL[xN]`): parsed and sized without the CUDA plugin; compiled by
XLA:GPU on this CPU host where the plugin (the `gpu` extra) is installed."""
import importlib.util
import json

import pytest

from experiments.bench.__main__ import main as bench_main
from zarya_jax import target
from zarya_jax.config import ConfigError

HAS_PLUGIN = importlib.util.find_spec("jax_cuda12_plugin") is not None


def test_gpu_targets_are_parsed_and_sized():
    assert target.parse("gpu:h100x8") == ("gpu", "h100x8")
    assert target.parse("gpu:a100") == ("gpu", "a100")
    assert target.parse("gpu:b200x64") == ("gpu", "b200x64")
    for bad in ("gpu:h999x8", "gpu:h100x0", "gpu:h100x", "gpu:", "gpu:h100x8x2", "gpu:h100x12"):
        with pytest.raises(ConfigError, match="gpu:MODEL"):
            target.parse(bad)
    # XLA:GPU's sizes: partitions × hosts × GPUs per host.
    assert target.gpu_topology("h100x16")[1] == "1x2x8"
    assert target.gpu_topology("h100x4")[1] == "1x1x4"
    assert target.gpu_topology("b200")[1] == "1x1x1"


def test_every_gpu_model_has_a_device_kind_and_its_memory():
    """Each target config names its device (the devices' `device_kind`) and its memory, which `hbm_bytes` reports."""
    assert set(target.GPU_MODELS) >= {"a100", "h100", "h200", "b200"}
    memory = target._gpu_memory()
    assert len(memory) == len(target.GPU_MODELS)
    assert memory["NVIDIA H100 80GB HBM3"] == 84942979072
    assert memory["NVIDIA H200 141GB HBM3e"] > memory["NVIDIA A100-SXM4-80GB"]


@pytest.mark.skipif(not HAS_PLUGIN, reason="needs the CUDA plugin (pip install -e '.[gpu]')")
def test_programs_compile_for_gpus(tmp_path):
    """The tiny preset's Zarya step and AR decoder, compiled by XLA:GPU for two H100s on an FSDP mesh: the
    devices are the H100's, the memory is the compiler's buffer assignment against the H100's 79.1 GiB."""
    assert bench_main(["--out", str(tmp_path), "aot", "--target", "gpu:h100x2", "--presets", "tiny", "--programs",
                       "zarya,ar", "--seq", "256", "--batch", "4", "--decode-batch", "2", "--prompt", "128",
                       "--new", "16"]) == 0
    rows = json.loads((tmp_path / "aot.json").read_text())["rows"]
    assert [r["program"] for r in rows] == ["zarya", "ar"]
    for row in rows:
        assert row["status"] == "compiled", row.get("error")
        assert row["mesh"] == "1/2/1" and row["fits"] and 0 < row["total_gib"] < row["hbm_gib"]
        assert row["hbm_gib"] == pytest.approx(84942979072 / 2**30)
    devices = target.devices("gpu:h100x2")
    assert len(devices) == 2 and {d.platform for d in devices} == {"gpu"}
    assert devices[0].device_kind == "NVIDIA H100 80GB HBM3"
