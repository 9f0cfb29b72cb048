"""Compile targets: the devices a program is compiled for, which need not be this host's.

    devices("tpu:v5e:4x4")   # 16 TPU v5e chips, on any host with libtpu (the `tpu` extra)
    devices("gpu:h100x8")    # 8 H100s, on any host with the CUDA plugin (the `gpu` extra), no GPU or CUDA needed
    devices("cpu")           # this host's CPU devices

A TPU target is a topology (`jax.experimental.topologies.get_topology_desc`): real TPU devices whose
programs the TPU compiler (XLA:TPU, Mosaic for Pallas kernels) compiles on a host without a TPU, with
the chip's own buffer assignment in `compiled.memory_analysis()`. A mesh built on them
(`train.sharding.make_mesh(config, devices(...))`) carries their platform, so everything traced under
it (attention's kernel choice, `nn.attention.platform`) is decided for the chip, not for this host.
Nothing compiled for a topology can run here; it is for sizes, memory and "does it compile".

A GPU target is the same through the CUDA plugin (`jax-cuda12-plugin`, without CUDA's libraries): a
topology of `N` GPUs of one model, described to XLA:GPU by a target config (`GpuTargetConfigProto`,
`gpu_targets/<model>.txtpb`: compute capability, cores, shared memory, memory size), so the GPU compiler
optimises, fuses and assigns buffers for that chip on a host without one. cuDNN's flash attention
(`attention=auto` on a GPU, bf16/fp16) asks the cuDNN library for its version while tracing, so it also
needs `nvidia-cudnn-cu12` (`has_cudnn`); XLA compiles its call without running cuDNN.

`memory(compiled)` is the per-chip memory of a compiled program and `hbm_bytes(device)` what one chip
has, so "fits" means `memory(...)["total"] <= hbm_bytes(...)`.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import jax

from .config import ConfigError

GIB = 1 << 30
# HBM per chip (the device a topology lists), by `device_kind`.
HBM_GIB = {"TPU v4": 32, "TPU v5 lite": 16, "TPU v5": 95, "TPU v5p": 95, "TPU v6 lite": 32, "TPU v6e": 32}
TPU_GENERATIONS = ("v4", "v5e", "v5p", "v6e")
GPU_CONFIGS = Path(__file__).parent / "gpu_targets"  # <model>.txtpb: a GpuTargetConfigProto per GPU model
GPU_MODELS = tuple(sorted(p.stem for p in GPU_CONFIGS.glob("*.txtpb")))
GPUS_PER_HOST = 8
# What a TPU worker of each generation calls its accelerator type (a topology compiled on a CPU host names one).
_ACCELERATOR_TYPES = {"v4": "v4-8", "v5e": "v5litepod-4", "v5p": "v5p-8", "v6e": "v6e-4"}
_GPU = re.compile(r"([a-z0-9]+?)(?:x([1-9][0-9]*))?")


def parse(target: str) -> tuple[str, str]:
    """'tpu:v5e:4x4' → ('tpu', 'v5e:4x4'); 'gpu:h100x8' → ('gpu', 'h100x8'); 'cpu' → ('cpu', '').
    Raises ConfigError on anything else."""
    platform, _, topology = target.partition(":")
    if platform == "cpu" and not topology:
        return platform, ""
    if platform == "tpu":
        generation, _, shape = topology.partition(":")
        dims = shape.split("x")
        if generation in TPU_GENERATIONS and len(dims) in (2, 3) and all(d.isdigit() and int(d) > 0 for d in dims):
            return platform, topology
    if platform == "gpu":
        match = _GPU.fullmatch(topology)
        count = int(match[2] or 1) if match else 0
        if match and match[1] in GPU_MODELS and (count <= GPUS_PER_HOST or count % GPUS_PER_HOST == 0):
            return platform, topology
    raise ConfigError(f"target {target!r}: expected 'cpu', 'tpu:GENERATION:SHAPE' with GENERATION one of "
                      f"{TPU_GENERATIONS} and SHAPE like 2x2, 4x4 or 2x2x2 (e.g. tpu:v5e:4x4), or 'gpu:MODEL[xN]' "
                      f"with MODEL one of {GPU_MODELS} and N GPUs, 1 to {GPUS_PER_HOST} or a multiple of "
                      f"{GPUS_PER_HOST} (e.g. gpu:h100x8)")


def gpu_topology(topology: str) -> tuple[str, str]:
    """'h100x16' (a parsed GPU topology) → (the H100's target config text, '1x2x8'): XLA:GPU's partitions ×
    hosts × GPUs per host, hosts of `GPUS_PER_HOST` GPUs (one host below that)."""
    model, count = _GPU.fullmatch(topology).groups()
    n = int(count or 1)
    hosts, per_host = (n // GPUS_PER_HOST, GPUS_PER_HOST) if n > GPUS_PER_HOST else (1, n)
    return (GPU_CONFIGS / f"{model}.txtpb").read_text(), f"1x{hosts}x{per_host}"


@functools.cache
def devices(target: str) -> tuple[jax.Device, ...]:
    """The devices of `target` (see `parse`), in the topology's order. A TPU target needs libtpu (the
    `tpu` extra) but no TPU; several processes may compile for one at a time. A GPU target needs the CUDA
    plugin (the `gpu` extra) but no GPU."""
    platform, topology = parse(target)
    if platform == "cpu":
        return tuple(jax.devices("cpu"))
    if platform == "gpu":
        return _gpu_devices(target, *gpu_topology(topology))
    # libtpu takes a machine-wide lock file when it loads; a topology needs no chip, so sharing is safe.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if jax.default_backend() != "tpu":  # not a TPU worker: say so, or libtpu prints errors looking for its peers
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", _ACCELERATOR_TYPES.get(topology.partition(":")[0], ""))
    from jax.experimental import topologies
    try:
        return tuple(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
    except Exception as e:  # noqa: BLE001 - libtpu missing, or a shape this generation does not have
        raise ConfigError(f"target {target!r}: the TPU topology could not be made ({str(e).splitlines()[0]}); "
                          "it needs libtpu: pip install -e '.[tpu]'") from None


def _gpu_devices(target: str, config: str, sizes: str) -> tuple[jax.Device, ...]:
    # The plugin checks the CUDA libraries' versions when it loads; compiling for a topology uses none of them.
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    from jax.experimental import topologies
    try:
        return tuple(topologies.get_topology_desc(platform="cuda", topology_name=target, target_config=config,
                                                  topology=sizes).devices)
    except Exception as e:  # noqa: BLE001 - the CUDA plugin missing
        raise ConfigError(f"target {target!r}: the GPU topology could not be made ({str(e).splitlines()[0]}); "
                          "it needs the CUDA plugin: pip install -e '.[gpu]'") from None


def has_cudnn() -> bool:
    """Whether JAX can read the cuDNN library's version, which it does while tracing cuDNN's attention (the
    GPU's `attention=auto` in bf16/fp16): `nvidia-cudnn-cu12` installed, no GPU needed. Ask after `devices`
    of a GPU target: the CUDA plugin loads the library when it starts."""
    from jax._src.lib import cuda_versions  # what jax.nn.dot_product_attention asks
    try:
        return cuda_versions is not None and cuda_versions.cudnn_get_version() > 0
    except RuntimeError:  # "cuDNN not found."
        return False


@functools.cache
def _gpu_memory() -> dict[str, int]:
    """device_kind → bytes of device memory, from the GPU target configs."""
    texts = [p.read_text() for p in GPU_CONFIGS.glob("*.txtpb")]
    field = lambda name, text: re.search(rf"{name}: \"?([^\"\n]+)", text)[1]
    return {field("device_description_str", t): int(field("device_memory_size", t)) for t in texts}


def gpu_kind(target: str) -> tuple[str, int]:
    """'gpu:h100x8' → (its GPUs' `device_kind` from the target config, 8), without the CUDA plugin."""
    platform, topology = parse(target)
    if platform != "gpu":
        raise ConfigError(f"target {target!r}: expected a gpu:MODEL[xN] target")
    model, count = _GPU.fullmatch(topology).groups()
    text = (GPU_CONFIGS / f"{model}.txtpb").read_text()
    return re.search(r"device_description_str: \"([^\"]+)\"", text)[1], int(count or 1)


def hbm_bytes(device: jax.Device) -> int | None:
    """Memory one chip of `device`'s kind has (None: unknown, e.g. a CPU device). A GPU's is all of it; JAX
    preallocates 75% of it unless told otherwise (XLA_PYTHON_CLIENT_MEM_FRACTION)."""
    if device.device_kind in _gpu_memory():
        return _gpu_memory()[device.device_kind]
    gib = HBM_GIB.get(device.device_kind)
    return None if gib is None else gib * GIB


def memory(compiled) -> dict[str, int]:
    """Per-device bytes of a compiled program: arguments, outputs, aliased (donated inputs reused as outputs),
    temporaries, and the peak `total` = arguments + outputs − aliased + temporaries."""
    m = compiled.memory_analysis()
    out = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
           "aliased": m.alias_size_in_bytes, "temporaries": m.temp_size_in_bytes}
    out["total"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
    return out
