"""Why a decoding mode loses accuracy: each head's teacher-forced accuracy, and where outputs go wrong.

`teacher_forced(params, config, examples, slot_size)` scores both heads of one model on held-out
(prompt, answer) token ids, in one pass per example over `[prompt][answer][mask × len(answer)]`:
  * AR head: the row of answer token a − 1 (the last prompt token for a = 0) predicts token a from the
    clean text before it (the AR convention);
  * MDM head: answer token a's mask copy sees the prompt, the clean answer up to the start of a's slot
    (slots of `slot_size` tokens) and the masks of its own slot before it, and predicts token a at its
    own position (the MDM convention) — what mode B's plan pass sees for the slot that directly
    follows committed text, and what a masked slot of slotted training is taught.
Both copies of a token carry its logical position (docs/algorithms.md §0). Predictions are argmaxes with the mask
token excluded, as in decoding.

`first_errors(outputs, references, slot_size)` locates, per decoded output, the first token that
differs from the reference answer (EOS included): its offset within a slot, its distance from the
answer's end, and whether the output was cut short (no EOS, fewer tokens than the reference: the
token budget ran out). `explain(...)` turns both into one sentence per mode that loses accuracy.

Mode A's sequential phase asks the MDM head a mask after the whole decoded context, read from its own
row: at slot size 1 the MDM column above is exactly that query on a clean prefix (mode A at α0 = 0),
so `analyse` always scores slot size 1; and `split_first_errors` counts mode A's first errors by the
phase that decoded the token (predictions carry `diffusion_offsets`, from `evaluate`).

`drafter_agreement(model, examples, draft_length)` scores Uno's LoRA drafter the same way: per draft
position j, how often its teacher-forced draft (the training layout, which is the inference draft
window, `objectives.drafter.agreement_counts`) is the AR argmax, next to the acceptance measured at
decode time (`stats["acceptance_by_position"]`): a drafter that agrees teacher-forced but is rejected
at decode time drafts from a layout it was not trained on; one that does not agree is undertrained.

`analyse(...)` does all of it for an evaluation (`evaluate`'s summary and predictions) and `markdown`
renders it: the quickstart report's diagnostics section and `python -m experiments.evaluate --diagnose`.
"""
from __future__ import annotations

import collections
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..config import missing_mask_token
from ..inference import Inference
from ..data import render
from .. import model as model_lib
from ..objectives.drafter import agreement_counts
from .evaluate import MODE_LABELS
from .results import ModeResult, Prediction


