"""The in-pod agent: its verdicts (as ``openforge run`` judges), and the whole in-pod
handshake with real processes: the agent running a real ``openforge sidecar``, the
entrypoint script running a harness and a grader, the verdict in the termination message."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mitmproxy import certs
from openforge import podrun
from openforge.trajectory import auth
from openforge_operator import entrypoint
from openforge_runner.processes import free_port
from openforge_sidecar import podagent
from openforge_sidecar.recording import spool

FAILING = frozenset(range(1, 256))


def wait_port(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the agent exited with {process.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def files(
    run_dir: Path, *, harness: int | None, grader_stdout: str | None = None, grader_exit: int = 0
) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    if harness is not None:
        (run_dir / podrun.HARNESS_EXIT_CODE).write_text(f"{harness}\n")
    if grader_stdout is not None:
        (run_dir / podrun.GRADER_STDOUT).write_text(grader_stdout)
        (run_dir / podrun.GRADER_EXIT_CODE).write_text(f"{grader_exit}\n")
    return run_dir


# -- verdicts --------------------------------------------------------------------------------


def test_the_grader_s_own_exit_codes_are_read_as_timeout_and_sh_report_them(tmp_path: Path) -> None:
    """124 is ``timeout``'s (the grader ran past its timeout: no reward, even one it printed);
    126 and 127 with nothing printed are the shell's (its command could not be run)."""
    late = podagent.judge(
        files(tmp_path / "a", harness=0, grader_stdout='{"reward": 1}', grader_exit=124),
        reward_from="stdout-json",
        failing_exit_codes=FAILING,
    )
    assert (late.status, late.reason, late.reward, late.message) == (
        "failed",
        "GraderFailed",
        None,
        "the grader ran past its timeout",
    )
    missing = podagent.judge(
        files(tmp_path / "b", harness=0, grader_stdout="", grader_exit=127),
        reward_from="exit-code",
        failing_exit_codes=FAILING,
    )
    assert (missing.status, missing.reason) == (
        "failed",
        "GraderFailed",
    ) and "exit 127" in missing.message
    run_dir = files(tmp_path / "c", harness=0, grader_stdout='{"reward": 1}')
    (run_dir / podrun.GRADER_EXIT_CODE).unlink()
    unrecorded = podagent.judge(run_dir, reward_from="stdout-json", failing_exit_codes=FAILING)
    assert (unrecorded.reason, unrecorded.message) == (
        "GraderFailed",
        "the grader could not run: its exit code was never recorded",
    )


def test_a_graded_rollout_succeeds_whatever_the_exit_code_unless_the_policy_fails_it(
    tmp_path: Path,
) -> None:
    run_dir = files(tmp_path, harness=3, grader_stdout='{"reward": 0.5}')
    assert podagent.judge(
        run_dir, reward_from="stdout-json", failing_exit_codes=frozenset()
    ) == podagent.Verdict(3, 0.5, '{"reward": 0.5}', "succeeded", "")
    failed = podagent.judge(run_dir, reward_from="stdout-json", failing_exit_codes=FAILING)
    assert (failed.status, failed.reason, failed.reward) == ("failed", "", 0.5)


def test_no_reward_is_a_grader_failure(tmp_path: Path) -> None:
    verdict = podagent.judge(
        files(tmp_path, harness=0, grader_stdout="crashed", grader_exit=1),
        reward_from="stdout-json",
        failing_exit_codes=FAILING,
    )
    assert (verdict.status, verdict.reason, verdict.reward) == ("failed", "GraderFailed", None)
    assert "no JSON line" in verdict.message


def test_without_a_grader_exit_zero_is_reward_one(tmp_path: Path) -> None:
    assert (
        podagent.judge(
            files(tmp_path, harness=0), reward_from="none", failing_exit_codes=FAILING
        ).reward
        == 1.0
    )
    verdict = podagent.judge(
        files(tmp_path / "b", harness=2), reward_from="none", failing_exit_codes=frozenset()
    )
    assert (verdict.reward, verdict.status) == (0.0, "succeeded")


