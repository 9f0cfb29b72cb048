"""Compile targets: the devices a program is compiled for, which need not be this host's.

    devices("tpu:v5e:4x4")   # 16 TPU v5e chips, on any host with libtpu (the `tpu` extra)
    devices("cpu")           # this host's CPU devices

A TPU target is a topology (`jax.experimental.topologies.get_topology_desc`): real TPU devices whose
programs the TPU compiler (XLA:TPU, Mosaic for Pallas kernels) compiles on a host without a TPU, with
the chip's own buffer assignment in `compiled.memory_analysis()`. A mesh built on them
(`train.sharding.make_mesh(config, devices(...))`) carries their platform, so everything traced under
it (attention's kernel choice, `nn.attention.platform`) is decided for the chip, not for this host.
Nothing compiled for a topology can run here; it is for sizes, memory and "does it compile".

`memory(compiled)` is the per-chip memory of a compiled program and `hbm_bytes(device)` what one chip
has, so "fits" means `memory(...)["total"] <= hbm_bytes(...)`.
"""
from __future__ import annotations

import functools
import os

import jax

from .config import ConfigError

GIB = 1 << 30
# HBM per chip (the device a topology lists), by `device_kind`.
HBM_GIB = {"TPU v4": 32, "TPU v5 lite": 16, "TPU v5": 95, "TPU v5p": 95, "TPU v6 lite": 32, "TPU v6e": 32}
TPU_GENERATIONS = ("v4", "v5e", "v5p", "v6e")


def parse(target: str) -> tuple[str, str]:
    """'tpu:v5e:4x4' → ('tpu', 'v5e:4x4'); 'cpu' → ('cpu', ''). Raises ConfigError on anything else."""
    platform, _, topology = target.partition(":")
    if platform == "cpu" and not topology:
        return platform, ""
    if platform == "tpu":
        generation, _, shape = topology.partition(":")
        dims = shape.split("x")
        if generation in TPU_GENERATIONS and len(dims) in (2, 3) and all(d.isdigit() and int(d) > 0 for d in dims):
            return platform, topology
    raise ConfigError(f"target {target!r}: expected 'cpu' or 'tpu:GENERATION:SHAPE' with GENERATION one of "
                      f"{TPU_GENERATIONS} and SHAPE like 2x2, 4x4 or 2x2x2 (e.g. tpu:v5e:4x4)")


@functools.cache
def devices(target: str) -> tuple[jax.Device, ...]:
    """The devices of `target` (see `parse`), in the topology's order. A TPU target needs libtpu (the
    `tpu` extra) but no TPU; several processes may compile for one at a time."""
    platform, topology = parse(target)
    if platform == "cpu":
        return tuple(jax.devices("cpu"))
    # libtpu takes a machine-wide lock file when it loads; a topology needs no chip, so sharing is safe.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies
    try:
        return tuple(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
    except Exception as e:  # noqa: BLE001 - libtpu missing, or a shape this generation does not have
        raise ConfigError(f"target {target!r}: the TPU topology could not be made ({str(e).splitlines()[0]}); "
                          "it needs libtpu: pip install -e '.[tpu]'") from None


def hbm_bytes(device: jax.Device) -> int | None:
    """Memory one chip of `device`'s kind has (None: unknown, e.g. a CPU device)."""
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
