"""The one mapping table between Hugging Face Qwen3 tensor names and our params pytree (docs/algorithms.md §1).

Both converters use it. Hugging Face keeps one tensor per layer, linear weights as `[out, in]`;
we keep layers stacked on a leading axis and kernels as `[*in, *out]` with the heads split out:

    model.layers.{i}.self_attn.q_proj.weight  [H*Q, D]  ⇄  layers/q_proj/kernel  [L, D, H, Q]
    model.layers.{i}.self_attn.o_proj.weight  [D, H*Q]  ⇄  layers/o_proj/kernel  [L, H, Q, D]
    model.layers.{i}.mlp.gate_proj.weight     [F, D]    ⇄  layers/gate_proj/kernel [L, D, F]
    lm_head.weight                            [V, D]    ⇄  lm_head [D, V]   (untied heads only)

Norm scales and the embedding keep their layout. Every move asserts the shape it expects.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Mapping

import numpy as np

from ..config import ModelConfig


# Our projection name → its Hugging Face module under `model.layers.{i}` (also PEFT's LoRA module names).
PROJECTION_MODULES = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
                      "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                      "down_proj": "mlp.down_proj"}
LAYER_PREFIX = "model.layers.{i}."


class ShapeError(ValueError):
    """A tensor does not have the shape the config implies."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One param. `hf` holds `{i}` for per-layer tensors, which we stack on axis 0.

    `linear` entries are HF `[prod(out), prod(in)]` ⇄ ours `in_shape + out_shape`;
    the others have the same layout on both sides (`in_shape` is the whole shape, `out_shape` empty).
    """

    hf: str
    path: tuple[str, ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...] = ()
    linear: bool = False

    @property
    def layered(self) -> bool:
        return "{i}" in self.hf

    @property
    def hf_shape(self) -> tuple[int, ...]:
        if self.linear:
            return (math.prod(self.out_shape), math.prod(self.in_shape))
        return self.in_shape

    @property
    def our_shape(self) -> tuple[int, ...]:
        """Per-layer shape (without the stacked layer axis)."""
        return self.in_shape + self.out_shape

    def hf_name(self, layer: int | None = None) -> str:
        return self.hf.format(i=layer) if self.layered else self.hf


def entries(config: ModelConfig) -> list[Entry]:
    """The table for one config, in checkpoint order (embedding first, head last)."""
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    h, k, q = config.num_heads, config.num_kv_heads, config.head_dim
    pre = LAYER_PREFIX
    table = [Entry("model.embed_tokens.weight", ("embed",), (v, d))]
    for ours, theirs, size in (("input_norm", "input_layernorm", d), ("post_attn_norm", "post_attention_layernorm", d),
                               ("q_norm", "self_attn.q_norm", q), ("k_norm", "self_attn.k_norm", q)):
        table.append(Entry(pre + theirs + ".weight", ("layers", ours, "scale"), (size,)))
    shapes = {"q_proj": ((d,), (h, q)), "k_proj": ((d,), (k, q)), "v_proj": ((d,), (k, q)), "o_proj": ((h, q), (d,)),
              "gate_proj": ((d,), (f,)), "up_proj": ((d,), (f,)), "down_proj": ((f,), (d,))}
    for ours, module in PROJECTION_MODULES.items():
        i, o = shapes[ours]
        table.append(Entry(pre + module + ".weight", ("layers", ours, "kernel"), i, o, linear=True))
    table.append(Entry("model.norm.weight", ("final_norm", "scale"), (d,)))
    if not config.tie_word_embeddings:
        table.append(Entry("lm_head.weight", ("lm_head",), (d,), (v,), linear=True))
    return table


def tensors(config: ModelConfig):
    """Yields (HF name, entry, layer index or None) for every HF tensor, in checkpoint order."""
    for e in entries(config):
        for layer in range(config.num_layers) if e.layered else [None]:
            yield e.hf_name(layer), e, layer


def hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name the config implies, with its shape."""
    return {name: e.hf_shape for name, e, _ in tensors(config)}


