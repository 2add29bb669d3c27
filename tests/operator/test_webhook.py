"""The admission webhook's mutation, purely: the sidecar for a pod labelled for capture."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from openforge_operator import pods, probe, settings, webhook

CONFIG = settings.Settings(sidecar_image="registry/openforge:1")


def pod(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "generateName": "eval-",
            "labels": {webhook.CAPTURE_LABEL: "true"},
            "annotations": {
                "openforge.dev/policy-endpoint": "http://vllm:8000",
                "openforge.dev/policy-model": "tiny",
                **annotations,
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "agent",
                    "image": "agent:1",
                    "env": [
                        {"name": "OPENAI_BASE_URL", "value": "https://api.openai.com/v1"},
                        {"name": "KEEP", "value": "1"},
                    ],
                },
                {"name": "other", "image": "other:1"},
            ]
        },
    }


def test_injects_the_native_sidecar_and_points_the_first_container_at_it() -> None:
    original = pod(**{"openforge.dev/base-url-suffix": "/v1", "openforge.dev/policy-version": "7"})
    mutated = webhook.inject(original, CONFIG)
    assert original == pod(
        **{"openforge.dev/base-url-suffix": "/v1", "openforge.dev/policy-version": "7"}
    ), "pure"
    sidecar = mutated["spec"]["initContainers"][0]
    assert (
        sidecar["name"] == pods.SIDECAR
        and sidecar["restartPolicy"] == "Always"
        and sidecar["image"] == "registry/openforge:1"
    )
    assert sidecar["command"] == pods.SIDECAR_COMMAND and sidecar["startupProbe"]["exec"][
        "command"
    ] == probe.command(CONFIG.sidecar_port)
    args = dict(zip(sidecar["args"][::2], sidecar["args"][1::2], strict=True))
    assert (
        args["--engine"] == "http://vllm:8000"
        and args["--engine-model"] == "tiny"
        and args["--mode"] == "reverse"
    )
    assert (
        args["--rollout-id"] == "$(OPENFORGE_POD_NAME)"
        and args["--policy-version"] == "7"
        and "--collector" not in args
    )
    assert {
        "name": "OPENFORGE_POD_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    } in sidecar["env"]
    agent = mutated["spec"]["containers"][0]
    assert agent["env"] == [
        {"name": "KEEP", "value": "1"},
        {"name": "OPENAI_BASE_URL", "value": "http://127.0.0.1:15090/v1"},
    ]
    assert mutated["spec"]["containers"][1] == original["spec"]["containers"][1]
    assert {"name": pods.SIDECAR_VOLUME, "emptyDir": {}} in mutated["spec"]["volumes"]


def test_collector_token_and_a_named_container() -> None:
    mutated = webhook.inject(pod(**{
        "openforge.dev/collector": "collector.openforge.svc:50051",
        "openforge.dev/collector-token-secret": "tok/token",
        "openforge.dev/container": "other",
        "openforge.dev/base-url-env": "ANTHROPIC_BASE_URL, OPENAI_BASE_URL",
    }), CONFIG)  # fmt: skip
    sidecar = mutated["spec"]["initContainers"][0]
    assert (
        sidecar["args"][sidecar["args"].index("--collector") + 1] == "collector.openforge.svc:50051"
    )
    assert {"name": pods.TOKEN_VOLUME, "mountPath": pods.TOKEN_DIR, "readOnly": True} in sidecar[
        "volumeMounts"
    ]
    assert {
        "name": pods.TOKEN_VOLUME,
        "secret": {
            "secretName": "tok",
            "items": [{"key": "token", "path": "token"}],
            "defaultMode": 0o440,
        },
    } in mutated["spec"]["volumes"]
    assert mutated["spec"]["securityContext"]["fsGroup"] == CONFIG.sidecar_uid, (
        "the sidecar (not root) reads the 0440 token"
    )
    other = mutated["spec"]["containers"][1]
    assert [e["name"] for e in other["env"]] == ["ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"]


def test_a_pod_that_has_the_sidecar_is_left_alone() -> None:
    once = webhook.inject(pod(), CONFIG)
    assert webhook.inject(copy.deepcopy(once), CONFIG) == once


@pytest.mark.parametrize(
    ("annotations", "words"),
    [
        ({"openforge.dev/policy-endpoint": ""}, "policy-endpoint is required"),
        (
            {"openforge.dev/policy-endpoint": "vllm:8000"},
            "policy-endpoint: 'vllm:8000' is not an http",
        ),
        ({"openforge.dev/policy-model": " "}, "policy-model is required"),
        ({"openforge.dev/policy-version": "v1"}, "policy-version"),
        ({"openforge.dev/collector": "collector"}, "collector: 'collector' is not host:port"),
        (
            {"openforge.dev/collector": "c:1", "openforge.dev/collector-token-secret": "tok"},
            "collector-token-secret",
        ),
        ({"openforge.dev/base-url-env": "NOT VALID"}, "base-url-env"),
        ({"openforge.dev/base-url-suffix": "v1"}, "base-url-suffix"),
        ({"openforge.dev/container": "nope"}, "no container named 'nope'"),
    ],
)
def test_a_pod_that_cannot_be_captured_is_refused_naming_the_annotation(
    annotations: dict[str, str], words: str
) -> None:
    with pytest.raises(webhook.InjectionError, match=words):
        webhook.inject(pod(**annotations), CONFIG)


def test_self_signed_certificate_for_the_webhook_host() -> None:
    from cryptography import x509

    certfile, keyfile = webhook.self_signed("openforge-webhook.openforge.svc")
    certificate = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "openforge-webhook.openforge.svc" in names.get_values_for_type(x509.DNSName)
    assert "PRIVATE KEY" in Path(keyfile).read_text()


def test_the_api_server_is_told_to_call_the_service_not_a_url() -> None:
    """kopf's server yields a URL config; through a Service the URL becomes the Service,
    with kopf's path (kopf then appends each handler's id to it)."""
    kopf_config = {"url": "https://of-webhook.openforge.svc:9443", "caBundle": "Q0E="}
    assert webhook.service_config(
        kopf_config, namespace="openforge", name="of-webhook", port=9443
    ) == {
        "caBundle": "Q0E=",
        "service": {"namespace": "openforge", "name": "of-webhook", "port": 9443, "path": ""},
    }
    with_path = {"url": "https://h:9443/hooks"}
    assert (
        webhook.service_config(with_path, namespace="n", name="s", port=9443)["service"]["path"]
        == "/hooks"
    )


def test_a_server_through_a_service_yields_kopfs_configs_as_service_configs() -> None:
    options = webhook.WebhookOptions(
        addr="127.0.0.1",
        port=0,
        host="of-webhook.openforge.svc",
        service=("openforge", "of-webhook"),
    )
    server = options.server()

    async def first() -> dict[str, object]:
        async def review(*_: object, **__: object) -> dict[str, object]:
            return {}

        generator = server(review)
        try:
            return dict(await generator.__anext__())
        finally:
            await generator.aclose()

    config = asyncio.run(first())
    assert "url" not in config and config["caBundle"]
    assert config["service"] == {
        "namespace": "openforge",
        "name": "of-webhook",
        "port": 0,
        "path": "",
    }
    assert (
        type(webhook.WebhookOptions(host="h").server()).__name__ == "WebhookServer"
    )  # no Service: kopf's own
