"""Mode A: MDM sampling with first-hitting denoising and a reusable KV cache (docs/algorithms.md §5, Eso-LM style).

Per row, with M = max_new_tokens masks after the prompt:
1. Budget. T = `steps` > 0: N_d ~ Binomial(M, alpha0) diffusion tokens spread as evenly as possible
   over T steps (k_i = ⌊(i+1)N_d/T⌋ − ⌊iN_d/T⌋ ≤ ⌈M/T⌉), then the M − N_d others one per step
   (sequential phase). T = 0: every token is a diffusion token, ⌈M/4⌉ steps of ≤ 4. Empty steps
   (N_d < T) are skipped: they would sample nothing and leave the cache unchanged.
2. Order. The diffusion tokens in a random order, then the sequential ones left to right; the
   generated tokens are laid out physically in that order (logical positions carried, docs/algorithms.md §0).
   Beyond the paper (`MDM.order`): "logical" takes the diffusion tokens left to right (chunks of k_s);
   "confidence" feeds every undecoded mask at each diffusion step and commits the k_s whose most likely
   token is most probable (listed in logical order), so the window's mask half has M rows.
3. Step s feeds the window `[tokens sampled at step s−1 ; this step's k_s masks]` against the cache
   (window K = ⌈M/T⌉ (T > 0) or min(4, M) rows per half; unused rows are masked), commits the K/V of
   the clean half only, and samples the masks (MDM convention: a mask's logits row predicts its own
   position). The last step's tokens are never fed back (no pass needs them).
   With `sequential="ar"` (beyond the paper) a sequential step reads offset o from the AR row of
   the token before it (offset o − 1, or the last prompt token): that token is fed again, uncommitted,
   at its own position, and its committed copy (in the cache or in this window) is hidden from it, so
   the row sees exactly the decoded context, as the AR-convention sequential pass is trained
   (docs/algorithms.md §3.3). With α0 = 0 this is the AR sampler.
4. Tokens are scattered by logical offset, so the output is in logical order.
EOS: a row stops once every position before its first decoded EOS is decoded; the sequential tail
then ends at the EOS.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..nn import kv_cache, masks
from .. import model as model_lib
from . import decoding
from .config import GenerationConfig
from .decoder import Decoder
from .mode import Mode, expect_choice, expect_fraction, expect_int

Array = jax.Array
ORDERS = ("random", "logical", "confidence")
SEQUENTIAL = ("mask", "ar")


@dataclasses.dataclass(frozen=True)
class MDM(Mode):
    """Mode A's knobs (module doc).

    steps: T (0 → ⌈M/4⌉ diffusion steps of ≤ 4 tokens); alpha0: α0, the diffusion share of the budget.
    order, sequential: beyond the paper (defaults = the paper): the diffusion tokens in "random" |
      "logical" | "confidence" order; the sequential phase read from the mask's own row ("mask", MDM
      convention) or from the AR row of the token before it ("ar").
    Traced: α0, the order and the convention change values, not shapes, so every α0, both planned orders
    (random, logical) and both conventions at one T run one program; "confidence" scores every undecoded
    mask (other shapes) and keeps its own program (`static`). In the decoder `knobs.order` and
    `knobs.sequential` are their indices in `ORDERS` and `SEQUENTIAL`.
    """

    name = "mdm"
    label = "mode A (MDM)"
    TRACED = ("alpha0", "order", "sequential")
    CHOICES = {"order": ORDERS, "sequential": SEQUENTIAL}
    needs_mask_token = True

    steps: int = 0
    alpha0: float = 0.25
    order: str = "random"
    sequential: str = "mask"

    def check(self, gc) -> None:
        expect_int(self, "steps", 0)
        expect_fraction(self, "alpha0")
        expect_choice(self, "order")
        expect_choice(self, "sequential")

    def static(self) -> "MDM":
        """The random and the logical order share a program (only the plan's ranks differ), as do both
        sequential conventions; "confidence" keeps its own."""
        base = super().static()
        return dataclasses.replace(base, order="confidence") if self.order == "confidence" else base

    def short(self) -> str:
        """e.g. "T=8 α0=0.5 confidence order AR-row sequential"."""
        base = f"T={self.steps} α0={self.alpha0:g}" if self.steps else "T=0"
        extra = [f"{self.order} order"] if self.order != "random" else []
        extra += ["AR-row sequential"] if self.sequential == "ar" else []
        return " ".join([base] + extra)

    def canonical(self, max_new_tokens: int) -> "MDM":
        """T = 0 reads neither α0 (every token is a diffusion token) nor the sequential convention, α0 = 1
        not the convention (no sequential phase): those fields take their defaults."""
        alpha0 = MDM.alpha0 if self.steps == 0 else self.alpha0
        sequential = MDM.sequential if self.steps == 0 or alpha0 == 1.0 else self.sequential
        return dataclasses.replace(self, alpha0=alpha0, sequential=sequential)


def window_rows(gcfg: GenerationConfig) -> int:
    """Static K: the most tokens any step commits (the window's first half)."""
    m, t = gcfg.max_new_tokens, gcfg.mode.steps
    return -(-m // t) if t > 0 else min(4, m)


def query_rows(gcfg: GenerationConfig) -> int:
    """Static rows of the window's query half: K, or M when every undecoded mask is scored."""
    return gcfg.max_new_tokens if gcfg.mode.order == "confidence" else window_rows(gcfg)


def max_steps(gcfg: GenerationConfig) -> int:
    m, t = gcfg.max_new_tokens, gcfg.mode.steps
    return t + m if t > 0 else -(-m // 4)


def plan(key: Array, gcfg: GenerationConfig, batch: int, knobs: MDM | None = None
         ) -> tuple[Array, Array, Array, Array]:
    """Per-row schedule: (order int32 [B, M] logical offsets in physical order, sizes int32 [B, S]
    tokens per step (non-empty steps first), num_steps [B], num_diffusion [B]). S = max_steps.
    `knobs` (the mode, its traced α0 and order) default to `gcfg.mode`."""
    m, t = gcfg.max_new_tokens, gcfg.mode.steps
    knobs = (gcfg.mode if knobs is None else knobs).arrays()
    alpha0 = knobs.alpha0
    k_budget, k_order = jax.random.split(key)
    if t > 0:
        # Binomial(M, alpha0) as a sum of M Bernoulli draws (exact).
        n_d = (jax.random.uniform(k_budget, (batch, m)) < alpha0).sum(1).astype(jnp.int32)
        i = jnp.arange(t, dtype=jnp.int32)[None, :]
        diff = ((i + 1) * n_d[:, None]) // t - (i * n_d[:, None]) // t
        seq = (jnp.arange(m)[None, :] < (m - n_d)[:, None]).astype(jnp.int32)
        sizes = jnp.concatenate([diff, seq], axis=1)
    else:
        n = -(-m // 4)
        i = jnp.arange(n, dtype=jnp.int32)
        sizes = jnp.broadcast_to(((i + 1) * m) // n - (i * m) // n, (batch, n))
        n_d = jnp.full((batch,), m, jnp.int32)
    compact = jnp.argsort(sizes == 0, axis=1, stable=True)
    sizes = jnp.take_along_axis(sizes, compact, axis=1).astype(jnp.int32)
    offsets = jnp.arange(m)[None, :]
    # random, or logical (also confidence's placeholder: its order is chosen while decoding)
    random_rank = jnp.argsort(jnp.argsort(jax.random.uniform(k_order, (batch, m)), axis=1), axis=1)
    logical = (knobs.order == ORDERS.index("logical")) | (gcfg.mode.order == "confidence")
    rank = jnp.where(logical, jnp.broadcast_to(offsets, (batch, m)), random_rank)
    sort_key = jnp.where(rank < n_d[:, None], rank, n_d[:, None] + offsets)
    order = jnp.argsort(sort_key, axis=1).astype(jnp.int32)
    return order, sizes, (sizes > 0).sum(1).astype(jnp.int32), n_d


@dataclasses.dataclass(frozen=True)
class Decode:
    """What every step of one decode reads: the static sizes (M, K, Q, steps), special ids and sampler,
    and the per-row schedule (`plan`) and prompt arrays, traced inside the decode."""

    m: int
    kw: int
    kq: int
    n_steps_max: int
    eos: int | None
    pad: int
    mask_id: int
    vocab: int
    stop: bool
    confidence: bool
    has_sequential: bool
    draw: object
    lengths: Array
    last_prompt: Array
    planned: Array
    sizes: Array
    n_steps: Array
    n_dif_steps: Array
    starts: Array
    ar_rows: Array
    k_sample: Array

    @property
    def b(self) -> int:
        return self.lengths.shape[0]

    @property
    def qslot(self) -> Array:
        return jnp.arange(self.kq)[None, :]

    @property
    def slot(self) -> Array:
        return jnp.arange(self.kw)[None, :]


def _setup(tokens: Array, lengths: Array, key: Array, config, gcfg: GenerationConfig, knobs: MDM
           ) -> tuple[Decode, Array]:
    """(the decode's constants and schedule, num_diffusion [B]). The schedule has its non-empty diffusion
    steps first (k_s ≤ ⌈M/T⌉ evenly spread); T = 0 has no sequential phase."""
    b = tokens.shape[0]
    eos, pad = decoding.special_ids(config, gcfg)
    k_plan, k_sample = jax.random.split(key)
    planned, sizes, n_steps, n_diff = plan(k_plan, gcfg, b, knobs)
    steps = gcfg.mode.steps
    return Decode(m=gcfg.max_new_tokens, kw=window_rows(gcfg), kq=query_rows(gcfg), n_steps_max=max_steps(gcfg),
                  eos=eos, pad=pad, mask_id=config.mask_token_id, vocab=config.vocab_size,
                  stop=eos is not None and gcfg.stop_at_eos, confidence=gcfg.mode.order == "confidence",
                  has_sequential=steps > 0, draw=decoding.sampler(config, gcfg), lengths=lengths,
                  last_prompt=tokens[jnp.arange(b), lengths - 1], planned=planned, sizes=sizes, n_steps=n_steps,
                  n_dif_steps=jnp.minimum(n_diff, steps) if steps > 0 else n_steps,
                  starts=jnp.cumsum(sizes, axis=1) - sizes,
                  ar_rows=knobs.sequential == SEQUENTIAL.index("ar"), k_sample=k_sample), n_diff


def _init_state(d: Decode, cache: dict, tokens: Array, config, gcfg: GenerationConfig, debug: bool) -> dict:
    b, m, kw = d.b, d.m, d.kw
    state = dict(s=jnp.int32(0), cache=cache, gen=jnp.full((b, m), d.pad, jnp.int32),
                 decoded=jnp.zeros((b, m), bool), prev_off=jnp.full((b, kw), m, jnp.int32),
                 order=jnp.zeros((b, m), jnp.int32), phys=jnp.zeros((b, m), jnp.int32),
                 done=jnp.zeros((b,), bool), nfe=jnp.ones((b,), jnp.int32),
                 presence=decoding.initial_presence(tokens, d.lengths, config.vocab_size, gcfg))
    if debug:
        n, w = d.n_steps_max, kw + d.kq
        state["trace"] = dict(logits=jnp.zeros((n, b, w, config.vocab_size), jnp.float32),
                              tokens=jnp.zeros((n, b, w), jnp.int32), positions=jnp.zeros((n, b, w), jnp.int32),
                              valid=jnp.zeros((n, b, w), bool), cache_len=jnp.zeros((n, b), jnp.int32))
    return state


def candidates(d: Decode, st: dict, s: Array, k_s: Array, sequential: Array) -> tuple[Array, Array]:
    """This step's query rows: (logical offsets [B, Q], valid [B, Q])."""
    if d.confidence:
        undecoded = jnp.argsort(st["decoded"], axis=1, stable=True)[:, :d.kq].astype(jnp.int32)
        n_left = d.m - st["decoded"].sum(1)
        # Diffusion: every undecoded mask competes; sequential: the leftmost one alone.
        n_cand = jnp.where(sequential, jnp.minimum(n_left, 1), n_left) * (k_s > 0)
        return undecoded, d.qslot < n_cand[:, None]
    phys = jnp.clip(d.starts[:, s][:, None] + d.qslot, 0, d.m - 1)
    return jnp.take_along_axis(d.planned, phys, axis=1), d.qslot < k_s[:, None]


def _ar_requery(d: Decode, st: dict, sequential: Array, q_off: Array, q_valid: Array, q_tok: Array,
                q_pos: Array, window_mask: Array):
    """The AR-row convention: a sequential step's query row is the token before its target, fed again
    at its own position with its committed copy (in the cache or in this window) hidden. Returns
    (q_tok, q_pos, window_mask, cache_hide: the cache row each window row must not see, -1 for none)."""
    kw, kq = d.kw, d.kq
    requery = q_valid & (sequential & d.ar_rows)[:, None]
    before = jnp.maximum(q_off - 1, 0)
    first = q_off == 0
    before_tok = jnp.where(first, d.last_prompt[:, None], jnp.take_along_axis(st["gen"], before, axis=1))
    q_tok = jnp.where(requery, before_tok, q_tok)
    q_pos = jnp.where(requery, q_pos - 1, q_pos)
    dup = jnp.where(first, d.lengths[:, None] - 1,
                    d.lengths[:, None] + jnp.take_along_axis(st["phys"], before, axis=1))
    cache_hide = jnp.concatenate([jnp.full((d.b, kw), -1, jnp.int32), jnp.where(requery, dup, -1)], 1)
    hide_prev = requery[:, :, None] & (st["prev_off"][:, None, :] == q_off[:, :, None] - 1)
    window_mask = window_mask & ~jnp.pad(hide_prev, ((0, 0), (kw, 0), (0, kq)))
    return q_tok, q_pos, window_mask, cache_hide


def window(d: Decode, st: dict, s: Array, active: Array, k_s: Array, sequential: Array) -> dict:
    """Step s's window `[tokens sampled at step s−1 ; this step's queries]`: tokens, positions, valid,
    the window mask, the cache row each window row must not see (`cache_hide`), the query offsets and
    validity, and which previous rows to commit."""
    m = d.m
    q_off, q_valid = candidates(d, st, s, k_s, sequential)
    q_off = jnp.where(q_valid, q_off, m)
    prev_valid = (st["prev_off"] < m) & active[:, None]
    prev_tok = jnp.take_along_axis(st["gen"], jnp.minimum(st["prev_off"], m - 1), axis=1)
    q_tok = jnp.where(q_valid, d.mask_id, d.pad)
    q_pos = d.lengths[:, None] + jnp.minimum(q_off, m - 1)
    window_mask = masks.causal_with_padding(jnp.concatenate([prev_valid, q_valid], axis=1))
    cache_hide = None
    if d.has_sequential:  # T = 0 has no sequential phase: no convention to read
        q_tok, q_pos, window_mask, cache_hide = _ar_requery(d, st, sequential, q_off, q_valid, q_tok, q_pos,
                                                            window_mask)
    return dict(tokens=jnp.concatenate([jnp.where(prev_valid, prev_tok, d.pad), q_tok], axis=1),
                positions=jnp.concatenate([d.lengths[:, None] + jnp.minimum(st["prev_off"], m - 1), q_pos], axis=1),
                valid=jnp.concatenate([prev_valid, q_valid], axis=1), window_mask=window_mask,
                cache_hide=cache_hide, q_off=q_off, q_valid=q_valid, prev_valid=prev_valid)


def choose(d: Decode, q_logits: Array, q_valid: Array, k_s: Array) -> Array:
    """The query rows committed this step: all valid ones, or with the confidence order the k_s whose
    most likely token is most probable (the mask token is never sampled)."""
    if not d.confidence:
        return q_valid
    banned = jnp.arange(d.vocab) == d.mask_id
    score = jnp.max(jax.nn.log_softmax(jnp.where(banned, -jnp.inf, q_logits), axis=-1), axis=-1)
    rank = jnp.argsort(jnp.argsort(jnp.where(q_valid, -score, jnp.inf), axis=1), axis=1)
    return q_valid & (rank < k_s[:, None])


def _place(d: Decode, st: dict, s: Array, active: Array, k_s: Array, chosen: Array, q_off: Array, new_tok: Array
           ) -> dict:
    """Scatters the chosen tokens by logical offset (listed in logical order: their physical order in the
    cache from the next step on) and updates which rows are done."""
    m, rows, offs = d.m, jnp.arange(d.b)[:, None], jnp.arange(d.m)[None, :]
    pick = jnp.argsort(~chosen, axis=1, stable=True)[:, :d.kw]
    step_off = jnp.where(d.slot < k_s[:, None], jnp.take_along_axis(q_off, pick, axis=1), m)
    step_tok = jnp.take_along_axis(new_tok, pick, axis=1)
    step_phys = d.starts[:, s][:, None] + d.slot
    gen = st["gen"].at[rows, step_off].set(step_tok, mode="drop")
    decoded = st["decoded"].at[rows, step_off].set(True, mode="drop")
    done = st["done"] | ~active | decoded.all(1)
    if d.stop:
        hit = decoded & (gen == d.eos)
        first_eos = jnp.where(hit.any(1), jnp.argmax(hit, axis=1), m)
        done = done | (decoded | (offs > first_eos[:, None])).all(1)
    return dict(s=s + 1, gen=gen, decoded=decoded, prev_off=step_off, done=done, nfe=st["nfe"] + active,
                order=st["order"].at[rows, jnp.where(step_off < m, step_phys, m)].set(step_off, mode="drop"),
                phys=st["phys"].at[rows, step_off].set(step_phys, mode="drop"),
                presence=decoding.add_presence(st["presence"], step_tok, step_off < m))


def step(d: Decode, st: dict, params, config, debug: bool) -> dict:
    """One denoising step: the window against the cache, the K/V of its clean half committed, the
    queries sampled (MDM convention: a mask's logits row predicts its own position) and placed."""
    s = st["s"]
    active = ~st["done"] & (s < d.n_steps)
    k_s = jnp.where(active, d.sizes[:, s], 0)
    sequential = s >= d.n_dif_steps
    win = window(d, st, s, active, k_s, sequential)
    logits, kv = model_lib.apply(params, config, win["tokens"], win["positions"], window_mask=win["window_mask"],
                                 cache=st["cache"], cache_hide=win["cache_hide"])
    cache = kv_cache.commit(st["cache"], kv, jnp.concatenate([win["prev_valid"], jnp.zeros_like(win["q_valid"])], 1))
    q_logits = logits[:, d.kw:]
    new_tok = d.draw(jax.random.fold_in(d.k_sample, s), q_logits, st["presence"])
    new = dict(cache=cache, **_place(d, st, s, active, k_s, choose(d, q_logits, win["q_valid"], k_s),
                                     win["q_off"], new_tok))
    if debug:
        tr = st["trace"]
        new["trace"] = dict(logits=tr["logits"].at[s].set(logits), tokens=tr["tokens"].at[s].set(win["tokens"]),
                            positions=tr["positions"].at[s].set(win["positions"]),
                            valid=tr["valid"].at[s].set(win["valid"]),
                            cache_len=tr["cache_len"].at[s].set(st["cache"]["length"]))
    return new


def run(params, tokens: Array, lengths: Array, key: Array, *, config, gcfg: GenerationConfig,
        debug: bool = False, knobs: MDM | None = None) -> dict:
    """Mode A decode. tokens int32 [B, P] right-padded, lengths [B]; `knobs` the mode with its traced
    fields (default `gcfg.mode`). Returns tokens [B, M] (logical), lengths, num_forward_passes [B]
    (prefill included), loop_passes, order [B, M] (logical offsets in physical order), num_diffusion
    [B]; with debug a per-pass 'trace' (logits/tokens/positions/valid [S, B, K + Q, ·], cache_len
    [S, B]; Q = `query_rows`)."""
    knobs = (gcfg.mode if knobs is None else knobs).arrays()
    d, n_diff = _setup(tokens, lengths, key, config, gcfg, knobs)
    b, m = d.b, d.m
    _, cache = decoding.prefill(params, config, tokens, lengths, tokens.shape[1] + m, gcfg.kv_cache_dtype)
    st = jax.lax.while_loop(lambda st: (st["s"] < d.n_steps_max) & jnp.any(~st["done"]),
                            lambda st: step(d, st, params, config, debug),
                            _init_state(d, cache, tokens, config, gcfg, debug))
    out, out_lengths = decoding.finish(st["gen"], jnp.full((b,), m, jnp.int32), d.eos, gcfg, d.pad)
    # Offsets a stopped row never decoded follow in logical order (they are cut by the output length).
    offs = jnp.arange(m)[None, :]
    left = jnp.argsort(st["decoded"], axis=1, stable=True).astype(jnp.int32)
    n_dec = st["decoded"].sum(1)
    order = jnp.where(offs < n_dec[:, None], st["order"],
                      jnp.take_along_axis(left, jnp.clip(offs - n_dec[:, None], 0, m - 1), axis=1))
    result = dict(tokens=out, lengths=out_lengths, num_forward_passes=st["nfe"], loop_passes=st["s"] + 1,
                  order=order, num_diffusion=n_diff)
    if debug:
        result["trace"] = st["trace"]
    return result


def physical_layout(prompt_tokens: np.ndarray, prompt_lengths: np.ndarray, out_tokens: np.ndarray,
                    out_lengths: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host-side: (tokens, positions) int [B, P + M] in physical order — prompt, then the kept
    generated tokens in denoising order; −1 after. Positions are logical."""
    b, p = prompt_tokens.shape
    m = out_tokens.shape[1]
    toks = np.full((b, p + m), -1, np.int64)
    pos = np.full((b, p + m), -1, np.int64)
    for i in range(b):
        n, k = int(prompt_lengths[i]), int(out_lengths[i])
        kept = [int(o) for o in order[i] if o < k]
        toks[i, :n] = prompt_tokens[i, :n]
        pos[i, :n] = np.arange(n)
        toks[i, n:n + k] = out_tokens[i, kept]
        pos[i, n:n + k] = n + np.asarray(kept, np.int64)
    return toks, pos


def stats(raw: dict, gcfg: GenerationConfig, tokens: np.ndarray, lengths: np.ndarray, out_lengths: np.ndarray) -> dict:
    """The denoising order and the physical layout of each row (prompt, then tokens in decode order)."""
    ptoks, ppos = physical_layout(tokens, lengths, np.asarray(raw["tokens"]), out_lengths, raw["order"])
    return dict(order=np.asarray(raw["order"]), num_diffusion=np.asarray(raw["num_diffusion"]),
                physical_tokens=ptoks, physical_positions=ppos)


DECODER = Decoder(run, stats)
MDM.decoder = DECODER
