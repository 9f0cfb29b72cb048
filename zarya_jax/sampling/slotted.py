"""Mode B: slotted speculative decoding, ReFusion's plan-and-infill (docs/algorithms.md §6), at fixed shapes.

Layout: G = max_new_tokens, NB blocks of `block_size = ⌊G/NB⌋` tokens rounded down to a multiple of
the slot size S (NB is lowered to ⌊G/S⌋ when ⌊G/NB⌋ < S) **[decision]**; the last G − NB·block_size
positions stay empty. NB is raised to ⌊G/C⌋ (or ⌊G/C⌋ + 1 where that still leaves blocks over C) when
the block exceeds C = `max_block_size` rounded down to a multiple of S **[decision]**: the window, hence a pass's logits and attention scores, stays bounded
whatever G. Blocks are decoded left to right, each as `block_size/S` slots.

One `lax.while_loop`; every iteration is exactly one model pass over a window of `block_size` rows
(window row j = block offset j, logical position len + block·block_size + j), so rows of the batch
may be in different phases and still share the pass:
- PLAN: the block's pending slots as masks, causal (masks see the cache and earlier masks). Every mask
  is drafted (§4 sampling); a slot's confidence is the (untempered) probability of its first draft
  token; the slots above τs are chosen, at least the most confident one.
- VERIFY: the chosen drafts, causal (they are concatenated in logical order). A token passes if its AR
  probability (from the previous row of its slot) exceeds τt; a slot's first token passes. The
  leading chosen slots that pass entirely (in the flattened order) are committed with this pass's
  K/V and the row plans again; otherwise the chosen slots go to infill with their passing prefixes.
- INFILL_DRAFT / INFILL_VERIFY: the chosen slots in parallel with the slot-local mask (each row sees
  the committed cache and its own slot, causally) instead of ReFusion's per-slot cache copies
  **[decision]**: a greedy MDM pass redrafts the not-yet-accepted tokens, an AR pass verifies them;
  the token right after each accepted prefix always passes, so infill ends within S rounds. Then all
  chosen slots are committed with the K/V of that last verify pass.
Commits append the slots physically after the committed tokens (logical positions kept), so every
clean token precedes every remaining mask and no K/V is recomputed.
EOS: an accepted EOS cuts its slot after it, drops every slot logically after it; the row stops after
the current block. Not lossless (threshold verification). Forward passes are counted per row.

Two corrections beyond the paper (`Slotted.ar_infill`, `ar_first_token`; both off by default, which
is ReFusion's rule) hand the tokens that ReFusion takes from the MDM path unchecked to the AR rows instead:
- `ar_infill`: where a slot's verification fails at token m (in VERIFY or INFILL_VERIFY), token m becomes the
  AR verify row's own choice (argmax, or a draw under sampling, from row m−1 of that pass) instead of the
  MDM redraft that ReFusion forces through. A token corrected in a pass has no K/V of its own yet, so a slot
  commits only from a pass that ran its final tokens: when every chosen token is settled, the next
  INFILL_DRAFT pass (no masks left in it) commits them.
- `ar_first_token`: a chosen slot that directly follows committed text (its first position is right after
  the prompt or a committed token) gets as first token the AR choice that the row of that preceding token
  made when it was committed (`ar_next`), instead of the unchecked MDM draft.
With both on and one slot per block (NB·S = G, so every slot directly follows committed text), every
committed token is either AR's own choice or passed τt ≥ 0.5 (so it is AR's argmax): greedy mode B then
equals AR token for token, and the MDM path only decides how many tokens a pass yields.

The code has the shape of the description above: the loop carries a `State`; each pass builds its window
(`window`), runs the model once, evaluates what every phase reads from the logits (`evaluate` → `Pass`),
asks each phase function (`plan`, `verify`, `infill_draft`, `infill_verify`) for its `Update`, takes per
row the update of that row's phase (`select`) and applies it (`apply_update`: commit, then block end). The
phases read the traced knobs from the mode itself (`Slotted`, its traced fields as arrays).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ..nn import kv_cache, masks
from .. import model as model_lib
from . import decoding, primitives
from .config import GenerationConfig
from .decoder import Decoder
from .mode import Mode, expect_bool, expect_at_least_zero, expect_fraction, expect_int

Array = jax.Array
PLAN, VERIFY, INFILL_DRAFT, INFILL_VERIFY, DONE = 0, 1, 2, 3, 4
PENDING, CHOSEN, COMMITTED, DEAD = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class Slotted(Mode):
    """Mode B's knobs (module doc).

    slot_size S, serial_num_blocks NB: the layout (docs/algorithms.md §6.0).
    max_block_size C: the largest block (window rows of one pass): more blocks than NB when ⌊G/NB⌋
      exceeds it, so a pass's memory is bounded whatever G. The block is part of the algorithm (a plan
      chooses among its slots), so where it binds the output differs from the unbounded layout's; where
      ⌊G/NB⌋ ≤ C nothing changes.
    slot_threshold τs in [0, 1]; any value > 1 is accepted and means "one slot per plan" (no first-token
      probability exceeds it, so the single most confident slot is always chosen, as in ReFusion's
      code). token_threshold τt in [0, 1].
    ar_infill, ar_first_token: the AR corrections (beyond the paper; off = ReFusion's rule, module doc).
    Traced: τs, τt and the corrections (one program for every value).
    """

    name = "slotted"
    label = "mode B (slotted)"
    TRACED = ("slot_threshold", "token_threshold", "ar_infill", "ar_first_token")
    needs_mask_token = True

    slot_size: int = 8
    serial_num_blocks: int = 2
    max_block_size: int = 256
    slot_threshold: float = 0.9
    token_threshold: float = 0.9
    ar_infill: bool = False
    ar_first_token: bool = False

    def check(self, gc) -> None:
        expect_int(self, "slot_size", 1)
        expect_int(self, "serial_num_blocks", 1)
        expect_int(self, "max_block_size", 1)
        expect_at_least_zero(self, "slot_threshold", "a value in [0, 1] (or > 1 for one slot per plan)")
        expect_fraction(self, "token_threshold")
        expect_bool(self, "ar_infill")
        expect_bool(self, "ar_first_token")
        if self.slot_size > gc.max_new_tokens:
            raise ValueError(f"{self.knob_name('slot_size')}={self.slot_size} does not fit max_new_tokens="
                             f"{gc.max_new_tokens}: mode B needs at least one whole slot (slot_size ≤ max_new_tokens)")
        if self.slot_size > self.max_block_size:
            raise ValueError(f"{self.knob_name('slot_size')}={self.slot_size} does not fit max_block_size="
                             f"{self.max_block_size}: a block holds whole slots (raise max_block_size or lower slot_size)")

    def short(self) -> str:
        """e.g. "S=8 NB=4 τs=0.9 τt=0.5 AR infill + first token"."""
        corr = {(False, False): "ReFusion rule", (True, False): "AR infill",
                (True, True): "AR infill + first token"}.get((self.ar_infill, self.ar_first_token), "custom")
        return (f"S={self.slot_size} NB={self.serial_num_blocks} τs={self.slot_threshold:g} "
                f"τt={self.token_threshold:g} {corr}")

    def canonical(self, max_new_tokens: int) -> "Slotted | None":
        """None where no whole slot fits the budget; serial_num_blocks 0 stands for one slot per block
        (NB = G // S)."""
        if self.slot_size > max_new_tokens:
            return None
        return dataclasses.replace(self, serial_num_blocks=self.serial_num_blocks or max_new_tokens // self.slot_size)


def block_layout(gcfg: GenerationConfig) -> tuple[int, int]:
    """(number of blocks, block size), docs/algorithms.md §6.0 with the rounding and bounding decisions above."""
    mode = gcfg.mode
    g, s, nb = gcfg.max_new_tokens, mode.slot_size, mode.serial_num_blocks
    if g // nb < s:
        nb = max(1, g // s)
    cap = max(s, mode.max_block_size // s * s)
    if (g // nb) // s * s > cap:  # the fewest blocks of at most C rows, from ⌊G/C⌋ full ones
        nb = g // cap
        nb += (g // nb) // s * s > cap
    return nb, (g // nb) // s * s


def max_iterations(gcfg: GenerationConfig) -> int:
    """Bound on loop passes: every plan round commits ≥ 1 slot in ≤ 2 + 2S passes."""
    nb, bs = block_layout(gcfg)
    s = gcfg.mode.slot_size
    return nb * (bs // s) * (2 + 2 * s)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The static shape of one decode: G outputs in `nb` blocks of `bs` window rows, `ns` slots of `S` rows
    per block; the special ids, and whether an accepted EOS stops a row."""

    g: int
    S: int
    nb: int
    bs: int
    ns: int
    mask_id: int
    pad: int
    eos: int | None
    stop: bool

    @classmethod
    def of(cls, config, gcfg: GenerationConfig) -> "Layout":
        nb, bs = block_layout(gcfg)
        eos, pad = decoding.special_ids(config, gcfg)
        return cls(g=gcfg.max_new_tokens, S=gcfg.mode.slot_size, nb=nb, bs=bs, ns=bs // gcfg.mode.slot_size,
                   mask_id=config.mask_token_id, pad=pad, eos=eos, stop=eos is not None and gcfg.stop_at_eos)

    @property
    def j(self) -> Array:
        """[1, bs]: window row = block offset."""
        return jnp.arange(self.bs)[None, :]

    @property
    def row_slot(self) -> Array:
        """[bs]: the slot of each window row."""
        return jnp.arange(self.bs) // self.S

    @property
    def first_row(self) -> Array:
        """bool [1, bs]: the first row of each slot."""
        return (jnp.arange(self.bs) % self.S == 0)[None, :]

    @property
    def slot_start(self) -> Array:
        """[1, ns]: each slot's first window row."""
        return jnp.arange(self.ns)[None, :] * self.S


@struct.dataclass
class State:
    """The loop's carry. Per row b: its `phase`, block `blk`, the block's `slots` [B, ns] (PENDING, CHOSEN,
    COMMITTED, DEAD), the window's `draft` tokens and accepted `tags` [B, bs]; the committed text in the
    cache, in physical order (`phys_tok`/`phys_pos` [B, P + G], −1 after) and in logical order (`gen`,
    `filled` [B, G]); `ar_next` [B, G + 1] (the AR choice for output i made when output i − 1 was
    committed, read by `ar_first_token`); counters; the debug `trace` (None without debug)."""

    it: Array
    cache: dict
    phys_tok: Array
    phys_pos: Array
    phase: Array
    blk: Array
    slots: Array
    draft: Array
    tags: Array
    eos_flag: Array
    gen: Array
    filled: Array
    nfe: Array
    plans: Array
    presence: Array | None
    ar_next: Array
    trace: dict | None = None


@struct.dataclass
class Pass:
    """What every phase reads from this pass's logits [B, bs, V]: the window rows of pending and chosen
    slots; `sample`, a draw for every row (PLAN's drafts); `greedy`, the argmax (INFILL_DRAFT's redrafts);
    `ar_ok`, whether each draft token's AR probability (from the previous row) exceeds τt; `choice`, the
    AR row j's pick for the next position, and `row_choice`, the pick for row j (row j − 1's choice)."""

    logits: Array
    pending: Array
    chosen: Array
    sample: Array
    greedy: Array
    ar_ok: Array
    choice: Array
    row_choice: Array


@struct.dataclass
class Update:
    """A phase's outcome for every row (a row takes the one of its own phase, `select`): new slots, draft
    and tags; the window rows to commit with this pass's K/V; whether the row commits now, its next
    phase, and the window offset of a committed EOS (bs if none)."""

    slots: Array
    draft: Array
    tags: Array
    commit: Array
    committed: Array
    next_phase: Array
    eos_pos: Array


def _slot_cumprod(x: Array, s: int) -> Array:
    """Prefix-AND within each slot of S consecutive rows. x bool [B, T] -> [B, T]."""
    b, t = x.shape
    return jnp.cumprod(x.reshape(b, t // s, s).astype(jnp.int32), axis=2).reshape(b, t).astype(bool)


def _append(buf: Array, length: Array, values: Array, keep: Array) -> Array:
    """Writes values[b, keep] after buf's row length (same placement as kv_cache.commit)."""
    idx = jnp.where(keep, length[:, None] + jnp.cumsum(keep, axis=1) - 1, buf.shape[1])
    return buf.at[jnp.arange(buf.shape[0])[:, None], idx].set(values, mode="drop")


def _shift_right(x: Array, fill) -> Array:
    """x [B, T] moved one row right, `fill` in row 0."""
    return jnp.concatenate([jnp.full((x.shape[0], 1), fill, x.dtype), x[:, :-1]], axis=1)


def _stay(st: State, lay: Layout, next_phase: int, slots: Array | None = None, draft: Array | None = None
          ) -> Update:
    """An update that commits nothing."""
    b = st.phase.shape[0]
    return Update(slots=st.slots if slots is None else slots, draft=st.draft if draft is None else draft,
                  tags=st.tags, commit=jnp.zeros_like(st.tags), committed=jnp.zeros((b,), bool),
                  next_phase=jnp.full((b,), next_phase, jnp.int32), eos_pos=jnp.full((b,), lay.bs))


# ------------------------------------------------------------------ one pass: window, model, evaluation

def window(st: State, lay: Layout, lengths: Array) -> tuple[Array, Array, Array, Array]:
    """Each row's window for its phase: (tokens, positions, valid [B, bs], attention mask [B, bs, bs]).
    PLAN runs the pending slots as masks; VERIFY the chosen drafts; INFILL_DRAFT the chosen slots with
    their unaccepted tokens masked, INFILL_VERIFY their drafts (both slot-local); DONE nothing."""
    ph = st.phase[:, None]
    slot_rows = st.slots[:, lay.row_slot]
    valid = jnp.where(ph == PLAN, slot_rows == PENDING, jnp.where(ph == DONE, False, slot_rows == CHOSEN))
    tokens = jnp.where(ph == PLAN, lay.mask_id, jnp.where((ph == INFILL_DRAFT) & ~st.tags, lay.mask_id, st.draft))
    tokens = jnp.where(valid, tokens, lay.pad)
    positions = (lengths + st.blk * lay.bs)[:, None] + lay.j
    causal = masks.causal_with_padding(valid)
    slot_local = masks.group_local(jnp.where(valid, lay.row_slot[None, :], -1))
    local = (st.phase == INFILL_DRAFT) | (st.phase == INFILL_VERIFY)
    return tokens, positions, valid, jnp.where(local[:, None, None], slot_local, causal)


def evaluate(st: State, logits: Array, key: Array, knobs: Slotted, lay: Layout, draw: Callable,
             greedy: Callable) -> Pass:
    """The draws and AR checks of this pass (`Pass`); pass `it` draws from fold_in(key, it)."""
    k_it = jax.random.fold_in(key, st.it)
    slot_rows = st.slots[:, lay.row_slot]
    ar_prob = jnp.concatenate([jnp.ones((logits.shape[0], 1)),
                               primitives.token_prob(logits[:, :-1], st.draft[:, 1:], lay.mask_id)], axis=1)
    choice = draw(jax.random.fold_in(k_it, 1), logits, st.presence)
    return Pass(logits=logits, pending=slot_rows == PENDING, chosen=slot_rows == CHOSEN,
                sample=draw(k_it, logits, st.presence), greedy=greedy(k_it, logits, st.presence),
                ar_ok=ar_prob > knobs.token_threshold, choice=choice, row_choice=_shift_right(choice, 0))


# ------------------------------------------------------------------ the phases

def _correct(ps: Pass, lay: Layout, prefix: Array, tokens: Array, allowed=True) -> tuple[Array, Array, Array]:
    """`ar_infill`: the first token after each chosen slot's accepted prefix (where `allowed`) becomes the
    AR row's choice. Returns (tags, tokens, corrected rows)."""
    prev = _shift_right(prefix, False) & ~lay.first_row
    boundary = ps.chosen & ~prefix & prev & allowed
    return prefix | boundary, jnp.where(boundary, ps.row_choice, tokens), boundary


def _settle(st: State, ps: Pass, lay: Layout, tags: Array, tokens: Array, corrected: Array, otherwise: int
            ) -> Update:
    """Chosen slots whose tokens are all accepted (an accepted EOS completes its slot and kills the slots
    after it) commit together, unless a token was corrected in this pass (its K/V is not this pass's);
    a row that does not complete goes to `otherwise`."""
    slots, eos_pos = st.slots, jnp.full((st.slots.shape[0],), lay.bs)
    j = lay.j
    if lay.stop:
        hit = tags & (tokens == lay.eos)
        eos_pos = jnp.where(hit.any(1), jnp.argmax(hit, axis=1), lay.bs)
        slots = jnp.where((lay.slot_start > eos_pos[:, None]) & ((st.slots == CHOSEN) | (st.slots == PENDING)),
                          DEAD, st.slots)
        tags = tags | (ps.chosen & (lay.row_slot[None, :] == (eos_pos // lay.S)[:, None]))
        tags = tags & (slots[:, lay.row_slot] == CHOSEN)
    live = slots[:, lay.row_slot] == CHOSEN
    complete = jnp.all(tags | ~live, axis=1) & ~jnp.any(corrected & live & (j <= eos_pos[:, None]), axis=1)
    return Update(slots=jnp.where(complete[:, None] & (slots == CHOSEN), COMMITTED, slots), draft=tokens, tags=tags,
                  commit=live & (j <= eos_pos[:, None]) & complete[:, None], committed=complete,
                  next_phase=jnp.where(complete, PLAN, otherwise), eos_pos=jnp.where(complete, eos_pos, lay.bs))


def plan(st: State, ps: Pass, knobs: Slotted, lay: Layout) -> Update:
    """PLAN: draft every mask; choose the pending slots whose first-token confidence (its untempered
    probability) exceeds τs, at least the most confident one. With `ar_first_token` a chosen slot right
    after committed text starts with the AR choice made when that text was committed."""
    rows = jnp.arange(st.slots.shape[0])[:, None]
    conf = primitives.token_prob(ps.logits, ps.sample, lay.mask_id)[:, ::lay.S]          # [B, ns]
    pend = st.slots == PENDING
    pick = pend & (conf > knobs.slot_threshold)
    best = jax.nn.one_hot(jnp.argmax(jnp.where(pend, conf, -1.0), axis=1), lay.ns, dtype=bool) & pend
    pick = jnp.where(pick.any(1, keepdims=True), pick, best)
    draft = jnp.where(ps.pending, ps.sample, st.draft)
    first_out = st.blk[:, None] * lay.bs + lay.slot_start                                  # [B, ns]
    follows = (first_out == 0) | st.filled[rows, jnp.maximum(first_out - 1, 0)]
    fix = (pick & follows)[:, lay.row_slot] & lay.first_row & knobs.ar_first_token
    draft = jnp.where(fix, st.ar_next[rows, first_out][:, lay.row_slot], draft)
    return _stay(st, lay, VERIFY, slots=jnp.where(pick, CHOSEN, st.slots), draft=draft)


def verify(st: State, ps: Pass, knobs: Slotted, lay: Layout) -> Update:
    """VERIFY: a token passes if its AR probability exceeds τt (a slot's first token always passes); the
    leading chosen slots that pass entirely commit (an accepted EOS cuts there) and the row plans again,
    else the chosen slots go to infill with their passing prefixes."""
    b, j = st.slots.shape[0], lay.j
    passed = ps.chosen & (lay.first_row | ps.ar_ok)
    first_fail = jnp.min(jnp.where(ps.chosen & ~passed, j, lay.bs), axis=1)
    lead = (st.slots == CHOSEN) & (lay.slot_start + lay.S - 1 < first_fail[:, None])  # [B, ns]
    commit = ps.chosen & lead[:, lay.row_slot]
    eos_pos = jnp.full((b,), lay.bs)
    if lay.stop:
        hit = ps.chosen & (st.draft == lay.eos) & (j < first_fail[:, None])
        eos_pos = jnp.where(hit.any(1), jnp.argmax(hit, axis=1), lay.bs)
        commit = jnp.where((eos_pos < lay.bs)[:, None], ps.chosen & (j <= eos_pos[:, None]), commit)
    commits = commit.any(1)
    slots = jnp.where(commit.reshape(b, lay.ns, lay.S).any(axis=2), COMMITTED,
                      jnp.where(st.slots == CHOSEN, PENDING, st.slots))
    slots = jnp.where(lay.slot_start > eos_pos[:, None], DEAD, slots)
    slots = jnp.where(commits[:, None], slots, st.slots)
    tags = _slot_cumprod(passed, lay.S)
    # `ar_infill` corrects only the first failure of the window: every row before it is accepted, so
    # its AR row saw exactly the text it will follow (later slots saw unaccepted drafts before them)
    c_tags, c_draft, _ = _correct(ps, lay, tags & ps.chosen, st.draft, j == first_fail[:, None])
    return Update(slots=slots, draft=jnp.where(knobs.ar_infill, c_draft, st.draft),
                  tags=jnp.where(knobs.ar_infill, c_tags, tags), commit=commit, committed=commits,
                  next_phase=jnp.where(commits, PLAN, INFILL_DRAFT), eos_pos=eos_pos)


def infill_draft(st: State, ps: Pass, knobs: Slotted, lay: Layout) -> Update:
    """INFILL_DRAFT: a greedy MDM redraft of the chosen slots' not-yet-accepted tokens. With every chosen
    token already settled (only after an `ar_infill` correction) the pass ran exactly the final tokens,
    so it commits them instead."""
    settled = jnp.all(st.tags | ~ps.chosen, axis=1)
    done = _settle(st, ps, lay, st.tags, st.draft, jnp.zeros_like(st.tags), INFILL_VERIFY)
    complete = done.committed & settled & knobs.ar_infill
    return Update(slots=jnp.where(complete[:, None], done.slots, st.slots),
                  draft=jnp.where(ps.chosen & ~st.tags, ps.greedy, st.draft), tags=st.tags,
                  commit=done.commit & complete[:, None], committed=complete,
                  next_phase=jnp.where(complete, PLAN, INFILL_VERIFY),
                  eos_pos=jnp.where(complete, done.eos_pos, lay.bs))


def infill_verify(st: State, ps: Pass, knobs: Slotted, lay: Layout) -> Update:
    """INFILL_VERIFY: extend each chosen slot's accepted prefix by the tokens that pass τt; the token right
    after it always passes (ReFusion) or, with `ar_infill`, becomes the AR row's choice. Complete rows
    commit all chosen slots, the others redraft."""
    a_tags, a_draft, a_fixed = _correct(ps, lay, _slot_cumprod(ps.chosen & (st.tags | ps.ar_ok), lay.S) & ps.chosen,
                                        st.draft)
    prev_tag = _shift_right(st.tags, True) | lay.first_row
    r_tags = _slot_cumprod(ps.chosen & (st.tags | prev_tag | ps.ar_ok), lay.S) & ps.chosen
    tags = jnp.where(knobs.ar_infill, a_tags, r_tags)
    draft = jnp.where(knobs.ar_infill, a_draft, st.draft)
    return _settle(st, ps, lay, tags, draft, a_fixed & knobs.ar_infill, INFILL_DRAFT)


PHASES = (plan, verify, infill_draft, infill_verify)  # indexed by phase id; DONE rows stay as they are


def select(phase: Array, updates: Sequence[Update], otherwise: Update) -> Update:
    """Row b takes `updates[phase[b]]` (`otherwise` for a phase past them): the one per-row selection."""
    out = otherwise
    for p in reversed(range(len(updates))):
        on = phase == p
        out = jax.tree.map(lambda new, old: jnp.where(on.reshape(on.shape + (1,) * (new.ndim - 1)), new, old),
                           updates[p], out)
    return out


def apply_update(st: State, u: Update, ps: Pass, kv, positions: Array, lay: Layout) -> State:
    """Commits the update's rows (this pass's K/V, the tokens in physical and logical order), then ends
    the block of a row with no pending slot left: the next block, or DONE after an EOS or the last block."""
    rows = jnp.arange(st.phase.shape[0])[:, None]
    length = st.cache["length"]
    out_idx = jnp.where(u.commit, st.blk[:, None] * lay.bs + lay.j, lay.g)
    eos_flag = st.eos_flag | (u.committed & (u.eos_pos < lay.bs))
    block_over = (u.next_phase == PLAN) & ~jnp.any(u.slots == PENDING, axis=1)
    finished = block_over & (eos_flag | (st.blk == lay.nb - 1))
    advance = block_over & ~finished
    return st.replace(
        it=st.it + 1, cache=kv_cache.commit(st.cache, kv, u.commit),
        phys_tok=_append(st.phys_tok, length, u.draft, u.commit),
        phys_pos=_append(st.phys_pos, length, positions, u.commit),
        gen=st.gen.at[rows, out_idx].set(u.draft, mode="drop"),
        filled=st.filled.at[rows, out_idx].set(True, mode="drop"),
        presence=decoding.add_presence(st.presence, u.draft, u.commit),
        ar_next=st.ar_next.at[rows, jnp.where(u.commit, out_idx + 1, lay.g + 1)].set(ps.choice, mode="drop"),
        phase=jnp.where(finished, DONE, u.next_phase), blk=st.blk + advance,
        slots=jnp.where(advance[:, None], PENDING, u.slots), tags=jnp.where(advance[:, None], False, u.tags),
        draft=u.draft, eos_flag=eos_flag, nfe=st.nfe + (st.phase != DONE), plans=st.plans + (st.phase == PLAN))


# ------------------------------------------------------------------ the decoder

def _init_state(tokens: Array, lengths: Array, cache: dict, first_choice: Array, presence, lay: Layout,
                n_iter: int, vocab: int, debug: bool) -> State:
    """The state after the prefill: the prompts committed, every row planning its first block."""
    b, p = tokens.shape
    prompt_valid = jnp.arange(p)[None, :] < lengths[:, None]
    empty = jnp.full((b, p + lay.g), -1, jnp.int32)
    start = jnp.zeros((b,), jnp.int32)
    trace = None
    if debug:
        per_row = (n_iter, b, lay.bs)
        trace = dict(logits=jnp.zeros(per_row + (vocab,), jnp.float32), tokens=jnp.zeros(per_row, jnp.int32),
                     positions=jnp.zeros(per_row, jnp.int32), valid=jnp.zeros(per_row, bool),
                     phase=jnp.full((n_iter, b), DONE, jnp.int32), cache_len=jnp.zeros((n_iter, b), jnp.int32))
    return State(it=jnp.int32(0), cache=cache, phys_tok=_append(empty, start, tokens, prompt_valid),
                 phys_pos=_append(empty, start, jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p)), prompt_valid),
                 phase=jnp.full((b,), PLAN, jnp.int32), blk=jnp.zeros((b,), jnp.int32),
                 slots=jnp.full((b, lay.ns), PENDING, jnp.int32), draft=jnp.full((b, lay.bs), lay.pad, jnp.int32),
                 tags=jnp.zeros((b, lay.bs), bool), eos_flag=jnp.zeros((b,), bool),
                 gen=jnp.full((b, lay.g), lay.pad, jnp.int32), filled=jnp.zeros((b, lay.g), bool),
                 nfe=jnp.ones((b,), jnp.int32), plans=jnp.zeros((b,), jnp.int32), presence=presence,
                 ar_next=jnp.zeros((b, lay.g + 1), jnp.int32).at[:, 0].set(first_choice), trace=trace)


def _record(trace: dict, it: Array, logits, tokens, positions, valid, phase, cache_len) -> dict:
    """The debug trace with pass `it` written."""
    new = dict(logits=logits, tokens=tokens, positions=positions, valid=valid, phase=phase, cache_len=cache_len)
    return {k: trace[k].at[it].set(v) for k, v in new.items()}


def run(params, tokens: Array, lengths: Array, key: Array, *, config, gcfg: GenerationConfig,
        knobs: Slotted | None = None, debug: bool = False) -> dict:
    """Mode B decode. tokens int32 [B, P] right-padded, lengths [B]; `knobs` the mode with its traced
    fields (default `gcfg.mode`, whose traced fields the static key resets). Returns tokens [B, G] (logical), lengths,
    num_forward_passes [B] (prefill included), loop_passes, physical_tokens/positions [B, P + G] (the
    cache's rows in physical order, −1 after), plans [B]; with debug a per-pass trace."""
    knobs = (gcfg.mode if knobs is None else knobs).arrays()
    lay = Layout.of(config, gcfg)
    n_iter = max_iterations(gcfg)
    draw = decoding.sampler(config, gcfg)
    greedy = decoding.sampler(config, gcfg.replace(temperature=0.0))

    last_logits, cache = decoding.prefill(params, config, tokens, lengths, tokens.shape[1] + lay.g, gcfg.kv_cache_dtype)
    presence = decoding.initial_presence(tokens, lengths, config.vocab_size, gcfg)
    first_choice = draw(jax.random.fold_in(key, n_iter), last_logits, presence)
    state = _init_state(tokens, lengths, cache, first_choice, presence, lay, n_iter, config.vocab_size, debug)

    def cond(st: State):
        return (st.it < n_iter) & jnp.any(st.phase != DONE)

    def body(st: State) -> State:
        win, positions, valid, wmask = window(st, lay, lengths)
        logits, kv = model_lib.apply(params, config, win, positions, window_mask=wmask, cache=st.cache)
        ps = evaluate(st, logits, key, knobs, lay, draw, greedy)
        u = select(st.phase, [phase(st, ps, knobs, lay) for phase in PHASES], _stay(st, lay, DONE))
        new = apply_update(st, u, ps, kv, positions, lay)
        if debug:
            new = new.replace(trace=_record(st.trace, st.it, logits, win, positions, valid, st.phase,
                                            st.cache["length"]))
        return new

    st = jax.lax.while_loop(cond, body, state)
    idx = jnp.arange(lay.g)[None, :]
    generated = jnp.sum(st.filled & (idx < lay.nb * lay.bs), axis=1).astype(jnp.int32)
    if lay.stop:
        hit = st.filled & (st.gen == lay.eos)
        generated = jnp.where(hit.any(1), jnp.argmax(hit, axis=1) + 1, generated)
    out = jnp.where(idx < generated[:, None], st.gen, lay.pad)
    result = dict(tokens=out, lengths=generated, num_forward_passes=st.nfe, loop_passes=st.it + 1,
                  physical_tokens=st.phys_tok, physical_positions=st.phys_pos, plans=st.plans,
                  num_blocks=jnp.int32(lay.nb), block_size=jnp.int32(lay.bs))
    if debug:
        result["trace"] = st.trace
    return result


def _cut_physical(toks: np.ndarray, pos: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keeps the physical rows whose logical position is < end[b] (drops text after EOS), −1 after."""
    out_t = np.full_like(toks, -1)
    out_p = np.full_like(pos, -1)
    for i in range(toks.shape[0]):
        keep = (pos[i] >= 0) & (pos[i] < end[i])
        n = int(keep.sum())
        out_t[i, :n] = toks[i, keep]
        out_p[i, :n] = pos[i, keep]
    return out_t, out_p


def stats(raw: dict, gcfg: GenerationConfig, tokens: np.ndarray, lengths: np.ndarray, out_lengths: np.ndarray) -> dict:
    """The committed physical order (cut at each row's end), plans per row and the block layout."""
    ptoks, ppos = _cut_physical(np.asarray(raw["physical_tokens"]), np.asarray(raw["physical_positions"]),
                                lengths + out_lengths)
    return dict(physical_tokens=ptoks, physical_positions=ppos, plans=np.asarray(raw["plans"]),
                num_blocks=int(raw["num_blocks"]), block_size=int(raw["block_size"]))


DECODER = Decoder(run, stats)
Slotted.decoder = DECODER