def test_the_termination_message_turns_an_unacknowledged_rollout_into_a_sidecar_failure() -> None:
    verdict = podagent.Verdict(0, 1.0, "", "succeeded", "")
    assert podagent.termination_message(verdict, {"acknowledged": True, "calls": 4}).body() == {
        "exitCode": 0, "status": "succeeded", "reason": "", "reward": 1.0, "acknowledged": True,
        "calls": 4, "message": "",
    }  # fmt: skip
    lost = podagent.termination_message(
        verdict, {"acknowledged": False, "error": "connection refused"}
    )
    assert (lost.status, lost.reason) == ("failed", "SidecarFailed")
    assert "connection refused" in lost.message
    refused = podagent.termination_message(
        verdict, {"acknowledged": True, "exporter": {"acked": 3, "refused": 2}}
    )
    assert (refused.status, refused.reason, refused.acknowledged) == (
        "failed",
        "SidecarFailed",
        False,
    )
    assert "refused 2 of the rollout's records" in refused.message
    long = podagent.termination_message(
        podagent.Verdict(1, None, "", "failed", "GraderFailed", "x" * 9000), {}
    )
    assert len(long.dumps().encode()) < 4096  # the kubelet keeps 4096 bytes


# -- the handshake, for real -------------------------------------------------------------------


class Agent:
    """``python -m openforge_sidecar.podagent`` around a real passthrough ``openforge sidecar``."""

    def __init__(self, tmp_path: Path, *extra: str, sidecar_extra: tuple[str, ...] = ()) -> None:
        self.run_dir = tmp_path / "run"
        self.port = free_port()
        self.log = tmp_path / "agent.log"
        listen = f"127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "openforge_sidecar.podagent",
                "--run-dir", str(self.run_dir), "--listen", listen,
                "--reward-from", "stdout-json", "--failing-exit-codes", "1-255",
                "--finish-wait", "5", "--poll", "0.05", *extra]  # fmt: skip
        args += ["--", "--listen", listen, "--capture", "passthrough", "--upstream", "http://127.0.0.1:9",
                 "--spool", str(tmp_path / "spool"), "--confdir", str(tmp_path / "confdir"),
                 "--job", "job", "--rollout-id", "job-0-0", *sidecar_extra]  # fmt: skip
        self.spool = tmp_path / "spool"
        self.process = subprocess.Popen(
            args,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def wait_serving(self, timeout: float = 60) -> None:
        wait_file(self.run_dir / podrun.SIDECAR_SERVING, self.process, timeout)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=40)