def _layout(prompt: np.ndarray, answer: np.ndarray, slot_size: int, length: int, pad_id: int, mask_id: int):
    """tokens, positions [L], attention mask [L, L] of one example's teacher-forcing row."""
    p, a = len(prompt), len(answer)
    n = p + 2 * a
    tokens = np.full(length, pad_id, np.int32)
    tokens[:p], tokens[p:p + a], tokens[p + a:n] = prompt, answer, mask_id
    positions = np.zeros(length, np.int32)
    positions[:p + a] = np.arange(p + a)
    positions[p + a:n] = p + np.arange(a)
    mask = np.zeros((length, length), bool)
    mask[:p + a, :p + a] = np.tril(np.ones((p + a, p + a), bool))  # the clean text: causal
    for i in range(a):
        start = (i // slot_size) * slot_size
        row = p + a + i
        mask[row, :p + start] = True               # prompt + clean answer before the slot
        mask[row, p + a + start:row + 1] = True    # own slot's masks up to itself
    idx = np.arange(n, length)
    mask[idx, idx] = True                          # padding rows see themselves (finite softmax)
    return tokens, positions, mask


@functools.partial(jax.jit, static_argnames=("config",))
def _predict(params, tokens, positions, mask, *, config):
    logits, _ = model_lib.apply(params, config, tokens, positions, window_mask=mask)
    if config.mask_token_id is not None:
        logits = logits.at[..., config.mask_token_id].set(-jnp.inf)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def teacher_forced(params, config, examples: Sequence[tuple[Sequence[int], Sequence[int]]], slot_size: int,
                   batch_size: int = 32) -> list[dict]:
    """Per example {'ar': bool [A], 'mdm': bool [A]}: did each head's argmax hit answer token a.

    examples: (prompt ids, answer ids with EOS) pairs; slot_size: the MDM slot (≥ 1)."""
    if config.mask_token_id is None:
        raise ValueError(missing_mask_token("teacher-forced MDM accuracy needs"))
    if slot_size < 1:
        raise ValueError(f"slot_size={slot_size}: expected ≥ 1")
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    exs = [(np.asarray(p, np.int32), np.asarray(a, np.int32)) for p, a in examples]
    need = max(len(p) + 2 * len(a) for p, a in exs)
    length = -(-need // 16) * 16
    out = []
    for start in range(0, len(exs), batch_size):
        chunk = exs[start:start + batch_size]
        rows = [_layout(p, a, slot_size, length, pad, config.mask_token_id) for p, a in chunk]
        rows += [rows[0]] * (batch_size - len(rows))  # one shape, one compile
        tok, pos, msk = (np.stack(x) for x in zip(*rows))
        pred = np.asarray(_predict(params, tok, pos, msk, config=config))
        for r, (p, a) in enumerate(chunk):
            n_p, n_a = len(p), len(a)
            ar_pred = pred[r, n_p - 1:n_p + n_a - 1]
            mdm_pred = pred[r, n_p + n_a:n_p + 2 * n_a]
            out.append({"ar": ar_pred == a, "mdm": mdm_pred == a})
    return out


def by_offset(scores: list[dict], slot_size: int) -> list[dict]:
    """Accuracy of each head by offset within a slot: [{'offset', 'n', 'ar', 'mdm'}]."""
    hits = collections.defaultdict(lambda: np.zeros(3))
    for s in scores:
        for a, (x, y) in enumerate(zip(s["ar"], s["mdm"])):
            hits[a % slot_size] += (1, x, y)
    return [{"offset": o, "n": int(h[0]), "ar": h[1] / h[0], "mdm": h[2] / h[0]} for o, h in sorted(hits.items())]


def overall(scores: list[dict]) -> dict:
    n = sum(len(s["ar"]) for s in scores)
    return {"n": n, "ar": sum(int(s["ar"].sum()) for s in scores) / max(n, 1),
            "mdm": sum(int(s["mdm"].sum()) for s in scores) / max(n, 1)}


def first_error(output: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first output token that differs from the reference (EOS included), None if the
    output reproduces it; len(output) when the output stops early."""
    for i, r in enumerate(reference):
        if i >= len(output) or output[i] != r:
            return i
    return None


def first_errors(outputs: Sequence[Sequence[int]], references: Sequence[Sequence[int]], slot_size: int,
                 eos_id: int | None) -> dict:
    """Where outputs first go wrong: counts by offset within a slot and by distance from the answer's
    end (negative: inside the answer; 0: the EOS), plus outputs cut short (no EOS and shorter than the
    reference: the token budget ran out)."""
    by_slot, by_end = collections.Counter(), collections.Counter()
    wrong = cut = 0
    for out, ref in zip(outputs, references):
        i = first_error(list(out), list(ref))
        if i is None:
            continue
        wrong += 1
        if i >= len(out) and (eos_id is None or eos_id not in out):
            cut += 1
        by_slot[i % slot_size] += 1
        by_end[i - (len(ref) - 1)] += 1
    return {"outputs": len(outputs), "wrong": wrong, "cut_short": cut, "slot_size": slot_size,
            "by_slot_offset": dict(sorted(by_slot.items())), "by_distance_from_end": dict(sorted(by_end.items()))}


def split_first_errors(outputs: Sequence[Sequence[int]], references: Sequence[Sequence[int]],
                       diffusion_offsets: Sequence[Sequence[int]]) -> dict:
    """Mode A's first errors by phase: {'diffusion', 'sequential', 'cut_short'} counts, a token being a
    diffusion token when its offset is in that output's `diffusion_offsets`."""
    counts = {"diffusion": 0, "sequential": 0, "cut_short": 0}
    for out, ref, dif in zip(outputs, references, diffusion_offsets):
        i = first_error(list(out), list(ref))
        if i is None:
            continue
        counts["cut_short" if i >= len(out) else ("diffusion" if i in set(dif) else "sequential")] += 1
    return counts


def explain(label: str, accuracy: float, ar_accuracy: float, errors: dict, offsets: list[dict]) -> str:
    """One sentence: how many points a mode loses against AR, where its first errors fall and what
    each head scores there (teacher-forced)."""
    gap = 100 * (ar_accuracy - accuracy)
    if errors["wrong"] == 0:
        return f"{label}: every output reproduces its reference."
    top = max(errors["by_slot_offset"].items(), key=lambda kv: kv[1])
    share = top[1] / errors["wrong"]
    at = next((o for o in offsets if o["offset"] == top[0]), None)
    heads = (f"; teacher-forced at that offset the AR head scores {100 * at['ar']:.1f}% and the MDM head "
             f"{100 * at['mdm']:.1f}%") if at else ""
    cut = f"; {errors['cut_short']} outputs cut short by the token budget" if errors["cut_short"] else ""
    return (f"{label}: {100 * accuracy:.1f}% vs AR {100 * ar_accuracy:.1f}% ({gap:+.1f} points lost); "
            f"{errors['wrong']} of {errors['outputs']} outputs differ from the reference, {100 * share:.0f}% of them "
            f"first at slot offset {top[0]} (S={errors['slot_size']}){heads}{cut}.")


def explain_ar(accuracy: float, errors: dict, heads: dict) -> str:
    """One sentence on AR's own misses: how many outputs differ, where they first go wrong relative to
    the answer's end, and the AR head's teacher-forced accuracy."""
    ends = errors["by_distance_from_end"]
    where = ", ".join(f"{-k} before the end: {v}" if k < 0 else ("at the EOS: " + str(v) if k == 0 else f"+{k}: {v}")
                      for k, v in sorted(ends.items(), key=lambda kv: -kv[1])[:3])
    return (f"AR: {100 * accuracy:.1f}% exact match; {errors['wrong']} of {errors['outputs']} outputs differ from "
            f"the reference (first errors, tokens {where}); the AR head predicts {100 * heads['ar']:.1f}% of the "
            f"reference's tokens teacher-forced.")


def drafter_agreement(model: Inference, examples: Sequence[tuple[Sequence[int], Sequence[int]]], draft_length: int,
                      batch_size: int = 32, seed: int = 0) -> list[float | None]:
    """Teacher-forced agreement of `model.adapter` with the AR argmax at each draft position 0 … F−1 over
    the answers of `examples` ((prompt ids, answer ids incl. EOS) pairs); position 0 (the seed, exact) is
    None, as is a position no answer token reached."""
    length = max(len(p) + len(a) for p, a in examples)
    pad = model.config.pad_token_id or 0
    agree = np.zeros(draft_length, np.int64)
    count = np.zeros(draft_length, np.int64)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        chunk = chunk + [chunk[-1]] * (batch_size - len(chunk))  # one compiled shape; repeats are not counted
        real = np.arange(batch_size) < len(examples) - start
        tokens = np.full((batch_size, length), pad, np.int32)
        seg = np.zeros((batch_size, length), np.int32)
        answer = np.zeros((batch_size, length), bool)
        for i, (p, a) in enumerate(chunk):
            n = len(p) + len(a)
            tokens[i, :n] = list(p) + list(a)
            seg[i, :n] = int(real[i])
            answer[i, len(p):n] = True
        batch = {"tokens": jnp.asarray(tokens), "segment_ids": jnp.asarray(seg), "answer_mask": jnp.asarray(answer),
                 "positions": jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch_size, length))}
        a, c = agreement_counts(model.params, model.adapter, batch, jax.random.PRNGKey(seed + start),
                                config=model.config, lora=model.lora, block_size=draft_length)
        agree += np.asarray(a)
        count += np.asarray(c)
    return [None] + [float(x / n) if n else None for x, n in zip(agree[1:], count[1:])]


# The drafter's teacher-forced agreement is scored on the first answers only: every answer token at every
# block alignment is a forward over the paired layout per alignment (F of them), and 64 answers give each
# draft position over a thousand rows.
AGREEMENT_EXAMPLES = 64


def analyse(model: Inference, records, summary: Sequence[ModeResult], predictions: Sequence[Prediction],
            slot_sizes) -> dict:
    """Teacher-forced accuracy of both heads per slot size and by offset within a slot, and per mode
    where its outputs first differ from the reference (answer + EOS); one explanation per mode below AR
    (and for AR's own misses). summary/predictions: `evaluate`'s on `records` (of which it decoded the first
    `examples`: its `eval.limit`), rendered with the checkpoint's prompt format (`model.prompt_format`) as
    in `evaluate`."""
    records = records[:summary[0].examples] if summary else records
    params, model_config, tokenizer, prompt_format = model.params, model.config, model.tokenizer, model.prompt_format
    eos = model_config.eos_token_id
    examples = []
    for r in records:
        prompt, answer = render.render(r, tokenizer, prompt_format)
        examples.append((tokenizer.encode(prompt), tokenizer.encode(answer) + ([eos] if eos is not None else [])))
    slot_sizes = sorted(set(slot_sizes) | {1})  # 1: mode A's sequential query on a clean prefix
    heads = {}
    for s in slot_sizes:
        scores = teacher_forced(params, model_config, examples, s)
        heads[s] = {"overall": overall(scores), "by_offset": by_offset(scores, s)}
    by_mode = {r.mode: r for r in summary}
    ar = by_mode.get("ar")
    errors, explanations = {}, []
    for mode, row in by_mode.items():
        s = row.knob("slot_size") if mode == "slotted" else slot_sizes[-1]
        outs = [p.output_ids for p in predictions if p.mode == mode]
        errors[mode] = first_errors(outs, [a for _, a in examples], s, eos)
        dif = [p.diffusion_offsets for p in predictions if p.mode == mode]
        if mode == "mdm" and dif and all(d is not None for d in dif):
            errors[mode]["by_phase"] = split_first_errors(outs, [a for _, a in examples], dif)
        if ar is not None and mode != "ar" and row.accuracy < ar.accuracy:
            explanations.append(explain(row.label, row.accuracy, ar.accuracy, errors[mode],
                                        heads[s]["by_offset"] if s in heads else []))
    if ar is not None and ar.accuracy < 1.0:
        explanations.insert(0, explain_ar(ar.accuracy, errors["ar"], heads[slot_sizes[-1]]["overall"]))
    out = {"heads": {str(k): v for k, v in heads.items()}, "first_errors": errors, "explanations": explanations}
    lora_row = by_mode.get("spec-lora")
    if lora_row is not None and model.adapter is not None:
        f = lora_row.knob("draft_length")
        agreed = examples[:AGREEMENT_EXAMPLES]
        out["drafter"] = {"draft_length": f, "teacher_forced": drafter_agreement(model, agreed, f),
                          "teacher_forced_examples": len(agreed), "decode": lora_row.acceptance_by_position}
    return out


def markdown(diag: dict) -> str:
    """The explanations, the heads' teacher-forced accuracy table and the first-error table."""
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    lines = [f"- {e}" for e in diag["explanations"]] or ["- No mode loses accuracy against AR."]
    lines += ["", "Teacher-forced accuracy of each head on the reference answers (AR: from the row before, "
              "clean prefix; MDM: the token's slot masked after the clean prefix):", "",
              "| slot size | AR head | MDM head | MDM head by offset within the slot (%) |", "|---|---|---|---|"]
    for s in sorted(diag["heads"], key=int):
        h = diag["heads"][s]
        offs = " ".join(f"{o['offset']}:{100 * o['mdm']:.0f}" for o in h["by_offset"])
        lines.append(f"| {s} | {pct(h['overall']['ar'])} | {pct(h['overall']['mdm'])} | {offs} |")
    lines += ["", "| mode | outputs differing from the reference | cut short | first error by slot offset |",
              "|---|---|---|---|"]
    for mode, e in diag["first_errors"].items():
        offs = " ".join(f"{k}:{v}" for k, v in e["by_slot_offset"].items()) or "–"
        lines.append(f"| {MODE_LABELS.get(mode, mode)} | {e['wrong']}/{e['outputs']} | {e['cut_short']} | "
                     f"{offs} (S={e['slot_size']}) |")
    phases = {m: e["by_phase"] for m, e in diag["first_errors"].items() if "by_phase" in e}
    if phases:
        lines += ["", "| mode | first errors in diffusion tokens | in sequential tokens | cut short |", "|---|---|---|---|"]
        lines += [f"| {MODE_LABELS.get(m, m)} | {c['diffusion']} | {c['sequential']} | {c['cut_short']} |"
                  for m, c in phases.items()]
    if "drafter" in diag:
        d = diag["drafter"]
        cell = lambda x: "–" if x is None else f"{100 * x:.0f}%"  # noqa: E731
        decode = d["decode"] or [None] * d["draft_length"]
        on = d.get("teacher_forced_examples")
        lines += ["", f"Uno's LoRA drafter by draft position (F={d['draft_length']}): teacher-forced agreement with "
                  f"the AR argmax (the training layout on {'the first %d' % on if on else 'the'} reference answers), "
                  "and the acceptance at decode time (P(accepted | reached)):", "",
                  "| | " + " | ".join(f"c{j}" for j in range(1, d["draft_length"])) + " |",
                  "|---|" + "---|" * (d["draft_length"] - 1),
                  "| teacher-forced | " + " | ".join(cell(x) for x in d["teacher_forced"][1:]) + " |",
                  "| decode | " + " | ".join(cell(x) for x in decode[1:]) + " |"]
    if "1" in diag["heads"]:
        lines += ["", f"Mode A's sequential query (a mask after a clean prefix, its own row; slot size 1): MDM head "
                  f"{pct(diag['heads']['1']['overall']['mdm'])} teacher-forced."]
    return "\n".join(lines) + "\n"
