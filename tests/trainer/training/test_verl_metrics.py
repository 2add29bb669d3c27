"""veRL's ``file`` logger appends once the plugin is installed: a resumed run keeps the
metrics of its earlier steps (veRL's own opens the file with "wb")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openforge_trainer.training import verl_metrics


def test_veRLs_tracking_appends_to_the_metrics_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.utils import tracking

    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    monkeypatch.setattr(tracking, "FileLogger", tracking.FileLogger)  # restored after the test
    verl_metrics.install()
    for step in (1, 2):  # a run, then the run resumed: each its own Tracking
        logger = tracking.Tracking(project_name="p", experiment_name="e", default_backend=["file"])
        logger.log(data={"critic/score/mean": np.float32(step / 4)}, step=step)
        logger.logger["file"].finish()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"step": 1, "data": {"critic/score/mean": 0.25}},
        {"step": 2, "data": {"critic/score/mean": 0.5}},
    ]


def test_without_a_path_it_writes_where_veRLs_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    logger = verl_metrics.AppendingFileLogger("proj", "exp")
    logger.log({"a": 1}, 3)
    logger.finish()
    assert (tmp_path / "proj" / "exp.jsonl").read_text() == '{"step":3,"data":{"a":1}}\n'
