"""Fused Ψ-Spec: one forward pass per speculative cycle, still lossless, with either drafter (docs/algorithms.md §7.5).

The cache holds the committed text except its last token y (logical position n−1); K drafts d1 … dK
for positions n … n+K−1 and their draft distributions q1 … qK come from the previous cycle. One pass
over a window of (K+1) + (K+1)·B rows holds
- the verify block `[y, d1 … dK]` at positions n−1 … n+K−1, causal against the cache, the AR weights
  (gate off): row j gives p_{j+1}, the AR distribution of position n+j (AR convention);
- K+1 scenario blocks of B rows each. Block m assumes the cycle accepts d1 … dm and emits a
  correction/bonus e at position n+m: its rows sit at positions n+m … n+m+B−1, see the cache, the
  verify rows 0 … m (y, d1 … dm) and, causally, their own block. Its first row holds e's place (e is
  drawn from p, so the row is context only for the self drafter). The drafts of the next cycle,
  d'_i for position n+m+i (i = 1 … K), are read from the block by the drafter's own convention:
  * `FusedSelf` (mode "spec-self-fused", B = K+1, mask tokens, one set of weights): row i drafts its own position
    (MDM convention), rows 1 … K;
  * `FusedLora` (mode "spec-lora-fused", B = K, the adapter's noise rows `LoraConfig.noise`, gate on): row i drafts the
    next position (the adapter's next-token convention), rows 0 … K−1. Block m is then exactly the
    two-pass draft window `[seed, z1 … zK]` with the seed d_m (y for m = 0) at n+m−1: the seed row is
    verify row m, whose K/V is the AR K/V either way. So the adapter's training layout (a clean seed,
    then noise rows that see it, `objectives.drafter`) is the fused layout too, and d'_i is the
    two-pass draft c_i of a window of F = K+1 rows: the same adapter serves both loops.
Acceptance is `spec.accept_drafts` unchanged (greedy: argmax match; sampling: min(1, p/q) with q the
distribution the drafts were drawn from by the mode's `proposal` (`spec.proposal`), the residual at the
first rejection, else a bonus from p_{K+1}), so the output is the AR model's distribution exactly;
only the drafts are one token blinder than two-pass speculation's (they do not see e). The cycle
commits the K/V of `y, d1 … dm` (computed against the cache: the AR K/V), keeps e as the next y and
takes block m's draft rows as the next drafts and q. Each emitted token has its AR
logits at hand (d_j from verify row j−1, e from row m), so its log-probability costs nothing.

Preparing fewer scenarios (`Fused.scenarios` = S < K+1): each row's window holds the S blocks of the
acceptance lengths its drafter finds most probable (from its own probabilities of its drafts,
`likely_scenarios`), laid out per row (`scenario_layout`); a cycle that stops at another length takes
the next drafts from the prepared block of the largest length below it (drafts for other positions:
verified like any drafts, so still lossless, only rarely accepted; `scenario_hit_rate` counts the hits).

Every cycle has K drafts, so the knobs are `draft_length` = K, `scenarios` and the drafts' `proposal` (`Fused`). The
first cycle's drafts come from the prefill itself: one causal pass over each prompt followed by B−1 noise
rows (`prefill_and_draft`) commits the prompt minus y and reads the rows of y and the noise as a scenario
block (for the LoRA drafter y's row is its AR row, so d1 is proposed from p itself). Forward passes per
row: the prefill and one per cycle.

Statistics (as `spec.summarize`): `accepted_per_cycle` (mean m, drafts kept), `tokens_per_cycle`
(mean m+1), `tokens_per_forward` (generated tokens / decode passes: one per cycle),
`acceptance_by_position` (per draft d_j: P(accepted | examined)).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..config import LoraConfig, ModelConfig
from ..nn import kv_cache
from .. import model as model_lib
from ..lora import noise_tokens
from . import decoding, spec
from .config import GenerationConfig
from .decoder import Decoder

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Fused(spec.Speculative):
    """Fused Ψ-Spec's knobs (module doc): `spec.Speculative`'s, with draft_length K drafts per cycle, and

    scenarios: S, the scenario blocks a cycle prepares (1 … K+1; 0, the default, is all K+1): per row the S
    acceptance lengths the drafter itself finds most probable (`likely_scenarios`), the window then
    (K+1) + S·B rows instead of (K+1)(1+B). A cycle that stops at a length it did not prepare
    takes the next drafts from the prepared block nearest below (drafts for other positions, verified
    as any drafts are: lossless, only rarely accepted). Static: it sets the window's shape.
    """

    scenarios: int = 0

    def check(self, gc) -> None:
        super().check(gc)
        k = self.draft_length
        if isinstance(self.scenarios, bool) or not isinstance(self.scenarios, int) or not 0 <= self.scenarios <= k + 1:
            raise ValueError(f"{self.knob_name('scenarios')}={self.scenarios!r}: expected an integer in [0, "
                             f"draft_length + 1 = {k + 1}] (0: all of them)")

    def canonical(self, max_new_tokens: int) -> "Fused":
        point = super().canonical(max_new_tokens)
        return dataclasses.replace(point, scenarios=0) if point.scenarios == point.draft_length + 1 else point

    def prepared(self) -> int:
        """S, the scenario blocks of a window."""
        return self.scenarios or self.draft_length + 1

    def lookahead(self) -> int:
        return 2 * self.draft_length  # the last scenario rows reach K positions past the last draft

    def lookahead_source(self) -> str:
        return "2 × " + super().lookahead_source()

    def short(self) -> str:
        return f"K={self.draft_length}" + (f" S={self.scenarios}" if self.scenarios else "") + self.proposal_label()


@dataclasses.dataclass(frozen=True)
class FusedSelf(Fused):
    """Fused self-speculation: the scenario blocks are mask rows (one set of weights)."""

    name = "spec-self-fused"
    label = "spec, self drafter, fused"
    drafter = "self"
    needs_mask_token = True


@dataclasses.dataclass(frozen=True)
class FusedLora(Fused):
    """Fused speculation with Uno's gated-LoRA drafter (`generate`'s `lora_params`, `lora`)."""

    name = "spec-lora-fused"
    label = "spec, LoRA drafter, fused"
    drafter = "lora"


def block_rows(k: int, drafter: str) -> int:
    """B, the rows of one scenario block: e's place and K drafts (self), or K noise rows (LoRA)."""
    return k + 1 if drafter == "self" else k


