"""Categorical sampling shared by every mode (docs/algorithms.md §4).

Order of the logit transforms (as Hugging Face's logits processors): mask token → −inf, repetition
penalty, temperature, top-k, top-p. Sampling is `argmax(logits/T + Gumbel)` with Gumbel noise built
from a uniform with 53 bits of precision: float64 when x64 is on, otherwise two uint32 words, so the
Gumbel tail is not truncated near 16.6 as with float32 uniforms (Zheng et al. 2025). Temperature 0 is
greedy. `temperature`, `top_k`, `top_p`, `repetition_penalty` are Python scalars (static).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
NEG_INF = -jnp.inf


def exclude_token(logits: Array, token_id: int | None) -> Array:
    """Sets one token's logit to −inf (the `<mdm_mask>` token is never sampled, docs/algorithms.md §4)."""
    if token_id is None:
        return logits
    return logits.at[..., token_id].set(NEG_INF)


def apply_repetition_penalty(logits: Array, presence: Array | None, penalty: float) -> Array:
    """CTRL penalty on tokens already present: positive logits / penalty, negative × penalty.

    logits [..., V]; presence bool broadcastable to logits ([B, V] or [B, 1, V]).
    """
    if presence is None or penalty == 1.0:
        return logits
    penalised = jnp.where(logits > 0, logits / penalty, logits * penalty)
    return jnp.where(presence, penalised, logits)


def filter_logits(logits: Array, top_k: int = 0, top_p: float = 1.0) -> Array:
    """Top-k then top-p (nucleus) filtering on already-tempered logits [..., V]; dropped tokens → −inf.

    Top-p keeps the smallest set of most likely tokens whose mass reaches `top_p` (the token that
    crosses the threshold is kept); ties at the cut-off are kept.
    """
    v = logits.shape[-1]
    if top_k and top_k < v:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits >= kth, logits, NEG_INF)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep = mass_before < top_p
        keep = keep.at[..., 0].set(True)
        # The smallest kept logit is the cut-off; everything at or above it stays.
        cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits >= cutoff, logits, NEG_INF)
    return logits


def process_logits(logits: Array, temperature: float, top_k: int = 0, top_p: float = 1.0,
                   repetition_penalty: float = 1.0, presence: Array | None = None,
                   exclude_id: int | None = None) -> Array:
    """All transforms of docs/algorithms.md §4 → tempered, filtered float32 logits [..., V] (temperature 0: untempered)."""
    logits = exclude_token(logits.astype(jnp.float32), exclude_id)
    logits = apply_repetition_penalty(logits, presence, repetition_penalty)
    if temperature > 0:
        logits = logits / temperature
    return filter_logits(logits, top_k, top_p)


def probs(logits: Array, temperature: float, top_k: int = 0, top_p: float = 1.0,
          repetition_penalty: float = 1.0, presence: Array | None = None,
          exclude_id: int | None = None) -> Array:
    """The exact distribution that `sample` draws from, float32 [..., V] (one-hot argmax when T = 0)."""
    z = process_logits(logits, temperature, top_k, top_p, repetition_penalty, presence, exclude_id)
    if temperature == 0:
        return jax.nn.one_hot(jnp.argmax(z, axis=-1), z.shape[-1], dtype=jnp.float32)
    return jax.nn.softmax(z, axis=-1)


def gumbel_from_words(w0: Array, w1: Array) -> Array:
    """Gumbel noise float32 from two uint32 words per draw (53 random bits: 21 of w0, 32 of w1).

    With b the 53 bits, v = (b + ½)/2^53 is uniform in (0, 1); v and 1 − v are both formed from
    integers (1 − v from the bitwise complement of b), so neither loses precision near 0. Then
    E = −log(1 − v) ~ Exp(1) is computed from whichever of v, 1 − v is below ½ (log1p for small v),
    so E keeps its relative precision at both ends, and the sample is −log(E): the tail reaches
    −log(2^−54) ≈ 37.4 instead of float32's ≈ 16.6.
    """
    hi = w0 >> 11
    lo = w1

    def value(h, l):
        return h.astype(jnp.float32) * (2.0 ** -21) + (l.astype(jnp.float32) + 0.5) * (2.0 ** -53)

    v = value(hi, lo)
    u = value((~hi) & jnp.uint32((1 << 21) - 1), ~lo)  # = 1 − v exactly on the grid
    e = jnp.where(v < 0.5, -jnp.log1p(-v), -jnp.log(u))
    return -jnp.log(e)


def gumbel(key: Array, shape) -> Array:
    """Standard Gumbel noise float32 [shape] from a 53-bit uniform (float64 when x64 is on)."""
    if jax.config.jax_enable_x64:
        u = jax.random.uniform(key, shape, jnp.float64, minval=jnp.finfo(jnp.float64).tiny, maxval=1.0)
        return (-jnp.log(-jnp.log(u))).astype(jnp.float32)
    words = jax.random.bits(key, (2,) + tuple(shape), jnp.uint32)
    return gumbel_from_words(words[0], words[1])


def sample(key: Array, logits: Array, temperature: float, top_k: int = 0, top_p: float = 1.0,
           repetition_penalty: float = 1.0, presence: Array | None = None,
           exclude_id: int | None = None) -> Array:
    """Draws token ids int32 [...] from logits [..., V] (docs/algorithms.md §4); temperature 0 → argmax."""
    z = process_logits(logits, temperature, top_k, top_p, repetition_penalty, presence, exclude_id)
    if temperature == 0:
        return jnp.argmax(z, axis=-1).astype(jnp.int32)
    return jnp.argmax(z + gumbel(key, z.shape), axis=-1).astype(jnp.int32)


def token_prob(logits: Array, tokens: Array, exclude_id: int | None = None) -> Array:
    """softmax(logits)[token] (untempered, mask token excluded), float32 [...]: the confidences and
    verification probabilities of mode B (docs/algorithms.md §6)."""
    p = jax.nn.softmax(exclude_token(logits.astype(jnp.float32), exclude_id), axis=-1)
    return jnp.take_along_axis(p, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def token_logprob(logits: Array, tokens: Array, temperature: float = 1.0, exclude_id: int | None = None) -> Array:
    """log softmax(logits / temperature)[token], float32 [...], the excluded token's mass 0: a token's
    log-probability under the policy before top-k / top-p / repetition penalty (the sampler's
    per-token log-probabilities, and a teacher-forced forward's)."""
    z = exclude_token(logits.astype(jnp.float32), exclude_id) / temperature
    logp = jax.nn.log_softmax(z, axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def presence_from(tokens: Array, valid: Array, vocab: int) -> Array:
    """bool [B, V]: which ids occur among the valid entries of tokens [B, T]."""
    b = tokens.shape[0]
    idx = jnp.where(valid, tokens, vocab)
    return jnp.zeros((b, vocab), bool).at[jnp.arange(b)[:, None], idx].set(True, mode="drop")
