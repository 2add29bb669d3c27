"""The per-job NetworkPolicy: deny-all ingress, egress only to DNS, the policy endpoint,
the collector and the HarnessEnv's allowed hosts, each host turned into peers."""

from __future__ import annotations

from typing import Any

import pytest
from openforge_operator import network, settings
from operator_fixtures import UID, env, job

CONFIG = settings.Settings()
OUTSIDE = [
    {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(network.PRIVATE_V4)}},
    {"ipBlock": {"cidr": "::/0", "except": list(network.PRIVATE_V6)}},
]


def build(*, allowed: list[str] | None = None, **job_spec: Any) -> dict[str, Any]:
    return network.build_network_policy(
        job(spec=job_spec), env(spec={"capture": {"allowedHosts": allowed or []}}), config=CONFIG
    )


def test_the_policy_selects_the_jobs_pods_and_denies_ingress() -> None:
    policy = build()
    assert (
        policy["metadata"]["name"] == "job-rollouts"
        and policy["metadata"]["ownerReferences"][0]["uid"] == UID
    )
    assert policy["spec"]["podSelector"] == {"matchLabels": {"openforge.dev/job-uid": UID}}
    assert (
        policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["ingress"] == []
    )


def test_egress_is_dns_policy_and_collector_only() -> None:
    egress = build()["spec"]["egress"]
    assert egress == [
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                    },
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {
            "to": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "models"}}}
            ],
            "ports": [{"protocol": "TCP", "port": 8000}],
        },
        {
            "to": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openforge"}}}
            ],
            "ports": [{"protocol": "TCP", "port": 50051}],
        },
    ]


def test_allowed_hosts_become_peers() -> None:
    egress = build(
        allowed=["pypi.org", "10.1.2.3:8080", "[fd00::1]:443", "git", "api.github.com:22"]
    )["spec"]["egress"][3:]
    assert egress[0] == {
        "to": OUTSIDE,
        "ports": [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 443}],
    }
    assert egress[1] == {
        "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }
    assert egress[2] == {
        "to": [{"ipBlock": {"cidr": "fd00::1/128"}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    }
    assert egress[3]["to"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns"}}}
    ]
    assert egress[4] == {"to": OUTSIDE, "ports": [{"protocol": "TCP", "port": 22}]}


@pytest.mark.parametrize(
    ("endpoint", "peer", "port"),
    [
        ("https://api.example.com/v1", OUTSIDE, 443),
        ("http://192.168.0.7:9000", [{"ipBlock": {"cidr": "192.168.0.7/32"}}], 9000),
        (
            "http://vllm.models.svc.cluster.local",
            [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "models"}}}],
            80,
        ),
        (
            "http://vllm:8000",
            [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns"}}}],
            8000,
        ),
    ],
)
def test_the_policy_endpoint(endpoint: str, peer: list[dict[str, Any]], port: int) -> None:
    rule = build(policy={"endpoint": endpoint, "model": "m"})["spec"]["egress"][1]
    assert rule == {"to": peer, "ports": [{"protocol": "TCP", "port": port}]}


def test_outside_addresses_exclude_the_cluster_metadata_and_loopback_ranges() -> None:
    assert {"169.254.0.0/16", "10.0.0.0/8", "127.0.0.0/8"} <= set(network.PRIVATE_V4)


def test_dns_pods_are_configurable() -> None:
    config = settings.Settings(dns_namespace="dns", dns_pod_labels={"app": "coredns"})
    dns = network.build_network_policy(job(), env(), config=config)["spec"]["egress"][0]["to"][0]
    assert dns == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dns"}},
        "podSelector": {"matchLabels": {"app": "coredns"}},
    }
