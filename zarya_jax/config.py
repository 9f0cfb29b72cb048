"""Frozen, hashable configs: the Qwen3 backbone (`ModelConfig`), the Zarya diffusion
hyperparameters (`ZaryaConfig`, docs/algorithms.md §1–§3), the gated-LoRA adapter (`LoraConfig`, docs/algorithms.md §7) and how
records become prompts (`PromptFormat`, rendered by `zarya_jax.data.render`).

Configs are jit-static: every field is a Python scalar or tuple, so a config can be passed as a
`static_argnums` argument and hashed into a compile cache key.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# `ModelConfig.attention`: the kernel of the training mask (`zarya_jax.nn.attention`).
ATTENTION_BACKENDS = ("auto", "dense", "dot_product", "splash")
# `ModelConfig.remat_policy`: what a rematerialised layer keeps from its forward pass (`model`).
REMAT_POLICIES = ("full", "dots", "qkv")
# ModelConfig fields that say how to compute, not what the model is (`ModelConfig.with_runtime_of`).
RUNTIME_FIELDS = ("dtype", "remat", "remat_policy", "attention", "scan_unroll", "cache_block")


class ConfigError(ValueError):
    """A config value is out of range or of the wrong kind."""


# How a checkpoint gets the `<mdm_mask>` token: converted again with it (docs/conversion.md).
ADD_MASK_TOKEN = "python -m conversion.hf_to_jax --hf-dir HF_DIR --out CKPT --add-mask-token"


def missing_mask_token(needs: str, model: str = "the model config", otherwise: str = "") -> str:
    """The message of every refusal of a model without a mask token, naming the remedy: `needs` says what
    reads the token (e.g. "mode 'mdm' needs"), `model` whose config lacks it (e.g. "the checkpoint 'ckpt'"),
    `otherwise` what works without one (e.g. "evaluate it with --modes ar")."""
    return (f"{needs} a mask token, but {model} has none (mask_token_id is None): convert the Hugging Face model "
            f"with `{ADD_MASK_TOKEN}` and use CKPT" + (f", or {otherwise}" if otherwise else ""))


# The range of every integer knob and flag, by its name (the last part of a dotted key): a seed is a
# uint32 (`jax.random.PRNGKey` silently drops higher bits, and overflows past 64), a step count is in
# 0 … MAX_STEPS (a run without end is a typo), anything else fits int32 (the arrays it sizes or
# indexes). Each field's own check then says what is meaningful (e.g. train.steps ≥ 1).
MAX_SEED = 2**32 - 1
MAX_STEPS = 10**9
MAX_INT = 2**31 - 1


def int_range(name: str) -> tuple[int, int]:
    leaf = name.lstrip("-").replace("-", "_").rsplit(".", 1)[-1]
    if leaf == "seed" or leaf.endswith("_seed"):
        return 0, MAX_SEED
    if leaf == "steps" or leaf.endswith("_steps"):
        return 0, MAX_STEPS
    return -MAX_INT, MAX_INT


def check_bounds(name: str, value: Any, integer: bool | None = None) -> None:
    """Raises ConfigError naming `name` and `value` unless a number is in range: every float finite (NaN
    and inf are never a setting), every integer (`integer`: whether the value is meant as one, default
    its type) within `int_range(name)`; other values pass."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}={value}: expected a finite number")
    if isinstance(value, int) if integer is None else integer:
        low, high = int_range(name)
        if not low <= value <= high:
            raise ConfigError(f"{name}={value}: expected an integer in [{low}, {high}]")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Qwen3 decoder dimensions (docs/algorithms.md §1). `dtype` is the compute dtype, `param_dtype` the storage one.

    `attention` picks the kernel of the causal-within-segments mask (training, prefill, `forward`):
    one of `ATTENTION_BACKENDS`, see `zarya_jax.nn.attention`. `remat` recomputes each layer in the
    backward pass; `remat_policy` says what it keeps: `full` nothing, `dots` the weight matmuls' outputs
    (attention and elementwise ops are recomputed), `qkv` the post-RoPE q/k/v and the attention output.
    `scan_unroll`: layers per iteration of the layer scan (`num_layers` = fully unrolled: longer compiles,
    sometimes faster steps; the params are stacked either way).
    `cache_block`: rows of the KV cache a decoding pass reads at a time, only the blocks below the batch's
    longest live row (`nn.attention.live`); 0 reads the whole allocation densely (`nn.attention.cached`:
    what the target compiler's cost model can count, a while_loop's body being counted once).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40960
    dtype: str = "float32"
    param_dtype: str = "float32"
    mask_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None  # kept for the Hugging Face config.json (no objective or sampler reads it)
    remat: bool = False
    remat_policy: str = "full"
    attention: str = "auto"
    scan_unroll: int = 1
    cache_block: int = 256

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings", "scan_unroll"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"ModelConfig.{name}={value!r}: expected a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ConfigError(f"ModelConfig.{name}={getattr(self, name)!r}: expected one of {sorted(_DTYPES)}")
        if isinstance(self.cache_block, bool) or not isinstance(self.cache_block, int) or self.cache_block < 0:
            raise ConfigError(f"ModelConfig.cache_block={self.cache_block!r}: expected an integer ≥ 0 "
                              "(rows per block of the live cache; 0 = read the whole allocation)")
        if self.attention not in ATTENTION_BACKENDS:
            raise ConfigError(f"ModelConfig.attention={self.attention!r}: expected one of {ATTENTION_BACKENDS}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ConfigError(f"ModelConfig.remat_policy={self.remat_policy!r}: expected one of {REMAT_POLICIES}")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(
                f"ModelConfig.mask_token_id={self.mask_token_id} outside the vocabulary [0, {self.vocab_size})")

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self):
        return _DTYPES[self.param_dtype]

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def with_runtime_of(self, other: "ModelConfig") -> "ModelConfig":
        """This model run the way `other` says: its `RUNTIME_FIELDS` (how to compute, not what the model
        is), e.g. a checkpoint's structure with a run config's precision, remat and attention kernel."""
        return self.replace(**{f: getattr(other, f) for f in RUNTIME_FIELDS})

    def num_params(self) -> int:
        """Parameter count (embeddings included once when tied)."""
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        layer = d * q + 2 * d * kv + q * d + 3 * d * f + 2 * d + 2 * self.head_dim
        head = 0 if self.tie_word_embeddings else d * v
        return v * d + self.num_layers * layer + d + head


