"""``openforge operator`` flags and the settings they give."""

from __future__ import annotations

import subprocess
import sys

import pytest
from openforge_operator import cli, settings


def test_defaults() -> None:
    ns, config = cli.options(["--namespace", "rl"])
    assert ns.namespace == ["rl"] and not ns.all_namespaces and not ns.standalone and not ns.webhook
    assert config == settings.Settings()


def test_every_setting_flag() -> None:
    ns, config = cli.options([
        "-A", "--standalone", "--sidecar-image", "img:2", "--image-pull-policy", "Always", "--sidecar-port", "16000",
        "--sidecar-uid", "2000", "--harness-uid", "3000", "--resync-seconds", "5", "--create-concurrency", "8",
        "--finish-wait-seconds", "9", "--dns-namespace", "dns", "--dns-label", "app=coredns", "--dns-label", "tier=x",
        "--liveness", "http://0.0.0.0:8080/healthz",
    ])  # fmt: skip
    assert ns.all_namespaces and ns.standalone and ns.liveness == "http://0.0.0.0:8080/healthz"
    assert config == settings.Settings(
        sidecar_image="img:2", image_pull_policy="Always", sidecar_port=16000, sidecar_uid=2000, harness_uid=3000,
        resync_seconds=5, create_concurrency=8, finish_wait_seconds=9, dns_namespace="dns",
        dns_pod_labels={"app": "coredns", "tier": "x"},
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [[], ["-n", "a", "-A"], ["-n", "a", "--standalone", "--peering", "p"], ["-n", "a", "--webhook-cert", "c"], ["-n", "a", "--dns-label", "novalue"]],
)
def test_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        cli.options(argv)


def test_the_openforge_command_knows_it() -> None:
    done = subprocess.run([sys.executable, "-m", "openforge.cli", "operator", "--help"], capture_output=True, text=True, timeout=60, check=True)
    assert "--all-namespaces" in done.stdout and "--webhook" in done.stdout and "--sidecar-image" in done.stdout
