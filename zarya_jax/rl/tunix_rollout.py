"""A tunix rollout engine over `generate()`: lossless speculative rollouts for tunix's RL learners.

tunix's `RLCluster` samples through any subclass of `tunix.rl.rollout.base_rollout.BaseRollout`
(`generate`, `get_per_token_logps`, `update_params`, `pad_id`, `eos_id`, `model`). `ZaryaRollout` is
that interface over `zarya_jax.sampling.generate`, so a tunix GRPO run gets AR or Ψ-Spec rollouts
(both exactly the policy's samples) with their log-probabilities at no extra pass. When tunix is
importable the class subclasses its `BaseRollout` and returns its `RolloutOutput`; otherwise it is the
same interface duck-typed, with a local `RolloutOutput` of the same fields (docs/rl.md says why tunix
is not a dependency).

Conventions (tunix's): `generate(prompts: list[str], rollout_config)` reads the `RolloutConfig` fields
`max_tokens_to_generate`, `temperature`, `top_p`, `top_k` (None or -1: off), `seed` (a key or an
int), `max_prompt_length` (prompts are cut to their last tokens and left-padded to it) and
`eos_tokens` (one id at most); it returns the texts, the unpadded completion tokens, the left-padded
prompt tokens and the per-token log-probabilities (`logits` is empty: Ψ-Spec keeps no per-step
logits). `get_per_token_logps(prompt_tokens, completion_tokens)`: left-padded prompts [B, P],
right-padded completions [B, G] (pad or EOS ends a completion, the EOS included) → [B, G], 0 after
the end.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from ..sampling import GenerationConfig, generate
from ..sampling.modes import MODES
from . import grpo

# The modes whose samples are the policy's own (AR and the lossless speculative modes).
ON_POLICY = tuple(name for name, cls in MODES.items() if name == "ar" or cls.lossless)

try:  # the optional engine interface; see the module doc
    from tunix.rl.rollout.base_rollout import BaseRollout, RolloutOutput
except ImportError:  # tunix absent (or unimportable): the interface, duck-typed
    BaseRollout = object

    @dataclasses.dataclass
    class RolloutOutput:
        """tunix's `RolloutOutput` fields."""

        text: list[str]
        logits: list
        tokens: list[np.ndarray]
        left_padded_prompt_tokens: np.ndarray
        logprobs: list[np.ndarray] | None


class ZaryaRollout(BaseRollout):
    """params/config: the policy (`zarya_jax` tree and `ModelConfig`); tokenizer: encode/decode;
    generation_config: the sampler (mode "ar", "spec-self" or "spec-lora" with its knobs, e.g. the draft
    length; the sampling knobs come from each call's rollout config); lora_params/lora: the LoRA drafter
    (a mode that drafts with the adapter)."""

    def __init__(self, params, config, tokenizer, generation_config: GenerationConfig = GenerationConfig(mode="ar"),
                 *, lora_params=None, lora=None):
        name = generation_config.mode.name
        if name not in ON_POLICY:
            raise ValueError(f"generation_config.mode={name!r}: a rollout engine must sample the policy (one of "
                             f"{ON_POLICY}); modes 'mdm' and 'slotted' are not on-policy")
        self._params, self._config, self._tokenizer = params, config, tokenizer
        self._gcfg = generation_config
        uses_lora = getattr(generation_config.mode, "drafter", None) == "lora"
        self._lora = {"lora_params": lora_params, "lora": lora} if uses_lora else {}

    # ---- the interface
    def generate(self, prompts: list[str], rollout_config, **kwargs) -> RolloutOutput:
        rc = rollout_config
        width = int(getattr(rc, "max_prompt_length", 64))
        ids = [self._tokenizer.encode(p)[-width:] for p in prompts]
        eos = getattr(rc, "eos_tokens", None) or None
        if eos is not None and len(set(eos)) > 1:
            raise ValueError(f"rollout_config.eos_tokens={eos}: this engine stops at one EOS id")
        top_k = getattr(rc, "top_k", None)
        gc = self._gcfg.replace(max_new_tokens=int(rc.max_tokens_to_generate), temperature=float(rc.temperature),
                                top_p=float(getattr(rc, "top_p", None) or 1.0),
                                top_k=0 if top_k in (None, -1) else int(top_k),
                                eos_token_id=None if eos is None else int(eos[0]))
        seed = getattr(rc, "seed", None)
        key = seed if seed is not None and np.ndim(seed) else jax.random.PRNGKey(int(seed or 0))
        out = generate(self._params, self._config, ids, gc, key, **self._lora)
        tokens = [np.asarray(t[:n]) for t, n in zip(out.tokens, out.lengths)]
        left = np.full((len(ids), width), self.pad_id(), np.int32)
        for i, p in enumerate(ids):
            left[i, width - len(p):] = p
        return RolloutOutput(text=[self._tokenizer.decode([int(x) for x in t]) for t in tokens], logits=[],
                             tokens=tokens, left_padded_prompt_tokens=left,
                             logprobs=[np.asarray(lp[:n]) for lp, n in zip(out.logprobs, out.lengths)])

    def get_per_token_logps(self, prompt_tokens, completion_tokens, temperature: float = 1.0) -> jax.Array:
        prompt = np.asarray(prompt_tokens)
        comp = np.asarray(completion_tokens, np.int32)
        pad, eos = self.pad_id(), self.eos_id()
        prompts = [list(row[row != pad]) for row in prompt]
        ends = comp == eos
        first_eos = np.where(ends.any(1), ends.argmax(1) + 1, comp.shape[1])
        first_pad = np.where((comp == pad).any(1), (comp == pad).argmax(1), comp.shape[1])
        mask = np.arange(comp.shape[1])[None, :] < np.minimum(first_eos, first_pad)[:, None]
        width = max(map(len, prompts)) + comp.shape[1]
        tokens = np.full((len(prompts), width), pad, np.int32)
        for i, p in enumerate(prompts):
            tokens[i, :len(p)] = p
            tokens[i, len(p):len(p) + comp.shape[1]] = np.where(mask[i], comp[i], pad)
        batch = {"tokens": tokens, "prompt_lengths": np.asarray([len(p) for p in prompts], np.int32),
                 "completions": comp, "mask": mask}
        return grpo.completion_logprobs(self._params, self._config, batch, temperature)

    def update_params(self, params, filter_types=None) -> None:
        """The policy's new params (the trainer's tree; the self-drafter follows them, a LoRA drafter does not)."""
        self._params = params

    def pad_id(self) -> int:
        c = self._config
        return c.pad_token_id if c.pad_token_id is not None else (c.eos_token_id or 0)

    def eos_id(self) -> int:
        return self._config.eos_token_id

    def model(self) -> Any:
        return self._params