SEQUENTIAL_CONVENTIONS = ("ar", "mdm", "both")


@dataclasses.dataclass(frozen=True)
class ZaryaConfig:
    """Zarya's diffusion hyperparameters (docs/algorithms.md §1–§3), defaults from the paper / ReFusion."""

    alpha0: float = 0.25
    eps: float = 1e-3
    diffusion_loss_proportion: float = 0.5
    sequential_shuffle: bool = True
    diffusion_shuffle: bool = True
    ordered_sampling: bool = False
    grouped_noise: bool = False
    max_span_length: int = 8
    noise_sorting: bool = False
    slotted_training: bool = True
    # AR targets across slot boundaries (prompt → first answer token, last token of a clean slot →
    # next logical token). ReFusion (docs/algorithms.md §2.4) gives them none, which leaves every slot-start transition
    # untrained for AR decoding and self-speculation; False reproduces ReFusion exactly.
    boundary_targets: bool = True
    slot_size_set: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    slot_step_borders: tuple[float, ...] = (0.06, 0.2, 0.4, 0.6, 0.8, 1.0)
    antithetic_sampling: bool = False
    elbo_weight: bool = False  # Eso-LM's α0(1−eps)/(1−α_t) instead of 1/p_mask (docs/algorithms.md §3.3)
    # Non-slotted sequential pass (docs/algorithms.md §3.3, §3.7): "ar" — the clean x0, row i targets a masked
    # x0[i + 1]; "mdm" — Eso-LM's reconstruction loss: masked copies that see the clean tokens before them
    # (in Eso-LM's sampling order) and predict themselves, the query mode A's sequential phase asks;
    # "both" (the default: it alone trains AR decoding and mode A's query) — the two together.
    sequential_convention: str = "both"

    def __post_init__(self):
        object.__setattr__(self, "slot_size_set", tuple(int(s) for s in self.slot_size_set))
        object.__setattr__(self, "slot_step_borders", tuple(float(b) for b in self.slot_step_borders))
        if not 0.0 < self.alpha0 <= 1.0:
            raise ConfigError(f"ZaryaConfig.alpha0={self.alpha0}: expected a value in (0, 1]")
        if not 0.0 <= self.eps < 1.0:
            raise ConfigError(f"ZaryaConfig.eps={self.eps}: expected a value in [0, 1)")
        if not 0.0 <= self.diffusion_loss_proportion <= 1.0:
            raise ConfigError(
                f"ZaryaConfig.diffusion_loss_proportion={self.diffusion_loss_proportion}: expected [0, 1]")
        if self.sequential_convention not in SEQUENTIAL_CONVENTIONS:
            raise ConfigError(f"ZaryaConfig.sequential_convention={self.sequential_convention!r}: expected one "
                              f"of {SEQUENTIAL_CONVENTIONS}")
        if self.max_span_length < 1:
            raise ConfigError(f"ZaryaConfig.max_span_length={self.max_span_length}: expected ≥ 1")
        if not self.slot_size_set or any(s < 1 for s in self.slot_size_set):
            raise ConfigError(f"ZaryaConfig.slot_size_set={self.slot_size_set}: expected positive sizes")
        if len(self.slot_size_set) != len(self.slot_step_borders):
            raise ConfigError(
                f"ZaryaConfig.slot_step_borders={self.slot_step_borders} must have one border per slot size "
                f"in slot_size_set={self.slot_size_set}")
        if list(self.slot_step_borders) != sorted(self.slot_step_borders):
            raise ConfigError(f"ZaryaConfig.slot_step_borders={self.slot_step_borders}: expected increasing")

    def replace(self, **changes) -> "ZaryaConfig":
        return dataclasses.replace(self, **changes)