def window_layout(k: int, drafter: str = "self") -> tuple[np.ndarray, np.ndarray]:
    """The fused window for K = k drafts: (logical position offsets from n int [T], attention mask bool
    [T, T]) with T = (k+1)(1+B): the verify block first (rows 0 … k), then block m at rows
    (k+1) + m·B … (k+1) + (m+1)·B − 1 (module doc)."""
    w, blk = k + 1, block_rows(k, drafter)
    offsets = np.concatenate([np.arange(w) - 1] + [m + np.arange(blk) for m in range(w)]).astype(np.int32)
    mask = np.zeros((w + w * blk,) * 2, bool)
    mask[:w, :w] = np.tril(np.ones((w, w), bool))
    for m in range(w):
        rows = slice(w + m * blk, w + (m + 1) * blk)
        mask[rows, :m + 1] = True  # y, d1 … dm
        mask[rows, rows] = np.tril(np.ones((blk, blk), bool))
    return offsets, mask


def window_rows(gcfg: GenerationConfig) -> int:
    k = gcfg.mode.draft_length
    return k + 1 + gcfg.mode.prepared() * block_rows(k, gcfg.mode.drafter)


def scenario_layout(ms: Array, k: int, blk: int) -> tuple[Array, Array]:
    """`window_layout` for the scenario blocks of acceptance lengths `ms` int [b, S] (per row, any S of
    0 … K): (position offsets from n int [b, T], mask bool [b, T, T]) with T = (K+1) + S·B, block s
    (rows (K+1) + s·B …) at n+m_s … seeing y, d1 … d_{m_s} and itself causally."""
    b, S = ms.shape
    w = k + 1
    blk_of = jnp.repeat(jnp.arange(S), blk)                  # [S·B] the block of each scenario row
    within = jnp.tile(jnp.arange(blk), S)                    # its row within the block
    m_row = jnp.take_along_axis(ms, jnp.broadcast_to(blk_of, (b, S * blk)), axis=1)  # [b, S·B]
    offsets = jnp.concatenate([jnp.broadcast_to(jnp.arange(w) - 1, (b, w)), m_row + within], axis=1)
    verify = jnp.tril(jnp.ones((w, w), bool))
    sees_verify = jnp.arange(w)[None, None, :] <= m_row[:, :, None]                 # [b, S·B, w]
    own = (blk_of[:, None] == blk_of[None, :]) & (within[:, None] >= within[None, :])  # [S·B, S·B]
    top = jnp.broadcast_to(jnp.concatenate([verify, jnp.zeros((w, S * blk), bool)], axis=1), (b, w, w + S * blk))
    bottom = jnp.concatenate([sees_verify, jnp.broadcast_to(own, (b, S * blk, S * blk))], axis=2)
    return offsets.astype(jnp.int32), jnp.concatenate([top, bottom], axis=1)


