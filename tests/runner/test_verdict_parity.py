"""One harness, one grader, one verdict: a pod's in-pod agent and ``openforge run`` judge an
attempt alike (``openforge.api.verdict``).

Both sides run real processes. The pod's side is the harness container's entrypoint
(``entrypoint.SCRIPT`` under ``sh``: the harness, then the grader under ``timeout``,
their exit codes and output to the run folder) and the in-pod agent's
``podagent.judge`` over that folder; the local side is ``executor.attempt``, which runs
the same commands as ``openforge run`` does. Before the rule was shared they differed: a
grader that printed a reward and then ran past its timeout was graded in a pod and a
GraderFailed locally, and a grader that could not be started gave reward 0 in a pod
(``rewardFrom: exit-code``) and a GraderFailed locally.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from openforge import podrun
from openforge.api import manifests, retries, v1alpha1, verdict
from openforge_operator import entrypoint
from openforge_runner import executor, plan
from openforge_sidecar import podagent

PY = sys.executable
PRINT_HALF = [PY, "-c", "print('noise'); print('{\"reward\": 0.5}')"]
PRINT_THEN_HANG = [PY, "-c", "import time; print('{\"reward\": 0.5}', flush=True); time.sleep(30)"]
MISSING = ["/nonexistent/grade"]
FAIL_ON_3 = [{"action": "FailRollout", "onExitCodes": {"operator": "In", "values": [3]}}]

CASES: dict[
    str,
    tuple[list[str], list[str] | None, str, list[dict[str, Any]], tuple[str, str, float | None]],
] = {
    # name: (harness, grader, rewardFrom, failure rules, (status, reason, reward))
    "graded whatever the exit code":
        (["sh", "-c", "exit 3"], PRINT_HALF, "stdout-json", [], ("succeeded", "", 0.5)),
    "a failing exit code, graded":
        (["sh", "-c", "exit 3"], PRINT_HALF, "stdout-json", FAIL_ON_3, ("failed", "", 0.5)),
    "a SIGKILLed harness is 137 to the policy":
        (["sh", "-c", "kill -9 $$"], PRINT_HALF, "stdout-json", FAIL_ON_3, ("failed", "", 0.5)),
    "a grader past its timeout gave no reward":
        (["true"], PRINT_THEN_HANG, "stdout-json", [], ("failed", "GraderFailed", None)),
    "a grader that cannot run gave no reward":
        (["true"], MISSING, "exit-code", [], ("failed", "GraderFailed", None)),
    "the grader's exit code":
        (["true"], [PY, "-c", "raise SystemExit(4)"], "exit-code", [], ("succeeded", "", 0.0)),
    "no JSON is no reward":
        (["true"], [PY, "-c", "print('hi')"], "stdout-json", [], ("failed", "GraderFailed", None)),
    "without a grader, exit 0 is 1": (["true"], None, "", [], ("succeeded", "", 1.0)),
    "without a grader, exit 2 is 0": (["sh", "-c", "exit 2"], None, "", [], ("succeeded", "", 0.0)),
}  # fmt: skip
GRADER_TIMEOUT = 10  # a Python grader on a loaded 2-core machine took over 2 s to print


def bodies(
    harness: list[str], grader: list[str] | None, reward_from: str, rules: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    env: dict[str, Any] = {
        "apiVersion": v1alpha1.API_VERSION, "kind": "HarnessEnv", "metadata": {"name": "env"},
        "spec": {
            "api": "openai-chat", "baseUrl": {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"},
            "template": {"spec": {"containers": [
                {"name": "harness", "image": "example/h:1", "command": harness}]}},
        },
    }  # fmt: skip
    if grader is not None:
        env["spec"]["grader"] = {
            "command": grader,
            "rewardFrom": reward_from,
            "timeoutSeconds": GRADER_TIMEOUT,
        }
    job: dict[str, Any] = {
        "apiVersion": v1alpha1.API_VERSION, "kind": "RolloutJob", "metadata": {"name": "same"},
        "spec": {"harnessEnvRef": {"name": "env"}, "tasks": {"inline": [{"id": "t"}]},
                 "policy": {"endpoint": "http://policy.test:8000", "model": "m"}},
    }  # fmt: skip
    if rules:
        job["spec"]["failurePolicy"] = {"rules": rules}
    return [env, job]


def in_a_pod(
    tmp_path: Path,
    harness: list[str],
    grader: list[str] | None,
    reward_from: str,
    rules: list[dict[str, Any]],
) -> verdict.Verdict:
    job = manifests.parse(bodies(harness, grader, reward_from, rules)[1])
    assert isinstance(job, v1alpha1.RolloutJob)
    run_dir = tmp_path / "pod-run"
    run_dir.mkdir()
    (run_dir / podrun.SIDECAR_READY).touch()

    def agent() -> None:  # the in-pod agent's part the entrypoint waits on
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (run_dir / podrun.HARNESS_DONE).exists():
            time.sleep(0.05)
        (run_dir / podrun.FINISHED).write_text('{"status": "succeeded"}')

    thread = threading.Thread(target=agent)
    thread.start()
    env = {
        **os.environ, "OPENFORGE_RUN_DIR": str(run_dir),
        "OPENFORGE_TERMINATION_LOG": str(tmp_path / "termination-log"),
        "OPENFORGE_FINISH_WAIT": "30", "OPENFORGE_GRADER_TIMEOUT": str(GRADER_TIMEOUT),
        "OPENFORGE_SIDECAR_WAIT": "5",
    }  # fmt: skip
    work = tmp_path / "pod-work"
    work.mkdir()
    subprocess.run(
        [*entrypoint.COMMAND, *entrypoint.arguments(harness, grader)],
        env=env,
        cwd=work,
        capture_output=True,
        timeout=90,
        check=False,
    )
    thread.join()
    return podagent.judge(
        run_dir,
        reward_from=reward_from if grader is not None else "none",
        failing_exit_codes=retries.failing_exit_codes(job.spec),
    )


def on_one_machine(
    tmp_path: Path,
    harness: list[str],
    grader: list[str] | None,
    reward_from: str,
    rules: list[dict[str, Any]],
) -> verdict.Verdict:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all(bodies(harness, grader, reward_from, rules)))
    bundle = plan.load([path])
    [rollout] = plan.rollouts_for(bundle, 0)
    home = tmp_path / "local"
    (home / "work").mkdir(parents=True)
    judged = executor.attempt(
        bundle, rollout, sidecar_url="http://127.0.0.1:9", home=home, stop=threading.Event()
    )
    assert judged is not None
    return judged


@pytest.mark.parametrize("case", CASES)
def test_a_pod_and_openforge_run_judge_an_attempt_alike(tmp_path: Path, case: str) -> None:
    harness, grader, reward_from, rules, expected = CASES[case]
    pod = in_a_pod(tmp_path, harness, grader, reward_from, rules)
    local = on_one_machine(tmp_path, harness, grader, reward_from, rules)
    assert (pod.status, pod.reason, pod.reward) == expected, pod
    assert (local.status, local.reason, local.reward) == expected, local
    assert pod.exit_code == local.exit_code
    assert pod.grader_output == local.grader_output


def test_the_report_settles_the_verdict_alike() -> None:
    judged = verdict.Verdict(0, 1.0, "", "succeeded", "")
    for answer, expected in [
        ({"acknowledged": True, "calls": 4}, ("succeeded", "", True)),
        (
            {"acknowledged": False, "error": "connection refused"},
            ("failed", "SidecarFailed", False),
        ),
        (
            {"acknowledged": True, "exporter": {"acked": 3, "refused": 2}},
            ("failed", "SidecarFailed", False),
        ),
    ]:
        settled = verdict.settle(judged, answer)
        assert (settled.verdict.status, settled.verdict.reason, settled.acknowledged) == expected
        message = podagent.termination_message(judged, answer)
        assert (message.status, message.reason, message.acknowledged) == expected
