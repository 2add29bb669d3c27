"""``openforge`` with the sidecar's phases published for ``memory_phases.py``.

Run as ``python bench/phase_probe.py sidecar ...`` with ``OPENFORGE_PHASES_FILE`` set:
the functions in :data:`PHASES` are wrapped so that, while one runs, the file's first
256 bytes (a shared mapping) name it, and the open ones above it, ``/``-joined; nothing
else changes. A sampler in another process reads them beside the sidecar's RSS: a
sampler inside would not run while a C call (a parse, the tokenizer) holds the GIL.
"""

from __future__ import annotations

import functools
import inspect
import mmap
import os
import sys
from collections.abc import Callable
from typing import Any

SIZE = 256
_open: list[str] = []


def _published(label: mmap.mmap) -> Callable[..., None]:
    def publish(after: str = "") -> None:
        """The open phases; with none open, "outside, after" the ones just closed
        (``after``), however briefly they were open alone."""
        outside = f"outside, after {after}" if after else "outside"
        text = ("/".join(_open) or outside).encode()[: SIZE - 1]
        label[:SIZE] = text.ljust(SIZE, b"\0")

    return publish


def _closed(name: str, publish: Callable[..., None]) -> None:
    """``name`` has returned: published with what was open before it did."""
    before = "/".join(_open)
    _open.remove(name)
    publish(after=before)


def _wrap(owner: Any, attr: str, publish: Callable[..., None]) -> None:
    function = getattr(owner, attr)
    name = f"{owner.__name__}.{attr}"
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            _open.append(name)
            publish()
            try:
                return await function(*args, **kwargs)
            finally:
                _closed(name, publish)

        setattr(owner, attr, wrapped_async)
        return

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _open.append(name)
        publish()
        try:
            return function(*args, **kwargs)
        finally:
            _closed(name, publish)

    setattr(owner, attr, wrapped)


def PHASES() -> list[tuple[Any, str]]:
    from openforge.wire.codecs import openai_chat
    from openforge_sidecar import capture, relay
    from openforge_sidecar.policy import engine, history
    from openforge_sidecar.recording import exporter, recorder

    return [
        (openai_chat.OpenAIChatCodec, "parse_request"),
        (capture.Capture, "request"),
        (history.TokenHistory, "plan"),
        (engine, "completion_body"),
        (capture.Capture, "responseheaders"),
        (capture.Capture, "response"),
        (relay.Relay, "__call__"),
        (capture.Capture, "_close_answered"),
        (recorder.Writer, "_append"),
        (exporter.Exporter, "_unacked"),
        (exporter.Exporter, "_write"),
    ]


def main(argv: list[str]) -> int:
    path = os.environ["OPENFORGE_PHASES_FILE"]
    with open(path, "r+b") as handle:
        label = mmap.mmap(handle.fileno(), SIZE)
    publish = _published(label)
    for owner, attr in PHASES():
        _wrap(owner, attr, publish)
    publish()
    from openforge import cli

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
