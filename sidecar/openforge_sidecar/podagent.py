"""The in-pod agent: main process of a rollout pod's sidecar container.

Run as ``python -m openforge_sidecar.podagent [options] -- SIDECAR-ARGS``. In
one Python process (a pod's start-up pays for one interpreter and one set of
imports, not two) it

- copies the job's CA (Proxy and Transparent modes) from its read-only Secret
  mount into the sidecar's writable mitmproxy confdir;
- binds the sidecar's port (``--listen``) first thing, before the sidecar's
  imports, and creates ``sidecar-ready`` in the shared run directory: the
  harness container's entrypoint waits for that file, then starts the
  harness, whose first connections wait in the socket's backlog until the
  sidecar serves them (the harness's start-up overlaps the sidecar's);
- with ``--fence-wait``, creates ``sidecar-ready`` only once the pod is fenced:
  a network plugin applies a NetworkPolicy to a new pod some time after the
  pod has started (Kubernetes promises no order), and a harness started
  before then could reach what the job's policy denies it. The agent tries the
  API server (``--fence-target``, else ``$KUBERNETES_SERVICE_HOST``), which no
  job's policy admits, until the connection fails, in a thread beside the
  sidecar's imports; a pod still unfenced after that many seconds is reported
  failed (SidecarFailed, the harness never ran) instead of run unfenced;
- runs ``openforge sidecar SIDECAR-ARGS`` in its main thread, with
  ``--listen-fd`` (that socket), ``--ready-file`` (the sidecar creates
  ``sidecar-serving`` once it serves) and ``--finish-on-stop`` (a sidecar
  stopped before the rollout was reported, e.g. the pod deleted or past its
  deadline, records it as failed, then flushes its spool to the collector);
  if the sidecar fails, the process exits with its code, the kubelet restarts
  the container, and the sidecar resumes from its spool;
- a sidecar that died after ``sidecar-ready`` but before it served may have
  refused the harness's first calls unrecorded: a restarted agent that finds
  ``sidecar-ready`` without ``sidecar-serving`` marks the attempt
  (``sidecar-start-failed``), and its verdict is SidecarFailed whatever the
  harness did;
- in a second thread, when the harness container's entrypoint
  (``openforge_operator.entrypoint``) writes ``harness-done`` into the run
  directory, turns the harness's exit code and the grader's output into a
  reward and a verdict by the rule ``openforge run`` follows too (``openforge.api.verdict``),
  reports the rollout to the sidecar (``POST /openforge/v1/rollout/finish``, which records it and
  waits for the collector's acknowledgement) and writes the verdict to
  ``finished``, which the entrypoint copies into its termination message for
  the operator.

Every step is keyed on files in the run directory, so a restarted agent
neither loses nor repeats a report.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from openforge import cli, endpoints, podrun
from openforge.api import rollouts, verdict

CA_FILE = "mitmproxy-ca.pem"
BACKLOG = 128
"""Connections the sidecar's socket queues before the sidecar serves them."""
STOPPED_EXIT_CODE = -1
"""The exit code reported for a harness that never finished (the pod was stopped)."""
FENCE_CONNECT_TIMEOUT = 1.0
"""Seconds one try of the fence waits for the API server's answer: a policy that drops
(not rejects) the packets makes every fenced try take this long."""
GRADER_TIMED_OUT = 124
"""``timeout``'s exit code for a command that ran past it."""
Verdict = verdict.Verdict


