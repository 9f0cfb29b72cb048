"""The mesh axes and the one logical-axis rules table, shared by the model (its fused attention kernels
run per shard) and the trainer (`zarya_jax.train.sharding`: params, optimizer state, batches).

One mesh with three named axes, `('data', 'fsdp', 'tensor')`; every array dim carries a *logical* axis
name and `RULES` maps logical names to mesh axes. `spec_for` turns a shape and its logical axes into a
`PartitionSpec` on a given mesh (a `Mesh` or an `AbstractMesh`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch dim is split over both data-parallel axes

# Logical axis -> mesh axes (None: replicated). The only place parallelism is decided.
RULES: dict[str, Any] = {
    "batch": BATCH_AXES,
    "length": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "layers": None,
    "norm": None,
    "lora_rank": None,
    "lora_in": "fsdp",
    "lora_out": None,
}


def _mesh_size(mesh, axes) -> int:
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[a] for a in axes]))


def spec_for(shape: Sequence[int], axes: Sequence[str | None], mesh, rules: dict[str, Any] = RULES) -> P:
    """PartitionSpec for an array of `shape` with logical `axes`; indivisible dims stay replicated,
    mesh axes the mesh lacks are skipped, and a mesh axis is used at most once per array."""
    used: set[str] = set()
    out = []
    for size, name in zip(shape, axes):
        mesh_axes = rules.get(name) if name is not None else None
        flat = () if mesh_axes is None else ((mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes))
        flat = tuple(a for a in flat if a not in used and a in mesh.shape and mesh.shape[a] > 1)
        if not flat or size % _mesh_size(mesh, flat):
            out.append(None)
            continue
        used.update(flat)
        out.append(flat[0] if len(flat) == 1 else flat)
    return P(*out)
