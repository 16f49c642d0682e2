"""RL algorithms as small pure functions: advantages, GRPO, self-distillation, per-token log-probs."""