def likely_scenarios(conf: Array, s: int) -> Array:
    """The `s` acceptance lengths m ∈ 0 … K most probable per row, by the drafter's own probability of each
    of its drafts, conf [b, K] (a_j = q_j(d_j), raw logits, temperature 1): P(m) ∝ a_1 ⋯ a_m (1 − a_{m+1}),
    with a_{K+1} = 0. Returns int [b, s]."""
    log_a = jnp.log(jnp.clip(conf, 1e-30, 1.0))
    head = jnp.concatenate([jnp.zeros_like(conf[:, :1]), jnp.cumsum(log_a, axis=1)], axis=1)       # Σ_{j≤m} log a_j
    tail = jnp.log1p(-jnp.clip(jnp.concatenate([conf, jnp.zeros_like(conf[:, :1])], axis=1), 0.0, 1.0 - 1e-7))
    return jax.lax.top_k(head + tail, s)[1].astype(jnp.int32)


def prefill_and_draft(params, config: ModelConfig, prompts: Array, lengths: Array, noise: Array, blk: int,
                      cache_len: int, cache_dtype: str = "auto", adapter: dict | None = None) -> tuple[dict, Array, Array]:
    """The prefill of fused Ψ-Spec, which also drafts the first cycle: one causal pass over each prompt
    (int [b, P] right-padded, lengths [b] ≥ 1) followed by B−1 rows of `noise` (int [b, P + B − 1], read
    at the rows after each prompt; with `adapter`, gate on there). Returns (a cache of `cache_len` rows
    holding each prompt minus its last token y, y int [b], logits fp32 [b, B, V] of y's row and the noise
    rows: the window `[y, noise × (B−1)]` at n−1 … n+B−2 against that cache, as a scenario block)."""
    b, P = prompts.shape
    idx = jnp.arange(P + blk - 1, dtype=jnp.int32)[None, :]
    tokens = jnp.where(idx < lengths[:, None], jnp.pad(prompts, ((0, 0), (0, blk - 1))), noise)
    valid = idx < (lengths + blk - 1)[:, None]
    gate = {} if adapter is None else {"gate": valid & (idx >= lengths[:, None]), **adapter}
    hidden, kv = model_lib.apply(params, config, tokens, jnp.broadcast_to(idx, tokens.shape),
                                 segment_ids=valid.astype(jnp.int32), return_hidden=True, **gate)
    rows = (lengths - 1)[:, None] + jnp.arange(blk, dtype=jnp.int32)[None, :]
    logits = model_lib.lm_head(params, config, jnp.take_along_axis(hidden, rows[..., None], axis=1))
    cache = kv_cache.commit(kv_cache.init(config, b, cache_len, cache_dtype), kv, idx < (lengths - 1)[:, None])
    return cache, jnp.take_along_axis(prompts, (lengths - 1)[:, None], axis=1)[:, 0], logits


