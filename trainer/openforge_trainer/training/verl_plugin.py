"""What veRL imports to train on OpenForge: set ``VERL_USE_EXTERNAL_MODULES`` to this module.

veRL imports the modules named there whenever ``verl`` is imported, in the
driver and in every Ray worker, so each process registers the ``external``
rollout (:mod:`verl_rollout`), the appending metrics file (:mod:`verl_metrics`: a
resumed run keeps its earlier steps' metrics) and, when ``VERL_PLATFORM=openforge-cpu``,
the CPU platform (:mod:`verl_platform`). :mod:`verl_launch` sets both.
"""

from __future__ import annotations

from openforge_trainer.training import verl_metrics, verl_platform, verl_rollout


def install() -> None:
    """Everything OpenForge registers with veRL (idempotent)."""
    verl_platform.install()
    verl_rollout.install()
    verl_metrics.install()


install()
