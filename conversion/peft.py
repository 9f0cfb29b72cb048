"""Uno's gated-LoRA adapter (`zarya_jax.lora`) ⇄ a PEFT LoRA adapter directory, both ways and exactly.

A PEFT directory holds `adapter_config.json` (`peft_type: LORA`, `r`, `lora_alpha`, `target_modules`, …) and
`adapter_model.safetensors` with one pair of factors per layer and projection, under the module names of
Hugging Face's Qwen3 (`hf_params.PROJECTION_MODULES`):

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight  [r, in]   ⇄  layers/q_proj/a[i]  [in, r]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight  [out, r]  ⇄  layers/q_proj/b[i]  [r, out]

Both scale the update by `lora_alpha / r` (ours: alpha / rank), and the in/out axes flatten the heads in
the order `hf_params` uses for the base weights, so PEFT's merged model is our model with the gate on for
every token. What PEFT has no field for, the adapter's draft-input convention (`LoraConfig.noise`,
docs/algorithms.md §7.1), travels in a side file, `zarya_lora.json`, which PEFT ignores. Importing a PEFT adapter: projections
or layers it does not target get zero factors (no update, as in PEFT); `use_rslora` scales by
lora_alpha/√r, which becomes alpha = lora_alpha·√r; DoRA, per-module ranks, bias training, extra trained
modules and `fan_in_fan_out` have no equivalent here and are refused. The layer selection
(`LoraConfig.layers`) is PEFT's `layers_to_transform`: an adapter on some layers exports only their
factors and lists them; an imported one with `layers_to_transform` keeps that selection.
"""
from __future__ import annotations

import json
import math
import os
import re

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from zarya_jax import lora as lora_lib
from zarya_jax.config import LoraConfig, ModelConfig
from zarya_jax.nn.hf_params import LAYER_PREFIX, PROJECTION_MODULES

from . import ConversionError, read_json

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
SIDE_FILE = "zarya_lora.json"  # {"format", "noise"}: the draft-input convention PEFT has no field for
PEFT_PREFIX = "base_model.model."
_NAME = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(.+)\.lora_([AB])\.weight")
_PROJECTION_OF = {module: proj for proj, module in PROJECTION_MODULES.items()}


def tensor_name(proj: str, layer: int, factor: str) -> str:
    """PEFT's tensor name of one LoRA factor ("A" or "B") of our projection `proj` in `layer`."""
    return f"{PEFT_PREFIX}{LAYER_PREFIX.format(i=layer)}{PROJECTION_MODULES[proj]}.lora_{factor}.weight"


def _number(x: float):
    return int(x) if float(x).is_integer() else float(x)


def to_peft(adapter: dict, lora: LoraConfig, base_model: str | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """(PEFT tensors by name, adapter_config.json dict) of our adapter; the factors are transposed, not cast.
    An adapter with a non-finite array or alpha is refused (`lora.check_values`): JSON has no NaN."""
    try:
        lora_lib.check_values(adapter, lora, "LoRA adapter")
    except ValueError as e:
        raise ConversionError(str(e)) from None
    tensors = {}
    num_layers = np.shape(adapter["layers"][lora_lib.PROJECTIONS[0]]["a"])[0]
    chosen = lora.layer_ids(num_layers)
    for proj in lora_lib.PROJECTIONS:
        a, b = (np.asarray(adapter["layers"][proj][k]) for k in ("a", "b"))
        for i in chosen:
            tensors[tensor_name(proj, i, "A")] = np.ascontiguousarray(a[i].T)
            tensors[tensor_name(proj, i, "B")] = np.ascontiguousarray(b[i].T)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
              "r": lora.rank, "lora_alpha": _number(lora.alpha), "target_modules": sorted(lora_lib.PROJECTIONS),
              "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
              "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
              "layers_to_transform": None if lora.layers == "all" else list(chosen), "rank_pattern": {}, "alpha_pattern": {}}
    return tensors, config


def _check_config(config: dict, where: str) -> tuple[int, float]:
    """(r, our alpha) of a PEFT LoRA config; refuses what our adapter cannot represent."""
    if config.get("peft_type") != "LORA":
        raise ConversionError(f"{where}: peft_type={config.get('peft_type')!r}: expected 'LORA'")
    refused = {"use_dora": bool(config.get("use_dora")), "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
               "bias": config.get("bias", "none") != "none", "modules_to_save": bool(config.get("modules_to_save")),
               "rank_pattern": bool(config.get("rank_pattern")), "alpha_pattern": bool(config.get("alpha_pattern"))}
    bad = [k for k, v in refused.items() if v]
    if bad:
        raise ConversionError(f"{where}: {', '.join(f'{k}={config.get(k)!r}' for k in bad)} is not supported: the "
                              f"adapter must be a plain LoRA (no DoRA, bias, extra modules, per-module ranks, "
                              f"fan_in_fan_out=false)")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ConversionError(f"{where}: {CONFIG_FILE} field 'r' is {r!r}: expected a positive integer")
    # Python's json reads NaN and Infinity, which no trained adapter has
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ConversionError(f"{where}: {CONFIG_FILE} field 'lora_alpha' is {alpha!r}: expected a finite number > 0")
    return r, float(alpha) * (math.sqrt(r) if config.get("use_rslora") else 1.0)


