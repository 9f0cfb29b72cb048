"""Rewards: functions of (prompt record, completion text) → float.

- `answer_reward`: 1 when the completion's final `####` answer equals the record's (exact match after
  `eval.answers`' normalisation, so `1,000` matches `1000`), else 0.
- `format_reward`: 1 when the completion states a final answer (a `####` line with text after it), else 0.
- `DEFAULT_REWARDS`: the answer term plus a tenth of the format term; `score` sums weighted terms over
  a batch of (record, completion) pairs.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np

from ..config import PromptFormat
from ..data import render
from ..eval import answers

RewardFn = Callable[[dict, str], float]


def answer_reward(record: dict, completion: str, fmt: PromptFormat = PromptFormat()) -> float:
    return float(answers.is_correct(completion, render.parse(record, fmt)[1]))


def format_reward(record: dict, completion: str) -> float:
    return float(answers.extract(completion) is not None)


def default_rewards(fmt: PromptFormat = PromptFormat()) -> tuple[tuple[RewardFn, float], ...]:
    """The answer term (the record's answer read with the prompt format `fmt`) plus 0.1 × the format term."""
    answer = answer_reward if fmt == PromptFormat() else functools.partial(answer_reward, fmt=fmt)
    return ((answer, 1.0), (format_reward, 0.1))


DEFAULT_REWARDS = default_rewards()


def score(records: Sequence[dict], completions: Sequence[str],
          rewards: Sequence[tuple[RewardFn, float]] = DEFAULT_REWARDS) -> np.ndarray:
    """float32 [N]: Σ weight · reward(record_i, completion_i) for each pair."""
    if len(records) != len(completions):
        raise ValueError(f"completions: expected {len(records)} (one per record), got {len(completions)}")
    return np.asarray([sum(w * fn(r, c) for fn, w in rewards) for r, c in zip(records, completions)], np.float32)