@dataclasses.dataclass(frozen=True)
class Window:
    """One fused decode's constants: the weights, the drafter, the sizes (K drafts, w = K+1 verify rows,
    B rows per scenario block, `first` draft row of a block: 1 (self, MDM convention) or 0 (LoRA,
    next-token)), the sampling rule (`spec.target`), the drafts' (`spec.proposal`), EOS and the key."""

    params: dict
    lora_params: dict | None
    config: ModelConfig
    gcfg: GenerationConfig
    lora: LoraConfig | None
    dist: Callable
    draw: Callable
    qdist: Callable
    qdraw: Callable
    eos: int | None
    key: Array
    b: int

    @property
    def K(self) -> int:
        return self.gcfg.mode.draft_length

    @property
    def w(self) -> int:
        return self.K + 1

    @property
    def blk(self) -> int:
        return block_rows(self.K, self.gcfg.mode.drafter)

    @property
    def first(self) -> int:
        return self.blk - self.K

    @property
    def self_drafts(self) -> bool:
        return self.gcfg.mode.drafter == "self"

    @property
    def adapter(self) -> dict:
        return {} if self.self_drafts else {"lora_params": self.lora_params, "lora": self.lora}

    def noise(self, k: Array, shape) -> Array:
        """The drafter's input ids for rows it drafts from."""
        if self.self_drafts:
            return jnp.full(shape, self.config.mask_token_id, jnp.int32)
        return noise_tokens(k, shape, self.config.vocab_size, self.config.mask_token_id, self.lora.noise)

    def gated(self, on: Array) -> dict:
        """LoRA on the drafting rows only; the self drafter has one set of weights."""
        return {} if self.self_drafts else {"gate": jnp.broadcast_to(on, (self.b,) + on.shape[1:])}

    @property
    def S(self) -> int:
        return self.gcfg.mode.prepared()

    def drafts_from(self, k: Array, logits: Array, presence) -> tuple[Array, Array, Array]:
        """The drafts (by the mode's `proposal`), the distribution they were drawn from (any q is lossless,
        so the penalty set is the committed text's) and the drafter's own probability of each (softmax of
        the raw logits: what `likely_scenarios` reads; zeros when every scenario is prepared and nothing
        reads it)."""
        pres = None if presence is None else presence[:, None, :]
        drafts = self.qdraw(k, logits, pres)
        if self.S == self.K + 1:
            return drafts, self.qdist(logits, pres), jnp.zeros(drafts.shape, jnp.float32)
        conf = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), drafts[..., None], axis=-1)[..., 0]
        return drafts, self.qdist(logits, pres), conf


def _start(fx: Window, prompts: Array, lengths: Array) -> dict:
    """The loop's first state: the prefill drafts the first cycle, `[y, noise × (B−1)]` at n−1 … n+B−2
    read as a scenario block."""
    b, P = prompts.shape
    K, G = fx.K, fx.gcfg.max_new_tokens
    k_boot, k_boot_noise = jax.random.split(jax.random.fold_in(fx.key, 0))
    cache, y, boot = prefill_and_draft(fx.params, fx.config, prompts, lengths,
                                       fx.noise(k_boot_noise, (b, P + fx.blk - 1)), fx.blk,
                                       spec.cache_rows(fx.gcfg, P), fx.gcfg.kv_cache_dtype, fx.adapter or None)
    presence = decoding.initial_presence(prompts, lengths, fx.config.vocab_size, fx.gcfg)
    drafts, q, conf = fx.drafts_from(k_boot, boot[:, fx.first:], presence)
    _, pad = decoding.special_ids(fx.config, fx.gcfg)
    return dict(cache=cache, y=y, n=lengths, drafts=drafts, q=q, conf=conf, scenario_hits=jnp.int32(0),
                out=jnp.full((b, G), pad, jnp.int32),
                logprobs=jnp.zeros((b, G), jnp.float32), g=jnp.zeros((b,), jnp.int32),
                done=jnp.zeros((b,), bool), cycle=jnp.int32(0), row_cycles=jnp.zeros((b,), jnp.int32),
                accepted_sum=jnp.int32(0), accepted_at=jnp.zeros((K,), jnp.int32),
                reached_at=jnp.zeros((K,), jnp.int32), presence=presence)


