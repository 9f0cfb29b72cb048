"""Mode B: slotted speculative decoding, ReFusion's plan-and-infill (SPEC §6), at fixed shapes.

Layout: G = max_new_tokens, NB blocks of `block_size = ⌊G/NB⌋` tokens rounded down to a multiple of
the slot size S (NB is lowered to ⌊G/S⌋ when ⌊G/NB⌋ < S) **[decision]**; the last G − NB·block_size
positions stay empty. Blocks are decoded left to right, each as `block_size/S` slots.

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

Two corrections beyond the paper (`GenerationConfig.ar_infill`, `ar_first_token`; both off by default, which
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
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..nn import kv_cache, masks
from ..nn import model as model_lib
from . import decoding, primitives
from .config import GenerationConfig
from .decoder import Decoder

Array = jax.Array
PLAN, VERIFY, INFILL_DRAFT, INFILL_VERIFY, DONE = 0, 1, 2, 3, 4
PENDING, CHOSEN, COMMITTED, DEAD = 0, 1, 2, 3


def block_layout(gcfg: GenerationConfig) -> tuple[int, int]:
    """(number of blocks, block size), SPEC §6 with the rounding decision above."""
    g, s, nb = gcfg.max_new_tokens, gcfg.slot_size, gcfg.serial_num_blocks
    if g // nb < s:
        nb = max(1, g // s)
    return nb, (g // nb) // s * s


def max_iterations(gcfg: GenerationConfig) -> int:
    """Bound on loop passes: every plan round commits ≥ 1 slot in ≤ 2 + 2S passes."""
    nb, bs = block_layout(gcfg)
    return nb * (bs // gcfg.slot_size) * (2 + 2 * gcfg.slot_size)


def _slot_cumprod(x: Array, s: int) -> Array:
    """Prefix-AND within each slot of S consecutive rows. x bool [B, T] -> [B, T]."""
    b, t = x.shape
    return jnp.cumprod(x.reshape(b, t // s, s).astype(jnp.int32), axis=2).reshape(b, t).astype(bool)


def _append(buf: Array, length: Array, values: Array, keep: Array) -> Array:
    """Writes values[b, keep] after buf's row length (same placement as kv_cache.commit)."""
    idx = jnp.where(keep, length[:, None] + jnp.cumsum(keep, axis=1) - 1, buf.shape[1])
    return buf.at[jnp.arange(buf.shape[0])[:, None], idx].set(values, mode="drop")


