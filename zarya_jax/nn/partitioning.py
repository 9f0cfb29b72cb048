"""The mesh axes, the one logical-axis rules table and the declaration of a parameter's logical axes,
shared by the model (it declares each parameter's axes where it creates it; its fused attention kernels
run per shard) and the trainer (`zarya_jax.train.sharding`: params, optimizer state, batches).

One mesh with three named axes, `('data', 'fsdp', 'tensor')`; every array dim carries a *logical* axis
name and `RULES` maps logical names to mesh axes. A parameter is created boxed with its names
(`declare(init, names)` around its initializer → an `Axes` box; `nn.scan` adds `layers` in front), and
`declared` reads the boxes of an (abstract) init back as {path: names}, refusing a parameter created
without them. `spec_for` turns a shape and its logical axes into a `PartitionSpec` on a given mesh (a
`Mesh` or an `AbstractMesh`); a name without a rule is an error, and so is a parameter dim that does
not divide its mesh axes (`strict=True`; activations and batches stay lenient).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import struct
from flax.core import meta
from jax.sharding import PartitionSpec as P

from ..config import ConfigError

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
    "lora_rank": None,  # small and user-chosen (8, 16, …): not split, so any rank runs on any mesh
    "lora_in": "fsdp",
    # b [rank, out] and its Adam moments over every model-parallel device (a 4B drafter at rank 128 holds
    # 0.5 GiB of them per copy); tensor first so that, gathered over fsdp, a device holds its heads' block.
    "lora_out": ("tensor", "fsdp"),
}

# What to do about a parameter dim that does not divide its mesh axes, by logical name (`_remedy`).
_REMEDIES = {
    "vocab": "pad the vocabulary to a multiple of {n} (conversion keeps Qwen3's 151936 rows)",
    "heads": "use a number of attention heads divisible by {n}",
    "kv_heads": "use a number of KV heads divisible by {n}",
    "mlp": "use an intermediate_size divisible by {n}",
    "embed": "use a hidden_size divisible by {n}",
    "lora_in": "use model dims divisible by {n}",
    "lora_out": "use model dims divisible by {n}",
}




class Axes(struct.PyTreeNode, meta.AxisMetadata):
    """A parameter as created: its value and the logical axis name of each dim. Unboxing (Linen does it
    when the module reads the parameter; `init_params` before returning) gives the bare value and adds
    no sharding constraint: where a parameter lives is decided by `RULES` when the params are placed."""

    value: Any
    names: tuple[str | None, ...] = struct.field(pytree_node=False)

    def unbox(self) -> Any:
        return self.value

    def replace_boxed(self, val: Any) -> "Axes":
        return self.replace(value=val)

    def add_axis(self, index: int, params: dict[Any, Any]) -> "Axes":
        """`nn.scan` stacking layers: `metadata_params={PARTITION_NAME: name}` names the new dim."""
        if meta.PARTITION_NAME not in params:
            raise ConfigError(f"a transform added a dim to a parameter with axes {self.names} without naming it: "
                              f"pass metadata_params={{nn.PARTITION_NAME: name}}")
        names = list(self.names)
        names.insert(index, params[meta.PARTITION_NAME])
        return self.replace(names=tuple(names))

    def remove_axis(self, index: int, params: dict[Any, Any]) -> "Axes":
        names = list(self.names)
        names.pop(index)
        return self.replace(names=tuple(names))


def declare(init: Callable, names: Sequence[str | None]) -> Callable:
    """The initializer `init(key, shape, dtype)` with its result boxed as `Axes(value, names)`: one name
    per dim of the shape, next to the shape where the parameter is created."""
    names = tuple(names)

    def boxed(key, shape, dtype=None):
        if len(shape) != len(names):
            raise ConfigError(f"a parameter of shape {tuple(shape)} was declared with logical axes {names}: "
                              "expected one name per dim")
        return Axes(init(key, shape) if dtype is None else init(key, shape, dtype), names)

    return boxed


def path_str(path) -> str:
    """A pytree key path as 'a/b/c'."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def declared(variables) -> dict[str, tuple[str | None, ...]]:
    """{'a/b/c': logical axes} for every leaf of one boxed variable collection (e.g. the 'params' of an
    abstract `init`). Raises ConfigError naming a parameter created without a declaration."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(variables, is_leaf=lambda x: isinstance(x, Axes))[0]:
        name = path_str(path)
        if not isinstance(leaf, Axes):
            raise ConfigError(f"parameter {name!r} was created without logical axes: create it with "
                              "zarya_jax.nn.partitioning.declare(init, names), one name per dim")
        out[name] = leaf.names
    return out


def _mesh_size(mesh, axes) -> int:
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[a] for a in axes]))


def _remedy(name: str, flat: tuple[str, ...], mesh) -> str:
    """How to make a dim named `name` fit mesh axes `flat`: change the model or shrink the axes."""
    n = _mesh_size(mesh, flat)
    model = _REMEDIES.get(name, "make the dim a multiple of {n}").format(n=n)
    mesh_fix = " and ".join(f"mesh.{a}=1" for a in flat)
    return f"{model} or use {mesh_fix}"


def spec_for(shape: Sequence[int], axes: Sequence[str | None], mesh, rules: dict[str, Any] = RULES,
             what: str = "an array", strict: bool = False) -> P:
    """PartitionSpec for an array of `shape` with logical `axes`; mesh axes the mesh lacks (or of size 1)
    are skipped, and a mesh axis is used at most once per array. A logical name without a rule raises
    ConfigError naming `what` (e.g. the parameter's path).

    A dim not divisible by its mesh axes stays replicated when `strict` is False (activations and
    batches, e.g. one prompt decoded on a wide mesh) and raises ConfigError naming `what`, the dim, the
    mesh axes and the remedy when it is True (parameters: replicating one silently multiplies its memory
    and its optimizer state's by the axis size)."""
    unknown = [name for name in axes if name is not None and name not in rules]
    if unknown:
        raise ConfigError(f"{what}: logical axis {unknown[0]!r} (of {tuple(axes)}) has no rule; expected one of "
                          f"{sorted(rules)} or a rule for it in zarya_jax.nn.partitioning.RULES")
    used: set[str] = set()
    out = []
    for dim, (size, name) in enumerate(zip(shape, axes)):
        mesh_axes = rules[name] if name is not None else None
        flat = () if mesh_axes is None else ((mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes))
        flat = tuple(a for a in flat if a not in used and a in mesh.shape and mesh.shape[a] > 1)
        if flat and size % _mesh_size(mesh, flat):
            if strict:
                on = " × ".join(f"{a}={mesh.shape[a]}" for a in flat)
                raise ConfigError(f"{what} dim {dim} ({name}, {size}) does not divide mesh axis {on}: "
                                  f"{_remedy(name, flat, mesh)}")
            flat = ()
        if not flat:
            out.append(None)
            continue
        used.update(flat)
        out.append(flat[0] if len(flat) == 1 else flat)
    return P(*out)
