"""The one inference entry point (docs/algorithms.md §4): validate, pad/bucket the prompts, run one compiled program.

The generation config's mode (`mode.Mode`) carries its `decoder.Decoder`; `generate` does what the
modes share. Each decoder is one `jax.jit` with the model config, the generation config (its mode's
`static()`: the traced fields reset), the adapter config and `debug` static, so a program is compiled
once per (batch size, prompt bucket, model config, generation config) and a call with new prompts of
the same bucket reuses it. The mode's TRACED fields (mode B's thresholds and AR corrections, mode A's
α0, planned order and sequential convention, Ψ-Spec's `draft_when_active_below`) are passed as traced
scalars instead — the mode object itself, its traced fields as arrays — so sweeping them reuses one
program. `TRACE_COUNTS[mode name]` counts traces (for tests).
"""
from __future__ import annotations

import collections
import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import ar, decoding
from .config import GenerationConfig, GenerationOutput
from .decoder import Decoder
from ..nn import hf_params
from .prompts import as_prompt_list, pad_prompts

TRACE_COUNTS: collections.Counter = collections.Counter()


@functools.cache
def _jitted(decoder: Decoder):
    """The decoder's run under one `jax.jit` (one per decoder, compiled per static key)."""

    def traced(params, lora_params, draft_params, tokens, lengths, key, knobs, *, config, gcfg, lora, draft_config,
               debug, mesh=None):
        TRACE_COUNTS[gcfg.mode.name] += 1  # runs only while tracing
        extra = {"lora_params": lora_params, "lora": lora} if decoder.uses_adapter else {}
        if decoder.uses_draft_model:
            extra = {"draft_params": draft_params, "draft_config": draft_config}
        # The mesh as the context mesh: activations pinned to its batch axes, and the attention kernel
        # chosen for its platform and run per shard (a Pallas kernel cannot be partitioned by XLA).
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if mesh is not None else contextlib.nullcontext():
            names = [k for k in extra if k.endswith("params")]
            params, *weights = decoding.layer_weights((params, *(extra[k] for k in names)), gcfg.layer_loop)
            extra.update(zip(names, weights))
            return decoder.run(params, tokens, lengths, key, config=config, gcfg=gcfg, debug=debug, knobs=knobs,
                               **extra)

    return jax.jit(traced, static_argnames=("config", "gcfg", "lora", "draft_config", "debug", "mesh"))


def decoder_of(gc: GenerationConfig, use_cache: bool = True) -> Decoder:
    """The decoder that runs `gc`: its mode's, or the uncached AR baseline (`use_cache=False`, mode ar only)."""
    if use_cache:
        return gc.mode.decoder
    if not isinstance(gc.mode, ar.AR):
        raise ValueError(f"use_cache=False is only available for mode 'ar', not {gc.mode.name!r}")
    return ar.UNCACHED


def mesh_of(*trees) -> jax.sharding.Mesh | None:
    """The mesh the first `NamedSharding`-placed leaf of `trees` lives on (params loaded onto a mesh),
    or None (arrays on one device, or not yet placed)."""
    for leaf in jax.tree.leaves(trees):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding):
            return sharding.mesh
    return None


def static_key(gc: GenerationConfig) -> GenerationConfig:
    """The part of a generation config that selects a compiled program: the mode as `Mode.static()`
    sees it (its traced fields reset)."""
    return gc.replace(mode=gc.mode.static())


def _program(params, config, prompts, gc: GenerationConfig, *, lora_params, lora, draft_params, draft_config,
             use_cache: bool):
    """Validates a call at the edge → (decoder, the jitted args that do not depend on the prompts' values,
    its static kwargs, padded tokens, lengths)."""
    if not isinstance(gc, GenerationConfig):
        raise ValueError(f"generation_config: expected a GenerationConfig, got {type(gc).__name__}")
    prompts = as_prompt_list(prompts)
    gc.validate(config, prompts)
    hf_params.check_params(params, config)  # another config's params: one error naming the param
    decoder = decoder_of(gc, use_cache)
    drafting = decoder.uses_draft_model
    decoder.check(config, gc, *((draft_params, draft_config) if drafting else (lora_params, lora)))
    adapter = decoder.uses_adapter and getattr(gc.mode, "drafter", None) == "lora"
    _, pad = decoding.special_ids(config, gc)
    tokens, lengths = pad_prompts(prompts, gc.prompt_bucket, pad)
    weights = (params, lora_params if adapter else None, draft_params if drafting else None)
    static = {"config": config, "gcfg": static_key(gc),  # the traced fields are arguments: no recompile per value
              "lora": lora if adapter else None, "draft_config": draft_config if drafting else None}
    return decoder, weights, static, tokens, lengths


