"""Gated-LoRA adapter params as their own pytree (docs/algorithms.md §7): init, save/load, merge, and the adapter's
noise convention (`noise_tokens`, shared by drafter training and the Ψ-Spec draft pass).

The adapter itself is applied inside `model.Proj` (collection `'lora'`, per-token gate). Its params
mirror the base layer structure, stacked over layers:
`{'layers': {name: {'a': [layers, fan_in, r], 'b': [layers, r, fan_out]}}}` for the seven
projections; the update of a projection is `x @ a @ b * alpha / rank` with `b` zero at init, so a fresh
adapter drafts exactly like the AR model.

Adapters are saved apart from the base weights as one safetensors file (`adapter.safetensors`, keys
`layers.<proj>.<a|b>`) with the rank, alpha, noise convention and layer selection in its metadata
(`LoraConfig.layers`: the arrays stay stacked over all layers whatever the selection, the unselected
layers' entries unused and left as initialised, `b = 0`), so an adapter of a few hundred MB can be shipped and swapped without touching the base checkpoint, and is always sampled
with the noise it was trained on. The metadata also holds a checksum of every array (`nn.integrity`),
verified at load as a checkpoint's are: a damaged or unreadable file, or one without checksums (unless
`verify=False`), is a `CheckpointError` naming it. Save and load also refuse what no trained adapter
holds — a non-finite array, a rank that is not a positive integer, an alpha that is not a finite positive
number, an unknown noise convention or format — naming the file and the field.
"""
from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file

from .config import LORA_LAYERS, LORA_NOISE, ConfigError, LoraConfig, ModelConfig, missing_mask_token
from .files import atomic_directory
from .checkpoint import mesh_shardings
from .nn.integrity import CheckpointError, array_checksums, compare, describe_error

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_FILE = "adapter.safetensors"
FORMAT = "zarya_jax.lora/1"


def noise_tokens(key: jax.Array, shape: tuple[int, ...], vocab_size: int, mask_token_id: int | None,
                 noise: str = "uniform") -> jax.Array:
    """The draft rows' input ids (`LoraConfig.noise`): uniform over the vocabulary minus the mask token,
    or all `mask_token_id`."""
    if noise == "mask":
        if mask_token_id is None:
            raise ConfigError(missing_mask_token("noise='mask' needs", otherwise="use noise='uniform'"))
        return jnp.full(shape, mask_token_id, jnp.int32)
    if mask_token_id is None:
        return jax.random.randint(key, shape, 0, vocab_size, jnp.int32)
    z = jax.random.randint(key, shape, 0, vocab_size - 1, jnp.int32)
    return z + (z >= mask_token_id)  # skip the mask id, keep the rest uniform


def redraft_tokens(tokens: jax.Array, drafts: jax.Array, seed: jax.Array) -> jax.Array:
    """The input of a re-draft pass (docs/algorithms.md §7.7): the seed rows keep their tokens, every other row
    i holds row i−1's draft (a row's draft is for the next position, so it becomes the input at that
    position). tokens, drafts int [b, t]; seed bool [b, t], true on row 0 of every block."""
    prev = jnp.concatenate([tokens[:, :1], drafts[:, :-1]], axis=1)
    return jnp.where(seed, tokens, prev.astype(tokens.dtype))


