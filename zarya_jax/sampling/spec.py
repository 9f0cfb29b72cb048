"""Ψ-Spec lossless speculative sampling (docs/algorithms.md §7): Uno's gated-LoRA drafter, or Zarya self-speculation.

One cycle, per batch row, with the cache holding the committed text except its last token (the seed
at logical position n−1):
1. Draft pass against the cache.
   - `SpecLora` (mode "spec-lora"): `[seed, z1 … z_{F−1}]` at positions n−1 … n+F−2, gate off on the seed row and on
     for the noise rows, by the adapter's own convention (`LoraConfig.noise`: uniform random ids, or
     mask tokens if the adapter was trained so). Row 0 is
     the exact AR distribution p0; row j ≥ 1 is the draft q_j for position n+j (next-token convention).
   - `SpecSelf` (mode "spec-self", Zarya models, no LoRA): `[seed, mask × F]` at positions n−1 … n+F−1, one set of
     weights. Row 0 gives p0 (AR convention, it sees only committed text); the mask row at n+j gives
     q_j for its own position (MDM convention), j = 1 … F−1. The mask at n is context only (c0 is
     drawn from p0).
   c0 ~ p0, c_j ~ q_j. Nothing is committed. (`proposal` = "argmax" / "tempered" draws c_j = argmax q_j
   / c_j ~ softmax(log q_j / τ) instead, and q_j below stands for that distribution: docs/algorithms.md §7.8.)
2. Verify pass with the AR weights over `[seed, c0 … c_{F−1}]` at n−1 … n+F−1 against the same cache:
   row j + 1 gives p_{j+1} (the seed row recomputes the seed's AR K/V, so the cache is not written
   between the passes).
3. c0 is exact; c_j (j ≥ 1) is accepted left to right with probability min(1, p_j(c_j)/q_j(c_j)); at the
   first rejection a correction ~ normalize(max(0, p_j − q_j)); if all pass, a bonus ~ p_F. Greedy
   (temperature 0): accept iff c_j = argmax p_j; the correction/bonus is argmax p.
4. Commit the verify pass's K/V of the seed and c0 … c_m (one scatter into the loop-carried cache, in
   place); the correction/bonus is the next seed.
So every cycle yields m+2 tokens for two forward passes, and the output distribution is the AR
model's (the drafts only change how many tokens a cycle yields). Each emitted token's AR logits are
already at hand (the seed row for c0, verify row j − 1 for index j ≥ 1), so its log-probability under
the AR policy (`decoding.logprobs_of`) costs no extra pass.

Fixed shapes: every row runs every cycle; a row's acceptance m, its cache length and its output
offset are per-row arrays; finished rows (EOS or budget) stop committing. The whole decode is one
`lax.while_loop` inside one jit.

Multi-pass LoRA drafts (`SpecLora.draft_passes` = K > 1, docs/algorithms.md §7.7): after pass 1, passes 2 … K re-draft
the window `[seed, c0 … c_{F−2}]` (each row holds the previous pass's draft for its position) and redraw
c_1 … c_{F−1} from their q; the last pass's q is verified. K + 1 passes per cycle.

Statistics: `accepted_per_cycle` (mean of 1+m, the number of the F drafted tokens c0 … c_{F−1} kept),
`tokens_per_cycle` (mean of m+2), `tokens_per_forward` (generated tokens / decode forward passes,
two per cycle, K + 1 with K draft passes), `acceptance_by_position` (per draft index j: P(c_j accepted | c_j examined); index 0
is c0, always 1).

`DECODER` puts the mode behind `generate()` (validation, padding and output assembly shared with the
other modes); `spec_decode` is the jitted decode itself, with the cycle budget as a traced argument.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ConfigError, LoraConfig, ModelConfig, missing_mask_token
from ..nn import kv_cache
from .. import model as model_lib
from ..lora import check_lora, noise_tokens, redraft_tokens
from . import decoding, primitives
from .config import GenerationConfig
from .decoder import Decoder
from .mode import Mode, expect_choice, expect_fraction, expect_int

Array = jax.Array


PROPOSALS = ("sample", "argmax", "tempered")


@dataclasses.dataclass(frozen=True)
class Speculative(Mode):
    """The knobs every speculative mode shares (`TwoPass`, `fused.Fused`, `spec_model.SpecModel`).

    draft_length: the drafts per cycle (F, or K in the fused modes).
    proposal: how a draft is drawn from the drafter's distribution q (after temperature, top-k, top-p
      and the repetition penalty) at temperature > 0, and so what it is verified against
      (docs/algorithms.md §7.8): "sample" c ~ q; "argmax" c = argmax q, a point mass (accepted with
      probability p(c)); "tempered" c ~ softmax(log q / proposal_temperature). Every choice is lossless;
      greedy decoding ignores it. Static: each choice computes something else (argmax draws no noise).
    proposal_temperature: τ > 0 of "tempered" (τ → 0 is "argmax", τ = 1 "sample"); read by no other
      proposal. Traced: a sweep over τ reuses one program.
    """

    TRACED = ("proposal_temperature",)
    CHOICES = {"proposal": PROPOSALS}
    lossless = True
    drafter: ClassVar[str]

    draft_length: int = 8
    proposal: str = "sample"
    proposal_temperature: float = 0.5

    def check(self, gc) -> None:
        expect_int(self, "draft_length", 1)
        expect_choice(self, "proposal")
        tau = self.proposal_temperature
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 < tau < math.inf:
            raise ValueError(f"{self.knob_name('proposal_temperature')}={tau!r}: expected a finite temperature > 0")

    def canonical(self, max_new_tokens: int) -> "Speculative":
        """Only the tempered proposal reads τ: the others take its default."""
        if self.proposal == "tempered":
            return self
        return dataclasses.replace(self, proposal_temperature=type(self).proposal_temperature)

    def lookahead_source(self) -> str:  # every speculative mode's look-ahead is set by its draft length
        return f"{self.name}'s draft_length={self.draft_length}"

    def proposal_label(self) -> str:
        """"", " argmax" or " tempered τ=…" for `short`."""
        if self.proposal == "sample":
            return ""
        return f" {self.proposal}" + (f" τ={self.proposal_temperature:g}" if self.proposal == "tempered" else "")


@dataclasses.dataclass(frozen=True)
class TwoPass(Speculative):
    """The knobs of two-pass Ψ-Spec with either drafter (`SpecSelf`, `SpecLora`): `Speculative`'s, with
    draft_length F (the drafts c0 … c_{F−1} of a cycle), and

    draft_when_active_below: a cycle drafts only while the still-active rows are at most this fraction
      of the batch, else it is one AR pass (one token, one forward): speculation where decoding is
      memory-bound, in the same compiled loop. 1.0 drafts every cycle, 0.0 never drafts (plain AR
      through the spec loop). Traced: no recompile per value.
    """

    TRACED = Speculative.TRACED + ("draft_when_active_below",)

    draft_when_active_below: float = 1.0

    def check(self, gc) -> None:
        super().check(gc)
        expect_fraction(self, "draft_when_active_below", "a fraction of the batch's rows in [0, 1]")

    def lookahead(self) -> int:
        return self.draft_length  # the cache's slack rows: the last cycle's drafts past the budget

    def short(self) -> str:
        return f"F={self.draft_length}" + self.proposal_label()


@dataclasses.dataclass(frozen=True)
class SpecSelf(TwoPass):
    """Zarya self-speculation: the base drafts from mask rows (one set of weights)."""

    name = "spec-self"
    label = "spec, self drafter"
    drafter = "self"
    needs_mask_token = True


@dataclasses.dataclass(frozen=True)
class SpecLora(TwoPass):
    """Uno's gated-LoRA drafter (`generate`'s `lora_params`, `lora`). draft_passes: draft passes per cycle
    (docs/algorithms.md §7.7); pass k re-drafts the block from pass k−1's drafts, the last pass's q is
    verified (lossless for any k)."""

    name = "spec-lora"
    label = "spec, LoRA drafter"
    drafter = "lora"

    draft_passes: int = 1

    def check(self, gc) -> None:
        super().check(gc)
        expect_int(self, "draft_passes", 1)


# --------------------------------------------------------------------------- accept / residual
def accept_drafts(p: Array, q: Array, drafts: Array, key: Array, *, greedy: bool) -> tuple[Array, Array]:
    """Speculative acceptance for K drafts per row (docs/algorithms.md §7.3 step 3).

    p: [b, K+1, V] target probs at the K draft positions plus the bonus position; q: [b, K, V] the
    distributions the drafts were drawn from (`proposal`: q itself, a point mass or a tempered q);
    drafts: int [b, K] (c_j ~ q_j). Lossless for any q (§7.8); a point mass at c accepts with p(c) and
    its residual is p without c.
    Returns (m int [b] ∈ 0…K accepted prefix length, token int [b]: the correction at index m if m < K,
    else the bonus from p[:, K]).
    """
    b, k = drafts.shape
    ku, kr = jax.random.split(key)
    if greedy:
        ok = drafts == jnp.argmax(p[:, :k], axis=-1)
    else:
        pc = jnp.take_along_axis(p[:, :k], drafts[..., None], axis=-1)[..., 0]
        qc = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
        # u < p/q written without the division: q(c) > 0 because c was drawn from q (a point mass: q(c) = 1)
        ok = accept_uniform(ku, (b, k)) * qc < pc
    m = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
    p_m = jnp.take_along_axis(p, m[:, None, None], axis=1)[:, 0]
    q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)  # q = 0 at the bonus row → residual = p_K
    q_m = jnp.take_along_axis(q_pad, m[:, None, None], axis=1)[:, 0]
    if greedy:
        return m, jnp.argmax(p_m, axis=-1).astype(jnp.int32)
    residual = jnp.maximum(p_m - q_m, 0.0)
    # p = q to rounding leaves no residual mass; any rejection there has probability ~0, fall back to p
    residual = jnp.where(residual.sum(-1, keepdims=True) > 0, residual, p_m)
    return m, sample_from_probs(kr, residual)


# --------------------------------------------------------------------------- distributions
def accept_uniform(key: Array, shape) -> Array:
    """Acceptance uniforms: float64 with x64, else float32. Unlike a Gumbel tail, the test u·q < p only
    needs absolute precision, so float32's 2^-24 grid biases an acceptance by at most 6e-8."""
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    return jax.random.uniform(key, shape, dtype)


