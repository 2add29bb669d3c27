"""``openforge operator``: run the OpenForge operator (kopf) against a cluster.

It connects with ``--kubeconfig`` (or ``$KUBECONFIG``, or the in-cluster
service account), serves the namespaces given with ``--namespace`` (repeat
it) or all of them with ``--all-namespaces``, and runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys

from openforge.trajectory import auth

from openforge_operator import pods, settings

DEFAULTS = settings.Settings()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openforge operator",
        description="Run the Kubernetes operator for RolloutJob and HarnessEnv (kopf).",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--namespace", "-n", action="append", help="serve this namespace (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace")
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)"
    )
    parser.add_argument(
        "--standalone", action="store_true",
        help="run without kopf peering (one replica; no kopf peering objects needed)",
    )  # fmt: skip
    parser.add_argument(
        "--peering", metavar="NAME", help="kopf peering object name (without --standalone)"
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--sidecar-image",
        default=DEFAULTS.sidecar_image,
        help="capture sidecar image (default %(default)s)",
    )
    parser.add_argument(
        "--image-pull-policy",
        choices=("Always", "IfNotPresent", "Never"),
        help="for the sidecar image",
    )
    parser.add_argument(
        "--sidecar-port",
        type=int,
        default=DEFAULTS.sidecar_port,
        help="sidecar port on the pod's loopback (default %(default)s)",
    )
    parser.add_argument(
        "--sidecar-uid",
        type=int,
        default=DEFAULTS.sidecar_uid,
        help="sidecar user id (default %(default)s)",
    )
    parser.add_argument(
        "--sidecar-resources", metavar="JSON",
        help="the sidecar container's resources, as JSON: {\"requests\": {...}, \"limits\": {...}}"
        f" (default {json.dumps(DEFAULTS.sidecar_resources, separators=(',', ':'))})",
    )  # fmt: skip
    parser.add_argument(
        "--harness-uid",
        type=int,
        default=DEFAULTS.harness_uid,
        help="harness user id when the template sets none (default %(default)s)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=DEFAULTS.resync_seconds,
        help="reconcile each job at least this often (default %(default)s)",
    )
    parser.add_argument(
        "--create-concurrency",
        type=int,
        default=DEFAULTS.create_concurrency,
        help="pod creations in flight (default %(default)s)",
    )
    parser.add_argument(
        "--fence-wait-seconds", type=int, default=DEFAULTS.fence_wait_seconds,
        help="how long a pod waits for its NetworkPolicy to be enforced before the harness starts;"
        " 0: do not wait (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--finish-wait-seconds",
        type=int,
        default=DEFAULTS.finish_wait_seconds,
        help="how long a pod waits for the collector's ack (default %(default)s)",
    )
    parser.add_argument(
        "--collector-master-key-file", metavar="FILE",
        help="issue each RolloutJob without spec.trainer.tokenSecretRef its own collector token"
        " (Secret <job>-collector-token), derived from this master key"
        " (the collector's --master-key-file)",
    )  # fmt: skip
    parser.add_argument(
        "--dns-namespace",
        default=DEFAULTS.dns_namespace,
        help="namespace of the cluster DNS pods (default %(default)s)",
    )
    parser.add_argument(
        "--dns-label",
        action="append",
        metavar="KEY=VALUE",
        help="label of the cluster DNS pods (default k8s-app=kube-dns)",
    )
    webhook = parser.add_argument_group(
        "admission webhook (sidecar injection into pods labelled openforge.dev/capture=true)"
    )
    webhook.add_argument(
        "--webhook",
        action="store_true",
        help="serve the mutating webhook and manage its configuration",
    )
    webhook.add_argument(
        "--webhook-addr", default="0.0.0.0", help="listen address (default %(default)s)"
    )
    webhook.add_argument(
        "--webhook-port", type=int, default=9443, help="listen port (default %(default)s)"
    )
    webhook.add_argument(
        "--webhook-host", help="the name the API server reaches the webhook by (a Service DNS name)"
    )
    webhook.add_argument(
        "--webhook-service", metavar="NAMESPACE/NAME",
        help="the Service in front of the webhook (port --webhook-port): the API server calls it"
        " through the Service, not a URL (its resolver knows no cluster DNS names);"
        " --webhook-host is then NAME.NAMESPACE.svc",
    )  # fmt: skip
    webhook.add_argument(
        "--webhook-cert", help="TLS certificate file (default: self-signed for --webhook-host)"
    )
    webhook.add_argument("--webhook-key", help="TLS key file")
    webhook.add_argument(
        "--webhook-configuration",
        default="openforge-capture",
        help="MutatingWebhookConfiguration name (default %(default)s)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    return parser


def options(argv: list[str]) -> tuple[argparse.Namespace, settings.Settings]:
    """Parsed flags and the settings they give (pure: the master key is read by
    ``with_master_key``)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.standalone and ns.peering:
        parser.error("--peering and --standalone exclude each other")
    if bool(ns.webhook_cert) != bool(ns.webhook_key):
        parser.error("--webhook-cert and --webhook-key go together")
    if ns.webhook_service is not None:
        namespace, sep, name = ns.webhook_service.partition("/")
        if not sep or not namespace or not name or "/" in name:
            parser.error(f"--webhook-service: {ns.webhook_service!r} is not NAMESPACE/NAME")
        ns.webhook_service = (namespace, name)
        ns.webhook_host = ns.webhook_host or f"{name}.{namespace}.svc"
    labels = dict(DEFAULTS.dns_pod_labels)
    if ns.dns_label:
        labels = {}
        for item in ns.dns_label:
            key, sep, value = item.partition("=")
            if not sep or not key:
                parser.error(f"--dns-label: {item!r} is not KEY=VALUE")
            labels[key] = value
    if not 0 <= ns.fence_wait_seconds < pods.SIDECAR_START_SECONDS:
        parser.error(
            f"--fence-wait-seconds: {ns.fence_wait_seconds} is not from 0 to "
            f"{pods.SIDECAR_START_SECONDS - 1} "
            f"(the harness waits {pods.SIDECAR_START_SECONDS} s for its sidecar)"
        )
    resources = DEFAULTS.sidecar_resources
    if ns.sidecar_resources is not None:
        try:
            resources = settings.parse_resources(ns.sidecar_resources)
        except ValueError as error:
            parser.error(f"--sidecar-resources: {error}")
    config = settings.Settings(
        sidecar_image=ns.sidecar_image,
        sidecar_resources=resources,
        image_pull_policy=ns.image_pull_policy,
        sidecar_port=ns.sidecar_port,
        sidecar_uid=ns.sidecar_uid,
        harness_uid=ns.harness_uid,
        resync_seconds=ns.resync_seconds,
        create_concurrency=ns.create_concurrency,
        finish_wait_seconds=ns.finish_wait_seconds,
        fence_wait_seconds=ns.fence_wait_seconds,
        dns_namespace=ns.dns_namespace,
        dns_pod_labels=labels,
    )
    return ns, config


