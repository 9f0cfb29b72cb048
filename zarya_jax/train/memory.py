"""Will the train step fit? A per-device memory estimate made before anything is compiled or written,
checked against what the machine has, and out-of-memory errors turned into one line that names the knobs.

The estimate (`estimate_train_step`) adds up, per device, what the step holds at its peak:

- `state`: the train state on its shardings (fp32 master params, Adam moments, carry), exact;
- `gradients`: one fp32 gradient per trainable param on the params' shardings (two under gradient
  accumulation: the running sum and the micro-batch's), and `update`: the optimizer's update, one more;
- `weights`: the compute-dtype copies a step makes of the vocabulary matrix (the tied head) and of the
  two layers in flight (gathered ones under FSDP), and under FSDP the whole embedding gradient, which the
  compiler sums before slicing it (`train.step`);
- `activations`: per micro-batch, rows per device × length × the objective's forward passes tokens, each
  layer keeping its residuals for the backward pass — everything it computes without remat, its input only
  with `model.remat` (policy `full`), the matmul outputs (`dots`) or q/k/v and the attention output (`qkv`) —
  plus one layer's whole working set during its backward, the dense kernel's fp32 scores and probabilities
  when attention is dense (`nn.attention.resolve`), and the embedding and final hidden states;
- `logits`: one block of the blockwise loss (`objectives.losses.SEQ_CHUNK` positions × the vocabulary, fp32)
  with its gradient;
- `checkpoint copy` (CPU, `train.async_checkpointing`): an asynchronous save copies the state into host
  memory while the next steps run. A synchronous save makes that copy between steps: the run's peak is
  then the larger of the step and the state with its copy (`Estimate.save`; at Qwen3-0.6B's shape the
  save's 13.3 GiB, over a 11.6 GiB step at 1 × 128).

Against XLA's own buffer assignment (`compiled.memory_analysis()`: arguments + outputs − donated +
temporaries) on CPU the estimate is 1.0 to 1.3 times the compiled step's peak for the configurations
`tests/test_train_memory.py` compiles (tiny and real-vocabulary models, with and without remat,
accumulation, bf16, FSDP, the non-slotted objective; the test asserts 0.9 to 2): conservative, since the
allocator and the runtime around the program need room too.

What a device has (`available`): on CPU, the host's available memory (`/proc/meminfo` MemAvailable, capped
by a cgroup limit), shared by every CPU device of the process; on an accelerator, its allocator's
`bytes_limit` less what is in use. Unknown (no such statistics): no check.
"""
from __future__ import annotations

import dataclasses
import math
import os
import resource

import jax
import numpy as np

from ..config import ConfigError, ModelConfig
from ..nn import attention
from ..objectives.losses import SEQ_CHUNK

GIB = 1 << 30
# Bytes the step's dense attention keeps per token and key: fp32 scores, probabilities and their
# gradient, and the boolean mask.
_DENSE_ATTENTION_BYTES = 3 * 4
CHECKPOINT_COPY = "checkpoint copy"


class OutOfMemoryError(ConfigError):
    """The train step does not fit the machine's memory (estimated before compiling, or reported by XLA).
    Exit 2: a bad input (the batch, length or remat the config asks for), not a failure of the run."""


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Per-device bytes of a train step, by part (`parts`), the number of devices that draw on one memory
    pool (`devices`: every CPU device of this process shares the host's memory; an accelerator has its
    own), and the bytes a synchronous checkpoint save holds per device between steps (`save`: the state and
    its host copy, 0 where it is not counted)."""

    parts: dict[str, int]
    devices: int = 1
    save: int = 0

    @property
    def per_device(self) -> int:
        """Bytes of the step itself, per device."""
        return int(sum(self.parts.values()))

    @property
    def peak(self) -> int:
        """Per-device bytes at the run's peak: the step, or a save where that holds more."""
        return max(self.per_device, self.save)

    @property
    def pool(self) -> int:
        """Bytes of the memory pool the run draws on: the per-device peak × the devices sharing it."""
        return self.peak * self.devices

    def describe(self) -> str:
        """'18.76 GiB (per device: state 6.66 GiB, …)', the largest parts first."""
        parts = ", ".join(f"{k} {size(v)}" for k, v in sorted(self.parts.items(), key=lambda kv: -kv[1]) if v)
        if self.save > self.per_device:
            parts = f"saving a checkpoint: the state and its host copy {size(self.save)}; the step: {parts}"
        where = f"{self.devices} CPU devices × {size(self.peak)}" if self.devices > 1 else "per device"
        return f"{size(self.pool)} ({where}: {parts})"


