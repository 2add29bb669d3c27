"""Publish a new checkpoint to the inference servers, with its policy version.

Two kinds of server:

* :class:`ServePublisher` for ``openforge serve``:
  ``POST {url}/openforge/v1/weights`` with ``{"path": <checkpoint dir>,
  "policy_version": N}`` (or, in ``bytes`` mode, the safetensors state dict as
  an ``application/octet-stream`` body with header
  ``x-openforge-policy-version: N``); the server answers
  ``{"policy_version", "load_ms"}``. ``GET {url}/openforge/v1/policy``
  reports ``{"model", "policy_version"}``.
* :class:`VLLMPublisher` for a vLLM OpenAI server started with
  ``VLLM_SERVER_DEV_MODE=1`` (which exposes its RL control endpoints) and
  ``--worker-extension-cls openforge_trainer.serving.vllm_worker.WeightLoader``:
  ``POST /pause?mode=wait`` (in-flight requests finish, the KV/prefix caches
  are cleared), ``POST /collective_rpc`` ``{"method":
  "update_weights_from_path", "args": [<checkpoint dir>]}`` (every TP/PP
  worker loads the checkpoint's safetensors in place), optionally
  ``POST /update_weight_version`` ``{"new_version": "N"}`` (vLLM releases that
  have it), then ``POST /resume``. The checkpoint directory must be readable at
  the same path on the vLLM host (shared volume). These requests are checked
  against a recording stub server in the tests; no vLLM ran here.

A publish that fails is reported (:class:`PublishResult` with ``ok=False`` and
the server's answer), never raised: training goes on, and the rollouts the
server keeps producing carry its old policy version, which the staleness
limit accounts for. A vLLM server whose weight load failed is left paused
(half-loaded weights must not serve); the next publish resumes it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from openforge import endpoints

VLLM_WORKER_METHOD = "update_weights_from_path"


@dataclasses.dataclass(frozen=True)
class PublishResult:
    url: str
    kind: str  # "serve" | "vllm"
    policy_version: int
    ok: bool
    seconds: float
    detail: str  # the server's load time or the error, for the log


class PublishError(Exception):
    """One request of a publish failed (the message quotes the server's answer)."""


class Publisher(Protocol):
    url: str
    kind: str

    def publish(self, checkpoint: Path, policy_version: int) -> PublishResult: ...


class ServePublisher:
    """Pushes checkpoints to an ``openforge serve`` instance."""

    kind = "serve"

    def __init__(
        self, url: str, *, mode: Literal["path", "bytes"] = "path", timeout: float = 300.0
    ) -> None:
        self.url = url.rstrip("/")
        self.mode = mode
        self.timeout = timeout

    def publish(self, checkpoint: Path, policy_version: int) -> PublishResult:
        started = time.monotonic()
        try:
            if self.mode == "path":
                payload = {"path": str(checkpoint.resolve()), "policy_version": policy_version}
                answer = request_json(
                    "POST", self.url + endpoints.WEIGHTS, payload=payload, timeout=self.timeout
                )
            else:
                answer = request_json(
                    "POST",
                    self.url + endpoints.WEIGHTS,
                    payload=None,
                    body=state_dict_bytes(checkpoint),
                    headers={
                        "content-type": "application/octet-stream",
                        endpoints.POLICY_VERSION_HEADER: str(policy_version),
                    },
                    timeout=self.timeout,
                )
            reported = int(answer.get("policy_version", -1))
            if reported != policy_version:
                raise PublishError(
                    f"server reports policy_version {reported} after loading {policy_version}"
                )
            detail = f"load_ms={answer.get('load_ms')}"
        except (PublishError, OSError, ValueError) as exc:
            return self._result(policy_version, started, ok=False, detail=str(exc))
        return self._result(policy_version, started, ok=True, detail=detail)

    def policy(self) -> dict[str, Any]:
        """What the server is serving: ``{"model", "policy_version"}``."""
        return request_json("GET", self.url + endpoints.POLICY, payload=None, timeout=self.timeout)

    def _result(self, version: int, started: float, *, ok: bool, detail: str) -> PublishResult:
        return PublishResult(self.url, self.kind, version, ok, time.monotonic() - started, detail)


class VLLMPublisher:
    """Makes a vLLM server load a checkpoint from disk through its dev-mode endpoints."""

    kind = "vllm"

    def __init__(
        self,
        url: str,
        *,
        worker_method: str = VLLM_WORKER_METHOD,
        pause_mode: Literal["wait", "abort", "keep"] = "wait",
        set_weight_version: bool = False,
        timeout: float = 300.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.worker_method = worker_method
        self.pause_mode = pause_mode
        self.set_weight_version = set_weight_version
        self.timeout = timeout

    def publish(self, checkpoint: Path, policy_version: int) -> PublishResult:
        started = time.monotonic()
        try:
            query = urllib.parse.urlencode({"mode": self.pause_mode})
            request_json("POST", f"{self.url}/pause?{query}", payload=None, timeout=self.timeout)
            answer = request_json(
                "POST",
                self.url + "/collective_rpc",
                payload={
                    "method": self.worker_method,
                    "args": [str(checkpoint.resolve())],
                    "timeout": self.timeout,
                },
                timeout=self.timeout,
            )
            if self.set_weight_version:
                request_json(
                    "POST",
                    self.url + "/update_weight_version",
                    payload={"new_version": str(policy_version)},
                    timeout=self.timeout,
                )
            request_json("POST", self.url + "/resume", payload=None, timeout=self.timeout)
        except (PublishError, OSError, ValueError) as exc:
            detail = f"{exc} (server left paused if the load began)"
            return PublishResult(
                self.url, self.kind, policy_version, False, time.monotonic() - started, detail
            )
        workers = answer.get("results", [])
        return PublishResult(
            self.url,
            self.kind,
            policy_version,
            True,
            time.monotonic() - started,
            f"{len(workers)} workers loaded",
        )


def publish_all(
    publishers: Sequence[Publisher], checkpoint: Path, *, policy_version: int
) -> list[PublishResult]:
    """Publish to every server at once; one result per publisher, in order."""
    if not publishers:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(publishers)) as pool:
        futures = [pool.submit(p.publish, checkpoint, policy_version) for p in publishers]
        return [future.result() for future in futures]


def state_dict_bytes(checkpoint: Path) -> bytes:
    """The checkpoint's weights as one safetensors blob (a single file is sent as is)."""
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise PublishError(f"no *.safetensors in {checkpoint}")
    if len(files) == 1:
        return files[0].read_bytes()
    from safetensors.torch import load_file, save

    merged: dict[str, Any] = {}
    for path in files:
        merged.update(load_file(path))
    return bytes(save(merged))


def request_json(
    method: str,
    url: str,
    *,
    payload: dict[str, Any] | None,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float,
) -> dict[str, Any]:
    """One HTTP request; the JSON answer ({} when empty), or PublishError quoting it."""
    data = body
    all_headers = dict(headers or {})
    if payload is not None:
        data = json.dumps(payload).encode()
        all_headers["content-type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")[:500]
        raise PublishError(f"{method} {url}: HTTP {exc.code}: {text}") from None
    except urllib.error.URLError as exc:
        raise PublishError(f"{method} {url}: {exc.reason}") from None
    if not raw.strip():
        return {}
    document = json.load(io.BytesIO(raw))
    if not isinstance(document, dict):
        raise PublishError(f"{method} {url}: expected a JSON object, got {raw[:200]!r}")
    return document