def sample_from_probs(key: Array, probs: Array) -> Array:
    """An exact categorical draw from normalize(probs) [..., V]: argmax(log probs + 53-bit Gumbel)."""
    logp = jnp.where(probs > 0, jnp.log(jnp.where(probs > 0, probs, 1.0)), -jnp.inf)
    return jnp.argmax(logp + primitives.gumbel(key, probs.shape), axis=-1).astype(jnp.int32)


def target(config: ModelConfig, gcfg: GenerationConfig):
    """(dist, draw) with the config's knobs: dist(logits [..., V], presence) is the exact distribution
    the AR sampler draws from (p, and q by the same rule), draw(key, logits, presence) one token from it."""

    def dist(logits, presence):
        return primitives.probs(logits, gcfg.temperature, gcfg.top_k, gcfg.top_p, gcfg.repetition_penalty,
                                presence, config.mask_token_id)

    def draw(key, logits, presence):
        return primitives.sample(key, logits, gcfg.temperature, gcfg.top_k, gcfg.top_p, gcfg.repetition_penalty,
                                 presence, config.mask_token_id)

    return dist, draw


def proposal(config: ModelConfig, gcfg: GenerationConfig, tau: Array | float | None = None):
    """(qdist, qdraw) of the mode's `proposal` (docs/algorithms.md §7.8), as `target`'s pair for the drafts:
    qdraw(key, logits, presence) draws drafts from the drafter's logits, qdist(logits, presence) is the
    distribution they were drawn from, which `accept_drafts` verifies them against. "sample" is `target`
    itself (c ~ q); "argmax" the point mass at argmax q; "tempered" softmax(log q / τ) with τ = `tau`
    (traced; None: the mode's `proposal_temperature`). Greedy (temperature 0): `target`, whatever the
    proposal (the draft is argmax q and verification compares argmaxes)."""
    dist, draw = target(config, gcfg)
    kind = gcfg.mode.proposal if gcfg.temperature > 0 else "sample"
    if kind == "sample":
        return dist, draw
    knobs = (gcfg.top_k, gcfg.top_p, gcfg.repetition_penalty)
    if kind == "argmax":  # argmax q is the argmax of the untempered, unfiltered logits (penalty and mask applied)
        return (lambda logits, presence: primitives.probs(logits, 0.0, *knobs, presence, config.mask_token_id),
                lambda key, logits, presence: primitives.sample(key, logits, 0.0, *knobs, presence,
                                                                config.mask_token_id))
    tau = gcfg.mode.proposal_temperature if tau is None else tau

    def log_q(logits, presence):  # log q / τ, up to a constant per row; −inf off q's support
        return primitives.process_logits(logits, gcfg.temperature, *knobs, presence, config.mask_token_id) / tau

    def qdraw(key, logits, presence):
        z = log_q(logits, presence)
        return jnp.argmax(z + primitives.gumbel(key, z.shape), axis=-1).astype(jnp.int32)

    return (lambda logits, presence: jax.nn.softmax(log_q(logits, presence), axis=-1)), qdraw


