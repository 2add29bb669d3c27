"""The trajectory contract: the records a sidecar streams to the collector
(``v1``, generated from ``trajectory.proto``), the gRPC channel they travel on
(``channel``) and the per-job token that admits them (``auth``)."""

STOPPED = "stopped"
"""``RolloutFinished.status`` of an attempt cut off before it was finished: its sidecar
stopped (``--finish-on-stop``) or a drain closed it. It is never trained or measured;
its runner tries the rollout again as a new attempt."""
