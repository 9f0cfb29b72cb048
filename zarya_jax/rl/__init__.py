"""Reinforcement learning on the on-policy samplers (modes "ar" and "spec-*", docs/rl.md): GRPO's pure core
(`grpo`: advantages, teacher-forced log-probabilities, the clipped objective with a KL penalty), rewards
as functions of (record, completion text) (`rewards`), the rollouts (`rollout`), the run's config
(`config`), the trainer (`trainer.train_rl` on the shared training loop, imported on use) and its hooks
(`hooks`), the RL demo's plot (`plots`; the demo itself is `experiment.rl_demo`), and a tunix rollout engine
(`tunix_rollout`).
"""
from .grpo import GRPOConfig, completion_logprobs, group_advantages, grpo_loss, policy_loss, rollout_batch
from .rewards import DEFAULT_REWARDS, answer_reward, format_reward, score

__all__ = ["GRPOConfig", "completion_logprobs", "group_advantages", "grpo_loss", "policy_loss", "rollout_batch",
           "DEFAULT_REWARDS", "answer_reward", "format_reward", "score"]
