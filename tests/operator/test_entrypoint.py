"""The harness container's entrypoint script, run for real with /bin/sh: the harness,
then the grader with its arguments intact, the handshake files, the termination message."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from openforge import podrun
from openforge_operator import attempts, entrypoint

PY = sys.executable


def run(
    tmp_path: Path,
    harness: list[str],
    grader: list[str] | None,
    *,
    verdict: str | None = '{"status": "succeeded"}',
    wait: int = 10,
    sidecar_wait: int = 0,
    ready_after: float | None = None,
    verdict_first: str | None = None,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the entrypoint; a thread plays the in-pod agent (creates ``sidecar-ready``
    ``ready_after`` seconds in, writes ``finished`` once ``harness-done`` appears; with
    ``verdict_first``, writes that as ``finished`` before anything else)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if verdict_first is not None:
        (run_dir / podrun.FINISHED).write_text(verdict_first)
    termination = tmp_path / "termination-log"

    def agent() -> None:
        if ready_after is not None:
            time.sleep(ready_after)
            (run_dir / podrun.SIDECAR_READY).touch()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if (run_dir / podrun.HARNESS_DONE).exists():
                if verdict is not None:
                    (run_dir / podrun.FINISHED).write_text(verdict)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=agent)
    thread.start()
    env = {
        **os.environ,
        "OPENFORGE_RUN_DIR": str(run_dir),
        "OPENFORGE_TERMINATION_LOG": str(termination),
        "OPENFORGE_FINISH_WAIT": str(wait),
        "OPENFORGE_GRADER_TIMEOUT": "20",
        "OPENFORGE_SIDECAR_WAIT": str(sidecar_wait),
    }
    done = subprocess.run(
        [*entrypoint.COMMAND, *entrypoint.arguments(harness, grader)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    thread.join()
    return done, run_dir


def test_exits_with_the_harness_code_after_grading_and_reporting(tmp_path: Path) -> None:
    done, run_dir = run(
        tmp_path,
        [PY, "-c", "import sys; print('harness'); sys.exit(7)"],
        [
            PY,
            "-c",
            "import os; print('noise'); print('{\"reward\": 0.5, \"exit\": %s}' % "
            "os.environ['OPENFORGE_HARNESS_EXIT_CODE'])",
        ],
        verdict='{"status": "succeeded", "reward": 0.5}',
    )
    assert done.returncode == 7
    assert done.stdout.strip() == "harness", (
        "the harness's output is the container's; the grader's goes to a file"
    )
    assert (run_dir / "harness-exit-code").read_text() == "7\n"
    assert (run_dir / "grader-exit-code").read_text() == "0\n"
    assert (run_dir / "grader-stdout").read_text().splitlines() == [
        "noise",
        '{"reward": 0.5, "exit": 7}',
    ]
    assert (tmp_path / "termination-log").read_text() == '{"status": "succeeded", "reward": 0.5}'


def test_grader_arguments_arrive_exactly(tmp_path: Path) -> None:
    odd = ["a b", "$HOME", "'single'", '"double"', "back\\slash", "*", "", "$(whoami)", "-", "--"]
    done, run_dir = run(
        tmp_path, ["true"], [PY, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *odd]
    )
    assert done.returncode == 0
    assert json.loads((run_dir / "grader-stdout").read_text()) == odd


def test_harness_arguments_arrive_exactly(tmp_path: Path) -> None:
    odd = ["x y", "$PATH", "'q'", "\\n", ""]
    out = tmp_path / "argv.json"
    done, _ = run(
        tmp_path,
        [
            PY,
            "-c",
            f"import json, sys; open({str(out)!r}, 'w').write(json.dumps(sys.argv[1:]))",
            *odd,
        ],
        None,
    )
    assert done.returncode == 0
    assert json.loads(out.read_text()) == odd


def test_without_a_grader_nothing_is_graded(tmp_path: Path) -> None:
    done, run_dir = run(tmp_path, ["sh", "-c", "exit 3"], None)
    assert done.returncode == 3
    assert not (run_dir / "grader-stdout").exists() and (run_dir / "harness-done").exists()


def test_a_missing_harness_binary_exits_127_and_still_reports(tmp_path: Path) -> None:
    done, run_dir = run(tmp_path, ["/nonexistent/harness"], None)
    assert done.returncode == 127
    assert (run_dir / "harness-exit-code").read_text() == "127\n"
    assert (tmp_path / "termination-log").exists()


def test_without_a_verdict_it_gives_up_after_the_finish_wait(tmp_path: Path) -> None:
    started = time.monotonic()
    done, _ = run(tmp_path, ["true"], None, verdict=None, wait=2)
    assert done.returncode == 0
    assert 1.5 < time.monotonic() - started < 30
    assert not (tmp_path / "termination-log").exists()


def test_the_script_survives_the_kubelets_variable_expansion() -> None:
    """The kubelet rewrites ``$$`` to ``$`` and ``$(NAME)`` to NAME's value in a container's
    command."""
    assert "$$" not in entrypoint.SCRIPT
    assert not re.search(r"\$\([A-Za-z_]", entrypoint.SCRIPT)


def test_the_harness_starts_only_once_the_sidecar_is_ready(tmp_path: Path) -> None:
    started = tmp_path / "harness-started"
    done, run_dir = run(
        tmp_path,
        [PY, "-c", f"import time; open({str(started)!r}, 'w').write(repr(time.time()))"],
        None,
        sidecar_wait=20,
        ready_after=1.0,
    )
    assert done.returncode == 0
    ready = (run_dir / podrun.SIDECAR_READY).stat().st_mtime
    assert float(started.read_text()) >= ready, "the harness ran before the sidecar listened"


def test_a_sidecar_that_never_listens_fails_the_attempt_without_running_the_harness(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    done, run_dir = run(
        tmp_path, ["sh", "-c", "echo ran > harness-ran"], None, sidecar_wait=1, verdict=None
    )
    assert done.returncode == podrun.SIDECAR_NOT_READY_EXIT_CODE
    assert 0.9 < time.monotonic() - started < 20
    assert not (run_dir / podrun.HARNESS_DONE).exists() and not (tmp_path / "harness-ran").exists()
    message = json.loads((tmp_path / "termination-log").read_text())
    assert (message["status"], message["reason"], message["exitCode"]) == (
        "failed",
        "SidecarFailed",
        podrun.SIDECAR_NOT_READY_EXIT_CODE,
    )
    assert "did not listen within 1 s" in message["message"]


def test_an_agent_verdict_before_ready_ends_the_attempt_without_running_the_harness(
    tmp_path: Path,
) -> None:
    """The agent writes ``finished`` instead of ``sidecar-ready`` when the pod was never
    fenced: the entrypoint passes that verdict on and never runs the harness."""
    verdict = '{"exitCode":125,"status":"failed","reason":"SidecarFailed","message":"not fenced"}'
    done, run_dir = run(
        tmp_path,
        ["sh", "-c", "echo ran > harness-ran"],
        None,
        sidecar_wait=20,
        verdict=None,
        verdict_first=verdict,
    )
    assert done.returncode == podrun.SIDECAR_NOT_READY_EXIT_CODE
    assert not (run_dir / podrun.HARNESS_DONE).exists() and not (tmp_path / "harness-ran").exists()
    assert (tmp_path / "termination-log").read_text() == verdict


TERMINATED = """
import signal, sys, time
def stop(signum, frame):
    open(sys.argv[1], "w").write("terminated")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[2], "w").write("started")