def size(n: float) -> str:
    """Bytes as GiB, or MiB below one GiB."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def _shard_bytes(tree, shardings, itemsize: int | None = None) -> int:
    """Bytes one device holds of `tree` (ShapeDtypeStructs) on `shardings` (the largest shard of each
    leaf), at the leaves' own dtypes or `itemsize` bytes per element."""
    leaves = jax.tree.leaves(tree)
    shs = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    return sum(math.prod(sh.shard_shape(x.shape)) * (itemsize or np.dtype(x.dtype).itemsize)
               for x, sh in zip(leaves, shs))


def _layer_params(c: ModelConfig) -> int:
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size


def _activations(c: ModelConfig, tokens: int, length: int, dense: bool, cpu: bool) -> dict[str, int]:
    """Bytes of the layer stack's activations for `tokens` tokens per device in rows of `length`. On CPU at
    fp32 whatever the compute dtype: XLA:CPU computes bf16 matmuls and elementwise ops in fp32."""
    s = 4 if cpu else np.dtype(c.jnp_dtype).itemsize
    d, f = c.hidden_size, c.intermediate_size
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    # One layer's whole working set per token: the residual stream and norms (6 d), q before and after its
    # norm and RoPE and the attention output (5 q), k and v likewise (4 kv), the MLP's gate, up, SiLU and
    # product (4 f); plus the dense kernel's per-key fp32 arrays and mask.
    per_token = (6 * d + 5 * q + 4 * kv + 4 * f) * s + (_DENSE_ATTENTION_BYTES * c.num_heads + 1) * length * dense
    if not c.remat:
        kept = per_token
    elif c.remat_policy == "dots":  # the layer input and the outputs of its weight matmuls
        kept = (3 * d + q + 2 * kv + 2 * f) * s
    elif c.remat_policy == "qkv":  # the layer input, q, k, v and the attention output
        kept = (d + 2 * q + 2 * kv) * s
    else:  # full: the layer input only
        kept = d * s
    return {"activations": tokens * (c.num_layers * kept + per_token + 2 * d * (s + 4))}


