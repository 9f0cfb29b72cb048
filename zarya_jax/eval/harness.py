"""The lm-evaluation-harness model `zarya`: any checkpoint, in any decoding mode, on any lm-eval task.

`python -m experiments.lm_eval --model zarya --model_args ckpt=DIR,mode=slotted,slot_size=8 --tasks TASK`
(lm-eval's own command line; importing this module registers the model). Model arguments:

- `ckpt` (required): a `zarya_jax.checkpoint` directory, read by `zarya_jax.inference.load_for_inference`;
  `tokenizer`: a tokenizer directory (wins over the checkpoint's own); `lora`: an adapter directory for
  `mode=spec-lora` or `spec-lora-fused`; `draft`: a draft model checkpoint for `mode=spec-model`.
- `mode`: a decoding mode (`ar`, `mdm`, `slotted`, `spec-self`, `spec-lora`, `spec-model`,
  `spec-self-fused`, `spec-lora-fused`; `zarya_jax.sampling.modes`) for `generate_until`; any other
  `key=value` is a knob of that mode — a field of its dataclass (`slot_size=8`, `draft_length=4`) or a
  shared sampling field (`temperature=0.7`) — typed and checked like `evaluate --knob MODE.FIELD=VALUE`
  (a field the mode does not have is an error naming its fields). A knob given here wins over the
  task's `temperature` / `do_sample`.
- `format.FIELD=VALUE`: a field of the checkpoint's recorded prompt format (`render=false`: send lm-eval's
  text unchanged, e.g. with lm-eval's own `--apply_chat_template`).
- `max_length` (default min(2048, the model's positions)): the longest scored sequence; `length_bucket`
  (64): scored rows are padded to a multiple of it; `seed` (0).
- `--batch_size N` (lm-eval's flag): the fixed batch of every forward and generate call; short batches
  are padded with copies, so each length bucket compiles once.

Requests:
- `loglikelihood(context, continuation)`: the context rendered as a prompt exactly as the checkpoint's
  training prompts (`zarya_jax.data.render`), the continuation encoded apart and appended, as training
  appends the answer; one causal forward pass (`model.forward`) scores the continuation: the sum of
  its log-probabilities, and whether each token is the argmax. The `<mdm_mask>` token is excluded from
  the distribution, as in every sampler (docs/algorithms.md §4). Too long a row loses tokens from its left.
- `loglikelihood_rolling(text)`: the raw text (no rendering) in lm-eval's disjoint rolling windows of
  `max_length` tokens, the first predicted from EOS.
- `generate_until(context, gen_kwargs)`: the rendered context through `zarya_jax.sampling.generate` in
  `mode`, `max_gen_toks` new tokens, cut at the first `until` string; a context longer than
  `max_length − max_gen_toks` tokens loses tokens from its left; requests with equal `gen_kwargs` are
  batched.
"""
from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from .. import overrides as ov
from ..config import ConfigError
from ..data import render
from ..inference import load_for_inference
from .. import model as model_lib
from ..sampling import GenerationConfig, generate
from ..sampling.prompts import bucket_length
from .evaluate import ADAPTER_MODES, DRAFT_MODEL_MODES, MODES, SHARED_TYPES, generation_config


