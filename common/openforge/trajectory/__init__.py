"""The trajectory contract: the records a sidecar streams to the collector
(``v1``, generated from ``trajectory.proto``), the gRPC channel they travel on
(``channel``) and the per-job token that admits them (``auth``)."""

STOPPED = "stopped"
"""``RolloutFinished.status`` of an attempt cut off before it was finished: its sidecar
stopped (``--finish-on-stop``) or a drain closed it. It is never trained or measured;
its runner tries the rollout again as a new attempt."""

BATCH_LABEL = "openforge.dev/batch"
"""``RolloutStarted.labels`` key of the batch a rollout was started in, as
``<number>/<rollouts in the batch>`` (``openforge run``: the iteration, ``3/32``).
Rollouts of one task, policy version and batch are one training group; a training step
takes the groups of one batch, and takes them all once every rollout of the batch is
complete, however many that is: batches never merge."""
