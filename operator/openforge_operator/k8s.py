"""The one module that talks to the Kubernetes API server (besides kopf itself).

Requests go through ``kubernetes_asyncio``'s ApiClient for its kubeconfig and
in-cluster authentication, but as raw JSON (``_preload_content=False``): the
operator reads pods as plain dicts and boils each down to a few fields, so
the generated model classes would only cost time and memory.

Creates are idempotent: ``409 AlreadyExists`` means the object is there, which
is what a create wanted. Rollout pods have deterministic names, so an
operator that restarts and plans the same pod again gets a 409, never a
duplicate. Deletes and patches of an object that is gone return None/False
instead of raising.
"""

from __future__ import annotations

import datetime
import json
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
WATCH_TIMEOUT_SECONDS = 240
"""A watch request ends after this long (the server's choice is 30-60 min); it is
then resumed from its last resourceVersion."""


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, method: str, path: str, *, status: int, body: str) -> None:
        self.status = status
        self.reason = ""
        self.message = body[:500]
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            self.reason = str(parsed.get("reason", ""))
            self.message = str(parsed.get("message", self.message))
        super().__init__(f"{method} {path}: {status} {self.reason}: {self.message}")


class Api:
    """A connection to one API server."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._client = api_client

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, *, pool_size: int = 100) -> Api:
        """Connect with ``kubeconfig`` (or ``$KUBECONFIG``), else the in-cluster service account."""
        configuration = client.Configuration()
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(config_file=path, client_configuration=configuration)
        configuration.connection_pool_maxsize = pool_size
        return cls(client.ApiClient(configuration=configuration))

    async def close(self) -> None:
        await self._client.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = 60.0,
    ) -> Any:
        """One request; the parsed JSON answer, or ApiError."""
        response = await self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )
        try:
            text = await response.text()
        finally:
            response.release()
        if not 200 <= response.status < 300:
            raise ApiError(method, path, status=response.status, body=text)
        return json.loads(text) if text else None

    async def create(self, path: str, body: Mapping[str, Any]) -> bool:
        """Create an object; False when it already exists."""
        try:
            await self.request("POST", path, body=body)
        except ApiError as error:
            if error.status == 409 and error.reason == "AlreadyExists":
                return False
            raise
        return True

    async def get(self, path: str) -> dict[str, Any] | None:
        """An object, or None when it does not exist."""
        try:
            found: dict[str, Any] = await self.request("GET", path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None:
        """JSON-merge-patch an object; None when it is gone."""
        try:
            patched: dict[str, Any] = await self.request(
                "PATCH", path, body=patch, content_type=MERGE_PATCH
            )
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return patched

    async def remove_finalizer(self, path: str, finalizer: str) -> bool:
        """Take ``finalizer`` off a built-in object (others' finalizers stay, whatever order
        they are in); False when the object is gone."""
        patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}}
        try:
            await self.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE_PATCH)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def delete(
        self, path: str, *, uid: str | None = None, propagation: str = "Background"
    ) -> bool:
        """Delete an object (only if its uid is still ``uid``, when given); False when it is
        gone."""
        options: dict[str, Any] = {"propagationPolicy": propagation}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path, body=options)
        except ApiError as error:
            if error.status == 404 or (error.status == 409 and uid is not None):
                return False
            raise
        return True

    async def list(
        self, path: str, *, label_selector: str, page: int = 500
    ) -> tuple[list[dict[str, Any]], str]:
        """Every matching object (in pages) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        query: dict[str, str | int] = {"labelSelector": label_selector, "limit": page}
        while True:
            answer = await self.request("GET", path, query=query)
            items.extend(answer.get("items") or [])
            metadata = answer.get("metadata") or {}
            if not metadata.get("continue"):
                return items, str(metadata.get("resourceVersion", ""))
            query["continue"] = metadata["continue"]

    async def watch(
        self, path: str, *, label_selector: str, resource_version: str
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events (``{"type": ..., "object": ...}``) from ``resource_version``, bookmarks
        included, until the server ends the request. A 410 Gone arrives as an ApiError."""
        query: dict[str, str | int] = {
            "watch": "true",
            "labelSelector": label_selector,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": WATCH_TIMEOUT_SECONDS,
        }
        response = await self._send("GET", path, query=query, timeout=None)
        try:
            if not 200 <= response.status < 300:
                raise ApiError("WATCH", path, status=response.status, body=await response.text())
            while True:
                line = await response.content.readline()
                if not line:
                    return
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiError(
                        "WATCH", path, status=int(status.get("code", 500)), body=json.dumps(status)
                    )
                yield event
        finally:
            response.release()

    async def post_event(
        self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> None:
        """Record a core/v1 Event about ``involved`` (an object with apiVersion, kind, metadata)."""
        metadata = involved["metadata"]
        namespace = metadata.get("namespace") or "default"
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{metadata['name']}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": metadata["name"],
                "namespace": namespace,
                "uid": metadata.get("uid", ""),
                "resourceVersion": metadata.get("resourceVersion", ""),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": os.environ.get("HOSTNAME", component),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.create(f"/api/v1/namespaces/{namespace}/events", event)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None,
    ) -> aiohttp.ClientResponse:
        request_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=30)
        response: aiohttp.ClientResponse = await self._client.call_api(
            path,
            method,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=request_timeout,
        )
        return response


# -- paths ----------------------------------------------------------------------------------


def pods_path(namespace: str | None) -> str:
    return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"


def namespaced(
    namespace: str, resource: str, *, name: str | None = None, api_version: str = "v1"
) -> str:
    """The path of a namespaced collection or object of ``api_version`` (``v1``,
    ``group/version``)."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{resource}"
    return f"{path}/{name}" if name else path