def generate(params, config, prompts, generation_config: GenerationConfig, key, *, lora_params=None, lora=None,
             draft_params=None, draft_config=None, debug: bool = False, use_cache: bool = True,
             mesh: jax.sharding.Mesh | None = None) -> GenerationOutput:
    """Generates continuations of `prompts` (list of B token-id lists or 1-D integer arrays, or one integer
    array [B, L]) → `GenerationOutput`.

    Runs the decoder of `generation_config.mode`: "ar" (docs/algorithms.md §4), "mdm" (mode A, §5),
    "slotted" (mode B, §6), "spec-*" (§7; `lora_params`/`lora`, the drafter adapter with its noise
    convention, are used by "spec-lora" and "spec-lora-fused" only, `draft_params`/`draft_config`, a
    separate draft model with the base's vocabulary and special ids, by "spec-model" only: the other
    modes run the base weights). `use_cache=False` runs the AR baseline without a KV cache (mode "ar"
    only); `debug=True` adds per-pass logits to `stats["trace"]`
    (modes ar/mdm/slotted). `mesh`: the device mesh the program runs on (default: the mesh the params are
    placed on, if any): the decoder is traced with it as the context mesh, so activations follow its
    batch axes and attention runs the kernel of its platform per shard (splash on a TPU). Raises
    ValueError on bad input (prompts, config, params of another config) before anything is compiled.
    """
    gc = generation_config
    decoder, weights, static, tokens, lengths = _program(
        params, config, prompts, gc, lora_params=lora_params, lora=lora, draft_params=draft_params,
        draft_config=draft_config, use_cache=use_cache)
    # NumPy inputs go to the jitted program as they are: converting each with jnp.asarray first costs more
    # host time per call (10–16 µs an array) than the program's own transfer.
    raw = _jitted(decoder)(*weights, tokens, lengths, key, gc.mode.arrays(), **static,
                           debug=debug, mesh=mesh if mesh is not None else mesh_of(params))
    raw = jax.device_get(raw)
    out_lengths = np.asarray(raw["lengths"], np.int32)
    nfe = np.asarray(raw["num_forward_passes"], np.int32)
    tpf = (out_lengths / np.maximum(nfe, 1)).astype(np.float32)
    stats = {"mode": gc.mode.name, "loop_passes": int(raw["loop_passes"]),
             "mean_tokens_per_forward": float(tpf.mean()), "prompt_width": int(tokens.shape[1])}
    stats.update(decoder.stats(raw, gc, tokens, lengths, out_lengths))
    if debug and "trace" in raw:
        stats["trace"] = raw["trace"]
        stats["raw_physical"] = {k: raw[k] for k in ("physical_tokens", "physical_positions") if k in raw}
    logprobs = None
    if "logprobs" in raw:
        written = np.arange(gc.max_new_tokens)[None, :] < out_lengths[:, None]
        logprobs = np.where(written, np.asarray(raw["logprobs"], np.float32), np.float32(0))
    return GenerationOutput(tokens=np.asarray(raw["tokens"], np.int32), lengths=out_lengths,
                            num_forward_passes=nfe, tokens_per_forward=tpf, stats=stats, logprobs=logprobs)


def lower(params, config, generation_config: GenerationConfig, batch: int, prompt_length: int, *, mesh,
          lora_params=None, lora=None, draft_params=None, draft_config=None) -> jax.stages.Lowered:
    """The program `generate` runs for `batch` prompts of `prompt_length` tokens on `mesh`, lowered and not
    run: `params` (and the drafter's weights) may be ShapeDtypeStructs carrying their shardings, and the
    mesh's devices need not be this host's (a TPU topology compiled on a CPU host, `zarya_jax.target`).
    The prompts are split over the mesh's batch axes where `batch` divides them; the key and knobs are
    replicated. `.compile()` it for the target's memory analysis."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from ..nn.partitioning import spec_for

    gc = generation_config
    decoder, weights, static, tokens, lengths = _program(
        params, config, [[0] * prompt_length] * batch, gc, lora_params=lora_params, lora=lora,
        draft_params=draft_params, draft_config=draft_config, use_cache=True)
    rows = NamedSharding(mesh, spec_for((batch,), ("batch",), mesh))
    placed = lambda x, sharding: jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype, sharding=sharding)
    replicated = lambda tree: jax.tree.map(lambda x: placed(x, NamedSharding(mesh, P())), tree)
    tokens = placed(tokens, NamedSharding(mesh, P(*rows.spec, None)))
    knobs = replicated(gc.mode.arrays())
    key = replicated(jax.random.PRNGKey(0))
    return _jitted(decoder).lower(*weights, tokens, placed(lengths, rows), key, knobs, **static, debug=False,
                                  mesh=mesh)
