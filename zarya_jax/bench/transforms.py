"""Cost of the Zarya training transforms (docs/algorithms.md §2–§3) next to the model's forward + backward pass.

Times three jitted functions on the same packed batch, side by side:
  transform   the slotted or non-slotted transform alone (draws, masks, sort, window mask)
  model       forward + backward of the loss on precomputed transform outputs
  step        the full `value_and_grad(zarya_loss)` (transform + model + loss)
"""
from __future__ import annotations

import dataclasses
import statistics

import jax
import numpy as np

from .. import model as model_lib
from ..config import ZaryaConfig, preset
from ..data.batch import make_batch_rows
from ..objectives.losses import loss_from_logits, transform, zarya_loss
from .results import markdown_table, timings

MODES = {
    "slotted": ZaryaConfig(ordered_sampling=True, sequential_shuffle=True, diffusion_shuffle=True),
    "noise": ZaryaConfig(slotted_training=False, grouped_noise=True, noise_sorting=True, ordered_sampling=True,
                         sequential_shuffle=True, diffusion_shuffle=True, antithetic_sampling=True),
    "noise_bernoulli": ZaryaConfig(slotted_training=False),
}


@dataclasses.dataclass(frozen=True)
class TransformSettings:
    """Each transform of `modes` (keys of `MODES`) on `batch` packed rows of `length` tokens of `preset`,
    median of `iters` calls."""

    preset: str = "tiny"
    batch: int = 8
    length: int = 256
    slot_size: int = 8
    modes: tuple[str, ...] = tuple(MODES)
    iters: int = 20

    def check(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"--modes: unknown {bad}; expected a subset of {list(MODES)}")


def random_batch(rows: int, length: int, vocab: int, seed: int = 0) -> dict:
    """A packed batch of random prompt/answer examples filling `rows` rows of `length` tokens."""
    rng = np.random.default_rng(seed)
    examples = []
    for _ in range(rows * 8):
        p = int(rng.integers(1, max(2, length // 8)))
        a = int(rng.integers(1, max(2, length // 2)))
        ids = rng.integers(0, min(vocab, 256), size=min(p + a, length))
        examples.append((ids[:p].tolist(), ids[p:].tolist()))
    batch, _ = make_batch_rows(examples, length, 0, rows, pack=True)
    return batch


def _time(fn, *args, iters: int) -> float:
    call = lambda: jax.block_until_ready(fn(*args))  # noqa: E731
    call()  # compile + warm up
    return statistics.median(timings(call, iters))


def bench(model_config, zarya_config: ZaryaConfig, batch: dict, slot_size: int, iters: int = 20) -> dict:
    """Median seconds of transform, model fwd+bwd and full step; usable from other benchmarks."""
    params = model_lib.init_params(model_config, jax.random.PRNGKey(0))
    mask_id = model_config.mask_token_id
    key = jax.random.PRNGKey(1)
    batch = {k: jax.numpy.asarray(v) for k, v in batch.items()}

    f_transform = jax.jit(lambda k, b: transform(k, b, zarya_config, slot_size, mask_id))
    inputs = jax.block_until_ready(f_transform(key, batch))

    def model_loss(p, inp):
        logits, _ = model_lib.apply(p, model_config, inp["tokens"], inp["positions"], segment_ids=inp["segment_ids"])
        return loss_from_logits(logits, inp, zarya_config, slot_size)

    f_model = jax.jit(jax.value_and_grad(model_loss, has_aux=True))
    f_step = jax.jit(jax.value_and_grad(zarya_loss, has_aux=True), static_argnums=(1, 2, 5))
    t_transform = _time(f_transform, key, batch, iters=iters)
    t_model = _time(f_model, params, inputs, iters=iters)
    t_step = _time(f_step, params, model_config, zarya_config, batch, key, slot_size, iters=iters)
    return {"transform_s": t_transform, "model_fwd_bwd_s": t_model, "step_s": t_step,
            "transform_over_model": t_transform / t_model, "step_overhead": t_step / t_model - 1.0}


def measure(s: TransformSettings) -> tuple[list[dict], int]:
    """(a row per mode of `s`, the batch's answer tokens)."""
    s.check()
    config = preset(s.preset)
    if config.mask_token_id is None:  # presets carry the base vocabulary: use its last id as the mask
        config = config.replace(mask_token_id=config.vocab_size - 1)
    batch = random_batch(s.batch, s.length, config.vocab_size)
    rows = []
    for mode in s.modes:
        r = bench(config, MODES[mode], batch, s.slot_size, s.iters)
        rows.append({"mode": mode, "transform_ms": 1e3 * r["transform_s"], "fwd_bwd_ms": 1e3 * r["model_fwd_bwd_s"],
                     "step_ms": 1e3 * r["step_s"], "transform_over_fwd_bwd_pct": 100 * r["transform_over_model"],
                     **r})
    return rows, int(batch["answer_mask"].sum())


def markdown(rows: list[dict], answer_tokens: int, s: TransformSettings) -> str:
    head = (f"Transforms, device {jax.devices()[0].platform}, preset {s.preset}, batch {s.batch} × length "
            f"{s.length}, answer tokens {answer_tokens}, median of {s.iters}\n\n")
    return head + markdown_table(rows, ["mode", "transform_ms", "fwd_bwd_ms", "step_ms", "transform_over_fwd_bwd_pct"])
