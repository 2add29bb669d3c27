"""``openforge train`` as a real process on a real store."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from openforge_trainer.collection import store
from openforge_trainer.training import checkpoint, metrics, rollout_sampler
from openforge_trainer.training import cli as train_cli
from openforge_trainer.training import loop as trainer_loop

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rollout_sampler.build_tiny_model(tmp_path_factory.mktemp("policy") / "model")


def populate(db_path: Path, model_dir: Path, tasks: list[str]) -> list[str]:
    model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu")
    with store.Store(db_path) as db:
        return rollout_sampler.write_rollouts(db, model, job="job", tasks=tasks, samples=3)


def command(tmp_path: Path, model_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "openforge_trainer.training.cli",
        "--store",
        str(tmp_path / "store.db"),
        "--job",
        "job",
        "--model",
        str(model_dir),
        "--run-dir",
        str(tmp_path / "run"),
        "--lr",
        "1e-3",
        "--poll-interval",
        "0.1",
        *extra,
    ]


ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def test_two_steps_end_to_end(tmp_path: Path, model_dir: Path) -> None:
    ids = populate(tmp_path / "store.db", model_dir, ["a", "b", "c", "d", "e"])
    done = subprocess.run(
        command(
            tmp_path, model_dir, "--steps", "2", "--groups-per-step", "2", "--wait-for-groups", "5"
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("openforge train: starting (policy v0), job job")
    assert lines[0].endswith(", torch threads 1")  # ENV's OMP_NUM_THREADS
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == [
        "step 1 (policy v1)",
        "step 2 (policy v2)",
    ]
    assert lines[-1] == "openforge train: stopped after 2 step(s) this run (step 2, policy v2)"
    records = metrics.read(tmp_path / "run" / metrics.JSONL)
    assert [r["step"] for r in records] == [1, 2] and all(r["groups"] == 2 for r in records)
    with store.Store(tmp_path / "store.db") as db:
        marks = [db.rollout(rid).trained_checkpoint for rid in ids]  # type: ignore[union-attr]
    assert marks.count(str(checkpoint.path_for(tmp_path / "run", 1))) == 6
    assert marks.count(str(checkpoint.path_for(tmp_path / "run", 2))) == 6
    assert marks.count(None) == 3  # task e waits for the next run
    assert (tmp_path / "run" / metrics.CURVE).is_file()


def spawn(tmp_path: Path, model_dir: Path, *flags: str) -> subprocess.Popen[str]:
    """``openforge train`` running, its output (stderr too) on ``stdout``."""
    return subprocess.Popen(
        command(tmp_path, model_dir, *flags),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
    )


def communicate_or_dump_stacks(process: subprocess.Popen[str], *, timeout: float) -> str:
    """The rest of the trainer's output once it exits; if it has not within ``timeout``,
    the failure shows where each of its threads waits (SIGUSR1: ``openforge train``'s
    stack dump). A clean-clone run on 2026-12-03 saw this trainer not stop in 30 s once."""
    try:
        return process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)
        time.sleep(2)
        process.kill()
        rest = process.communicate()[0]
        raise AssertionError(f"openforge train did not stop in {timeout} s:\n{rest}") from None


def test_sigterm_stops_cleanly_after_the_step(tmp_path: Path, model_dir: Path) -> None:
    populate(tmp_path / "store.db", model_dir, ["a"])
    process = spawn(tmp_path, model_dir, "--groups-per-step", "1")
    assert process.stdout is not None
    seen = []
    deadline = time.monotonic() + 90
    for line in process.stdout:  # the trainer waits for more groups after step 1
        seen.append(line)
        if line.startswith("step 1 ") or time.monotonic() > deadline:
            break
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    rest = communicate_or_dump_stacks(process, timeout=30)
    output = "".join(seen) + rest
    assert process.returncode == 0, output
    assert "SIGTERM: stopping after the current step" in output
    assert output.rstrip().endswith("stopped after 1 step(s) this run (step 1, policy v1)")
    assert checkpoint.latest(tmp_path / "run") == checkpoint.path_for(tmp_path / "run", 1)


def test_sigterm_while_waiting_does_not_train_a_partial_step(
    tmp_path: Path, model_dir: Path
) -> None:
    """One group ready of the two a step takes: a stop ends the wait without training it."""
    populate(tmp_path / "store.db", model_dir, ["a"])
    process = spawn(tmp_path, model_dir, "--groups-per-step", "2", "--poll-interval", "0.2")
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith("openforge train: starting"):
            break
    time.sleep(3)  # waiting for a second group
    process.send_signal(signal.SIGUSR1)  # where it waits, and it goes on waiting
    time.sleep(1)
    process.send_signal(signal.SIGTERM)
    rest = communicate_or_dump_stacks(process, timeout=30)
    output = "".join(seen) + rest
    assert process.returncode == 0, output
    assert "(most recent call first)" in output and "in wait_for_groups" in output, output
    assert "the partial step is not trained" in output
    assert output.rstrip().endswith("stopped after 0 step(s) this run (step 0, policy v0)"), output
    assert checkpoint.latest(tmp_path / "run") is None


def test_bad_settings_exit_2_naming_the_field(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "store.db").touch()
    argv = command(tmp_path, model_dir, "--groups-per-step", "0", "--vllm", "gpu-0:8000")[3:]
    assert train_cli.main(argv) == 2
    error = capsys.readouterr().err
    assert "groups_per_step: Input should be greater than or equal to 1 (got 0)" in error
    assert "vllm_urls: 'gpu-0:8000' is not an http:// or https:// URL" in error
    missing = command(tmp_path / "nowhere", model_dir)[3:]
    assert train_cli.main(missing) == 2
    assert "--store: no store at" in capsys.readouterr().err


def test_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        train_cli.main(["--help"])
    text = capsys.readouterr().out
    for flag in (
        "--serve URL",
        "--vllm URL",
        "--steps",
        "--groups-per-step",
        "--lr",
        "--seed",
        "--wait-for-groups SECONDS",
    ):
        assert flag in text
    assert json.dumps("Skip (and count) groups sampled")[1:-1] in " ".join(text.split())


def test_options_set_any_field_by_snake_or_camel_case_name() -> None:
    values = train_cli.apply_options(
        {"lr": 1e-3},
        [
            "adam_eps=1e-5",
            "maxGradNorm=0.5",
            "loss_agg_mode=seq-mean-token-mean",
            "clipRatioHigh=0.28",
        ],
    )
    assert values == {
        "lr": 1e-3,
        "adam_eps": 1e-5,
        "max_grad_norm": 0.5,
        "loss_agg_mode": "seq-mean-token-mean",  # not JSON: kept as the string
        "clip_ratio_high": 0.28,
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["adam_eps"], "--option 'adam_eps': expected NAME=VALUE"),
        (["=1"], "--option '=1': expected NAME=VALUE"),
        (["lr=2e-3"], "--option 'lr=2e-3': lr is already set (by --lr)"),
        (["adamEps=1e-5", "adam_eps=1e-6"], "adam_eps is already set (by --option adam_eps)"),
    ],
)
def test_malformed_or_doubled_options_are_named(options: list[str], message: str) -> None:
    with pytest.raises(train_cli.train_config.ConfigError, match=re.escape(message)):
        train_cli.apply_options({"lr": 1e-3}, options)


def test_check_validates_options_and_names_the_field_at_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [
        "--store",
        str(tmp_path / "none.db"),
        "--job",
        "j",
        "--model",
        "m",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    assert train_cli.main([*base, "--option", "adamEps=1e-5", "--check"]) == 0
    assert json.loads(capsys.readouterr().out)["adam_eps"] == 1e-5
    assert (
        train_cli.main([*base, "--option", "adam_epz=1e-5", "--option", "kl_coef=-1", "--check"])
        == 2
    )
    err = capsys.readouterr().err
    assert "adam_epz: Extra inputs are not permitted (got 1e-05)" in err
    assert "kl_coef: Input should be greater than or equal to 0 (got -1)" in err
    assert not (tmp_path / "r").exists()  # --check reads and writes nothing