@functools.partial(jax.jit, static_argnums=(1,))
def token_logprobs(params, config, tokens: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per position of int32 `tokens` [B, L]: log p(targets[b, t] | tokens[b, :t+1]) float32 [B, L] and
    whether that target is the argmax, under the causal forward with the mask token excluded."""
    logits = model_lib.forward(params, config, tokens)
    if config.mask_token_id is not None:
        logits = logits.at[..., config.mask_token_id].set(-jnp.inf)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return picked, jnp.argmax(logits, axis=-1) == targets


def _truncate(answer_text: str, until: list[str]) -> str:
    cut = min((answer_text.find(s) for s in until if s and s in answer_text), default=len(answer_text))
    return answer_text[:cut]


@register_model("zarya")
class ZaryaLM(LM):
    """A zarya_jax checkpoint as an lm-evaluation-harness model (see the module docstring)."""

    def __init__(self, ckpt: str, mode: str = "ar", tokenizer: str | None = None, lora: str | None = None,
                 draft: str | None = None, batch_size: int | str = 1, max_batch_size: int | None = None, device: str | None = None,
                 max_length: int = 0, length_bucket: int = 64, seed: int = 0, render: bool = True, **knobs):
        # max_batch_size and device are lm-eval's arguments for every model; JAX places the arrays itself.
        super().__init__()
        if not isinstance(ckpt, str) or not os.path.isdir(ckpt):
            raise ConfigError(f"ckpt={ckpt!r}: expected a zarya_jax checkpoint directory")
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r}: expected one of {MODES}")
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ConfigError(f"--batch_size {batch_size!r}: expected a positive integer (no 'auto')")
        formats = {k.partition(".")[2]: v for k, v in knobs.items() if k.startswith("format.")}
        self.knobs = {k: v for k, v in knobs.items() if not k.startswith("format.")}
        self.mode, self.batch_size, self.seed, self.render = mode, int(batch_size), int(seed), bool(render)
        self.length_bucket = int(length_bucket)
        generation_config(mode, 1, {mode: self.knobs})  # typos and bad values fail here, before any request
        if mode in ADAPTER_MODES and not lora:
            raise ConfigError(f"mode={mode} needs lora=ADAPTER_DIR")
        if mode in DRAFT_MODEL_MODES and not draft:
            raise ConfigError(f"mode={mode} needs draft=DRAFT_CKPT_DIR")
        model = load_for_inference(ckpt, tokenizer=tokenizer, adapter=lora if mode in ADAPTER_MODES else None,
                                   draft=draft if mode in DRAFT_MODEL_MODES else None,
                                   format_overrides=formats)
        self.params, self.config, self.tokenizer, self.format = model.params, model.config, model.tokenizer, \
            model.prompt_format
        self.max_length = int(max_length) or min(2048, self.config.max_position_embeddings)
        self.drafter_kwargs = {**model.lora_kwargs, **model.draft_kwargs}
        self.ckpt = model.ckpt

    # ---------------------------------------------------------------- lm-eval's model interface

    @property
    def tokenizer_name(self) -> str:
        return f"zarya:{self.ckpt}:{json.dumps(ov.to_dict(self.format), sort_keys=True)}"

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        if self.render:
            raise ConfigError("--apply_chat_template renders contexts with lm-eval's chat template, and the zarya "
                              "model renders them again with the checkpoint's prompt format: pass render=false in "
                              "--model_args to use lm-eval's, or drop --apply_chat_template")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"--apply_chat_template: the tokenizer {self.tokenizer.name!r} has no chat template")
        return self.tokenizer.chat_prompt(chat_history, add_generation_prompt=add_generation_prompt)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) or ""

    def prompt_ids(self, context: str) -> list[int]:
        """The token ids of a context: rendered as a training prompt (unless render=false)."""
        text = render.render_prompt(context, self.tokenizer, self.format) if self.render else context
        return self.tokenizer.encode(text) or [self.tokenizer.eos_id]

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = [(self.prompt_ids(context), self.tokenizer.encode(continuation))
                 for context, continuation in (r.args for r in requests)]
        results = self.score(pairs)
        for r, res in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", r.args, res)
        return results

    def loglikelihood_rolling(self, requests) -> list[float]:
        eos = self.tokenizer.eos_id
        pairs, owner = [], []
        for i, r in enumerate(requests):
            windows = lm_utils.get_rolling_token_windows(self.tokenizer.encode(r.args[0]), prefix_token=eos,
                                                         max_seq_len=self.max_length, context_len=1)
            for window in map(lm_utils.make_disjoint_window, windows):
                pairs.append(window)
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self.score(pairs)):
            totals[i] += logprob
        for r, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, total)
        return totals

    def generate_until(self, requests) -> list[str]:
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(json.dumps(r.args[1], sort_keys=True, default=str), []).append(i)
        out: list[str] = [""] * len(requests)
        bar = tqdm(total=len(requests), desc=f"generate ({self.mode})", leave=False)
        batch_no = 0
        for indices in groups.values():
            gen_kwargs = dict(requests[indices[0]].args[1])
            until = gen_kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            gc = self.generation_config(gen_kwargs)
            keep = max(1, self.max_length - gc.max_new_tokens)  # prompt + generation fit in max_length
            prompts = {i: self.prompt_ids(requests[i].args[0])[-keep:] for i in indices}
            order = sorted(indices, key=lambda i: len(prompts[i]))  # similar lengths share a prompt bucket
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                batch = [prompts[i] for i in chunk]
                batch += [batch[0]] * (self.batch_size - len(batch))  # one shape: one compiled program
                key = jax.random.fold_in(jax.random.PRNGKey(self.seed), batch_no)
                batch_no += 1
                result = generate(self.params, self.config, batch, gc, key, **self.drafter_kwargs)
                tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
                for row, i in enumerate(chunk):
                    text = _truncate(self.tokenizer.decode(tokens[row, :int(lengths[row])].tolist()), until)
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        bar.close()
        return out

    # ---------------------------------------------------------------- the two computations

    def generation_config(self, gen_kwargs: dict) -> GenerationConfig:
        """The mode's GenerationConfig for a task's gen_kwargs (`max_gen_toks`, `do_sample`, `temperature`,
        and any other shared sampling field), with the model_args knobs on top."""
        max_new = int(gen_kwargs.pop("max_gen_toks", 256))
        do_sample = bool(gen_kwargs.pop("do_sample", False))
        task = {k: v for k, v in gen_kwargs.items() if k in SHARED_TYPES}
        task["temperature"] = float(task.get("temperature", 1.0)) if do_sample else 0.0
        return generation_config(self.mode, max_new, {"*": task, self.mode: self.knobs})

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), all greedy) per (context ids, continuation ids), in batches
        of `batch_size` rows padded to a multiple of `length_bucket` (causal: right padding is invisible)."""
        rows = []
        for context, continuation in pairs:
            ids = (list(context) + list(continuation))[-(self.max_length + 1):]
            n_cont = min(len(continuation), len(ids) - 1)
            rows.append((ids, n_cont))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(rows)
        pad = self.config.pad_token_id if self.config.pad_token_id is not None else 0
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            width = bucket_length(max(len(rows[i][0]) - 1 for i in chunk), self.length_bucket)
            tokens = np.full((self.batch_size, width), pad, np.int32)
            targets = np.zeros((self.batch_size, width), np.int32)
            for row, i in enumerate(chunk):
                ids = rows[i][0]
                tokens[row, :len(ids) - 1], targets[row, :len(ids) - 1] = ids[:-1], ids[1:]
            logp, greedy = jax.device_get(token_logprobs(self.params, self.config, tokens, targets))
            for row, i in enumerate(chunk):
                ids, n = rows[i]
                span = slice(len(ids) - 1 - n, len(ids) - 1)  # the positions whose targets are the continuation
                results[i] = (float(logp[row, span].sum()), bool(greedy[row, span].all()))
        return results
