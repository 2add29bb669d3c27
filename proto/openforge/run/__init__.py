"""``openforge run``: the same HarnessEnv + RolloutJob YAML, on one machine.

It plays the operator's part with processes instead of pods: each rollout
gets its own working directory, process group and capture sidecar; the
collector, the inference server (``openforge serve``) and the trainer run as
local processes; iterations loop rollout -> train -> publish weights. Like
the operator it talks to the components only through their commands and
wire contracts, never by importing them.

- :mod:`openforge.run.plan`: manifests -> what to start (pure).
- :mod:`openforge.run.processes`: starting and stopping local services.
- :mod:`openforge.run.executor`: one rollout, start to grade.
- :mod:`openforge.run.runner`: iterations, parallelism, retries, resume.
- :mod:`openforge.run.progress`: the live display.
- :mod:`openforge.run.cli`: the command.
"""