def projection_shapes(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """(in_shape, out_shape) of each projection's kernel, per layer (matches `model.Block`)."""
    d, h, kvh, hd, f = (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                        config.intermediate_size)
    return {"q_proj": ((d,), (h, hd)), "k_proj": ((d,), (kvh, hd)), "v_proj": ((d,), (kvh, hd)),
            "o_proj": ((h, hd), (d,)), "gate_proj": ((d,), (f,)), "up_proj": ((d,), (f,)),
            "down_proj": ((f,), (d,))}


@functools.partial(jax.jit, static_argnums=(0, 1))
def init_lora(config: ModelConfig, lora: LoraConfig, key: jax.Array) -> dict:
    """A fresh adapter: `a ~ N(0, 1/fan_in)`, `b = 0` (so the drafter starts as the AR model).

    Built directly from the shapes, without materialising the base model, so it is cheap for 4B models.
    """
    params = {}
    dtype = config.jnp_param_dtype
    keys = jax.random.split(key, len(PROJECTIONS))
    for k, (name, (i, o)) in zip(keys, projection_shapes(config).items()):
        fan_in, fan_out = int(np.prod(i)), int(np.prod(o))
        a = jax.random.normal(k, (config.num_layers, fan_in, lora.rank), jnp.float32) * fan_in ** -0.5
        params[name] = {"a": a.astype(dtype), "b": jnp.zeros((config.num_layers, lora.rank, fan_out), dtype)}
    return {"layers": params}


def check_lora(lora_params: dict, config: ModelConfig, lora: LoraConfig) -> None:
    """Raises ConfigError naming the first adapter array whose shape does not fit `config` / `lora`, or a
    `lora.layers` selection the model does not have."""
    lora.layer_ids(config.num_layers)
    if set(lora_params) != {"layers"} or set(lora_params["layers"]) != set(PROJECTIONS):
        got = sorted(lora_params.get("layers", lora_params))
        raise ConfigError(f"LoRA params have projections {got}: expected {sorted(PROJECTIONS)} under 'layers'")
    for name, (i, o) in projection_shapes(config).items():
        want = {"a": (config.num_layers, int(np.prod(i)), lora.rank),
                "b": (config.num_layers, lora.rank, int(np.prod(o)))}
        for part, shape in want.items():
            got = tuple(lora_params["layers"][name][part].shape)
            if got != shape:
                raise ConfigError(f"LoRA layers.{name}.{part} has shape {got}: expected {shape} "
                                  f"(rank {lora.rank}, model {config.hidden_size}d × {config.num_layers} layers)")


def num_params(lora_params: dict) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(lora_params)))


def merge(params: dict, lora_params: dict, lora: LoraConfig) -> dict:
    """Base params with the adapter folded in: `kernel + reshape(a @ b) * alpha/rank` (fp32 sum).

    The merged model equals the adapter model with the gate on for every token (the pure drafter); layers
    outside `lora.layers` keep their base kernels.
    """
    layers = dict(params["layers"])
    num_layers = layers[PROJECTIONS[0]]["kernel"].shape[0]
    chosen = lora.layer_ids(num_layers)
    on = jnp.asarray([i in chosen for i in range(num_layers)], jnp.float32)[:, None, None]
    for name in PROJECTIONS:
        kernel = layers[name]["kernel"]
        ad = lora_params["layers"][name]
        delta = jnp.einsum("lir,lro->lio", ad["a"].astype(jnp.float32), ad["b"].astype(jnp.float32)) * on
        delta = delta.reshape(kernel.shape) * lora.scale
        layers[name] = {**layers[name], "kernel": (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)}
    return {**params, "layers": layers}


def check_values(lora_params: dict, lora: LoraConfig, where: str) -> None:
    """Raises ConfigError naming `where` and the field when the adapter holds what no training produces: a
    non-finite alpha, an alpha ≤ 0, or a NaN/inf in any array (`lora_params`: a pytree of arrays)."""
    alpha = lora.alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ConfigError(f"{where}: alpha={alpha!r}: expected a finite number > 0")
    for path, x in jax.tree_util.tree_flatten_with_path(lora_params)[0]:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ConfigError(f"{where}: {_name(path)} has dtype {x.dtype}: expected floating point")
        finite = np.isfinite(np.asarray(jax.device_get(x)))
        if not finite.all():
            raise ConfigError(f"{where}: {_name(path)} holds {finite.size - np.count_nonzero(finite)} non-finite "
                              f"value(s) (NaN or inf): expected finite numbers")


