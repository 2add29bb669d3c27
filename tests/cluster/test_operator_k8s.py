"""``openforge_operator.k8s``, the operator's one API client, against the real API server:
idempotent creates, absent objects as None/False, uid preconditions, paging, watching."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import kube_cluster
import pytest
from openforge_operator import k8s

pytestmark = pytest.mark.cluster


def run(kube: kube_cluster.Kube, scenario: Callable[[k8s.Api], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        api = await k8s.Api.connect(str(kube.kubeconfig))
        try:
            return await scenario(api)
        finally:
            await api.close()

    return asyncio.run(main())


def config_map(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"k": "v"},
    }


def test_create_is_idempotent_and_absent_objects_are_none(
    kube: kube_cluster.Kube, namespace: str
) -> None:
    path = k8s.namespaced(namespace, "configmaps")

    async def scenario(api: k8s.Api) -> None:
        assert await api.create(path, config_map("a")) is True
        assert await api.create(path, config_map("a")) is False, "409 AlreadyExists is success"
        assert (await api.get(f"{path}/a"))["data"] == {"k": "v"}  # type: ignore[index]
        assert await api.get(f"{path}/missing") is None
        assert await api.merge_patch(f"{path}/missing", {"data": {"k": "w"}}) is None
        patched = await api.merge_patch(f"{path}/a", {"data": {"k": "w"}})
        assert patched is not None and patched["data"] == {"k": "w"}
        assert await api.delete(f"{path}/a", uid="00000000-0000-0000-0000-000000000000") is False, (
            "uid precondition"
        )
        assert await api.get(f"{path}/a") is not None
        assert await api.delete(f"{path}/a", uid=patched["metadata"]["uid"]) is True
        assert await api.delete(f"{path}/a") is False
        with pytest.raises(k8s.ApiError) as error:
            await api.create(
                path, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Not_Valid"}}
            )
        assert (
            error.value.status == 422
            and error.value.reason == "Invalid"
            and "Not_Valid" in error.value.message
        )

    run(kube, scenario)


def test_list_pages_and_watch_from_its_version(kube: kube_cluster.Kube, namespace: str) -> None:
    path = k8s.namespaced(namespace, "configmaps")

    async def scenario(api: k8s.Api) -> None:
        for i in range(5):
            await api.create(path, config_map(f"m{i}", mine="yes"))
        await api.create(path, config_map("other"))
        items, version = await api.list(path, label_selector="mine=yes", page=2)
        assert sorted(i["metadata"]["name"] for i in items) == [f"m{i}" for i in range(5)]
        seen: list[tuple[str, str]] = []

        async def watch() -> None:
            async for event in api.watch(path, label_selector="mine=yes", resource_version=version):
                if event["type"] != "BOOKMARK":
                    seen.append((event["type"], event["object"]["metadata"]["name"]))
                if len(seen) == 2:
                    return

        watcher = asyncio.create_task(watch())
        await api.create(path, config_map("m5", mine="yes"))
        await api.create(path, config_map("not-mine"))
        await api.delete(f"{path}/m0")
        await asyncio.wait_for(watcher, 30)
        assert seen == [("ADDED", "m5"), ("DELETED", "m0")]

    run(kube, scenario)


def test_events_are_recorded_about_an_object(kube: kube_cluster.Kube, namespace: str) -> None:
    path = k8s.namespaced(namespace, "configmaps")

    async def scenario(api: k8s.Api) -> None:
        await api.create(path, config_map("subject"))
        subject = await api.get(f"{path}/subject")
        assert subject is not None
        await api.post_event(
            subject,
            type_="Warning",
            reason="Tested",
            message="hello",
            component="openforge-operator",
        )

    run(kube, scenario)
    events = kube.get_json(
        "-n", namespace, "events", "--field-selector", "involvedObject.name=subject"
    )["items"]
    assert [(e["type"], e["reason"], e["message"], e["source"]["component"]) for e in events] == [
        ("Warning", "Tested", "hello", "openforge-operator")
    ]
