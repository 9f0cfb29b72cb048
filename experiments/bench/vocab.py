"""The losses and one decode pass at Qwen3's vocabulary (V = 151,936 + the mask row) on this machine.

    python -m experiments.bench.vocab [--batch 4] [--length 256] [--hidden 64] [--repeats 3] [--out FILE.json]

A one-layer model of width `--hidden` with Qwen3's vocabulary, so the [B, L, V] logits dominate. For
each of: the Zarya loss and its gradient (`objectives.losses.zarya_loss`), Uno's drafter loss and its
gradient w.r.t. the adapter (`objectives.drafter.drafter_loss`, 2L rows), and AR decoding of 16 tokens
(`sampling.generate`), it prints the median wall time of `--repeats` runs after a compile and the compiled
program's temporary buffers (XLA's `memory_analysis().temp_size_in_bytes`: independent of the machine's
load), also as a multiple of one [B, L, V] float32 array.
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from zarya_jax import lora as lora_lib
from zarya_jax.config import LoraConfig, ModelConfig, ZaryaConfig
from zarya_jax.model import init_params
from zarya_jax.objectives import drafter as drafter_lib
from zarya_jax.objectives.losses import zarya_loss
from zarya_jax.sampling import GenerationConfig, generate

VOCAB = 151936 + 1  # Qwen3's rows plus <mdm_mask>


def _timed(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _temp_bytes(fn, args) -> int:
    return int(jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes)


def measure(batch: int = 4, length: int = 256, hidden: int = 64, repeats: int = 3) -> dict:
    config = ModelConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=32, max_position_embeddings=2 * length + 64,
                         mask_token_id=VOCAB - 1, eos_token_id=151645, pad_token_id=151643)
    params = init_params(config, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 151643, (batch, length)), jnp.int32)
    data = {"tokens": tokens, "segment_ids": jnp.ones((batch, length), jnp.int32),
            "positions": jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length)),
            "answer_mask": jnp.asarray(np.arange(length)[None] >= length // 4).repeat(batch, 0)}
    key = jax.random.PRNGKey(1)
    zcfg = ZaryaConfig(slotted_training=True)
    zarya = jax.jit(lambda p, b, k: jax.value_and_grad(zarya_loss, has_aux=True)(p, config, zcfg, b, k, 4))
    lora = LoraConfig(rank=4, alpha=8.0)
    adapter = lora_lib.init_lora(config, lora, jax.random.PRNGKey(2))
    dcfg = drafter_lib.DrafterConfig(block_sizes=(4,), kl_weight=0.1, ce_weight=0.1)

    def drafter(a, p, b, k):
        pair = drafter_lib.make_pair_batch(k, b, 4, config, lora)
        return jax.value_and_grad(drafter_lib.drafter_loss, has_aux=True)(a, p, config, lora, pair, dcfg)

    drafter_j = jax.jit(drafter)
    one = batch * length * VOCAB * 4
    rows = {}
    for name, fn, args in (("zarya_loss+grad", zarya, (params, data, key)),
                           ("drafter_loss+grad", drafter_j, (adapter, params, data, key))):
        temp = _temp_bytes(fn, args)
        rows[name] = {"median_s": round(_timed(fn, args, repeats), 3), "temp_mb": round(temp / 2**20, 1),
                      "temp_per_BLV_f32": round(temp / one, 2)}
    prompts = [list(map(int, tokens[i, :32])) for i in range(batch)]
    gc = GenerationConfig(mode="ar", max_new_tokens=16, temperature=1.0, stop_at_eos=False)
    decode = lambda: generate(params, config, prompts, gc, jax.random.PRNGKey(3)).tokens
    decode()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        decode()
        times.append(time.perf_counter() - t)
    rows["ar_decode_16_tokens"] = {"median_s": round(float(np.median(times)), 3),
                                   "per_token_ms": round(1000 * float(np.median(times)) / 16, 1)}
    return {"batch": batch, "length": length, "hidden": hidden, "vocab": VOCAB,
            "BLV_f32_mb": round(one / 2**20, 1), "results": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.bench.vocab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the result as JSON here")
    args = p.parse_args(argv)
    for name in ("batch", "length", "hidden", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}={getattr(args, name)}: expected ≥ 1")
    result = measure(args.batch, args.length, args.hidden, args.repeats)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        from zarya_jax.files import atomic_write

        atomic_write(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