def _name(path) -> str:
    """`layers.q_proj.a`: a leaf's path as the file's tensor name."""
    return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def save(path: str | os.PathLike, lora_params: dict, lora: LoraConfig, extra: dict[str, str] | None = None) -> Path:
    """Writes `<path>/adapter.safetensors` (atomically: temp dir, then rename). Returns the file path.

    The metadata holds the rank, alpha, noise convention and layer selection; `extra`: more string metadata stored in
    the file, see `metadata`. An adapter with a non-finite array or alpha is refused (ConfigError) before
    anything is written. The arrays may be sharded over any mesh, across hosts too: every process of a
    multi-host run must call it (arrays that span processes are gathered; process 0 writes the file, the
    others return once it is in place).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"LoRA output {path} exists and is not a directory")
    flat = {f"layers.{name}.{part}": host_array(arr)
            for name in PROJECTIONS for part, arr in lora_params["layers"][name].items()}
    check_values(flat, lora, f"LoRA adapter to save in {str(path)!r}")
    if any(v.dtype == jnp.bfloat16 for v in flat.values()):
        # safetensors' numpy writer has no bf16; fp32 is lossless and loading casts back
        flat = {k: v.astype(np.float32) for k, v in flat.items()}
    if jax.process_index() == 0:
        with atomic_directory(path, overwrite=True) as tmp:
            save_file(flat, os.path.join(tmp, ADAPTER_FILE),
                      metadata={**(extra or {}), "rank": str(lora.rank), "alpha": repr(float(lora.alpha)),
                                "noise": lora.noise, "layers": lora.layers_text(), "format": FORMAT,
                                "checksums": json.dumps(array_checksums(flat))})
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("zarya_lora_save")
    return path / ADAPTER_FILE


def host_array(x) -> np.ndarray:
    """The whole of `x` as a host NumPy array. A jax array that spans several processes (no process holds
    all its shards) is gathered with a collective (`process_allgather`), which every process must join;
    any other is copied from its devices."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def _adapter_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    file = path / ADAPTER_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"LoRA adapter {path}: expected a directory holding {ADAPTER_FILE} or that file")
    return file


def _read(file: Path, tensors: bool = True) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """(metadata, arrays by name) of an adapter file; an unreadable one is a CheckpointError naming it."""
    try:
        with safe_open(str(file), framework="numpy") as f:
            return dict(f.metadata() or {}), {key: f.get_tensor(key) for key in f.keys()} if tensors else {}
    except Exception as e:  # safetensors raises several types for a truncated or foreign file
        raise CheckpointError(f"LoRA adapter {str(file)!r} is damaged or not a safetensors file "
                              f"({describe_error(e)})") from None


def _config(meta: dict[str, str], where: str) -> LoraConfig:
    """The LoraConfig recorded in an adapter's metadata; each bad field is a ConfigError naming it."""
    def field(name: str, parse, expected: str, default=None):
        if name not in meta:
            if default is not None:
                return default
            raise ConfigError(f"{where}: metadata has no {name!r} field: expected {expected} "
                              f"(files written by zarya_jax.lora.save carry it)")
        try:
            value = parse(meta[name])
        except ValueError:
            value = None
        if value is None:
            raise ConfigError(f"{where}: metadata field {name!r} is {meta[name]!r}: expected {expected}")
        return value

    def positive_int(text: str):
        return int(text) if text.strip().isdigit() and int(text) >= 1 else None

    def positive_float(text: str):
        value = float(text)
        return value if math.isfinite(value) and value > 0 else None

    field("format", lambda text: text if text == FORMAT else None, repr(FORMAT), default=FORMAT)
    # adapters written before the noise convention (the layer selection) was recorded were all trained with
    # uniform noise (on all layers)
    return LoraConfig(rank=field("rank", positive_int, "a positive integer"),
                      alpha=field("alpha", positive_float, "a finite number > 0"),
                      noise=field("noise", lambda text: text if text in LORA_NOISE else None,
                                  f"one of {LORA_NOISE}", default="uniform"),
                      layers=field("layers", _parse_layers, f"one of {LORA_LAYERS} or comma-separated layer indices",
                                   default="all"))