def judge(run_dir: Path, *, reward_from: str, failing_exit_codes: frozenset[int]) -> Verdict:
    """The verdict of a finished harness, from the entrypoint's files (``verdict.judge``,
    the rule ``openforge run`` follows too).

    ``reward_from`` is the grader's ``rewardFrom``, or ``none`` without a grader. The
    grader ran under ``timeout`` (exit code 124: it ran past its timeout); a shell's 126
    or 127 with nothing printed means its command could not be run.
    """
    harness_exit = _read_int(run_dir / podrun.HARNESS_EXIT_CODE)
    exit_code = STOPPED_EXIT_CODE if harness_exit is None else harness_exit
    graded: verdict.Graded | None = None
    if reward_from != "none":
        stdout = _read_text(run_dir / podrun.GRADER_STDOUT)
        grader_exit = _read_int(run_dir / podrun.GRADER_EXIT_CODE)
        if grader_exit is None:
            graded = verdict.Graded(stdout=stdout, error="its exit code was never recorded")
        elif grader_exit in (126, 127) and not stdout.strip():
            graded = verdict.Graded(
                error=f"exit {grader_exit}: its command was not found or cannot be run"
            )
        else:
            graded = verdict.Graded(
                stdout=stdout, exit_code=grader_exit, timed_out=grader_exit == GRADER_TIMED_OUT
            )
    return verdict.judge(
        exit_code=exit_code, grader=graded,
        reward_from=None if reward_from == "none" else reward_from,
        failing_exit_codes=failing_exit_codes,
        sidecar_start_failed=(run_dir / podrun.SIDECAR_START_FAILED).exists(),
    )  # fmt: skip


def post_finish(
    listen: str, verdict: Verdict, *, wait_seconds: float, deadline: float, token_file: str
) -> dict[str, Any]:
    """Report the rollout to the sidecar with its control token, retrying until
    ``deadline`` while it is not up (nor its token made)."""
    import urllib.request  # here, not at the top: it would be 30 ms before the agent binds the port

    from openforge import control

    body = json.dumps(verdict.report(wait_seconds).body()).encode()
    url = f"http://{listen}{endpoints.ROLLOUT_FINISH}"
    while True:
        try:
            token = control.headers(control.read(token_file)) if token_file else {}
            headers = {"content-type": "application/json", **token}
            request = urllib.request.Request(url, data=body, headers=headers)
            with urllib.request.urlopen(request, timeout=wait_seconds + 10) as response:
                result: dict[str, Any] = json.load(response)
                return result
        except (OSError, ValueError) as error:
            if time.monotonic() >= deadline:
                return {"acknowledged": False, "error": str(error)}
            time.sleep(0.5)


def termination_message(judged: Verdict, result: dict[str, Any]) -> podrun.Termination:
    """What the operator reads back from the harness container's termination message:
    the verdict settled by the sidecar's answer (``verdict.settle``)."""
    settled = verdict.settle(judged, result)
    final = settled.verdict
    return podrun.Termination(
        status=final.status,
        exit_code=final.exit_code,
        reason=final.reason,
        reward=final.reward,
        acknowledged=settled.acknowledged,
        calls=settled.calls,
        message=final.message,
    )