def entrypoint_run(
    run_dir: Path, termination: Path, harness: list[str], grader: list[str] | None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OPENFORGE_RUN_DIR": str(run_dir),
        "OPENFORGE_TERMINATION_LOG": str(termination),
        "OPENFORGE_FINISH_WAIT": "30",
        "OPENFORGE_SIDECAR_WAIT": "30",
    }
    return subprocess.run(
        [*entrypoint.COMMAND, *entrypoint.arguments(harness, grader)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_rollout_is_graded_reported_and_acknowledged(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    try:
        wait_port(agent.port, agent.process, timeout=60)
        done = entrypoint_run(
            agent.run_dir,
            tmp_path / "term",
            ["sh", "-c", "exit 3"],
            [sys.executable, "-c", "print('{\"reward\": 0.25}')"],
        )
        assert done.returncode == 3
        message = json.loads((tmp_path / "term").read_text())
        assert message == {
            "exitCode": 3,
            "status": "failed",
            "reason": "",
            "reward": 0.25,
            "acknowledged": True,
            "calls": 0,
            "message": "harness exited with 3",
        }
    finally:
        assert agent.stop() == 0
    assert list((tmp_path / "spool").glob("segment-*.log")), "the sidecar spooled the finish record"


def test_the_harness_cannot_report_its_own_rollout(tmp_path: Path) -> None:
    """As in a pod: the sidecar's control token is in its own directory. The harness, on the
    sidecar's port, is refused a finish with the reward it would like; the agent's finish,
    with the grader's reward and the token, is the one recorded."""
    token_file = tmp_path / "sidecar-own" / "control-token"
    agent = Agent(
        tmp_path,
        "--control-token-file",
        str(token_file),
        sidecar_extra=("--control-token-file", str(token_file)),
    )
    try:
        agent.wait_serving()
        assert token_file.stat().st_mode & 0o777 == 0o600
        forge = (
            "import urllib.request as u; "
            f"u.urlopen(u.Request('http://127.0.0.1:{agent.port}/openforge/v1/rollout/finish', "
            f'data=b\'{{"exit_code": 0, "reward": 1.0}}\'))'
        )
        done = entrypoint_run(
            agent.run_dir,
            tmp_path / "term",
            [sys.executable, "-c", forge],
            [sys.executable, "-c", "print('{\"reward\": 0.0}')"],
        )
        assert done.returncode == 1 and "HTTP Error 401" in done.stderr + done.stdout, done.stderr
        message = json.loads((tmp_path / "term").read_text())
        assert message["acknowledged"] is True and message["reward"] == 0.0, message
    finally:
        assert agent.stop() == 0
    log = (tmp_path / "agent.log").read_text()
    assert "refused a rollout/finish without the control token" in log


@pytest.mark.parametrize("token_job", ["job", "other"])
def test_a_rollout_is_acknowledged_only_when_the_collector_stored_it(
    tmp_path: Path, token_job: str
) -> None:
    """Sidecar -> collector with a per-job token, for real: the job's own token is stored
    and acknowledged; another job's token is refused record by record, which fails the
    rollout (SidecarFailed) instead of passing it as captured."""
    key = tmp_path / "master-key"
    key.write_text("k" * 64)
    token = tmp_path / "token"
    token.write_text(auth.issue(b"k" * 64, auth.JobIdentity("rl", token_job, "uid-1")))
    port = free_port()
    collector = subprocess.Popen(
        [sys.executable, "-m", "openforge.cli", "collector", "--store", str(tmp_path / "store.db"),
         "--listen", f"127.0.0.1:{port}", "--master-key-file", str(key)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    agent = Agent(
        tmp_path,
        sidecar_extra=("--collector", f"127.0.0.1:{port}", "--collector-token-file", str(token)),
    )
    try:
        wait_port(port, collector, timeout=60)
        wait_port(agent.port, agent.process, timeout=60)
        entrypoint_run(
            agent.run_dir,
            tmp_path / "term",
            ["true"],
            [sys.executable, "-c", "print('{\"reward\": 1}')"],
        )
        message = json.loads((tmp_path / "term").read_text())
    finally:
        agent.stop()
        collector.send_signal(signal.SIGTERM)
        collector.wait(timeout=30)
    with sqlite3.connect(tmp_path / "store.db") as db:
        stored = db.execute("SELECT COUNT(*) FROM records WHERE rollout_id = 'job-0-0'").fetchone()[
            0
        ]
    if token_job == "job":
        assert (message["status"], message["acknowledged"]) == ("succeeded", True)
        assert stored >= 2, "started and finished"
    else:
        assert (message["status"], message["reason"], message["acknowledged"]) == (
            "failed",
            "SidecarFailed",
            False,
        )
        assert "the collector refused" in message["message"]
        assert stored == 0


def wait_file(path: Path, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the agent exited with {process.returncode}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.005)


def test_the_harness_may_call_before_the_sidecar_serves_and_is_answered(tmp_path: Path) -> None:
    """The agent binds the port and says so (``sidecar-ready``) before the sidecar's imports;
    a call made then waits in the socket's backlog and is answered once the sidecar serves,
    by the sidecar running in the agent's own process."""
    agent = Agent(tmp_path)
    try:
        wait_file(agent.run_dir / podrun.SIDECAR_READY, agent.process, timeout=30)
        serving_before = (agent.run_dir / podrun.SIDECAR_SERVING).exists()
        with socket.create_connection(("127.0.0.1", agent.port), timeout=60) as connection:
            connection.sendall(
                b"GET /openforge/v1/stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            )
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        assert not serving_before, (
            "the sidecar already served when the port was bound: nothing was shown"
        )
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["rollout_id"] == "job-0-0"
        assert (agent.run_dir / podrun.SIDECAR_SERVING).exists()
        assert children(agent.process.pid) == [], "the sidecar runs in the agent's own process"
    finally:
        assert agent.stop() == 0


def test_a_sidecar_that_died_before_it_served_fails_the_attempt(tmp_path: Path) -> None:
    """``sidecar-ready`` without ``sidecar-serving`` at start: an earlier start of the
    container bound the port and died before serving, and the harness's first calls may
    have been refused unrecorded. The rollout is not graded data, whatever its grade."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / podrun.SIDECAR_READY).touch()
    agent = Agent(tmp_path)
    try:
        wait_port(agent.port, agent.process, timeout=60)
        entrypoint_run(
            agent.run_dir,
            tmp_path / "term",
            ["true"],
            [sys.executable, "-c", "print('{\"reward\": 1}')"],
        )
        message = json.loads((tmp_path / "term").read_text())
    finally:
        agent.stop()
    assert (message["status"], message["reason"], message["reward"]) == (
        "failed",
        "SidecarFailed",
        None,
    )
    assert "failed before it served" in message["message"]


@pytest.mark.parametrize("when", ["serving", "bound"])
def test_a_pod_stopped_before_the_harness_finished_records_the_rollout_stopped(
    tmp_path: Path, when: str
) -> None:
    """Stopped once the sidecar serves, or as early as the port is bound (the stop waits
    for the sidecar, which records the rollout stopped and flushes)."""
    agent = Agent(tmp_path)
    try:
        wait_file(
            agent.run_dir / (podrun.SIDECAR_SERVING if when == "serving" else podrun.SIDECAR_READY),
            agent.process,
            60,
        )
    finally:
        assert agent.stop() == 0
    assert not (agent.run_dir / podrun.FINISHED).exists(), "no harness is left to read a verdict"
    stored = list(spool.Spool(agent.spool).records_after(0))
    assert [record.WhichOneof("body") for record in stored] == ["started", "finished"]
    finished = stored[-1].finished
    assert (finished.status, finished.exit_code, finished.has_reward) == (
        "stopped",
        podagent.STOPPED_EXIT_CODE,
        False,
    )


def test_the_agent_exits_with_its_sidecars_code_so_the_kubelet_restarts_it(tmp_path: Path) -> None:
    agent = Agent(
        tmp_path, sidecar_extra=("--capture", "tokens")
    )  # tokens mode without an engine is refused
    assert agent.process.wait(timeout=60) == 1
    assert "--engine is required" in agent.log.read_text()
    assert not (agent.run_dir / podrun.FINISHED).exists()


def test_the_jobs_ca_is_copied_into_the_writable_confdir_and_used(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    certs.CertStore.from_store(secret, "mitmproxy", 2048)
    ca = secret / "mitmproxy-ca.pem"
    agent = Agent(
        tmp_path,
        "--ca-file",
        str(ca),
        "--confdir",
        str(tmp_path / "confdir"),
        sidecar_extra=("--mode", "regular"),
    )
    try:
        agent.wait_serving()
    finally:
        assert agent.stop() == 0
    copied = tmp_path / "confdir" / "mitmproxy-ca.pem"
    assert copied.read_text() == ca.read_text() and (copied.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("argv", [
    ["--listen", "x"], ["--listen", "x", "--failing-exit-codes", "5-1", "--"],
    ["--listen", "x", "--ca-file", "f", "--"],
    ["--listen", "127.0.0.1:1", "--fence-wait", "5", "--fence-target", "nohost", "--"],
])  # fmt: skip
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        podagent.main(argv)


def test_without_a_fence_target_the_api_server_is_the_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert podagent.default_fence_target() == "10.96.0.1:443"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert podagent.default_fence_target() == "[fd00::1]:443"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert podagent.default_fence_target() == ""
    with pytest.raises(SystemExit, match="KUBERNETES_SERVICE_HOST"):
        podagent.main(["--listen", "127.0.0.1:1", "--fence-wait", "5", "--"])


# -- the fence: a network plugin enforces a new pod's NetworkPolicy some time after it starts --


class ApiServer:
    """Something the pod can reach until "the policy is enforced" (``close``); it accepts
    every connection, as a server does (a full backlog would drop the agent's tries)."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.target = f"127.0.0.1:{self.socket.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            connection.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)  # stops listening, and wakes the accept
        self.socket.close()


def test_the_harness_starts_only_once_the_pod_is_fenced(tmp_path: Path) -> None:
    api = ApiServer()
    agent = Agent(
        tmp_path, "--fence-wait", "60", "--fence-target", api.target, "--fence-poll", "0.05"
    )
    try:
        agent.wait_serving()
        time.sleep(1.0)
        assert not (agent.run_dir / podrun.SIDECAR_READY).exists(), (
            "the harness may start while the pod reaches the API server"
        )
        fenced_at = time.time()
        api.close()
        started = tmp_path / "harness-started"
        done = entrypoint_run(
            agent.run_dir,
            tmp_path / "term",
            [
                sys.executable,
                "-c",
                f"import time; open({str(started)!r}, 'w').write(repr(time.time()))",
            ],
            [sys.executable, "-c", "print('{\"reward\": 1}')"],
        )
        assert done.returncode == 0, done.stderr
        assert float(started.read_text()) >= fenced_at
        message = json.loads((tmp_path / "term").read_text())
        assert (message["status"], message["acknowledged"]) == ("succeeded", True), message
    finally:
        api.close()
        assert agent.stop() == 0
    assert re.search(r"podagent: fenced after \d+\.\d\d s", agent.log.read_text())


def test_a_pod_never_fenced_fails_its_attempt_and_never_runs_the_harness(tmp_path: Path) -> None:
    """The verdict reaches the sidecar as the rollout's finish (recorded failed, never
    trained) and the harness container's termination message (the operator's attempt
    status, with the reason); the harness never ran."""
    api = ApiServer()
    agent = Agent(
        tmp_path, "--fence-wait", "2", "--fence-target", api.target, "--fence-poll", "0.05"
    )
    try:
        agent.wait_serving()
        done = entrypoint_run(
            agent.run_dir,
            tmp_path / "term",
            ["sh", "-c", f"echo ran > {tmp_path / 'harness-ran'}"],
            None,
        )
        assert done.returncode == podrun.SIDECAR_NOT_READY_EXIT_CODE, done.stderr
        assert (
            not (tmp_path / "harness-ran").exists()
            and not (agent.run_dir / podrun.SIDECAR_READY).exists()
        )
        message = json.loads((tmp_path / "term").read_text())
        assert (message["status"], message["reason"], message["reward"]) == (
            "failed",
            "SidecarFailed",
            None,
        ), message
        assert f"could still reach the API server ({api.target}) after 2 s" in message["message"]
    finally:
        api.close()
        assert agent.stop() == 0
    finished = [
        record.finished
        for record in spool.Spool(agent.spool).records_after(0)
        if record.HasField("finished")
    ]
    assert [(f.status, f.has_reward, f.exit_code) for f in finished] == [
        ("failed", False, podrun.SIDECAR_NOT_READY_EXIT_CODE)
    ]


def test_a_restarted_agent_does_not_hold_back_a_harness_already_running(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / podrun.SIDECAR_READY).touch()
    (run_dir / podrun.SIDECAR_SERVING).touch()
    api = ApiServer()
    agent = Agent(tmp_path, "--fence-wait", "2", "--fence-target", api.target)
    try:
        agent.wait_serving()
        time.sleep(3)
        assert not (run_dir / podrun.FINISHED).exists(), "a restart failed the running attempt"
    finally:
        api.close()
        assert agent.stop() == 0


def test_a_restarted_agent_does_not_report_twice(tmp_path: Path) -> None:
    """With ``finished`` already there, the agent posts nothing: the only finish its
    sidecar records is the one of its stop (a post would have recorded reward 1)."""
    run_dir = files(tmp_path / "run", harness=0, grader_stdout='{"reward": 1}')
    (run_dir / podrun.HARNESS_DONE).touch()
    (run_dir / podrun.FINISHED).write_text('{"status": "succeeded"}')
    listen = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "openforge_sidecar.podagent",
         "--run-dir", str(run_dir), "--listen", listen, "--poll", "0.05",
         "--", "--listen", listen, "--capture", "passthrough", "--upstream", "http://127.0.0.1:9",
         "--spool", str(tmp_path / "spool")],
    )  # fmt: skip
    time.sleep(3)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert (run_dir / podrun.FINISHED).read_text() == '{"status": "succeeded"}'
    finished = [
        record.finished
        for record in spool.Spool(tmp_path / "spool").records_after(0)
        if record.HasField("finished")
    ]
    assert [(f.status, f.has_reward) for f in finished] == [("stopped", False)]


def test_a_stop_early_in_a_restarted_agent_still_reaches_its_sidecar(tmp_path: Path) -> None:
    """A restarted container finds the earlier start's ``sidecar-serving``: the agent
    removes it, so a stop asked before this start's sidecar serves is still passed on
    (and not to the agent's own handler, which would keep it for good)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / podrun.SIDECAR_READY).touch()
    (run_dir / podrun.SIDECAR_SERVING).touch()
    agent = Agent(tmp_path)
    deadline = time.monotonic() + 30
    while (run_dir / podrun.SIDECAR_SERVING).exists():
        assert agent.process.poll() is None and time.monotonic() < deadline, (
            "the earlier start's sidecar-serving stayed"
        )
        time.sleep(0.005)
    assert agent.stop() == 0
    assert not (run_dir / podrun.SIDECAR_START_FAILED).exists(), (
        "the earlier start served: nothing to fail"
    )
    finished = [
        record.finished
        for record in spool.Spool(agent.spool).records_after(0)
        if record.HasField("finished")
    ]
    assert [(f.status, f.has_reward) for f in finished] == [("stopped", False)]
