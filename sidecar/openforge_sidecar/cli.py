"""``openforge sidecar``: run mitmproxy with the capture addon.

The sidecar is mitmproxy with :mod:`openforge_sidecar.capture` loaded, run
with only the mitmproxy addons it uses (:mod:`openforge_sidecar.master`);
this command turns friendly flags into mitmproxy options.
Three network modes:

* ``reverse`` (default): the harness's base URL points at the sidecar, which
  forwards non-LLM paths to ``--upstream`` (default: the engine).
* ``regular``: the harness uses the sidecar as ``HTTP(S)_PROXY`` and trusts
  its CA (``--confdir``/mitmproxy-ca-cert.pem); LLM calls to any host are
  captured, other traffic passes through.
* ``transparent``: traffic redirected by iptables (set up by the operator's
  init container) is intercepted; as ``regular`` otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openforge import cli as front_door
from openforge import endpoints, trajectory

from openforge_sidecar import capture, guard, master, upstream


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openforge sidecar", description=front_door.description(__doc__)
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:8090", help="host:port to listen on (default %(default)s)"
    )
    parser.add_argument(
        "--mode",
        choices=("reverse", "regular", "transparent"),
        default="reverse",
        help="network mode (default %(default)s)",
    )
    parser.add_argument(
        "--capture",
        choices=capture.MODES,
        default="tokens",
        help="tokens: token-in/token-out from the engine; passthrough: forward unchanged",
    )
    parser.add_argument(
        "--engine", default="", help="engine base URL (tokens mode), e.g. http://127.0.0.1:8000"
    )
    parser.add_argument("--engine-model", default="", help="model name to send to the engine")
    parser.add_argument(
        "--tokenizer", default="", help="tokenizer directory or URL (default: the engine)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=0,
        help="policy context length (default: the engine's, from its /v1/models; else 32768)",
    )
    parser.add_argument(
        "--upstream",
        default="",
        help="reverse-mode upstream for passthrough and non-LLM paths (default: the engine)",
    )
    parser.add_argument(
        "--spool", required=True, type=Path, help="spool directory (durable, fsync'd)"
    )
    parser.add_argument("--collector", default="", help="collector host:port; empty: spool only")
    parser.add_argument(
        "--collector-token-file", default="", help="file holding the collector bearer token"
    )
    parser.add_argument(
        "--flush-timeout", type=int, default=30, help="seconds to wait for acks on shutdown"
    )
    parser.add_argument("--job", default="local")
    parser.add_argument("--rollout-id", default="")
    parser.add_argument("--task-id", default="")
    parser.add_argument("--sample-index", type=int, default=0)
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--harness", default="")
    parser.add_argument(
        "--api",
        default="",
        choices=["", *capture.API_NAMES],
        help="the wire API the harness declares (its HarnessEnv's spec.api): an LLM call in"
        " another is refused, naming both; empty: any",
    )
    parser.add_argument("--policy-version", type=int, default=0)
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE",
        help="a label of the rollout's started record (repeatable),"
        f" e.g. {trajectory.BATCH_LABEL}=3",
    )  # fmt: skip
    parser.add_argument(
        "--confdir", default="", help="mitmproxy confdir holding the CA (regular/transparent modes)"
    )
    parser.add_argument(
        "--listen-fd",
        type=int,
        default=-1,
        help="serve this inherited socket, already listening on --listen, instead of binding one",
    )
    parser.add_argument(
        "--ready-file", default="", help="file to create once the sidecar serves (its spool open)"
    )
    parser.add_argument(
        "--finish-on-stop",
        action="store_true",
        help="on SIGTERM, record a rollout nobody finished as failed (a stopped pod)",
    )
    parser.add_argument(
        "--control-token-file", default="",
        help=f"POST {endpoints.ROLLOUT_FINISH} needs 'Authorization: Bearer TOKEN',"
        " TOKEN this file's (made, random, 0600, when absent):"
        " the harness, which reaches the same port, cannot report its own rollout",
    )  # fmt: skip
    parser.add_argument(
        "--max-connections",
        type=int,
        default=guard.DEFAULT_MAX_CONNECTIONS,
        help="client connections open at once; one more is closed as it connects (0: no limit)",
    )
    parser.add_argument(
        "--header-timeout",
        type=int,
        default=guard.DEFAULT_HEADER_TIMEOUT,
        help="seconds a new connection has to send its first request head (0: no limit)",
    )
    for name, default, what in (
        ("connect", upstream.DEFAULT_CONNECT_TIMEOUT, "to connect to the engine"),
        ("first-byte", upstream.DEFAULT_FIRST_BYTE_TIMEOUT, "of engine silence before its answer"),
        ("idle", upstream.DEFAULT_IDLE_TIMEOUT, "of engine silence within its answer"),
    ):
        parser.add_argument(
            f"--engine-{name}-timeout",
            type=int,
            default=default,
            help=f"seconds {what}; past them the call is the API's 504 (0: no limit)",
        )
    parser.add_argument("--verbose", action="store_true", help="log every flow")
    return parser


def labels(pairs: Sequence[str]) -> dict[str, str]:
    """``--label KEY=VALUE`` flags as a mapping; SystemExit naming a malformed one."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"openforge sidecar: --label must be KEY=VALUE, not {pair!r}")
        out[key] = value
    return out