def presence_rows(presence: Array | None, tokens: Array) -> Array | None:
    """bool [b, t, V]: row i's repetition-penalty set = committed text plus tokens[:, :i+1]."""
    if presence is None:
        return None
    seen = jnp.cumsum(jax.nn.one_hot(tokens, presence.shape[-1], dtype=jnp.int32), axis=1) > 0
    return presence[:, None, :] | seen


# --------------------------------------------------------------------------- the decode loop
def draft_pass(params, lora_params, cache: dict, seed: Array, n: Array, key: Array, *, config: ModelConfig,
               draft_length: int, drafter: str, lora: LoraConfig | None):
    """The draft pass of one cycle (docs/algorithms.md §7.3 step 1) against `cache` (committed text minus the seed);
    the LoRA drafter's noise rows follow the adapter's `lora.noise`.

    seed int [b] at logical position n−1 (n int [b]). Returns (logits fp32 [b, F, V]: row 0 the AR
    logits for position n, row j the draft logits for position n+j; window K/V, whose row 0 is the
    seed's AR K/V).
    """
    b, F = seed.shape[0], draft_length
    if drafter == "self":
        idx = jnp.arange(F + 1, dtype=jnp.int32)[None, :]
        toks = jnp.where(idx == 0, seed[:, None], config.mask_token_id)
        logits, kv = model_lib.apply(params, config, toks, (n - 1)[:, None] + idx, cache=cache)
        # row 0: p0 (AR convention); the mask at n+j (window row j+1) drafts its own position (MDM
        # convention); the mask at n is context only, as c0 comes from p0
        return jnp.concatenate([logits[:, :1], logits[:, 2:]], axis=1), kv
    idx = jnp.arange(F, dtype=jnp.int32)[None, :]
    z = noise_tokens(key, (b, F), config.vocab_size, config.mask_token_id, lora.noise)
    toks = jnp.where(idx == 0, seed[:, None], z)
    return lora_draft(params, lora_params, cache, toks, n, config=config, lora=lora)


