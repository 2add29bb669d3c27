"""The sidecar's own mitmproxy master: which addons it runs, what it imports, how it fails.

Each check builds the master in a fresh interpreter, as ``openforge sidecar``
does, since the point is what that process loads. The end-to-end tests
(test_capture_e2e.py, test_capture_faults.py, ...) serve real calls through
it; the last test here checks the capture addon still runs in stock mitmdump.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from openforge_runner.processes import free_port
from openforge_sidecar import addon

PROBE = """
import asyncio, json, sys
from openforge_sidecar import master

async def main():
    try:
        built = master.build(json.loads(sys.argv[1]), verbose=sys.argv[2] == "verbose")
    except master.StartupError as exc:
        print(json.dumps({"error": str(exc)}))
        return
    print(json.dumps({
        "chain": [type(a).__name__ for a in built.addons.chain],
        "modules": sorted(sys.modules),
        "rollout_id": built.options.openforge_rollout_id,
    }))

asyncio.run(main())
"""


def probe(tmp_path: Path, *settings: str, verbose: bool = False) -> dict[str, object]:
    chosen = {"openforge_engine": "http://127.0.0.1:9", "openforge_spool": str(tmp_path / "spool")}
    chosen.update(s.split("=", 1) for s in settings)
    argv = [json.dumps([f"{k}={v}" for k, v in chosen.items()]), "verbose" if verbose else "quiet"]
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return dict(json.loads(out.stdout.splitlines()[-1]))


def test_only_the_addons_the_sidecar_uses_in_mitmdumps_order(tmp_path: Path) -> None:
    found = probe(tmp_path, "mode=reverse:http://127.0.0.1:9")
    assert found["chain"] == [
        "TermLog",
        "Core",
        "Block",
        "DisableH2C",
        "Proxyserver",
        "Capture",
        "ConnectionGuard",
        "NextLayer",
        "TlsConfig",
        "UpdateAltSvc",
        "ErrorCheck",
    ]
    assert found["rollout_id"]  # the capture addon was configured with every option
    assert probe(tmp_path, verbose=True)["chain"][-2:] == ["Dumper", "ErrorCheck"]


def test_the_addons_it_leaves_out_are_not_even_imported(tmp_path: Path) -> None:
    modules = set(probe(tmp_path)["modules"])  # type: ignore[arg-type]
    assert "mitmproxy.addons.proxyserver" in modules
    for unused in ("mitmproxy.addons.onboarding", "mitmproxy.addons.proxyauth", "flask", "ldap3"):
        assert unused not in modules, unused


def test_the_options_given_reach_mitmproxys_addons_before_serving(tmp_path: Path) -> None:
    """As in mitmdump: the CA is in the confdir before the proxy listens."""
    probe(tmp_path, "mode=regular", f"confdir={tmp_path / 'ca'}")
    assert (tmp_path / "ca" / "mitmproxy-ca-cert.pem").exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["openforge_mode=sideways"], "openforge_mode must be one of"),
        (["openforge_spool="], "openforge_spool is required"),
        (["no_such_option=1"], "unknown mitmproxy options: no_such_option"),
        (["mode=sideways"], "Invalid proxy mode specification: sideways"),
    ],
)
def test_a_bad_option_is_a_startup_error_naming_it(
    tmp_path: Path, settings: list[str], message: str
) -> None:
    assert message in str(probe(tmp_path, *settings)["error"])


def test_the_capture_addon_still_runs_in_stock_mitmdump(procs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = procs.engine()
    port = free_port()
    mitmdump = Path(sys.executable).with_name("mitmdump")
    argv = [
        str(mitmdump), "--mode", f"reverse:{engine.url}", "--listen-host", "127.0.0.1",
        "--listen-port", str(port), "-s", addon.__file__,
        "--set", f"openforge_engine={engine.url}", "--set", f"openforge_spool={tmp_path / 'spool'}",
    ]  # fmt: skip
    with (tmp_path / "mitmdump.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, process)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        url = f"http://127.0.0.1:{port}"
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60, trust_env=False)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["role"] == "assistant"
        stats = httpx.get(f"{url}/openforge/v1/stats", trust_env=False).json()
        assert stats["counters"]["spooled_calls"] == 1
    finally:
        process.terminate()
        process.wait(timeout=30)


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"mitmdump exited with {process.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"mitmdump is not listening on {port}")


# --- the hook table: the same dispatch as mitmproxy's addon manager ---------------------------


class _Recorder:
    """An addon recording the hooks it gets; ``fail``/``halt`` on its request hook."""

    def __init__(
        self, name: str, calls: list[str], *, fail: bool = False, halt: bool = False
    ) -> None:
        self.name = name
        self._calls = calls
        self._fail = fail
        self._halt = halt
        self.addons: list[object] = []

    def request(self, flow: object) -> None:
        self._calls.append(f"{self.name}.request")
        if self._fail:
            raise ValueError("addon failure")
        if self._halt:
            from mitmproxy import exceptions

            raise exceptions.AddonHalt()


class _AsyncUpdates:
    def __init__(self, calls: list[str]) -> None:
        self.name = "updates"
        self._calls = calls

    async def update(self, flows: list[object]) -> None:
        self._calls.append(f"updates.update({len(flows)})")


def _dispatch(
    table: bool,
    build: Callable[[list[str]], list[object]],
    later: Callable[[list[str]], list[object]],
) -> list[str]:
    """Add ``build``'s addons, send a flow's request event, add ``later``'s, send it again."""
    from mitmproxy import master, options
    from mitmproxy.proxy.layers.http import HttpRequestHook
    from mitmproxy.test import tflow
    from openforge_sidecar import master as lean

    calls: list[str] = []

    async def scenario() -> None:
        built = master.Master(options.Options())
        try:
            if table:
                built.addons.__class__ = lean.HookTable
            built.addons.add(*build(calls))
            flow = tflow.tflow()
            await built.addons.handle_lifecycle(HttpRequestHook(flow))
            built.addons.add(*later(calls))
            await built.addons.handle_lifecycle(HttpRequestHook(flow))
            calls.append("end")
        finally:
            built._legacy_log_events.uninstall()  # its log handler outlives this event loop

    asyncio.run(scenario())
    return calls


