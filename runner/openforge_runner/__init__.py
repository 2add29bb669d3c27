"""``openforge run``: the same HarnessEnv + RolloutJob YAML, on one machine.

It plays the operator's part with processes instead of pods: each rollout
gets its own working directory, process group and capture sidecar; the
collector, the inference server (``openforge serve``) and the trainer run as
local processes; iterations loop rollout -> train -> publish weights. Like
the operator it talks to the components only through their commands and
wire contracts, never by importing them.

- :mod:`openforge_runner.plan`: manifests -> what to start (pure).
- :mod:`openforge_runner.processes`: starting and stopping local services.
- :mod:`openforge_runner.executor`: one rollout, start to grade.
- :mod:`openforge_runner.runner`: iterations, parallelism, retries, resume.
- :mod:`openforge_runner.progress`: the live display.
- :mod:`openforge_runner.cli`: the command.
"""