def lora_draft(params, lora_params, cache: dict, toks: Array, n: Array, *, config: ModelConfig, lora: LoraConfig):
    """One LoRA draft pass over the window `toks` int [b, F] (row 0 the seed, gate off; the others gate on) at
    positions n−1 … n+F−2. Returns (logits [b, F, V], window K/V)."""
    b, F = toks.shape
    idx = jnp.arange(F, dtype=jnp.int32)[None, :]
    return model_lib.apply(params, config, toks, (n - 1)[:, None] + idx, cache=cache,
                           gate=jnp.broadcast_to(idx > 0, (b, F)), lora_params=lora_params, lora=lora)


def redraft(params, lora_params, cache: dict, seed: Array, n: Array, drafts: Array, logits: Array, key: Array, draw,
            presence, *, config: ModelConfig, passes: int, lora: LoraConfig) -> tuple[Array, Array]:
    """Passes 2 … `passes` of a multi-pass LoRA draft (docs/algorithms.md §7.7): each re-drafts the window from the
    previous pass's drafts (`redraft_tokens`) and draws c_1 … c_{F−1} again from its q by `draw` (the
    proposal's: the drafts fed forward are the proposed ones); c0 (from the exact p0) is kept. drafts int
    [b, F], logits [b, F, V] of pass 1. Returns the last pass's (drafts, logits)."""
    first = jnp.arange(drafts.shape[1])[None, :] == 0
    for k in range(1, passes):
        toks = redraft_tokens(jnp.where(first, seed[:, None], drafts), drafts, jnp.broadcast_to(first, drafts.shape))
        logits, _ = lora_draft(params, lora_params, cache, toks, n, config=config, lora=lora)
        drafts = jnp.where(first, drafts, draw(jax.random.fold_in(key, k), logits, presence))
    return drafts, logits


def cache_rows(gcfg: GenerationConfig, prompt_len: int) -> int:
    """Rows of Ψ-Spec's cache: the prompt, G new tokens and F + 2 rows of slack (the last cycle commits its
    accepted drafts before the budget G cuts what it emits)."""
    return prompt_len + gcfg.max_new_tokens + gcfg.mode.draft_length + 2


def prefill_but_last(params, config: ModelConfig, prompts: Array, lengths: Array, cache_len: int,
                     cache_dtype: str = "auto") -> tuple[dict, Array]:
    """Ψ-Spec's prefill: a cache of `cache_len` rows holding each prompt minus its last token, and that
    token (the first seed, at logical position length − 1) int [b]."""
    b, P = prompts.shape
    ar_idx = jnp.arange(P)[None, :]
    valid = ar_idx < (lengths - 1)[:, None]
    _, kv = model_lib.apply(params, config, prompts, jnp.broadcast_to(ar_idx, (b, P)).astype(jnp.int32),
                            segment_ids=valid.astype(jnp.int32), return_hidden=True)
    cache = kv_cache.commit(kv_cache.init(config, b, cache_len, cache_dtype), kv, valid)
    return cache, jnp.take_along_axis(prompts, (lengths - 1)[:, None], axis=1)[:, 0]