def _layers_of(config: dict, where: str):
    """LoraConfig.layers from PEFT's `layers_to_transform` (None: all layers; an index or a list)."""
    chosen = config.get("layers_to_transform")
    if chosen is None:
        return "all"
    if config.get("layers_pattern"):
        raise ConversionError(f"{where}: layers_pattern={config['layers_pattern']!r} is not supported: expected "
                              "layers_to_transform over Qwen3's decoder layers")
    try:
        return LoraConfig(layers=[chosen] if isinstance(chosen, int) else chosen).layers
    except ValueError:
        raise ConversionError(f"{where}: {CONFIG_FILE} field 'layers_to_transform' is {chosen!r}: expected null, "
                              "a layer index or a list of distinct layer indices ≥ 0") from None


def from_peft(tensors: dict[str, np.ndarray], config: dict, noise: str = "uniform",
              model_config: ModelConfig | None = None, where: str = "PEFT adapter") -> tuple[dict, LoraConfig]:
    """(our adapter, LoraConfig) from PEFT tensors and adapter_config.json. Projections and layers the
    adapter does not target get zero factors; their sizes come from the other layers or `model_config`
    (needed when a projection is targeted in no layer)."""
    rank, alpha = _check_config(config, where)
    lora = LoraConfig(rank=rank, alpha=alpha, noise=noise, layers=_layers_of(config, where))
    found: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for name, arr in tensors.items():
        m = _NAME.fullmatch(name)
        if not m or m.group(2) not in _PROJECTION_OF:
            raise ConversionError(f"{where}: unexpected tensor {name!r}: expected names like "
                                  f"{tensor_name('q_proj', 0, 'A')!r} (LoRA factors of Qwen3's seven projections)")
        found.setdefault((_PROJECTION_OF[m.group(2)], int(m.group(1))), {})[m.group(3)] = np.asarray(arr)
    layers = model_config.num_layers if model_config else 1 + max((i for _, i in found), default=-1)
    try:
        chosen = lora.layer_ids(layers)
    except ValueError as e:
        raise ConversionError(f"{where}: {e}") from None
    stray = sorted({i for _, i in found} - set(chosen))
    if stray:
        raise ConversionError(f"{where}: factors for layer(s) {stray}, outside its layers_to_transform {list(chosen)}")
    shapes = lora_lib.projection_shapes(model_config) if model_config else {}
    adapter: dict = {"layers": {}}
    for proj in lora_lib.PROJECTIONS:
        have = [found[k] for k in sorted(found) if k[0] == proj]
        if have and any(set(f) != {"A", "B"} for f in have):
            raise ConversionError(f"{where}: {proj} has a lora_A without its lora_B (or the reverse)")
        if proj in shapes:
            fan_in, fan_out = (math.prod(s) for s in shapes[proj])
        elif have:
            fan_in, fan_out = have[0]["A"].shape[1], have[0]["B"].shape[0]
        else:
            raise ConversionError(f"{where} targets no {proj}: give --base CKPT to size its zero factors")
        dtype = have[0]["A"].dtype if have else np.float32
        a = np.zeros((layers, fan_in, rank), dtype)
        b = np.zeros((layers, rank, fan_out), dtype)
        for (p, i), f in found.items():
            if p != proj:
                continue
            if i >= layers:
                raise ConversionError(f"{where}: {proj} of layer {i}, but the model has {layers} layers")
            if f["A"].shape != (rank, fan_in) or f["B"].shape != (fan_out, rank):
                raise ConversionError(f"{where}: {proj} of layer {i} has lora_A {f['A'].shape}, lora_B "
                                      f"{f['B'].shape}: expected {(rank, fan_in)} and {(fan_out, rank)}")
            a[i], b[i] = f["A"].T, f["B"].T
        adapter["layers"][proj] = {"a": a, "b": b}
    if model_config is not None:
        lora_lib.check_lora(adapter, model_config, lora)
    try:
        lora_lib.check_values(adapter, lora, f"{where} ({WEIGHTS_FILE})")
    except ValueError as e:
        raise ConversionError(str(e)) from None
    return adapter, lora


def write(out_dir: str, tensors: dict[str, np.ndarray], config: dict, noise: str) -> None:
    """Writes the PEFT files and the side file into `out_dir` (an existing, empty staging directory)."""
    save_file(tensors, os.path.join(out_dir, WEIGHTS_FILE), metadata={"format": "pt"})
    with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
        json.dump(config, f, indent=2, allow_nan=False)  # strict JSON: NaN is not JSON, other readers refuse it
    with open(os.path.join(out_dir, SIDE_FILE), "w") as f:
        json.dump({"format": "zarya_jax.lora/1", "noise": noise}, f, indent=2)


def read(peft_dir: str) -> tuple[dict[str, np.ndarray], dict, str | None]:
    """(tensors, adapter_config.json dict, noise from the side file or None) of a PEFT adapter directory."""
    if not os.path.isdir(peft_dir):
        raise ConversionError(f"--peft {peft_dir!r} is not a directory")
    config = read_json(os.path.join(peft_dir, CONFIG_FILE), "PEFT adapter config")
    weights = os.path.join(peft_dir, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        pickled = os.path.isfile(os.path.join(peft_dir, "adapter_model.bin"))
        raise ConversionError(f"{weights!r} not found" + (" (only a pickled adapter_model.bin: save the adapter "
                                                          "with safe_serialization=True)" if pickled else ""))
    try:
        with safe_open(weights, framework="numpy") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises several types for truncated / non-safetensors files
        raise ConversionError(f"cannot read safetensors file {weights!r}: {e}") from e
    side = os.path.join(peft_dir, SIDE_FILE)
    noise = read_json(side, "adapter side file").get("noise") if os.path.isfile(side) else None
    return tensors, config, noise
