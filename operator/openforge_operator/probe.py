"""The sidecar's startup probe: exit 0 once something accepts TCP on the pod's loopback
(and, given a file, once that file exists: a rollout pod's ``sidecar-ready``, which the
in-pod agent creates only once the pod is fenced).

The kubelet dials ``tcpSocket`` and ``httpGet`` probes from the node's network
namespace, where the pod's ``127.0.0.1`` is the node's own loopback, so a probe
of a port the sidecar opens on loopback only can never pass that way. Run as an
``exec`` probe inside the sidecar container instead, it connects from the pod's
own network namespace (and as the sidecar's user, which Transparent mode's
redirect lets through). Imports nothing beyond the standard library: the
kubelet runs it every second until the sidecar listens.

    python -m openforge_operator.probe PORT [FILE]
"""

from __future__ import annotations

import os
import socket
import sys

TIMEOUT_SECONDS = 1.0


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` accepts a TCP connection within a second."""
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_SECONDS):
            return True
    except OSError:
        return False


def command(port: int, ready_file: str | None = None) -> list[str]:
    """The probe's ``exec.command`` for the sidecar listening on ``port`` (and, with
    ``ready_file``, having created it)."""
    return ["python", "-m", __name__, str(port), *([ready_file] if ready_file else [])]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or not args[0].isdigit() or not 0 < int(args[0]) < 65536:
        print("usage: python -m openforge_operator.probe PORT [FILE]", file=sys.stderr)
        return 2
    port = int(args[0])
    if not listening(port):
        print(f"nothing listens on 127.0.0.1:{port} yet", file=sys.stderr)
        return 1
    if len(args) == 2 and not os.path.exists(args[1]):
        print(f"{args[1]} does not exist yet", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