def loop_state(prompts: Array, lengths: Array, config: ModelConfig, gcfg: GenerationConfig, positions: int) -> dict:
    """The per-row output and the statistics counters a speculative decode loop starts from (`positions`
    draft indices counted in `accepted_at` / `reached_at`)."""
    b, G = prompts.shape[0], gcfg.max_new_tokens
    _, pad = decoding.special_ids(config, gcfg)
    return dict(out=jnp.full((b, G), pad, jnp.int32), logprobs=jnp.zeros((b, G), jnp.float32),
                g=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool), cycle=jnp.int32(0),
                row_cycles=jnp.zeros((b,), jnp.int32), accepted_sum=jnp.int32(0),
                accepted_at=jnp.zeros((positions,), jnp.int32), reached_at=jnp.zeros((positions,), jnp.int32),
                presence=decoding.initial_presence(prompts, lengths, config.vocab_size, gcfg))


def running(max_cycles: Array, gcfg: GenerationConfig):
    """The loop condition: a row still running and cycles left (at most `max_new_tokens`: each cycle
    yields a token)."""
    return lambda s: jnp.any(~s["done"]) & (s["cycle"] < jnp.minimum(max_cycles, gcfg.max_new_tokens))


@dataclasses.dataclass(frozen=True)
class Cycle:
    """What both kinds of cycle read: the weights and their configs, the key, the static sizes (F draft
    positions, draft passes per cycle), the sampling rule (`target`), the drafts' (`proposal`) and EOS."""

    params: dict
    lora_params: dict | None
    key: Array
    config: ModelConfig
    gcfg: GenerationConfig
    lora: LoraConfig | None
    dist: Callable
    draw: Callable
    qdist: Callable
    qdraw: Callable
    eos: int | None
    b: int

    @property
    def F(self) -> int:
        return self.gcfg.mode.draft_length

    @property
    def sampled(self) -> bool:
        """Whether the drafts are drawn by `draw` itself (the "sample" proposal, or greedy decoding)."""
        return self.gcfg.temperature == 0 or self.gcfg.mode.proposal == "sample"

    @property
    def passes(self) -> int:  # the LoRA drafter's `draft_passes`; one for the self drafter
        return getattr(self.gcfg.mode, "draft_passes", 1)

    @property
    def idx_f(self) -> Array:
        return jnp.arange(self.F, dtype=jnp.int32)[None, :]

    @property
    def idx_o(self) -> Array:
        return jnp.arange(self.F + 1, dtype=jnp.int32)[None, :]


# A cycle (spec or AR) reads the cache and returns the rest of the state plus what to commit: the K/V
# of its window (F + 1 rows, or the AR cycle's one) and which of them to keep. The one commit after it (`spec_decode`'s `step`)
# is a scatter into the loop-carried buffer, updated in place.

def _drafts(cy: Cycle, s: dict, k_noise: Array, k_draw: Array) -> tuple[Array, Array, Array, Array | None]:
    """Step 1 of a cycle: (drafts c0 … c_{F−1}, the first draft pass's logits, the verified pass's q
    [b, F−1, V], the draft rows' penalty set)."""
    c, n = s["cache"], s["n"]
    logits_d, _ = draft_pass(cy.params, cy.lora_params, c, s["seed"], n, k_noise, config=cy.config,
                             draft_length=cy.F, drafter=cy.gcfg.mode.drafter, lora=cy.lora)
    # p0 needs the committed text's penalty set; for q any rule is lossless (c_j ~ q_j is all that
    # matters), so the draft rows reuse that set instead of building one per row.
    pres_d = None if s["presence"] is None else s["presence"][:, None, :]
    drafts = cy.draw(k_draw, logits_d, pres_d)  # c0 ~ p0, c_j ~ q_j
    if not cy.sampled:  # c0 ~ p0 (emitted unverified); c_j from the proposal, whose row j reuses the noise of
        # `draw`'s row j (a row's noise is its own: c0's is row 0's), so "tempered" at τ = 1 is "sample"
        drafts = jnp.where(cy.idx_f == 0, drafts, cy.qdraw(k_draw, logits_d, pres_d))
    if cy.passes > 1:  # the last pass's q_j is verified, and its c_j ~ q_j: lossless for any number of passes
        drafts, logits_q = redraft(cy.params, cy.lora_params, c, s["seed"], n, drafts, logits_d, k_draw, cy.qdraw,
                                   pres_d, config=cy.config, passes=cy.passes, lora=cy.lora)
    else:
        logits_q = logits_d
    return drafts, logits_d, cy.qdist(logits_q[:, 1:], pres_d), pres_d