def _addons(calls: list[str]) -> list[object]:
    parent = _Recorder("parent", calls)
    parent.addons = [_Recorder("child", calls, fail=True), _Recorder("grandchild-sibling", calls)]
    return [
        _Recorder("first", calls),
        parent,
        _Recorder("failing", calls, fail=True),
        _Recorder("last", calls),
    ]


def _more(calls: list[str]) -> list[object]:
    return [
        _AsyncUpdates(calls),
        _Recorder("halting", calls, halt=True),
        _Recorder("after-halt", calls),
    ]


def test_the_hook_table_dispatches_as_mitmproxys_addon_manager(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stock = _dispatch(False, _addons, _more)
    ours = _dispatch(True, _addons, _more)
    assert ours == stock
    # An error is logged, the chain goes on; a halt stops it; sub-addons and async hooks take part.
    first = ["first.request", "parent.request", "child.request", "failing.request", "last.request"]
    assert ours == [*first, *first, "halting.request", "updates.update(1)", "end"]
    assert sum("Addon error: addon failure" in r.getMessage() for r in caplog.records) == 2 * 2 * 2


def test_startup_objects_are_frozen_and_young_collections_are_rarer() -> None:
    code = (
        "import gc, json; gc.disable(); from openforge_sidecar import master; "
        "before = gc.get_freeze_count(); master.settle_garbage_collector(); "
        "print(json.dumps([before, gc.get_freeze_count(), gc.get_threshold(), gc.isenabled()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, frozen, threshold, enabled = json.loads(out.stdout)
    assert before == 0 and frozen > 1000
    assert threshold[0] == 2000
    assert enabled, (
        "the collector is on again once the sidecar is built "
        "(a pod's agent turns it off for the imports)"
    )