def settings(ns: argparse.Namespace) -> list[str]:
    """The mitmproxy options, as ``name=value``, for parsed ``openforge sidecar`` flags (pure)."""
    host, _, port = ns.listen.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"openforge sidecar: --listen must be host:port, not {ns.listen!r}")
    if ns.capture == "tokens" and not ns.engine:
        raise SystemExit("openforge sidecar: --engine is required with --capture tokens")
    upstream = ns.upstream or ns.engine
    if ns.mode == "reverse":
        if not upstream:
            raise SystemExit(
                "openforge sidecar: --upstream is required in reverse passthrough mode"
            )
        mode = f"reverse:{upstream}"
    else:
        mode = ns.mode
    out = [
        f"mode={mode}",
        f"listen_host={host}",
        f"listen_port={port}",
        f"openforge_mode={ns.capture}",
        f"openforge_engine={ns.engine}",
        f"openforge_engine_model={ns.engine_model}",
        f"openforge_tokenizer={ns.tokenizer}",
        f"openforge_max_model_len={ns.max_model_len}",
        f"openforge_spool={ns.spool}",
        f"openforge_collector={ns.collector}",
        f"openforge_collector_token_file={ns.collector_token_file}",
        f"openforge_flush_timeout={ns.flush_timeout}",
        f"openforge_job={ns.job}",
        f"openforge_rollout_id={ns.rollout_id}",
        f"openforge_task_id={ns.task_id}",
        f"openforge_sample_index={ns.sample_index}",
        f"openforge_attempt={ns.attempt}",
        f"openforge_harness={ns.harness}",
        f"openforge_api={ns.api}",
        f"openforge_max_connections={ns.max_connections}",
        f"openforge_header_timeout={ns.header_timeout}",
        f"openforge_engine_connect_timeout={ns.engine_connect_timeout}",
        f"openforge_engine_first_byte_timeout={ns.engine_first_byte_timeout}",
        f"openforge_engine_idle_timeout={ns.engine_idle_timeout}",
        f"openforge_policy_version={ns.policy_version}",
        f"openforge_labels={json.dumps(labels(ns.label))}",
        f"openforge_ready_file={ns.ready_file}",
        f"openforge_finish_on_stop={'true' if ns.finish_on_stop else 'false'}",
        f"openforge_control_token_file={ns.control_token_file}",
        # Connect upstream only when a request is forwarded: an eager connection
        # saves a call its connect but holds a socket to the engine per sidecar
        # whether it calls or not.
        "connection_strategy=lazy",
    ]
    if ns.confdir:
        out.append(f"confdir={ns.confdir}")
    if not ns.verbose:
        out.append("termlog_verbosity=warn")
    return out


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))


def run(ns: argparse.Namespace, *, extra_addons: Sequence[Any] = ()) -> int:
    """Run the sidecar for parsed flags; ``extra_addons`` go next to the capture addon."""
    options = settings(ns)
    ns.spool.mkdir(parents=True, exist_ok=True)
    # The policy tokenizer encodes one text at a time: no thread pool for it.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    listening = inherited(ns.listen_fd, ns.listen)
    try:
        master.run(options, verbose=ns.verbose, extra_addons=extra_addons, listening=listening)
    except master.StartupError as exc:
        raise SystemExit(f"openforge sidecar: {exc}") from exc
    return 0


def inherited(fd: int, listen: str) -> socket.socket | None:
    """The listening TCP socket ``--listen-fd`` names (checked against ``--listen``),
    or None for -1."""
    if fd < 0:
        return None
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise SystemExit(f"openforge sidecar: --listen-fd {fd}: {exc.strerror}") from None
    host, _, port = listen.rpartition(":")
    bound = sock.getsockname()[:2]
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.type != socket.SOCK_STREAM or not listening or bound != (host.strip("[]"), int(port)):
        sock.detach()
        raise SystemExit(
            f"openforge sidecar: --listen-fd {fd} is not a TCP socket listening on --listen "
            f"{listen} (it is bound to {bound})"
        )
    return sock


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