def spec_cycle(cy: Cycle, s: dict) -> tuple[dict, tuple]:
    """One speculative cycle (module doc): draft, verify, accept, emit."""
    kc = jax.random.fold_in(cy.key, s["cycle"])
    k_noise, k_draw, k_acc = jax.random.split(kc, 3)
    active = ~s["done"]
    n, idx_o, F = s["n"], cy.idx_o, cy.F
    drafts, logits_d, q, _ = _drafts(cy, s, k_noise, k_draw)

    # Verify `[seed, c0 … c_{F−1}]` at n−1 … n+F−1 against the cache as it is: the seed row gives its
    # AR K/V again (the draft pass's row 0 is the same AR row), so nothing is committed between passes.
    hidden, kv_v = model_lib.apply(cy.params, cy.config, jnp.concatenate([s["seed"][:, None], drafts], axis=1),
                                   (n - 1)[:, None] + idx_o, cache=s["cache"], return_hidden=True)
    logits_v = model_lib.lm_head(cy.params, cy.config, hidden[:, 1:])
    p = cy.dist(logits_v, presence_rows(s["presence"], drafts))  # p_1 … p_F
    m, nxt = accept_drafts(p, q, drafts[:, 1:], k_acc, greedy=cy.gcfg.temperature == 0)
    commit = (kv_v, (idx_o <= (m + 1)[:, None]) & active[:, None])  # the seed, c0 … c_m

    # Emitted this cycle: c0 … c_m, then the correction/bonus (m+2 tokens); cut at EOS and budget.
    ext = jnp.concatenate([drafts, jnp.zeros((cy.b, 1), jnp.int32)], axis=1)
    new = jnp.where(idx_o <= m[:, None], ext, nxt[:, None])
    # Every emitted token comes from a base-weight row: c0 from the seed row of the draft pass, the
    # accepted drafts and the correction/bonus from the verify rows (row j − 1 for index j).
    ar_logits = jnp.concatenate([logits_d[:, :1], logits_v], axis=1)
    out, logprobs, g, finished, write = decoding.emit(s["out"], s["logprobs"], s["g"], active, new, m + 2,
                                                      ar_logits, cy.eos, config=cy.config, gcfg=cy.gcfg)
    act = active.astype(jnp.int32)
    per_cycle = cy.passes + 1  # draft passes + the verify pass
    reached = (cy.idx_f <= jnp.minimum(m + 1, F - 1)[:, None]) & active[:, None]  # c0 … c_{m+1} examined
    accepted = (cy.idx_f <= m[:, None]) & active[:, None]
    return dict(seed=jnp.where(active, nxt, s["seed"]), n=jnp.where(active, n + m + 2, n), out=out,
                logprobs=logprobs, g=g, done=s["done"] | finished, cycle=s["cycle"] + 1,
                row_cycles=s["row_cycles"] + act, row_draft_cycles=s["row_draft_cycles"] + act,
                row_passes=s["row_passes"] + per_cycle * act, loop_passes=s["loop_passes"] + per_cycle,
                accepted_sum=s["accepted_sum"] + jnp.sum((m + 1) * act),
                accepted_at=s["accepted_at"] + accepted.sum(0).astype(jnp.int32),
                reached_at=s["reached_at"] + reached.sum(0).astype(jnp.int32),
                presence=decoding.add_presence(s["presence"], new, write)), commit


def ar_cycle(cy: Cycle, s: dict) -> tuple[dict, tuple]:
    """One AR pass over the seed: c0 ~ p0 is emitted and becomes the next seed (its K/V is committed next
    cycle, as a spec cycle's correction/bonus would be): one token per forward, no drafting."""
    active = ~s["done"]
    logits, kv = model_lib.apply(cy.params, cy.config, s["seed"][:, None], (s["n"] - 1)[:, None], cache=s["cache"])
    pres = None if s["presence"] is None else s["presence"][:, None, :]
    k_draw = jax.random.split(jax.random.fold_in(cy.key, s["cycle"]), 3)[1]
    c0 = cy.draw(k_draw, logits, pres)
    out, logprobs, g, finished, write = decoding.emit(s["out"], s["logprobs"], s["g"], active, c0,
                                                      jnp.ones((cy.b,), jnp.int32), logits, cy.eos, config=cy.config,
                                                      gcfg=cy.gcfg)
    act = active.astype(jnp.int32)
    rest = {k: v for k, v in s.items() if k != "cache"}
    return {**rest, "seed": jnp.where(active, c0[:, 0], s["seed"]), "n": jnp.where(active, s["n"] + 1, s["n"]),
            "out": out, "logprobs": logprobs, "g": g, "done": s["done"] | finished, "cycle": s["cycle"] + 1,
            "row_cycles": s["row_cycles"] + act, "row_passes": s["row_passes"] + act,
            "loop_passes": s["loop_passes"] + 1,
            "presence": decoding.add_presence(s["presence"], c0, write)}, (kv, active[:, None])


