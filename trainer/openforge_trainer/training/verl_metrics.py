"""veRL's ``file`` logger, appending: a resumed run's metrics follow its earlier steps'.

veRL's ``FileLogger`` opens ``VERL_FILE_LOGGER_PATH`` with ``"wb"``, so a run resumed
from its checkpoint would start ``metrics.jsonl`` afresh and lose every step before it.
:func:`install` puts :class:`AppendingFileLogger` in its place: the same lines
(``{"step": N, "data": {...}}``), appended. veRL logs a step after its checkpoint is
written, so a resumed run logs no step twice unless a checkpoint was lost; readers take a
step's last line.
"""

from __future__ import annotations

import os
from typing import Any

import orjson


class AppendingFileLogger:
    """What veRL's ``Tracking`` calls for ``trainer.logger=[file]``: ``log`` and ``finish``."""

    def __init__(self, project_name: str, experiment_name: str) -> None:
        self.project_name = project_name
        self.experiment_name = experiment_name
        path = os.getenv("VERL_FILE_LOGGER_PATH")
        if path is None:  # veRL's own default
            root = os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", "."))
            os.makedirs(os.path.join(root, project_name), exist_ok=True)
            path = os.path.join(root, project_name, f"{experiment_name}.jsonl")
        self.filepath = path
        self.fp = open(path, "ab", buffering=0)  # noqa: SIM115 (closed by finish, as veRL's)

    def log(self, data: Any, step: int) -> None:
        line = orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY)
        self.fp.write(line + b"\n")

    def finish(self) -> None:
        self.fp.close()


def install() -> None:
    """Make veRL's ``file`` logger append (idempotent)."""
    from verl.utils import tracking

    tracking.FileLogger = AppendingFileLogger  # type: ignore[misc,assignment]