LORA_NOISE = ("uniform", "mask")
# `LoraConfig.layers`: the named layer selections (or an explicit tuple of layer indices).
LORA_LAYERS = ("all", "top", "bottom")


def _layer_selection(value: Any) -> str | tuple[int, ...]:
    """`LoraConfig.layers` normalised: a name of LORA_LAYERS, or a sorted tuple of distinct indices ≥ 0
    (from a tuple/list, one int, or a comma string such as "0,2")."""
    if isinstance(value, str) and value.strip() in LORA_LAYERS:
        return value.strip()
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    ids = []
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        if isinstance(text, str) and text.isdigit():
            text = int(text)
        if isinstance(text, bool) or not isinstance(text, int) or text < 0:
            ids = None
            break
        ids.append(text)
    if not ids or len(set(ids)) != len(ids):
        raise ConfigError(f"LoraConfig.layers={value!r}: expected one of {LORA_LAYERS} or a list of distinct "
                          "layer indices ≥ 0 (e.g. 0,2,3)")
    return tuple(sorted(ids))


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Gated LoRA on the seven projections (docs/algorithms.md §7); the update is scaled by alpha / rank.

    `noise` is the adapter's input convention, fixed by its training and saved with it: the draft rows
    hold uniform random ids ("uniform", never the mask id) or the mask token ("mask"), in training
    (`objectives.drafter`) and in the Ψ-Spec draft pass (`sampling.spec`) alike.
    `layers`: the decoder layers that carry the adapter — "all", "top" (the upper half, layers
    n//2 … n−1), "bottom" (layers 0 … n//2 − 1) or a tuple of layer indices; in the other layers every
    row computes the base projection, gate or not (`layer_ids`).
    """

    rank: int = 128
    alpha: float = 2048.0
    noise: str = "uniform"
    layers: str | tuple[int, ...] = "all"

    def __post_init__(self):
        if self.rank < 1:
            raise ConfigError(f"LoraConfig.rank={self.rank}: expected ≥ 1")
        if self.noise not in LORA_NOISE:
            raise ConfigError(f"LoraConfig.noise={self.noise!r}: expected one of {LORA_NOISE}")
        object.__setattr__(self, "layers", _layer_selection(self.layers))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def layer_ids(self, num_layers: int) -> tuple[int, ...]:
        """The indices of the layers that carry the adapter in a model of `num_layers` layers; a selection
        that is empty or names a layer the model lacks is a ConfigError naming it."""
        named = {"all": range(num_layers), "top": range(num_layers // 2, num_layers),
                 "bottom": range(num_layers // 2)}
        ids = tuple(named[self.layers]) if isinstance(self.layers, str) else self.layers
        if not ids or ids[-1] >= num_layers:
            raise ConfigError(f"LoraConfig.layers={self.layers!r}: selects layers {list(ids)}, but the model has "
                              f"{num_layers} layer(s) (indices 0 … {num_layers - 1})")
        return ids

    def layers_text(self) -> str:
        """`layers` as one string ("all", "top", "bottom" or "0,2,3"), as adapter metadata stores it."""
        return self.layers if isinstance(self.layers, str) else ",".join(map(str, self.layers))


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How a data record becomes the text the model sees (`zarya_jax.data.render`): training, evaluation,
    generation and the lm-evaluation-harness adapter all render through it, and a trained checkpoint
    records it (`config.json` → "prompt"), so a checkpoint is evaluated exactly as it was trained.

    prompt_key / answer_key: the record's fields (GSM8K: `question`, `answer`); chat records
    (`messages`) are read as they are. prompt_template: the user turn, with `{prompt}` standing for the
    prompt field (e.g. "Question: {prompt}\nAnswer:"). chat_template: render through the tokenizer's
    chat template when it has one (else the plain text). system: a system message (chat template) or
    first line (plain text); "" = none. enable_thinking: passed to chat templates that take it (Qwen3);
    None = the template's default.
    """

    prompt_key: str = "prompt"
    answer_key: str = "answer"
    prompt_template: str = "{prompt}"
    chat_template: bool = True
    system: str = ""
    enable_thinking: bool | None = None

    def __post_init__(self):
        for name in ("prompt_key", "answer_key"):
            if not getattr(self, name):
                raise ConfigError(f"{name}={getattr(self, name)!r}: expected a record field name")
        try:
            self.prompt_template.format(prompt="")
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"prompt_template={self.prompt_template!r}: expected a text with {{prompt}} as the "
                              f"only placeholder (double other braces: {{{{ }}}}); {type(e).__name__}: {e}") from None

    @classmethod
    def of(cls, config) -> "PromptFormat":
        """The PromptFormat fields of a config that extends it (e.g. `DataConfig`)."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


# Hugging Face's exact dimensions (Qwen/Qwen3-*/config.json); vocab before the mask token is added.
PRESETS: dict[str, ModelConfig] = {
    "qwen3-0.6b": ModelConfig(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                              num_heads=16, num_kv_heads=8, head_dim=128, tie_word_embeddings=True,
                              eos_token_id=151645, dtype="bfloat16"),
    "qwen3-1.7b": ModelConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=28,
                              num_heads=16, num_kv_heads=8, head_dim=128, tie_word_embeddings=True,
                              eos_token_id=151645, dtype="bfloat16"),
    "qwen3-4b": ModelConfig(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36,
                            num_heads=32, num_kv_heads=8, head_dim=128, tie_word_embeddings=True,
                            eos_token_id=151645, dtype="bfloat16"),
    # Tiny presets for tests and the CPU quickstart (vocab fits the byte tokenizer + specials).
    "tiny": ModelConfig(vocab_size=264, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, max_position_embeddings=2048),
    "small": ModelConfig(vocab_size=264, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8,
                         num_kv_heads=4, head_dim=32, max_position_embeddings=4096),
    "100m": ModelConfig(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_layers=12,
                        num_heads=12, num_kv_heads=4, head_dim=64, tie_word_embeddings=True),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}: expected one of {sorted(PRESETS)}")
    return PRESETS[name]


# ---------------------------------------------------------------- Hugging Face config.json

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM",)


def from_hf_dict(hf: dict[str, Any]) -> tuple[ModelConfig, ZaryaConfig | None]:
    """Reads a Hugging Face Qwen3 `config.json` dict (transformers 4 or 5 spelling of rope theta)."""
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if model_type != "qwen3" or (archs and not set(archs) & set(SUPPORTED_ARCHITECTURES)):
        raise ConfigError(
            f"unsupported architecture {archs or model_type!r} (model_type={model_type!r}): "
            f"supported are {list(SUPPORTED_ARCHITECTURES)} (model_type 'qwen3')")
    if hf.get("attention_bias"):
        raise ConfigError("attention_bias=True is not supported: Qwen3 checkpoints have no attention bias")
    if hf.get("use_sliding_window"):
        raise ConfigError("use_sliding_window=True is not supported: expected full attention in every layer")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"rope_type={rope_type!r} is not supported: expected 'default'")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    heads = hf["num_attention_heads"]
    first = lambda ids: (ids[0] if ids else None) if isinstance(ids, list) else ids  # a list of ids: its first
    eos, bos = first(hf.get("eos_token_id")), first(hf.get("bos_token_id"))
    dtype = hf.get("dtype", hf.get("torch_dtype")) or "float32"
    config = ModelConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, rope_theta=float(theta),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=hf.get("max_position_embeddings", 40960),
        dtype=dtype if dtype in _DTYPES else "float32",
        param_dtype=dtype if dtype in _DTYPES else "float32",
        mask_token_id=hf.get("mask_token_id"), eos_token_id=eos, pad_token_id=hf.get("pad_token_id"),
        bos_token_id=bos)
    zarya = hf.get("zarya")
    return config, (ZaryaConfig(**zarya) if zarya else None)


def to_hf_dict(config: ModelConfig, zarya: ZaryaConfig | None = None) -> dict[str, Any]:
    """Writes a transformers-5 Qwen3 `config.json` dict (rope theta in both spellings)."""
    hf = {
        "architectures": list(SUPPORTED_ARCHITECTURES), "model_type": "qwen3",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_theta": config.rope_theta, "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "dtype": config.param_dtype, "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id, "mask_token_id": config.mask_token_id,
        "bos_token_id": config.bos_token_id,
    }
    if zarya is not None:
        hf["zarya"] = dataclasses.asdict(zarya)
    return hf


def to_dict(config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = set(d) - known
    if unknown:
        raise ConfigError(f"unknown ModelConfig fields {sorted(unknown)}")
    return ModelConfig(**d)


def dumps(config) -> str:
    return json.dumps(to_dict(config), indent=2, sort_keys=True)