@functools.partial(jax.jit, static_argnames=("config", "gcfg", "lora"))
def spec_decode(params, lora_params, prompts: Array, lengths: Array, key: Array, max_cycles: Array,
                draft_below: Array | None = None, tau: Array | None = None, *, config: ModelConfig,
                gcfg: GenerationConfig, lora: LoraConfig | None = None) -> dict:
    """Ψ-Spec decode (module doc). prompts int [b, P] right-padded, lengths int [b] ≥ 1; max_cycles
    int32 scalar (traced: stopping early reuses the program; cycle k's randomness is fold_in(key, k)).
    draft_below: float32 scalar or None (traced, `draft_when_active_below`): a cycle drafts only while
    the active rows are at most this fraction of the batch, else it is one AR pass (`ar_cycle`); None
    drafts every cycle. tau: float32 scalar or None (traced, `proposal_temperature`; None: the mode's).

    `gcfg` gives max_new_tokens G, the mode (`SpecSelf` or `SpecLora`: the drafter, draft_length F,
    draft_passes, proposal), temperature/top-k/top-p/repetition penalty (applied identically to p and q,
    so the target is exactly the AR sampler's distribution), EOS. Returns {'tokens' [b, G] (pad after the end),
    'lengths' [b] (first EOS included), 'logprobs' [b, G] (`decoding.logprobs_of` each token under the
    AR model, 0 after the end), 'num_forward_passes' [b], 'loop_passes', 'row_cycles' [b] (cycles of
    either kind), 'row_draft_cycles' [b], 'accepted_sum', 'accepted_at' [F], 'reached_at' [F], 'cache',
    'seed' [b], 'positions' [b]}; `summarize` derives the statistics.
    """
    b, P = prompts.shape
    prompts = prompts.astype(jnp.int32)
    lengths = lengths.astype(jnp.int32)
    dist, draw = target(config, gcfg)
    qdist, qdraw = proposal(config, gcfg, tau)
    cy = Cycle(params=params, lora_params=lora_params, key=key, config=config, gcfg=gcfg, lora=lora, dist=dist,
               draw=draw, qdist=qdist, qdraw=qdraw, eos=decoding.special_ids(config, gcfg)[0], b=b)
    cache, seed = prefill_but_last(params, config, prompts, lengths, cache_rows(gcfg, P), gcfg.kv_cache_dtype)
    state = dict(cache=cache, seed=seed, n=lengths, **loop_state(prompts, lengths, config, gcfg, cy.F),
                 row_draft_cycles=jnp.zeros((b,), jnp.int32), row_passes=jnp.ones((b,), jnp.int32),
                 loop_passes=jnp.int32(1))

    def step(cycle):
        def body(s):
            new, (kv, keep) = cycle(cy, s)
            return {**new, "cache": kv_cache.commit(s["cache"], kv, keep)}
        return body

    go = running(max_cycles, gcfg)
    if draft_below is not None:
        # Rows only finish, so "few enough rows to draft" turns true once and stays: AR cycles until then,
        # speculative cycles after. Two loops, not a `lax.cond` per cycle: XLA hoists no loop-invariant work
        # (e.g. a CPU's f32 copy of bf16 weights) out of a conditional, so a cycle under one would redo it.
        many = lambda s: go(s) & (jnp.sum(~s["done"]) > draft_below * b)  # noqa: E731
        state = jax.lax.while_loop(many, step(ar_cycle), state)
    s = jax.lax.while_loop(go, step(spec_cycle), state)
    return {"tokens": s["out"], "lengths": s["g"], "logprobs": s["logprobs"],
            "num_forward_passes": s["row_passes"], "loop_passes": s["loop_passes"], "row_cycles": s["row_cycles"],
            "row_draft_cycles": s["row_draft_cycles"], "accepted_sum": s["accepted_sum"],
            "accepted_at": s["accepted_at"], "reached_at": s["reached_at"], "cache": s["cache"],
            "seed": s["seed"], "positions": s["n"]}