def layout(fx: Window, s: dict) -> tuple[Array, Array, Array]:
    """The cycle's window: (the acceptance lengths of its scenario blocks int [b, S], position offsets
    [b or 1, T], mask [b, T, T]); every length in order when all K+1 are prepared (`window_layout`),
    else each row's most likely S (`likely_scenarios`, `scenario_layout`)."""
    b, K = fx.b, fx.K
    if fx.S == K + 1:
        offsets, mask = window_layout(K, fx.gcfg.mode.drafter)
        ms = jnp.broadcast_to(jnp.arange(K + 1, dtype=jnp.int32), (b, K + 1))
        return ms, jnp.asarray(offsets)[None, :], jnp.broadcast_to(jnp.asarray(mask), (b,) + mask.shape)
    ms = likely_scenarios(s["conf"], fx.S)
    return (ms, *scenario_layout(ms, K, fx.blk))


def fused_cycle(fx: Window, s: dict) -> dict:
    """One cycle: the one pass over the verify block and the scenario blocks, acceptance, the commit of
    `y, d1 … dm`, the emitted tokens and the next drafts: block m's, else (m not prepared) the prepared
    block of the largest length below m (the first block if none)."""
    b, K, w, blk = fx.b, fx.K, fx.w, fx.blk
    ms, offsets, mask = layout(fx, s)
    scenario = jnp.arange(offsets.shape[1])[None, :] >= w
    idx_w = jnp.arange(w, dtype=jnp.int32)[None, :]
    idx_k = jnp.arange(K, dtype=jnp.int32)[None, :]
    kc = jax.random.fold_in(fx.key, s["cycle"] + 1)
    k_acc, k_draw = jax.random.split(kc)
    active = ~s["done"]
    c, n = s["cache"], s["n"]
    verify = jnp.concatenate([s["y"][:, None], s["drafts"]], axis=1)  # [y, d1 … dK]
    tokens = jnp.concatenate([verify, fx.noise(jax.random.fold_in(kc, 2), (b, fx.S * blk))], axis=1)
    logits, (k_win, v_win) = model_lib.apply(fx.params, fx.config, tokens, n[:, None] + offsets, cache=c,
                                             window_mask=mask, **fx.gated(scenario), **fx.adapter)
    logits_v = logits[:, :w]  # row j: p for position n+j
    p = fx.dist(logits_v, spec.presence_rows(s["presence"], verify))
    m, e = spec.accept_drafts(p, s["q"], s["drafts"], k_acc, greedy=fx.gcfg.temperature == 0)
    keep = (idx_w <= m[:, None]) & active[:, None]  # y, d1 … dm
    c = kv_cache.commit(c, (k_win[:, :, :w], v_win[:, :, :w]), keep)

    # Emitted: d1 … dm, then e at index m (m+1 tokens); token i's AR logits are verify row i.
    new = jnp.where(idx_w < m[:, None], jnp.concatenate([s["drafts"], e[:, None]], axis=1), e[:, None])
    out, logprobs, g, finished, written = decoding.emit(s["out"], s["logprobs"], s["g"], active, new, m + 1,
                                                        logits_v, fx.eos, config=fx.config, gcfg=fx.gcfg)
    presence = decoding.add_presence(s["presence"], new, written)

    # The next drafts: block m's draft rows (for positions n+m+1 … n+m+K), or the fallback block's.
    hit = ms == m[:, None]
    pick = jnp.argmax(jnp.where(hit, K + 1, jnp.where(ms <= m[:, None], ms, -1)), axis=1)
    blocks = logits[:, w:].reshape(b, fx.S, blk, -1)
    chosen = jnp.take_along_axis(blocks, pick[:, None, None, None], axis=1)[:, 0, fx.first:]
    drafts, q, conf = fx.drafts_from(k_draw, chosen, presence)

    act = active.astype(jnp.int32)
    reached = (idx_k <= jnp.minimum(m, K - 1)[:, None]) & active[:, None]  # d1 … d_{m+1} examined
    accepted = (idx_k < m[:, None]) & active[:, None]
    keep_row = active[:, None]
    return dict(cache=c, y=jnp.where(active, e, s["y"]), n=jnp.where(active, n + m + 1, n),
                drafts=jnp.where(keep_row, drafts, s["drafts"]), q=jnp.where(keep_row[..., None], q, s["q"]),
                conf=jnp.where(keep_row, conf, s["conf"]),
                scenario_hits=s["scenario_hits"] + jnp.sum(jnp.any(hit, axis=1) & active),
                out=out, logprobs=logprobs, g=g, done=s["done"] | finished, cycle=s["cycle"] + 1,
                row_cycles=s["row_cycles"] + act, accepted_sum=s["accepted_sum"] + jnp.sum(m * act),
                accepted_at=s["accepted_at"] + accepted.sum(0).astype(jnp.int32),
                reached_at=s["reached_at"] + reached.sum(0).astype(jnp.int32), presence=presence)


