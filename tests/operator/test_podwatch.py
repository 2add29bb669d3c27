"""The pod cache behind the one pod watch: summaries by job, gone pods, wake-ups."""

from __future__ import annotations

import asyncio

from openforge_operator import attempts, podwatch
from operator_fixtures import UID, pod, terminated


def test_events_update_summaries_and_wake_the_job() -> None:
    async def scenario() -> None:
        cache = podwatch.PodCache()
        wakeup = cache.wakeup(UID)
        cache.apply("ADDED", pod(0, 0))
        assert wakeup.is_set()
        wakeup.clear()
        cache.apply(
            "MODIFIED", pod(0, 0, phase="Succeeded", status={"containerStatuses": [terminated(0)]})
        )
        assert wakeup.is_set()
        [summary] = cache.pods(UID)
        assert summary.phase == "Succeeded" and summary.exit_code == 0 and not summary.gone
        cache.apply("DELETED", pod(0, 0, phase="Succeeded"))
        assert cache.pods(UID)[0].gone, "a deleted pod is remembered as gone"

    asyncio.run(scenario())


def test_a_pod_seen_deleted_while_its_harness_ran_stays_so() -> None:
    cache = podwatch.PodCache()
    cache.apply("ADDED", pod(0, 0, phase="Running"))
    asked = {"deletionTimestamp": "2026-01-01T10:00:30Z", "deletionGracePeriodSeconds": 30}
    cache.apply("MODIFIED", pod(0, 0, phase="Running", **asked))
    assert cache.pods(UID)[0].deleted_unfinished
    # the kubelet stopped the harness (SIGKILL after the grace), then deleted the pod with
    # grace 0: its last state's deletionTimestamp is after the harness's end
    harness = terminated(137)
    harness["state"]["terminated"]["finishedAt"] = "2026-01-01T10:00:30Z"
    last = {"deletionTimestamp": "2026-01-01T10:00:32Z", "deletionGracePeriodSeconds": 0}
    cache.apply(
        "DELETED", pod(0, 0, phase="Failed", status={"containerStatuses": [harness]}, **last)
    )
    [summary] = cache.pods(UID)
    assert summary.gone and summary.deleted_unfinished
    assert attempts.judge(summary, failing_exit_codes=frozenset()).state == "failed"


def test_pods_without_rollout_labels_are_ignored() -> None:
    cache = podwatch.PodCache()
    stray = pod(0, 0)
    del stray["metadata"]["labels"]["openforge.dev/job-uid"]
    cache.apply("ADDED", stray)
    assert cache.pods(UID) == []


def test_a_relist_marks_pods_that_disappeared_as_gone() -> None:
    async def scenario() -> None:
        cache = podwatch.PodCache()
        cache.relisted("ns", [pod(0, 0), pod(1, 0)])
        other = pod(2, 0)
        other["metadata"]["namespace"] = "elsewhere"
        cache.apply("ADDED", other)
        wakeup = cache.wakeup(UID)
        cache.relisted("ns", [pod(1, 0, phase="Running")])
        by_name = {s.name: s for s in cache.pods(UID)}
        assert (
            by_name["job-0-0"].gone
            and not by_name["job-1-0"].gone
            and by_name["job-1-0"].phase == "Running"
        )
        assert not by_name["job-2-0"].gone, "another namespace's list says nothing about it"
        assert wakeup.is_set()

    asyncio.run(scenario())


def test_forget_drops_a_job() -> None:
    cache = podwatch.PodCache()
    cache.apply("ADDED", pod(0, 0))
    cache.forget(UID)
    assert cache.pods(UID) == []


def test_synced_waits_for_every_namespace() -> None:
    async def scenario() -> None:
        cache = podwatch.PodCache()
        waiter = asyncio.create_task(cache.wait_synced(["a", "b"]))
        cache.synced("a").set()
        await asyncio.sleep(0)
        assert not waiter.done()
        cache.synced("b").set()
        await asyncio.wait_for(waiter, 1)

    asyncio.run(scenario())


def test_a_gone_pod_holds_nothing_and_every_summary_reaches_the_listener() -> None:
    async def scenario() -> None:
        cache = podwatch.PodCache()
        seen: list[tuple[str, bool, bool]] = []
        cache.listener = lambda s: seen.append((s.name, s.held, s.gone))
        held = {"finalizers": ["openforge.dev/attempt-record"]}
        cache.apply("ADDED", pod(0, 0, **held))
        cache.apply("ADDED", pod(1, 0, **held))
        cache.apply("DELETED", pod(0, 0, phase="Failed", **held))
        cache.relisted("ns", [])
        by_name = {s.name: s for s in cache.pods(UID)}
        assert not by_name["job-0-0"].held and not by_name["job-1-0"].held, (
            "nothing to let go of a pod that is gone"
        )
        assert seen == [
            ("job-0-0", True, False),
            ("job-1-0", True, False),
            ("job-0-0", False, True),
        ]

    asyncio.run(scenario())