def summarize(raw: dict) -> dict:
    """Derived statistics (host floats) from `spec_decode`'s counters (see module doc)."""
    row_cycles = max(int(np.sum(raw["row_cycles"])), 1)
    draft_cycles = int(np.sum(raw.get("row_draft_cycles", raw["row_cycles"])))
    generated = int(np.sum(raw["lengths"]))
    reached = np.maximum(np.asarray(raw["reached_at"]), 1)
    return {"cycles": int(np.max(raw["row_cycles"])), "loop_passes": int(raw["loop_passes"]),
            "draft_cycles": draft_cycles,  # row-cycles that drafted (the others were AR passes)
            "accepted_per_cycle": float(raw["accepted_sum"]) / max(draft_cycles, 1),
            "tokens_per_cycle": generated / row_cycles,
            # decode passes = every pass but the prefill (two per cycle here; one per cycle fused)
            "tokens_per_forward": generated / max(int(np.sum(np.asarray(raw["num_forward_passes"]) - 1)), 1),
            "acceptance_by_position": (np.asarray(raw["accepted_at"]) / reached).tolist(),
            # the counts behind the ratios, so callers can pool several calls exactly (`pool_acceptance`)
            "counts": {"draft_cycles": draft_cycles, "accepted": int(raw["accepted_sum"]),
                       "accepted_at": np.asarray(raw["accepted_at"]).tolist(),
                       "reached_at": np.asarray(raw["reached_at"]).tolist()}}


def pool_acceptance(counts: list[dict]) -> dict:
    """`accepted_per_cycle` and `acceptance_by_position` over several calls' `stats["counts"]` (e.g. the
    batches of an evaluation): ratios of the summed counts, not means of per-call ratios."""
    cycles = max(sum(c["draft_cycles"] for c in counts), 1)
    accepted_at = np.sum([c["accepted_at"] for c in counts], axis=0)
    reached_at = np.maximum(np.sum([c["reached_at"] for c in counts], axis=0), 1)
    return {"accepted_per_cycle": sum(c["accepted"] for c in counts) / cycles,
            "acceptance_by_position": (accepted_at / reached_at).tolist()}


def check(config: ModelConfig, gcfg: GenerationConfig, lora_params, lora: LoraConfig | None) -> None:
    """Validates the adapter at the edge (`GenerationConfig.validate` covers the knobs); raises
    ConfigError naming the problem."""
    if gcfg.mode.drafter != "lora":
        return
    if lora_params is None or lora is None:
        raise ConfigError(f"mode {gcfg.mode.name!r} needs the adapter: pass lora_params and its LoraConfig")
    if lora.noise == "mask" and config.mask_token_id is None:
        raise ConfigError(missing_mask_token("the adapter, trained with noise='mask', needs",
                                             otherwise="use an adapter trained with lora.noise=uniform"))
    check_lora(lora_params, config, lora)


# What a decode loop returns for a caller that continues it (the caches, the seed, its position, the next
# drafts) and `generate` does not read: each output of its program is one more host transfer per call.
LOOP_STATE = frozenset({"cache", "draft_cache", "seed", "positions", "drafts"})


def outputs(raw: dict) -> dict:
    """`raw` without `LOOP_STATE`: what a speculative decoder's run hands `generate`."""
    return {k: v for k, v in raw.items() if k not in LOOP_STATE}


def run(params, tokens: Array, lengths: Array, key: Array, *, config: ModelConfig, gcfg: GenerationConfig,
        debug: bool = False, knobs: SpecSelf | SpecLora | None = None, lora_params=None,
        lora: LoraConfig | None = None) -> dict:
    """The decoder's run: `spec_decode` with the whole budget (at most `max_new_tokens` cycles) and the
    traced `draft_when_active_below` (None: every cycle drafts) and `proposal_temperature` of `knobs`,
    its `outputs`."""
    knobs = None if knobs is None else knobs.arrays()
    below, tau = (None, None) if knobs is None else (knobs.draft_when_active_below, knobs.proposal_temperature)
    raw = spec_decode(params, lora_params, tokens, lengths, key, jnp.int32(gcfg.max_new_tokens), below, tau,
                      config=config, gcfg=gcfg, lora=lora)
    return outputs(raw)


def stats(raw: dict, gcfg: GenerationConfig, tokens: np.ndarray, lengths: np.ndarray, out_lengths: np.ndarray) -> dict:
    return {"drafter": gcfg.mode.drafter, "draft_length": gcfg.mode.draft_length,
            "draft_passes": getattr(gcfg.mode, "draft_passes", 1), **summarize(raw)}


DECODER = Decoder(run, stats, check, uses_adapter=True)
SpecSelf.decoder = SpecLora.decoder = DECODER
