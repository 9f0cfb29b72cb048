"""Reinforcement learning on the on-policy samplers (modes "ar" and "spec"): GRPO's pure core (`grpo`:
advantages, teacher-forced log-probabilities, the clipped objective with a KL penalty) and rewards as
functions of (record, completion text) (`rewards`). The trainer and its command are not built yet.
"""
from .grpo import GRPOConfig, completion_logprobs, group_advantages, grpo_loss, policy_loss, rollout_batch
from .rewards import DEFAULT_REWARDS, answer_reward, format_reward, score

__all__ = ["GRPOConfig", "completion_logprobs", "group_advantages", "grpo_loss", "policy_loss", "rollout_batch",
           "DEFAULT_REWARDS", "answer_reward", "format_reward", "score"]
