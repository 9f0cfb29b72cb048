"""Device mesh, logical-axis rules and the shardings of params, optimizer state and batches.

One mesh with three named axes, `('data', 'fsdp', 'tensor')`:
- `data`: pure data parallelism (params replicated, batch split);
- `fsdp`: the batch is split *and* params/optimizer state are sharded along their `embed` dim
  (ZeRO-3 style: XLA all-gathers a layer's weights before use and reduce-scatters its grads);
- `tensor`: Megatron-style tensor parallelism over heads, MLP width and vocabulary.

Every param dim carries a *logical* axis name, declared where the model creates the parameter
(`zarya_jax.model`, with `nn.partitioning.declare`) and read back by path (`declared_axes`), and ONE
table (`RULES`, in `zarya_jax.nn.partitioning`, where the model's fused attention reads it too) maps
logical names to mesh axes. Changing the parallelism layout means editing `RULES` or the mesh sizes,
never the model. A parameter with no declaration, a name with no rule, or a dim whose size does not
divide its mesh axes is an error naming its path (never silently replicated); batches stay lenient.

The device order of a mesh depends only on the devices and the mesh shape, never on the number of
processes (`device_grid`), so a program compiled from one process (e.g. for TPU topology devices) uses
the layout of the multi-host run.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Sequence

import jax
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..config import ConfigError, LoraConfig, preset
from .. import model as model_lib
from ..nn.partitioning import BATCH_AXES, MESH_AXES, RULES, path_str, spec_for

__all__ = ["path_str"]  # re-exported: the trainer's optimizer masks name params by path too


@functools.cache
def declared_axes() -> dict[str, tuple[str | None, ...]]:
    """Every param path the model can create (the untied `lm_head` and the LoRA adapter's `a`/`b`
    included; sizes do not change the paths) -> the logical axes declared where it is created."""
    return model_lib.declared_axes(preset("tiny").replace(tie_word_embeddings=False), LoraConfig(rank=1))


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh sizes. -1 on one axis means "all remaining devices". `num_devices` -1 = all devices;
    a smaller number builds the mesh on the first devices only (used to measure scaling)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    num_devices: int = -1

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        if sum(s == -1 for s in sizes) > 1:
            raise ConfigError(f"mesh={sizes} (data, fsdp, tensor): at most one axis may be -1")
        for name, s in zip(MESH_AXES, sizes):
            if s != -1 and s < 1:
                raise ConfigError(f"mesh.{name}={s}: expected a positive size or -1 (fill)")
        if self.num_devices != -1 and self.num_devices < 1:
            raise ConfigError(f"mesh.num_devices={self.num_devices}: expected ≥ 1 or -1 (all)")


def resolve_mesh_shape(config: MeshConfig, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) sizes whose product is `num_devices`, filling the -1 axis."""
    sizes = [config.data, config.fsdp, config.tensor]
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if num_devices % known:
            raise ConfigError(
                f"mesh (data={config.data}, fsdp={config.fsdp}, tensor={config.tensor}): the fixed axes "
                f"({known} devices) do not divide the {num_devices} available devices")
        sizes[sizes.index(-1)] = num_devices // known
    if int(np.prod(sizes)) != num_devices:
        raise ConfigError(
            f"mesh (data={sizes[0]}, fsdp={sizes[1]}, tensor={sizes[2]}) needs {int(np.prod(sizes))} "
            f"devices but {num_devices} are used (set mesh.num_devices or make one axis -1)")
    return tuple(sizes)