@functools.partial(jax.jit, static_argnames=("config", "gcfg", "lora"))
def fused_decode(params, lora_params, prompts: Array, lengths: Array, key: Array, max_cycles: Array,
                 tau: Array | None = None, *, config: ModelConfig, gcfg: GenerationConfig,
                 lora: LoraConfig | None = None) -> dict:
    """Fused Ψ-Spec decode (module doc) with the drafter of `gcfg.mode` (`FusedSelf`: lora_params and lora
    None; `FusedLora`: the adapter). prompts int [b, P] right-padded, lengths int [b] ≥ 1; max_cycles
    int32 scalar (traced; cycle c's randomness is fold_in(key, c + 1), the prefill's drafts'
    fold_in(key, 0)); tau float32 scalar or None (traced `proposal_temperature`; None: the mode's).
    Returns the keys of `spec.spec_decode` ('accepted_at', 'reached_at' per draft d1 … dK; 'seed' is y,
    'positions' n) plus 'drafts' [b, K]."""
    prompts = prompts.astype(jnp.int32)
    lengths = lengths.astype(jnp.int32)
    dist, draw = spec.target(config, gcfg)
    qdist, qdraw = spec.proposal(config, gcfg, tau)
    fx = Window(params=params, lora_params=lora_params, config=config, gcfg=gcfg, lora=lora, dist=dist, draw=draw,
                qdist=qdist, qdraw=qdraw, eos=decoding.special_ids(config, gcfg)[0], key=key, b=prompts.shape[0])
    G = gcfg.max_new_tokens
    s = jax.lax.while_loop(lambda s: jnp.any(~s["done"]) & (s["cycle"] < jnp.minimum(max_cycles, G)),
                           functools.partial(fused_cycle, fx), _start(fx, prompts, lengths))
    return {"tokens": s["out"], "lengths": s["g"], "logprobs": s["logprobs"],
            "num_forward_passes": 1 + s["row_cycles"], "loop_passes": 1 + s["cycle"], "row_cycles": s["row_cycles"],
            "accepted_sum": s["accepted_sum"], "accepted_at": s["accepted_at"], "reached_at": s["reached_at"],
            "cache": s["cache"], "seed": s["y"], "positions": s["n"], "drafts": s["drafts"],
            "scenario_hits": s["scenario_hits"]}


def run(params, tokens: Array, lengths: Array, key: Array, *, config: ModelConfig, gcfg: GenerationConfig,
        debug: bool = False, knobs: Fused | None = None, lora_params=None, lora: LoraConfig | None = None) -> dict:
    """The decoder's run: `fused_decode` with the whole budget and the traced `proposal_temperature` of
    `knobs`, its `spec.outputs`."""
    tau = None if knobs is None else knobs.arrays().proposal_temperature
    raw = fused_decode(params, lora_params, tokens, lengths, key, jnp.int32(gcfg.max_new_tokens), tau,
                       config=config, gcfg=gcfg, lora=lora)
    return spec.outputs(raw)


def stats(raw: dict, gcfg: GenerationConfig, tokens: np.ndarray, lengths: np.ndarray, out_lengths: np.ndarray) -> dict:
    """`spec.summarize`'s, with `scenario_hit_rate`: the share of row-cycles whose acceptance length was
    among the prepared scenarios (1 with all K+1)."""
    return {"drafter": gcfg.mode.drafter, "draft_length": gcfg.mode.draft_length, "fused": True,
            "scenarios": gcfg.mode.prepared(),
            "scenario_hit_rate": int(raw["scenario_hits"]) / max(int(np.sum(raw["row_cycles"])), 1),
            **spec.summarize(raw)}


DECODER = Decoder(run, stats, spec.check, uses_adapter=True)
FusedSelf.decoder = FusedLora.decoder = DECODER