class Agent:
    """The sidecar, in this process, and the thread that reports the rollout when the harness is
    done."""

    def __init__(self, options: argparse.Namespace, sidecar_args: list[str]) -> None:
        self.options = options
        self.run_dir = Path(options.run_dir)
        self.sidecar_args = sidecar_args
        self.stop_asked: int | None = None

    def run(self) -> int:
        # the collector off while the sidecar imports (a tenth of a second of every
        # pod's start); the sidecar turns it on once it is built
        gc.disable()
        # until the sidecar's own handlers are in, a stop is kept and passed on to them
        signal.signal(signal.SIGTERM, self._keep_stop)
        signal.signal(signal.SIGINT, self._keep_stop)
        restarted = self._prepare()
        fd = listen(self.options.listen).detach()  # the sidecar's socket from now on
        if self.options.fence_wait > 0 and not restarted:
            threading.Thread(
                target=self._ready_when_fenced, name="openforge-podagent-fence", daemon=True
            ).start()
        else:
            (self.run_dir / podrun.SIDECAR_READY).touch()
        threading.Thread(
            target=self._pass_on_stop, name="openforge-podagent-stop", daemon=True
        ).start()
        threading.Thread(target=self._watch, name="openforge-podagent", daemon=True).start()
        # SIGTERM and SIGINT stop the sidecar (its own handlers): it records a
        # rollout nobody reported as failed, flushes its spool and returns
        return cli.main([
            "sidecar", *self.sidecar_args,
            "--listen-fd", str(fd),
            "--ready-file", str(self.run_dir / podrun.SIDECAR_SERVING),
            "--finish-on-stop",
        ])  # fmt: skip

    def _prepare(self) -> bool:
        """Ready the run directory and the confdir; True when an earlier start of this
        container already let the harness start (``sidecar-ready``)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ready, serving = self.run_dir / podrun.SIDECAR_READY, self.run_dir / podrun.SIDECAR_SERVING
        restarted = ready.exists()
        if restarted and not serving.exists():
            (self.run_dir / podrun.SIDECAR_START_FAILED).touch()
        serving.unlink(missing_ok=True)  # an earlier start's: this one creates its own
        if self.options.ca_file:
            confdir = Path(self.options.confdir)
            confdir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.options.ca_file, confdir / CA_FILE)
            os.chmod(confdir / CA_FILE, 0o600)
        return restarted

    def _ready_when_fenced(self) -> None:
        """Let the harness start once the pod is fenced; else report the attempt failed."""
        target, started = self.options.fence_target, time.monotonic()
        if await_fence(target, wait=self.options.fence_wait, poll=self.options.fence_poll):
            (self.run_dir / podrun.SIDECAR_READY).touch()
            print(
                f"podagent: fenced after {time.monotonic() - started:.2f} s ({target} "
                "unreachable); the harness may start",
                file=sys.stderr,
                flush=True,
            )
            return
        print(
            f"podagent: still not fenced after {self.options.fence_wait:g} s ({target} reachable); "
            "failing the attempt",
            file=sys.stderr,
            flush=True,
        )
        message = (
            f"the pod could still reach the API server ({target}) after "
            f"{self.options.fence_wait:g} s: the cluster did not enforce the job's NetworkPolicy "
            "(its network plugin has no NetworkPolicy support, or is that far behind), so the "
            "harness never ran; an operator run with --fence-wait-seconds 0 starts harnesses "
            "without waiting for the fence"
        )
        self._report(
            Verdict(
                podrun.SIDECAR_NOT_READY_EXIT_CODE, None, "", "failed", "SidecarFailed", message
            ),
            wait=self.options.finish_wait,
        )

    def _keep_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_asked = signum

    def _pass_on_stop(self) -> None:
        # The sidecar's handlers replace ours before it serves: a stop asked
        # until then was kept (and any later one is the sidecar's own).
        serving = self.run_dir / podrun.SIDECAR_SERVING
        while not serving.exists():
            time.sleep(self.options.poll)
        if self.stop_asked is not None:
            os.kill(os.getpid(), self.stop_asked)

    def _watch(self) -> None:
        done = self.run_dir / podrun.HARNESS_DONE
        while not done.exists():
            time.sleep(self.options.poll)
        if not self._reported():
            self._report(self._judge(), wait=self.options.finish_wait)

    def _judge(self) -> Verdict:
        failing = frozenset(rollouts.parse_indexes(self.options.failing_exit_codes))
        return judge(self.run_dir, reward_from=self.options.reward_from, failing_exit_codes=failing)

    def _reported(self) -> bool:
        return (self.run_dir / podrun.FINISHED).exists()

    def _report(self, verdict: Verdict, *, wait: float) -> None:
        deadline = time.monotonic() + wait + 10
        result = post_finish(
            self.options.listen,
            verdict,
            wait_seconds=wait,
            deadline=deadline,
            token_file=self.options.control_token_file,
        )
        _create(self.run_dir / podrun.FINISHED, termination_message(verdict, result).dumps())


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` (an IPv6 host in brackets) as (host, port); ValueError when it is not one."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not host:port: {address!r}")
    return host.strip("[]"), int(port)


def fenced(target: str, *, timeout: float = FENCE_CONNECT_TIMEOUT) -> bool:
    """Whether a TCP connection to ``host:port`` fails (refused, dropped, unreachable)."""
    try:
        with socket.create_connection(host_port(target), timeout=timeout):
            return False
    except OSError:
        return True


def await_fence(target: str, *, wait: float, poll: float) -> bool:
    """Whether ``target`` became unreachable within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while not fenced(target):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def default_fence_target() -> str:
    """The API server as a pod sees it (the kubelet sets these in every container)."""
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST", ""),
        os.environ.get("KUBERNETES_SERVICE_PORT", ""),
    )
    if not host or not port:
        return ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(address: str) -> socket.socket:
    """A TCP socket listening on ``host:port`` (the sidecar's ``--listen``)."""
    host, port = host_port(address)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _create(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m openforge_sidecar.podagent",
        description=(
            "Run the capture sidecar in a rollout pod "
            "and report the rollout when the harness is done."
        ),
    )
    parser.add_argument(
        "--run-dir", default=podrun.RUN_DIR, help="directory shared with the harness container"
    )
    parser.add_argument("--listen", required=True, help="the sidecar's host:port (its --listen)")
    parser.add_argument(
        "--ca-file", default="", help="the job's CA (key and certificate) to copy into --confdir"
    )
    parser.add_argument("--confdir", default="", help="the sidecar's mitmproxy confdir")
    parser.add_argument(
        "--reward-from", choices=("stdout-json", "exit-code", "none"), default="none",
        help="the grader's rewardFrom; none: no grader (exit 0 is reward 1.0)",
    )  # fmt: skip
    parser.add_argument(
        "--failing-exit-codes", default="",
        help="harness exit codes that fail the rollout, compact ('1-255'); others are graded data",
    )  # fmt: skip
    parser.add_argument(
        "--finish-wait", type=float, default=60.0, help="seconds to wait for the collector's ack"
    )
    parser.add_argument(
        "--poll", type=float, default=0.05, help="seconds between looks at the run directory"
    )
    parser.add_argument(
        "--control-token-file", default="",
        help="the sidecar's --control-token-file (in its own volume):"
        " the token the rollout is reported with",
    )  # fmt: skip
    parser.add_argument(
        "--fence-wait", type=float, default=0.0,
        help="seconds to wait for the job's NetworkPolicy to fence the pod before the harness"
        " starts (0: do not wait)",
    )  # fmt: skip
    parser.add_argument(
        "--fence-target", default="",
        help="host:port the fence makes unreachable"
        " (default: the API server, $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)",
    )  # fmt: skip
    parser.add_argument(
        "--fence-poll", type=float, default=0.2, help="seconds between tries of the fence"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        raise SystemExit("podagent: give the sidecar's arguments after '--'")
    split = args.index("--")
    options = build_parser().parse_args(args[:split])
    if options.ca_file and not options.confdir:
        raise SystemExit("podagent: --ca-file needs --confdir")
    try:
        host_port(options.listen)
    except ValueError:
        raise SystemExit(f"podagent: --listen must be host:port, not {options.listen!r}") from None
    if options.fence_wait > 0:
        options.fence_target = options.fence_target or default_fence_target()
        try:
            host_port(options.fence_target)
        except ValueError:
            raise SystemExit(
                f"podagent: --fence-target must be host:port, not {options.fence_target!r}"
                " (without it, $KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT must be set)"
            ) from None
    try:
        rollouts.parse_indexes(options.failing_exit_codes)
    except ValueError as error:
        raise SystemExit(f"podagent: --failing-exit-codes: {error}") from None
    return Agent(options, args[split + 1 :]).run()


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _read_int(path: Path) -> int | None:
    text = _read_text(path).strip()
    try:
        return int(text)
    except ValueError:
        return None


if __name__ == "__main__":
    sys.exit(main())