time.sleep(60)
"""


@pytest.mark.parametrize("stage", ["harness", "grader"])
def test_a_term_is_passed_on_and_a_stopped_rollout_is_neither_graded_nor_reported(
    tmp_path: Path, stage: str
) -> None:
    """The pod deleted or past its deadline: the kubelet's TERM reaches the script, which as
    PID 1 of the container would otherwise ignore it for the whole grace period."""
    run_dir, termination = tmp_path / "run", tmp_path / "termination-log"
    run_dir.mkdir()
    got, started = tmp_path / "got-term", tmp_path / "started"
    slow = [PY, "-c", TERMINATED, str(got), str(started)]
    harness, grader = (
        (slow, [PY, "-c", "print('{\"reward\": 1}')"]) if stage == "harness" else (["true"], slow)
    )
    env = {
        **os.environ,
        "OPENFORGE_RUN_DIR": str(run_dir),
        "OPENFORGE_TERMINATION_LOG": str(termination),
        "OPENFORGE_FINISH_WAIT": "30",
    }
    script = subprocess.Popen(
        [*entrypoint.COMMAND, *entrypoint.arguments(harness, grader)], env=env
    )
    deadline = time.monotonic() + 30
    while not started.exists():
        assert script.poll() is None and time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    stopped_at = time.monotonic()
    script.send_signal(signal.SIGTERM)
    assert script.wait(timeout=20) == 143
    assert time.monotonic() - stopped_at < 10, (
        "the script waited for its child instead of stopping it"
    )
    assert got.read_text() == "terminated", f"the {stage} never got the TERM"
    assert not (run_dir / podrun.HARNESS_DONE).exists()
    assert (run_dir / podrun.HARNESS_EXIT_CODE).exists() == (stage == "grader")
    verdict = json.loads(termination.read_text())
    assert (verdict["status"], verdict["exitCode"], verdict["stopped"]) == ("failed", 143, True)
    summary = attempts.summarize(
        {
            "metadata": {
                "name": "job-0-0",
                "labels": {"openforge.dev/job-uid": "u", "openforge.dev/rollout": "0",
                           "openforge.dev/attempt": "0"},
                # what the pod shows after the kubelet's own deletion (grace 0), the
                # harness stopped seconds before it: no longer "deleted while running"
                "deletionTimestamp": "2026-01-01T00:01:00Z",
                "deletionGracePeriodSeconds": 0,
            },
            "spec": {"nodeName": "node-1"},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "harness", "state": {
                "terminated": {"exitCode": 143, "finishedAt": "2026-01-01T00:00:50Z",
                               "message": termination.read_text()}}}]},
        }
    )  # fmt: skip
    assert summary is not None and not summary.deleted_unfinished
    judged = attempts.judge(summary, failing_exit_codes=frozenset())
    assert judged.state == "failed", "a stopped rollout is never judged a success"


def test_the_script_spells_the_run_directory_s_files_as_podrun_names_them() -> None:
    # the script is sh, so it cannot import the names: hold its spelling to them
    written = set(re.findall(r'"\$run/([a-z-]+)"', entrypoint.SCRIPT))
    shared_by_script = set(podrun.FILES) - {podrun.SIDECAR_SERVING, podrun.SIDECAR_START_FAILED}
    assert written == shared_by_script
    assert f"exit {podrun.SIDECAR_NOT_READY_EXIT_CODE}\n" in entrypoint.SCRIPT
    assert f'"exitCode":{podrun.SIDECAR_NOT_READY_EXIT_CODE},' in entrypoint.SCRIPT
    assert 'run="${OPENFORGE_RUN_DIR:-' + podrun.RUN_DIR + '}"' in entrypoint.SCRIPT
