"""The admission webhook in real pods: the chart's operator with ``operator.webhook.enabled``
serves it behind its Service, the API server calls it for labelled pods, and a pod that
someone else created (no RolloutJob) runs with the injected native sidecar, its harness
held back by the sidecar's startup probe, its call captured and stored by the collector
with the shared token its annotation names. An unlabelled pod is left alone; a labelled
pod without its annotations is refused with a message naming the one missing.
"""

from __future__ import annotations

import contextlib
import secrets
import uuid
from collections.abc import Iterator

import kube_cluster
import pytest
import realpods
import yaml

pytestmark = [pytest.mark.kind, pytest.mark.slow]

TOKEN_SECRET = "webhook-collector-token"


def token_secret(name: str, token: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {"token": token},
    }


@contextlib.contextmanager
def webhook_platform(kind: kube_cluster.Kube) -> Iterator[str]:
    """The platform with the webhook on and a shared collector token (yielded); the
    demo's platform again afterwards."""
    token = secrets.token_urlsafe(32)
    kind.kubectl(
        "-n",
        "openforge",
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump(token_secret(TOKEN_SECRET, token)),
    )
    try:
        realpods.ensure_platform(
            kind,
            "operator.webhook.enabled=true",
            f"trainer.collector.tokenSecret.name={TOKEN_SECRET}",
        )
        yield token
    finally:
        realpods.ensure_platform(kind)
        kind.kubectl(
            "-n", "openforge", "delete", "secret", TOKEN_SECRET, "--ignore-not-found", check=False
        )


def labelled_pod(name: str, job: str, annotations: dict[str, str] | None = None) -> dict:
    chosen = {
        "openforge.dev/policy-endpoint": realpods.POLICY_ENDPOINT,
        "openforge.dev/policy-model": "tiny-react",
        "openforge.dev/collector": realpods.COLLECTOR_ENDPOINT,
        "openforge.dev/collector-token-secret": f"{TOKEN_SECRET}/token",
        "openforge.dev/base-url-suffix": "/v1",
        "openforge.dev/job": job,
    }
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"openforge.dev/capture": "true"},
                     "annotations": chosen if annotations is None else annotations},
        "spec": {
            "restartPolicy": "Never", "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "containers": [{"name": "agent", "image": realpods.HARNESS_IMAGE,
                            "command": ["python3", "-c", realpods.ONE_CALL],
                            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                          "limits": {"memory": "256Mi"}}}],
        },
    }  # fmt: skip


def injected(kind: kube_cluster.Kube, namespace: str, pod: dict) -> dict:
    """Create ``pod`` until the webhook has mutated it (the operator's server takes a
    moment to answer after its pod is Ready; until then ``failurePolicy: Ignore`` lets the
    pod through unmutated, and it is deleted and created again)."""
    name = pod["metadata"]["name"]

    def created() -> bool:
        kind.kubectl(
            "-n",
            namespace,
            "delete",
            "pod",
            name,
            "--ignore-not-found",
            "--wait=true",
            check=False,
            timeout=120,
        )
        kind.kubectl("-n", namespace, "create", "-f", "-", stdin=yaml.safe_dump(pod))
        spec = realpods.pod(kind, namespace, name)["spec"]
        return any(c["name"] == realpods.SIDECAR for c in spec.get("initContainers", []))

    kube_cluster.wait_for(created, what=f"{name} created with the sidecar", timeout=180, interval=3)
    return realpods.pod(kind, namespace, name)


@pytest.mark.timeout(1500)
def test_the_webhook_captures_a_labelled_pod_that_someone_else_created(
    platform: kube_cluster.Kube,
) -> None:
    kind = platform
    namespace = f"hook-{uuid.uuid4().hex[:6]}"
    job = namespace
    with webhook_platform(kind) as token:
        realpods.ensure_namespace(kind, namespace)
        kind.kubectl(
            "-n",
            namespace,
            "apply",
            "-f",
            "-",
            stdin=yaml.safe_dump(token_secret(TOKEN_SECRET, token)),
        )

        # the chart makes the configuration; the operator fills in its webhooks at start
        def hooks() -> list[dict]:
            return (
                kind.get_json("mutatingwebhookconfiguration", "openforge-capture").get("webhooks")
                or []
            )

        kube_cluster.wait_for(
            lambda: bool(hooks()), what="the operator's webhooks", timeout=120, interval=2
        )
        assert hooks()[0]["failurePolicy"] == "Ignore", hooks()

        pod = injected(kind, namespace, labelled_pod("eval", job))
        sidecar = pod["spec"]["initContainers"][0]
        assert sidecar["restartPolicy"] == "Always" and "startupProbe" in sidecar, sidecar
        agent = pod["spec"]["containers"][0]
        assert {"name": "OPENAI_BASE_URL", "value": "http://127.0.0.1:15090/v1"} in agent["env"], (
            agent["env"]
        )

        def done() -> bool:
            return realpods.pod(kind, namespace, "eval")["status"].get("phase") in (
                "Succeeded",
                "Failed",
            )

        kube_cluster.wait_for(done, what="eval finished", timeout=300, interval=2)
        finished = realpods.pod(kind, namespace, "eval")
        log = kind.kubectl("-n", namespace, "logs", "eval", "-c", "agent", check=False).stdout
        assert finished["status"]["phase"] == "Succeeded" and "answered" in log, (
            finished["status"],
            log,
        )
        # the sidecar's startup probe held the agent back until it listened
        statuses = {
            s["name"]: s
            for s in [
                *finished["status"]["initContainerStatuses"],
                *finished["status"]["containerStatuses"],
            ]
        }
        assert realpods.started_at(statuses[realpods.SIDECAR]) <= realpods.started_at(
            statuses["agent"]
        )

        def stored() -> bool:
            rollouts = realpods.store_summary(kind, job)["rollouts"]
            return bool(rollouts) and bool(rollouts[0]["calls"])

        kube_cluster.wait_for(stored, what=f"{job}'s call stored", timeout=120, interval=2)
        [rollout] = realpods.store_summary(kind, job)["rollouts"]
        assert rollout["id"] == "eval", rollout  # the pod's name is the rollout id
        assert not rollout["finished"], rollout  # capture only: no grader, no finish record
        [call] = rollout["calls"]
        assert (
            call["exact"]
            and call["completion_tokens"] > 0
            and call["logprobs"] == call["completion_tokens"]
        ), call

        plain = labelled_pod("plain", job)
        plain["metadata"].pop("labels")
        kind.kubectl("-n", namespace, "create", "-f", "-", stdin=yaml.safe_dump(plain))
        assert "initContainers" not in realpods.pod(kind, namespace, "plain")["spec"]

        bad = labelled_pod("bad", job, annotations={"openforge.dev/policy-model": "tiny-react"})
        refused = kind.kubectl(
            "-n", namespace, "create", "-f", "-", stdin=yaml.safe_dump(bad), check=False
        )
        assert (
            refused.returncode != 0
            and "openforge.dev/policy-endpoint is required" in refused.stderr
        ), refused.stderr
        kind.kubectl("delete", "namespace", namespace, "--wait=false")