def stacked_shape(entry: Entry, config: ModelConfig) -> tuple[int, ...]:
    """Our full shape of an entry: `[layers, ...]` for per-layer tensors."""
    return ((config.num_layers,) if entry.layered else ()) + entry.our_shape


def _check(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise ShapeError(f"tensor {name!r} has shape {tuple(got)}, expected {tuple(want)} from the config")


def fill(entry: Entry, hf_array: np.ndarray, out: np.ndarray, name: str | None = None) -> None:
    """Writes one HF tensor into `out` (our per-layer layout, possibly a slice of a bigger array).

    Writing in place (with any dtype cast) saves a temporary copy of the tensor.
    """
    _check(name or entry.hf, hf_array.shape, entry.hf_shape)
    _check(f"{'/'.join(entry.path)} (destination)", out.shape, entry.our_shape)
    if not entry.linear:
        out[...] = hf_array
        return
    flat = (math.prod(entry.in_shape), math.prod(entry.out_shape))
    view = out if out.shape == flat else out.reshape(flat)
    if not np.may_share_memory(view, out):  # a reshape that copied would silently drop the write
        raise ValueError(f"destination of {entry.hf!r} must be contiguous")
    view[...] = hf_array.T


def to_hf(entry: Entry, ours: np.ndarray, name: str | None = None) -> np.ndarray:
    """One per-layer slice of our param in HF layout (contiguous, same dtype)."""
    _check(f"{'/'.join(entry.path)} for {name or entry.hf}", ours.shape, entry.our_shape)
    if not entry.linear:
        return np.ascontiguousarray(ours)
    return np.ascontiguousarray(ours.reshape(math.prod(entry.in_shape), math.prod(entry.out_shape)).T)


def get_path(tree: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(tree, Mapping) or key not in tree:
            raise KeyError(f"params have no entry {'/'.join(path)!r}")
        tree = tree[key]
    return tree


def set_path(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def leaves(tree, prefix: tuple[str, ...] = ()):
    """Yields (path, leaf) of a nested dict."""
    for key, value in tree.items():
        if isinstance(value, Mapping):  # dicts, and flax FrozenDicts
            yield from leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


@functools.lru_cache(maxsize=64)
def expected_shapes(config: ModelConfig) -> Mapping[tuple[str, ...], tuple[int, ...]]:
    """{param path: shape} that the config implies, read-only: cached and shared by every caller (`generate`
    checks the params on every call)."""
    return types.MappingProxyType({e.path: stacked_shape(e, config) for e in entries(config)})


def check_params(params: dict, config: ModelConfig) -> None:
    """Asserts that `params` has exactly the leaves and shapes the config implies."""
    want = expected_shapes(config)
    have = dict(leaves(params))
    missing = sorted("/".join(p) for p in set(want) - set(have))
    extra = sorted("/".join(p) for p in set(have) - set(want))
    if missing or extra:
        raise ShapeError(f"params do not match the config: missing {missing}, unexpected {extra}")
    for path, shape in want.items():
        _check("/".join(path), tuple(have[path].shape), shape)


def from_hf(tensors: Mapping[str, np.ndarray], config: ModelConfig, dtype=np.float32) -> dict:
    """Our params pytree (numpy, `dtype`) from HF tensors by name, e.g. an in-memory transformers
    model's `state_dict()` as numpy arrays (a tied model's extra `lm_head.weight` is ignored)."""
    params: dict = {}
    for e in entries(config):
        arr = np.empty(stacked_shape(e, config), dtype)
        for layer in range(config.num_layers) if e.layered else [None]:
            name = e.hf_name(layer)
            fill(e, np.asarray(tensors[name]), arr if layer is None else arr[layer], name)
        set_path(params, e.path, arr)
    return params
