"""The per-job NetworkPolicy: what a rollout pod may reach (pure).

An agent under training must not be able to game its reward: reach the
trainer and write records, talk to the API server, or fetch answers from the
internet. Each job's pods get a policy that denies all ingress and allows
egress only to

- the cluster DNS (port 53, UDP and TCP);
- the policy endpoint (``spec.policy.endpoint``), where the sidecar sends the
  model calls;
- the collector (``spec.trainer.endpoint``), where the sidecar streams records;
- the hosts the HarnessEnv declares (``spec.capture.allowedHosts``, ``host`` or
  ``host:port``; without a port, 80 and 443).

A NetworkPolicy selects pods, not containers: the harness shares the pod's
network namespace with the sidecar, so what the sidecar may reach the
harness may too. That is why the collector requires the job's bearer token,
which is mounted into the sidecar container only: the harness can open a
connection to the collector but cannot write a record. The policy endpoint is
the same: the harness can call the inference server directly, bypassing
capture, but such calls are simply not training data; they cannot change a
reward, which the grader computes in the pod.

NetworkPolicy peers are addresses and selectors, not host names, so a host
becomes:

- an IP literal: that address (``/32`` or ``/128``);
- ``name.namespace.svc[.cluster.local]``: every pod of that namespace, on that
  port (the Service's own selector is not read: that would need read access
  to Services);
- a bare name (a Service in the job's namespace): every pod of the job's
  namespace, on that port;
- any other name (outside the cluster): any address outside the private,
  link-local and loopback ranges, on that port. A policy cannot name a DNS
  name, so this is as close as plain NetworkPolicy gets; a CNI with FQDN
  policies (Cilium, Calico Enterprise) can narrow it.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from typing import Any

from openforge.api import v1alpha1

from openforge_operator import objects, settings

NAMESPACE_LABEL = "kubernetes.io/metadata.name"
PRIVATE_V4 = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "127.0.0.0/8",
)
PRIVATE_V6 = ("fc00::/7", "fe80::/10", "::1/128")
DEFAULT_PORTS = (80, 443)


def build_network_policy(
    job: v1alpha1.RolloutJob, env: v1alpha1.HarnessEnv, *, config: settings.Settings
) -> dict[str, Any]:
    """The job's NetworkPolicy over its rollout pods (selected by the job's uid)."""
    namespace = job.metadata.namespace or "default"
    egress = [_dns(config)]
    if job.spec.policy.endpoint is not None:
        host, port = _url_host_port(job.spec.policy.endpoint)
        egress.append(rule(host, [port], namespace=namespace))
    hosts = [job.spec.trainer.endpoint] if job.spec.trainer is not None else []
    for entry in [*hosts, *env.spec.capture.allowed_hosts]:
        name, given = _split_host_port(entry)
        egress.append(rule(name, [given] if given else list(DEFAULT_PORTS), namespace=namespace))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": objects.metadata(job, objects.network_policy_name(objects.job_name(job))),
        "spec": {
            "podSelector": {"matchLabels": {objects.LABEL_JOB_UID: objects.job_uid(job)}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def rule(host: str, ports: list[int], *, namespace: str) -> dict[str, Any]:
    """One egress rule allowing TCP ``ports`` on ``host`` (see the module docstring)."""
    return {
        "to": peers(host, namespace=namespace),
        "ports": [{"protocol": "TCP", "port": p} for p in ports],
    }


def peers(host: str, *, namespace: str) -> list[dict[str, Any]]:
    """The NetworkPolicy peers that stand for ``host``."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return [{"ipBlock": {"cidr": f"{address}/{address.max_prefixlen}"}}]
    labels = host.lower().rstrip(".").split(".")
    if len(labels) == 1:
        return [{"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: namespace}}}]
    if len(labels) >= 3 and labels[2] == "svc":
        return [{"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: labels[1]}}}]
    return [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_V4)}},
        {"ipBlock": {"cidr": "::/0", "except": list(PRIVATE_V6)}},
    ]


def _dns(config: settings.Settings) -> dict[str, Any]:
    return {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: config.dns_namespace}},
                "podSelector": {"matchLabels": dict(config.dns_pod_labels)},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }


def _url_host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None:
        raise ValueError(f"{url!r} has no host")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _split_host_port(entry: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 literal."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        if port.isdigit():
            return host, int(port)
    return entry, None
