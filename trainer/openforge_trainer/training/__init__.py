"""Training: ``openforge train`` (``cli``, ``config``) and veRL's own trainer.

The GRPO loop (``loop``) over batches of captured rollouts (``rollout_sampler``,
``rl_batch``) with veRL's algorithms (``algorithms``), its guard, checkpoints and
metrics; and veRL's Ray trainer on the same rollouts (``verl_launch``, with the
agent loop, the ``external`` rollout and the CPU platform: ``verl_agent_loop``,
``verl_rollout``, ``verl_platform``, ``verl_plugin``).
"""