def device_grid(shape: Sequence[int], devices: Sequence[jax.Device]) -> np.ndarray:
    """`devices` arranged as a `shape` array, the same in every process and for any process count.

    Accelerators: `mesh_utils.create_device_mesh` (TPU: the last, fastest-varying axis on the nearest
    chips of the torus, independent of the order `devices` come in; it handles multi-host pods), splitting
    a physical axis when the shape needs it (e.g. 2 × 8 on a 4 × 4 slice); a device set it cannot place
    (a partial slice) keeps the order given. CPU: the order given."""
    if devices[0].platform == "cpu":
        return np.asarray(devices).reshape(shape)
    try:
        return mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, NotImplementedError, AssertionError):
        try:
            return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        except (ValueError, NotImplementedError, AssertionError):
            return np.asarray(devices).reshape(shape)


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` over ('data', 'fsdp', 'tensor'); tensor is the fastest-varying (intra-host) axis.
    `devices` (default: all of them) may be another target's, e.g. TPU topology devices
    (`jax.experimental.topologies`) to compile for on a CPU host; their order is `device_grid`'s."""
    devices = list(jax.devices() if devices is None else devices)
    if config.num_devices != -1:
        if config.num_devices > len(devices):
            raise ConfigError(f"mesh.num_devices={config.num_devices} but only {len(devices)} devices exist")
        devices = devices[: config.num_devices]
    shape = resolve_mesh_shape(config, len(devices))
    return Mesh(device_grid(shape, devices), MESH_AXES)


def logical_axes(path: str, ndim: int, declared: dict | None = None) -> tuple[str | None, ...]:
    """Logical axes of the param at `path` (e.g. 'layers/q_proj/kernel') from `declared` (default: the
    model's, `declared_axes`). Raises ConfigError naming a path with no declaration or another rank."""
    declared = declared_axes() if declared is None else declared
    if path not in declared:
        raise ConfigError(f"param {path!r} has no declared logical axes (declared: {sorted(declared)}); declare them "
                          "where it is created (zarya_jax.nn.partitioning.declare) so that it is not replicated")
    axes = declared[path]
    if len(axes) != ndim:
        raise ConfigError(f"param {path!r} has {ndim} dims but its declared logical axes are {axes}")
    return axes


def tree_shardings(tree, mesh: Mesh, rules: dict = RULES, declared: dict | None = None):
    """NamedShardings for a params-like pytree (arrays, ShapeDtypeStructs or tracers): each leaf's declared
    logical axes (`logical_axes`) through `rules`. Raises ConfigError naming a leaf without a declaration,
    with an axis `rules` lacks, or with a dim that does not divide its mesh axes (`spec_for`, strict)."""
    def one(path, leaf):
        shape, name = np.shape(leaf), path_str(path)
        axes = logical_axes(name, len(shape), declared)
        return NamedSharding(mesh, spec_for(shape, axes, mesh, rules, what=f"param {name!r}", strict=True))

    return jax.tree_util.tree_map_with_path(one, tree)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def opt_state_shardings(optimizer, opt_state_shapes, params_shardings, mesh: Mesh):
    """Optimizer state mirrors the params (Adam's mu/nu): same shardings; scalars (counts) replicate."""
    return optax.tree_utils.tree_map_params(
        optimizer, lambda _, s: s, opt_state_shapes, params_shardings,
        transform_non_params=lambda _: replicated(mesh),
        is_leaf=lambda x: isinstance(x, NamedSharding))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[B, L] arrays: batch over (data, fsdp), length replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, None))


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def global_batch(local: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles each host's slice of the batch ([B/num_hosts, L] numpy) into global jax Arrays."""
    sharding = batch_sharding(mesh)
    out = {}
    for name, x in local.items():
        global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
        out[name] = jax.make_array_from_process_local_data(sharding, x, global_shape)
    return out


_MULTIHOST_ENV = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")


def maybe_initialize_distributed(mode: str = "auto") -> bool:
    """Calls `jax.distributed.initialize()` for multi-host runs; must run before any device use.

    mode 'on' always initializes (arguments from the environment / cluster auto-detection, e.g.
    TPU pods, SLURM, Open MPI); 'off' never; 'auto' when a coordinator address is in the environment
    or SLURM / Open MPI report more than one task. Does nothing when already initialized.
    Without a cluster to detect (several processes on one machine, or hosts you launch yourself), set
    `JAX_COORDINATOR_ADDRESS=host:port`, `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` (0 … N−1) on each.
    """
    if mode not in ("auto", "on", "off"):
        raise ConfigError(f"train.distributed={mode!r}: expected 'auto', 'on' or 'off'")
    if mode == "off" or jax.distributed.is_initialized():
        return False
    if mode == "auto":
        multi = any(os.environ.get(k) for k in _MULTIHOST_ENV)
        multi |= int(os.environ.get("SLURM_NTASKS", "1")) > 1
        multi |= int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
        if not multi:
            return False
    env = {name: int(os.environ[var]) for name, var in (("num_processes", "JAX_NUM_PROCESSES"),
                                                          ("process_id", "JAX_PROCESS_ID")) if os.environ.get(var)}
    jax.distributed.initialize(**env)
    return True