def _parse_layers(text: str):
    """A metadata `layers` field as LoraConfig.layers (None when it is not one)."""
    try:
        return LoraConfig(layers=text).layers
    except ConfigError:
        return None


def _recorded_checksums(meta: dict[str, str], where: str) -> dict:
    if "checksums" not in meta:
        raise CheckpointError(f"{where} has no 'checksums' metadata (written before adapters carried checksums): "
                              "cannot verify it; pass verify=False (--no-verify) to load it unverified")
    try:
        sums = json.loads(meta["checksums"])
        if not isinstance(sums, dict) or not all(isinstance(v, dict) for v in sums.values()):
            raise ValueError("expected a JSON object of {array: {shape, dtype, sum}}")
    except ValueError as e:
        raise CheckpointError(f"{where} is damaged: metadata field 'checksums' is unreadable ({e})") from None
    return sums


def _nest(flat: dict[str, np.ndarray], cfg: LoraConfig, where: str) -> dict:
    """{'layers': {proj: {'a', 'b'}}} from the file's tensors, checked complete and of rank `cfg.rank`."""
    params: dict = {"layers": {}}
    for key, value in flat.items():
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "layers" or parts[1] not in PROJECTIONS or parts[2] not in ("a", "b"):
            raise ConfigError(f"{where}: unexpected tensor {key!r} (expected layers.<proj>.<a|b>, proj one of "
                              f"{PROJECTIONS})")
        params["layers"].setdefault(parts[1], {})[parts[2]] = value
    for name in PROJECTIONS:
        for part, rank_axis in (("a", 2), ("b", 1)):
            value = params["layers"].get(name, {}).get(part)
            if value is None:
                raise ConfigError(f"{where}: tensor layers.{name}.{part} is missing")
            if value.ndim != 3 or value.shape[rank_axis] != cfg.rank:
                want = "[layers, fan_in, rank]" if part == "a" else "[layers, rank, fan_out]"
                raise ConfigError(f"{where}: tensor layers.{name}.{part} has shape {value.shape}: expected "
                                  f"{want} with the metadata's rank {cfg.rank}")
    return params


def load(path: str | os.PathLike, dtype=None, verify: bool = True, mesh: jax.sharding.Mesh | None = None
         ) -> tuple[dict, LoraConfig]:
    """Reads an adapter directory (or the `.safetensors` file itself) -> (lora_params, LoraConfig), the
    arrays on the default device, or sharded on `mesh` by the trainer's rules (`checkpoint.mesh_shardings`).

    verify: check the arrays against the checksums in the metadata; a file without them is refused
    (CheckpointError) unless verify=False. Whatever `verify`, the metadata must be valid (rank, alpha,
    noise, format) and every array finite and complete; each violation is a ConfigError naming the file
    and the field."""
    file = _adapter_file(path)
    where = f"LoRA adapter {str(file)!r}"
    meta, flat = _read(file)
    if verify:
        compare(_recorded_checksums(meta, where), array_checksums(flat), repr(str(file)))
    cfg = _config(meta, where)
    params = _nest(flat, cfg, where)
    try:
        cfg.layer_ids(params["layers"][PROJECTIONS[0]]["a"].shape[0])
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    check_values(flat, cfg, where)
    if mesh is not None:  # every process read the same file: each places its shards from it
        cast = np.asarray if dtype is None else (lambda x: np.asarray(x).astype(dtype))
        params = jax.tree.map(cast, params)
        return jax.device_put(params, mesh_shardings(params, mesh)), cfg
    cast = (lambda x: jnp.asarray(x)) if dtype is None else (lambda x: jnp.asarray(x).astype(dtype))
    return jax.tree.map(cast, params), cfg


def metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata of a saved adapter (rank, alpha, noise, format and any `extra` given to `save`)."""
    return _read(_adapter_file(path), tensors=False)[0]
