"""A call that comes in while the capture addon is still starting up.

The proxy accepts connections before the addon's ``running`` hook has
loaded the policy tokenizer and asked the engine for its model name. A call
in that window must wait for the load to finish. (It once found the
tokenizer but no token history yet: the request hook failed, the request
went to the engine unrewritten and the engine answered 404.)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import local_http
import pytest
import tiny_policy
from mitmproxy.test import taddons
from openforge_sidecar import capture
from openforge_sidecar.recording import spool

TINY = tiny_policy.DIR


class _SlowModels:
    """``/v1/models`` answered only once the test releases it."""

    asked = threading.Event()
    release = threading.Event()

    @classmethod
    def wait(cls) -> None:
        cls.asked.set()
        cls.release.wait(30)


@pytest.fixture
def engine() -> Iterator[str]:
    _SlowModels.asked.clear()
    _SlowModels.release.clear()
    with local_http.serving(local_http.models("policy-x", before=_SlowModels.wait)) as url:
        try:
            yield url
        finally:
            _SlowModels.release.set()  # a request still waiting ends before the server


def test_a_call_during_startup_waits_for_the_token_history(engine: str, tmp_path: Path) -> None:
    async def main() -> None:
        addon = capture.Capture()
        with taddons.context(addon) as tctx:
            tctx.configure(
                addon,
                openforge_engine=engine,
                openforge_tokenizer=str(TINY),
                openforge_spool=str(tmp_path / "spool"),
            )
            running = asyncio.create_task(addon.running())
            # The tokenizer is loaded; the engine is being asked for its model.
            assert await asyncio.to_thread(_SlowModels.asked.wait, 30)
            asyncio.get_running_loop().call_later(0.3, _SlowModels.release.set)
            tokenizer = await addon._policy_tokenizer()  # what a call does first
            assert addon._history is not None, "a call went on without the token history"
            assert addon._engine_model == "policy-x"
            assert tokenizer.eos_token == "<|im_end|>"
            await running
            await addon.done()

    asyncio.run(main())


@pytest.mark.parametrize("finish_on_stop", [True, False])
def test_the_ready_file_is_created_once_running_and_a_stop_finishes_an_unfinished_rollout(
    tmp_path: Path, finish_on_stop: bool
) -> None:
    """What a rollout pod's agent relies on: ``openforge_ready_file`` appears once the
    addon runs (the servers already listen then), and with ``openforge_finish_on_stop`` a
    shutdown before anyone finished the rollout records it as failed, without a reward."""
    ready = tmp_path / "run" / "sidecar-ready"

    async def main() -> None:
        addon = capture.Capture()
        with taddons.context(addon) as tctx:
            tctx.configure(
                addon,
                openforge_mode="passthrough",
                openforge_spool=str(tmp_path / "spool"),
                openforge_rollout_id="r-0-0",
                openforge_ready_file=str(ready),
                openforge_finish_on_stop=finish_on_stop,
            )
            assert not ready.exists()
            await addon.running()
            assert ready.exists() and ready.read_bytes() == b""
            await addon.done()

    asyncio.run(main())
    kinds = [
        record.WhichOneof("body") for record in spool.Spool(tmp_path / "spool").records_after(0)
    ]
    if not finish_on_stop:
        assert kinds == ["started"]
        return
    assert kinds == ["started", "finished"]
    finished = list(spool.Spool(tmp_path / "spool").records_after(0))[-1].finished
    assert (finished.status, finished.exit_code, finished.has_reward) == (
        "stopped",
        capture.STOPPED_EXIT_CODE,
        False,
    )