def run(params, tokens: Array, lengths: Array, key: Array, *, config, gcfg: GenerationConfig,
        debug: bool = False, dyn: dict | None = None) -> dict:
    """Mode B decode. tokens int32 [B, P] right-padded, lengths [B]. `dyn` may hold the thresholds as
    traced scalars ({'slot_threshold', 'token_threshold', 'ar_infill', 'ar_first_token'}); otherwise gcfg's
    values are used. Returns tokens [B, G] (logical),
    lengths, num_forward_passes [B] (prefill included), loop_passes, physical_tokens/positions
    [B, P + G] (the cache's rows in physical order, −1 after), plans [B]; with debug a per-pass trace."""
    b, p = tokens.shape
    g, S = gcfg.max_new_tokens, gcfg.slot_size
    nb, bs = block_layout(gcfg)
    ns = bs // S
    lc = p + g
    n_iter = max_iterations(gcfg)
    eos, pad = decoding.special_ids(config, gcfg)
    mask_id = config.mask_token_id
    draw = decoding.sampler(config, gcfg)
    greedy_cfg = gcfg.replace(temperature=0.0)
    greedy = decoding.sampler(config, greedy_cfg)
    stop = eos is not None and gcfg.stop_at_eos
    dyn = dyn or {}
    tau_s = dyn.get("slot_threshold", gcfg.slot_threshold)
    tau_t = dyn.get("token_threshold", gcfg.token_threshold)
    use_infill = jnp.asarray(dyn.get("ar_infill", gcfg.ar_infill), bool)
    use_first = jnp.asarray(dyn.get("ar_first_token", gcfg.ar_first_token), bool)

    last_logits, cache = decoding.prefill(params, config, tokens, lengths, lc, gcfg.kv_cache_dtype)
    prompt_valid = jnp.arange(p)[None, :] < lengths[:, None]
    zeros_lc = jnp.full((b, lc), -1, jnp.int32)
    phys_tok = _append(zeros_lc, jnp.zeros((b,), jnp.int32), tokens, prompt_valid)
    phys_pos = _append(zeros_lc, jnp.zeros((b,), jnp.int32),
                       jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p)), prompt_valid)

    j = jnp.arange(bs)[None, :]            # window row = block offset
    row_slot = jnp.arange(bs) // S          # [bs]
    first_row = (jnp.arange(bs) % S == 0)[None, :]
    slot_start = jnp.arange(ns)[None, :] * S
    rows = jnp.arange(b)[:, None]

    state = dict(it=jnp.int32(0), cache=cache, phys_tok=phys_tok, phys_pos=phys_pos,
                 phase=jnp.full((b,), PLAN, jnp.int32), blk=jnp.zeros((b,), jnp.int32),
                 slots=jnp.full((b, ns), PENDING, jnp.int32), draft=jnp.full((b, bs), pad, jnp.int32),
                 tags=jnp.zeros((b, bs), bool), eos_flag=jnp.zeros((b,), bool),
                 gen=jnp.full((b, g), pad, jnp.int32), filled=jnp.zeros((b, g), bool),
                 nfe=jnp.ones((b,), jnp.int32), plans=jnp.zeros((b,), jnp.int32),
                 presence=decoding.initial_presence(tokens, lengths, config.vocab_size, gcfg))
    # ar_next[b, i]: the AR choice for output index i made by the row of index i − 1 (the last prompt
    # token for i = 0) when that row was committed; read by `ar_first_token`.
    first_choice = draw(jax.random.fold_in(key, n_iter), last_logits, state["presence"])
    state["ar_next"] = jnp.zeros((b, g + 1), jnp.int32).at[:, 0].set(first_choice)
    if debug:
        state["trace"] = dict(logits=jnp.zeros((n_iter, b, bs, config.vocab_size), jnp.float32),
                              tokens=jnp.zeros((n_iter, b, bs), jnp.int32),
                              positions=jnp.zeros((n_iter, b, bs), jnp.int32),
                              valid=jnp.zeros((n_iter, b, bs), bool), phase=jnp.full((n_iter, b), DONE, jnp.int32),
                              cache_len=jnp.zeros((n_iter, b), jnp.int32))

    def cond(st):
        return (st["it"] < n_iter) & jnp.any(st["phase"] != DONE)

    def body(st):
        it, phase, slots, draft, tags = st["it"], st["phase"], st["slots"], st["draft"], st["tags"]
        ph = phase[:, None]
        slot_rows = slots[:, row_slot]                       # [B, bs]
        pending_rows = slot_rows == PENDING
        chosen_rows = slot_rows == CHOSEN
        local = (phase == INFILL_DRAFT) | (phase == INFILL_VERIFY)

        # ---- the window of this pass, per row's phase
        valid = jnp.where(ph == PLAN, pending_rows, jnp.where(ph == DONE, False, chosen_rows))
        win_tok = jnp.where(ph == PLAN, mask_id, jnp.where((ph == INFILL_DRAFT) & ~tags, mask_id, draft))
        win_tok = jnp.where(valid, win_tok, pad)
        positions = (lengths + st["blk"] * bs)[:, None] + j
        causal = masks.causal_with_padding(valid)
        slot_local = masks.group_local(jnp.where(valid, row_slot[None, :], -1))
        wmask = jnp.where(local[:, None, None], slot_local, causal)
        logits, kv = model_lib.apply(params, config, win_tok, positions, window_mask=wmask, cache=st["cache"])
        nfe = st["nfe"] + (phase != DONE)

        # ---- PLAN: draft every mask, choose slots by first-token confidence
        k_it = jax.random.fold_in(key, it)
        plan_draft = draw(k_it, logits, st["presence"])
        conf = primitives.token_prob(logits, plan_draft, mask_id)[:, ::S]          # [B, ns]
        pend = slots == PENDING
        pick = pend & (conf > tau_s)
        best = jax.nn.one_hot(jnp.argmax(jnp.where(pend, conf, -1.0), axis=1), ns, dtype=bool) & pend
        pick = jnp.where(pick.any(1, keepdims=True), pick, best)
        plan_slots = jnp.where(pick, CHOSEN, slots)
        plan_draft = jnp.where(pending_rows, plan_draft, draft)
        first_out = st["blk"][:, None] * bs + slot_start                                     # [B, ns]
        follows = (first_out == 0) | st["filled"][rows, jnp.maximum(first_out - 1, 0)]
        fix = (pick & follows)[:, row_slot] & first_row & use_first
        plan_draft = jnp.where(fix, st["ar_next"][rows, first_out][:, row_slot], plan_draft)

        # ---- AR probability of each drafted token from the previous row of its slot; the AR rows' own
        # choices: choice[:, j] is row j's pick for the next position, row_choice[:, j] the pick for row j
        ar_prob = jnp.concatenate([jnp.ones((b, 1)), primitives.token_prob(logits[:, :-1], draft[:, 1:], mask_id)],
                                  axis=1)
        ar_ok = ar_prob > tau_t
        choice = draw(jax.random.fold_in(k_it, 1), logits, st["presence"])
        row_choice = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), choice[:, :-1]], axis=1)

        def correct(prefix, tokens, allowed=True):
            """`ar_infill`: the first token after each chosen slot's accepted prefix (where `allowed`)
            becomes row_choice. Returns (tags, tokens, corrected rows)."""
            prev = jnp.concatenate([jnp.zeros((b, 1), bool), prefix[:, :-1]], axis=1) & ~first_row
            boundary = chosen_rows & ~prefix & prev & allowed
            return prefix | boundary, jnp.where(boundary, row_choice, tokens), boundary

        # ---- VERIFY: commit the passing leading chosen slots, else go to infill
        passed = chosen_rows & (first_row | ar_ok)
        first_fail = jnp.min(jnp.where(chosen_rows & ~passed, j, bs), axis=1)
        lead = (slots == CHOSEN) & (slot_start + S - 1 < first_fail[:, None])   # [B, ns]
        commit_v = chosen_rows & lead[:, row_slot]
        v_eos_pos = jnp.full((b,), bs)
        if stop:
            v_eos = chosen_rows & (draft == eos) & (j < first_fail[:, None])
            v_eos_pos = jnp.where(v_eos.any(1), jnp.argmax(v_eos, axis=1), bs)
            commit_v = jnp.where((v_eos_pos < bs)[:, None], chosen_rows & (j <= v_eos_pos[:, None]), commit_v)
        v_commits = commit_v.any(1)
        v_slots_done = commit_v.reshape(b, ns, S).any(axis=2)
        verify_slots = jnp.where(v_slots_done, COMMITTED, jnp.where(slots == CHOSEN, PENDING, slots))
        verify_slots = jnp.where(slot_start > v_eos_pos[:, None], DEAD, verify_slots)
        verify_slots = jnp.where(v_commits[:, None], verify_slots, slots)
        verify_tags = _slot_cumprod(passed, S)
        # `ar_infill` corrects only the first failure of the window: every row before it is accepted, so
        # its AR row saw exactly the text it will follow (later slots saw unaccepted drafts before them)
        c_tags, c_draft, _ = correct(verify_tags & chosen_rows, draft, j == first_fail[:, None])
        verify_tags = jnp.where(use_infill, c_tags, verify_tags)
        verify_draft = jnp.where(use_infill, c_draft, draft)

        # ---- INFILL_DRAFT: greedy redraft of the not-yet-accepted tokens
        infill_draft = jnp.where(chosen_rows & ~tags, greedy(k_it, logits, st["presence"]), draft)

        # ---- INFILL_VERIFY: extend each slot's accepted prefix (the next token always passes, or with
        # `ar_infill` becomes the AR row's choice)
        a_tags, a_draft, a_fixed = correct(_slot_cumprod(chosen_rows & (tags | ar_ok), S) & chosen_rows, draft)
        prev_tag = jnp.concatenate([jnp.ones((b, 1), bool), tags[:, :-1]], axis=1) | first_row
        r_tags = _slot_cumprod(chosen_rows & (tags | prev_tag | ar_ok), S) & chosen_rows
        iv_tags = jnp.where(use_infill, a_tags, r_tags)
        iv_draft = jnp.where(use_infill, a_draft, draft)
        corrected = a_fixed & use_infill

        def settle(new_tags, tokens, corrected):
            """Chosen slots whose tokens are all accepted (an accepted EOS completes its slot and kills the
            slots after it) commit together, unless a token was corrected in this pass (its K/V is not
            this pass's). Returns (slots, commit rows, complete [B], EOS offset [B], tags)."""
            new_slots, eos_pos = slots, jnp.full((b,), bs)
            if stop:
                hit = new_tags & (tokens == eos)
                eos_pos = jnp.where(hit.any(1), jnp.argmax(hit, axis=1), bs)
                new_slots = jnp.where((slot_start > eos_pos[:, None]) & ((slots == CHOSEN) | (slots == PENDING)),
                                      DEAD, slots)
                new_tags = new_tags | (chosen_rows & (row_slot[None, :] == (eos_pos // S)[:, None]))
                new_tags = new_tags & (new_slots[:, row_slot] == CHOSEN)
            live = new_slots[:, row_slot] == CHOSEN
            complete = jnp.all(new_tags | ~live, axis=1) & ~jnp.any(corrected & live & (j <= eos_pos[:, None]), axis=1)
            commit_rows = live & (j <= eos_pos[:, None]) & complete[:, None]
            new_slots = jnp.where(complete[:, None] & (new_slots == CHOSEN), COMMITTED, new_slots)
            return new_slots, commit_rows, complete, eos_pos, new_tags

        i_slots, commit_i, complete, i_eos_pos, new_tags = settle(iv_tags, iv_draft, corrected)
        # INFILL_DRAFT with every chosen token already settled (only after an `ar_infill` correction): the
        # pass ran exactly the final tokens, so it commits them
        settled = jnp.all(tags | ~chosen_rows, axis=1)
        d_slots, commit_d, d_complete, d_eos_pos, _ = settle(tags, draft, jnp.zeros_like(tags))
        d_complete = d_complete & settled & use_infill

        # ---- select per phase
        is_plan, is_ver, is_dr, is_iv = (phase == PLAN), (phase == VERIFY), (phase == INFILL_DRAFT), \
            (phase == INFILL_VERIFY)
        sel = lambda a, bv, c, d, e: jnp.where(  # noqa: E731
            _b(is_plan, a), a, jnp.where(_b(is_ver, a), bv, jnp.where(_b(is_dr, a), c, jnp.where(_b(is_iv, a), d, e))))
        new_slots = sel(plan_slots, verify_slots, jnp.where(d_complete[:, None], d_slots, slots), i_slots, slots)
        new_draft = sel(plan_draft, verify_draft, infill_draft, iv_draft, draft)
        new_tags_all = sel(tags, verify_tags, tags, new_tags, tags)
        commit = (jnp.where(is_ver[:, None], commit_v, False) | jnp.where(is_iv[:, None], commit_i, False)
                  | jnp.where((is_dr & d_complete)[:, None], commit_d, False))
        committed_now = (is_ver & v_commits) | (is_iv & complete) | (is_dr & d_complete)
        next_phase = jnp.where(is_plan, VERIFY, jnp.where(is_ver, jnp.where(v_commits, PLAN, INFILL_DRAFT),
                               jnp.where(is_dr, jnp.where(d_complete, PLAN, INFILL_VERIFY),
                                         jnp.where(is_iv, jnp.where(complete, PLAN, INFILL_DRAFT), DONE))))
        eos_pos = jnp.where(is_ver, v_eos_pos, jnp.where(is_iv & complete, i_eos_pos,
                                                         jnp.where(is_dr & d_complete, d_eos_pos, bs)))
        eos_flag = st["eos_flag"] | (committed_now & (eos_pos < bs))

        # ---- commit: K/V of this pass, tokens into the logical output
        cache = kv_cache.commit(st["cache"], kv, commit)
        length = st["cache"]["length"]
        phys_tok = _append(st["phys_tok"], length, new_draft, commit)
        phys_pos = _append(st["phys_pos"], length, positions, commit)
        out_idx = jnp.where(commit, st["blk"][:, None] * bs + j, g)
        gen = st["gen"].at[rows, out_idx].set(new_draft, mode="drop")
        filled = st["filled"].at[rows, out_idx].set(True, mode="drop")
        presence = decoding.add_presence(st["presence"], new_draft, commit)
        ar_next = st["ar_next"].at[rows, jnp.where(commit, out_idx + 1, g + 1)].set(choice, mode="drop")

        # ---- block end: next block, or stop (after EOS or the last block)
        block_over = (next_phase == PLAN) & ~jnp.any(new_slots == PENDING, axis=1)
        finished = block_over & (eos_flag | (st["blk"] == nb - 1))
        advance = block_over & ~finished
        next_phase = jnp.where(finished, DONE, next_phase)
        new_slots = jnp.where(advance[:, None], PENDING, new_slots)
        blk = st["blk"] + advance
        new_tags_all = jnp.where(advance[:, None], False, new_tags_all)

        new = dict(it=it + 1, cache=cache, phys_tok=phys_tok, phys_pos=phys_pos, phase=next_phase, blk=blk,
                   slots=new_slots, draft=new_draft, tags=new_tags_all, eos_flag=eos_flag, gen=gen, filled=filled,
                   nfe=nfe, plans=st["plans"] + is_plan, presence=presence, ar_next=ar_next)
        if debug:
            tr = st["trace"]
            new["trace"] = dict(logits=tr["logits"].at[it].set(logits), tokens=tr["tokens"].at[it].set(win_tok),
                                positions=tr["positions"].at[it].set(positions),
                                valid=tr["valid"].at[it].set(valid), phase=tr["phase"].at[it].set(phase),
                                cache_len=tr["cache_len"].at[it].set(length))
        return new

    st = jax.lax.while_loop(cond, body, state)
    idx = jnp.arange(g)[None, :]
    generated = jnp.sum(st["filled"] & (idx < nb * bs), axis=1).astype(jnp.int32)
    if stop:
        hit = st["filled"] & (st["gen"] == eos)
        generated = jnp.where(hit.any(1), jnp.argmax(hit, axis=1) + 1, generated)
    out = jnp.where(idx < generated[:, None], st["gen"], pad)
    result = dict(tokens=out, lengths=generated, num_forward_passes=st["nfe"], loop_passes=st["it"] + 1,
                  physical_tokens=st["phys_tok"], physical_positions=st["phys_pos"], plans=st["plans"],
                  num_blocks=jnp.int32(nb), block_size=jnp.int32(bs))
    if debug:
        result["trace"] = st["trace"]
    return result


def _b(cond: Array, like: Array) -> Array:
    """Broadcasts a per-row bool [B] against an array [B, ...]."""
    return cond.reshape(cond.shape + (1,) * (like.ndim - 1))


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