def with_master_key(ns: argparse.Namespace, config: settings.Settings) -> settings.Settings:
    """The settings with the collector master key read from ``--collector-master-key-file``
    (unchanged without it); exits with a usage error naming the flag when it cannot be used."""
    if not ns.collector_master_key_file:
        return config
    try:
        key = auth.read_master_key(ns.collector_master_key_file)
    except ValueError as error:
        build_parser().error(f"--collector-master-key-file: {error}")
    return dataclasses.replace(config, collector_master_key=key)


def main(argv: list[str] | None = None) -> int:
    ns, config = options(list(sys.argv[1:] if argv is None else argv))
    config = with_master_key(ns, config)
    if ns.kubeconfig:
        # before kubernetes_asyncio is imported: it reads $KUBECONFIG once, at import,
        # and kopf's login goes through it
        os.environ["KUBECONFIG"] = ns.kubeconfig
    logging.basicConfig(
        level=logging.DEBUG if ns.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not ns.verbose:
        # kopf logs every handler call at INFO ("Handler ... succeeded"): one line per event
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    import kopf
    from kopf._core.engines import peering

    from openforge_operator import handlers, webhook

    hook = None
    if ns.webhook:
        hook = webhook.WebhookOptions(
            addr=ns.webhook_addr, port=ns.webhook_port, host=ns.webhook_host,
            certfile=ns.webhook_cert, pkeyfile=ns.webhook_key,
            configuration_name=ns.webhook_configuration, service=ns.webhook_service,
        )  # fmt: skip
    namespaces = None if ns.all_namespaces else list(ns.namespace)
    runtime = handlers.Runtime(
        config=config, namespaces=namespaces, webhook=hook, kubeconfig=ns.kubeconfig
    )
    kopf.run(
        registry=handlers.build_registry(runtime),
        standalone=ns.standalone,
        peering_name=ns.peering,
        clusterwide=ns.all_namespaces,
        namespaces=namespaces or (),
        liveness_endpoint=ns.liveness,
        identity=peering.Identity(identity()),
    )
    return 0


def identity() -> str:
    """This operator process's name among peers: ``<host>@<pid>``.

    kopf's own default asks the password database for the user's name, which fails in a
    container whose user has no entry (the chart's uid 65532: ``KeyError: 'getpwuid():
    uid not found'``) and crashed the operator on its first start in a real pod.
    """
    return f"{socket.gethostname()}@{os.getpid()}"


if __name__ == "__main__":
    sys.exit(main())