def estimate_train_step(model_config: ModelConfig, abstract_state: dict, state_shardings: dict, mesh, *,
                        batch_size: int, max_length: int, grad_accum: int, forward_passes: float = 1.0,
                        async_checkpointing: bool = True) -> Estimate:
    """The per-device memory of one train step of `model_config` at a global batch of `batch_size` rows of
    `max_length` tokens in `grad_accum` micro-batches on `mesh` (see the module doc); `abstract_state`
    with `state_shardings` as the loop builds them (`train.step.init_state`, `state_shardings`)."""
    c = model_config
    fsdp, tensor = mesh.shape["fsdp"], mesh.shape["tensor"]
    rows = max(1, -(-batch_size // (grad_accum * mesh.shape["data"] * fsdp)))
    s = np.dtype(c.jnp_dtype).itemsize
    grads_f32 = _shard_bytes(abstract_state["params"], state_shardings["params"], itemsize=4)
    table = c.vocab_size * c.hidden_size
    weights = (table // tensor + 2 * _layer_params(c) // tensor) * s
    if fsdp > 1:
        weights += table * 4 // tensor
    platform = mesh.devices.flat[0].platform
    cpu = platform == "cpu"
    dense = attention.resolve(c.attention, "gpu" if platform in ("cuda", "rocm") else platform, c.jnp_dtype,
                              max_length, c.head_dim) == "dense"
    tokens = int(rows * max_length * forward_passes)
    parts = {"state": _shard_bytes(abstract_state, state_shardings),
             "gradients": grads_f32 * (2 if grad_accum > 1 else 1),
             "update": grads_f32,
             "weights": weights,
             **_activations(c, tokens, max_length, dense, cpu),
             "logits": 2 * rows * min(SEQ_CHUNK, max_length) * c.vocab_size * 4}
    # Saving copies the state into host memory. Asynchronously the copy lives on while the next steps run;
    # synchronously it is made between steps, when only the state is held besides it.
    save = 0
    if cpu and async_checkpointing:
        parts[CHECKPOINT_COPY] = parts["state"]
    elif cpu:
        save = 2 * parts["state"]
    return Estimate(parts, len(mesh.local_devices) if cpu else 1, save)


# ---------------------------------------------------------------- what the machine has


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_available() -> int | None:
    """Bytes of host memory a new allocation can take now: MemAvailable, capped by the cgroup's limit
    less its usage (v2 or v1) when there is one. None where neither can be read."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:
            avail = max(limit - usage, 0) if avail is None else min(avail, max(limit - usage, 0))
            break
    return avail


def available(device) -> tuple[int | None, str]:
    """(bytes the train step can use on `device`'s memory pool, what it is) — None when unknown."""
    if device.platform == "cpu":
        avail = host_available()
        return avail, "host memory available" if avail is not None else "unknown host memory"
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - a backend without statistics
        stats = {}
    limit = stats.get("bytes_limit")
    if not limit:
        return None, f"unknown memory of {device.device_kind}"
    return int(limit) - int(stats.get("bytes_in_use", 0)), f"free on one {device.device_kind}"


def peak_used(device) -> tuple[int | None, str]:
    """(the most memory this process has used so far on `device`'s pool, what it is): the peak resident
    set of the process on CPU, the allocator's peak on an accelerator."""
    if device.platform == "cpu":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak resident memory of the process"
    try:
        peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
    except Exception:  # noqa: BLE001
        peak = None
    return (int(peak), f"peak allocated on one {device.device_kind}") if peak else (None, "unknown")


# ---------------------------------------------------------------- the check and the error


def remedies(model_config: ModelConfig, mesh, async_checkpointing: bool = False) -> str:
    """The knobs that lower a train step's memory, for the error line."""
    knobs = ["a smaller data.batch_size or data.max_length", "optim.grad_accum_steps (micro-batches)"]
    if not model_config.remat or model_config.remat_policy != "full":
        knobs.append("model.remat=true (model.remat_policy=full)")
    if model_config.dtype == "float32":
        knobs.append("model.dtype=bfloat16")
    if mesh.devices.flat[0].platform != "cpu":
        knobs.append("more devices for mesh.fsdp")
    elif async_checkpointing:
        knobs.append("train.async_checkpointing=false")
    return ", ".join(knobs)


def check(estimate: Estimate, device, model_config: ModelConfig, mesh) -> str:
    """Raises OutOfMemoryError when `estimate` exceeds what `device`'s pool has; returns a line saying how
    they compare (for the log)."""
    have, what = available(device)
    if have is None:
        return f"memory: estimated {estimate.describe()}; {what}, not checked"
    if estimate.pool > have:
        raise OutOfMemoryError(
            f"the train step needs an estimated {estimate.describe()} but {what} is {size(have)}: lower "
            f"it with {remedies(model_config, mesh, CHECKPOINT_COPY in estimate.parts)} (or skip this check with "
            "train.memory_check=false)")
    return f"memory: estimated {estimate.describe()} of {size(have)} {what}"


def is_out_of_memory(e: BaseException) -> bool:
    """An error XLA raises when an allocation fails (compiling or running a program)."""
    text = str(e)
    return isinstance(e, MemoryError) or (
        type(e).__name__ in ("XlaRuntimeError", "JaxRuntimeError")
        and ("RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text))


def out_of_memory_error(e: BaseException, estimate: Estimate | None, model_config: ModelConfig, mesh,
                        where: str) -> OutOfMemoryError:
    """The one-line error for an out-of-memory `e` raised `where` (e.g. 'compiling the train step')."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    est = f" (estimated {estimate.describe()})" if estimate is not None else ""
    return OutOfMemoryError(f"out of memory {where}{est}: {first[:300]}; lower it with "
                            f"{remedies(model_config, mesh, estimate is not None and CHECKPOINT_COPY in estimate.parts)}")
