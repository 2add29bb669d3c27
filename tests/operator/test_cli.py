"""``openforge operator`` flags and the settings they give."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from openforge_operator import cli, settings


def test_defaults() -> None:
    ns, config = cli.options(["--namespace", "rl"])
    assert ns.namespace == ["rl"] and not ns.all_namespaces and not ns.standalone and not ns.webhook
    assert config == settings.Settings()


def test_every_setting_flag() -> None:
    ns, config = cli.options([
        "-A", "--standalone", "--sidecar-image", "img:2", "--image-pull-policy", "Always",
        "--sidecar-port", "16000", "--sidecar-uid", "2000", "--harness-uid", "3000",
        "--resync-seconds", "5", "--create-concurrency", "8", "--finish-wait-seconds", "9",
        "--fence-wait-seconds", "0", "--dns-namespace", "dns",
        "--dns-label", "app=coredns", "--dns-label", "tier=x",
        "--liveness", "http://0.0.0.0:8080/healthz",
        "--sidecar-resources", '{"requests": {"cpu": "10m", "memory": 64}}',
    ])  # fmt: skip
    assert ns.all_namespaces and ns.standalone and ns.liveness == "http://0.0.0.0:8080/healthz"
    assert config == settings.Settings(
        sidecar_image="img:2", image_pull_policy="Always", sidecar_port=16000, sidecar_uid=2000,
        harness_uid=3000, resync_seconds=5, create_concurrency=8, finish_wait_seconds=9,
        fence_wait_seconds=0, dns_namespace="dns", dns_pod_labels={"app": "coredns", "tier": "x"},
        sidecar_resources={"requests": {"cpu": "10m", "memory": "64"}},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ("{nope", "not JSON"),
        ("[1]", "want an object"),
        ('{"request": {}}', "'request'"),
        ('{"limits": "1Gi"}', "limits: want an object"),
        ('{"limits": {"memory": "lots"}}', "limits.memory: 'lots' is not a Kubernetes quantity"),
        ('{"requests": {"cpu": true}}', "requests.cpu"),
    ],
)
def test_bad_sidecar_resources_name_the_part_at_fault(
    value: str, fault: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.options(["-n", "rl", "--sidecar-resources", value])
    err = capsys.readouterr().err
    assert "--sidecar-resources" in err and fault in err, err


def test_the_collector_master_key_is_read_from_its_file_and_kept_out_of_repr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "master-key"
    key.write_text("k" * 40 + "\n")
    ns, config = cli.options(["-n", "rl", "--collector-master-key-file", str(key)])
    assert config.collector_master_key is None, "options() reads no file"
    config = cli.with_master_key(ns, config)
    assert config.collector_master_key == b"k" * 40
    assert "kkkk" not in repr(config)
    key.write_text("short")
    with pytest.raises(SystemExit):
        cli.with_master_key(ns, config)
    assert (
        "--collector-master-key-file" in (err := capsys.readouterr().err) and "at least 32" in err
    )
    ns, config = cli.options(["-n", "rl"])
    assert cli.with_master_key(ns, config) == config


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["-n", "a", "-A"],
        ["-n", "a", "--standalone", "--peering", "p"],
        ["-n", "a", "--webhook-cert", "c"],
        ["-n", "a", "--dns-label", "novalue"],
        ["-n", "a", "--webhook-service", "svc"],
        ["-n", "a", "--webhook-service", "ns/a/b"],
    ],
)
def test_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        cli.options(argv)


@pytest.mark.parametrize("value", ["-1", "120", "600"])
def test_the_fence_wait_must_end_before_the_harness_gives_up_on_its_sidecar(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.options(["-n", "rl", "--fence-wait-seconds", value])
    assert "--fence-wait-seconds" in capsys.readouterr().err


def test_the_webhook_service_names_the_host_unless_given() -> None:
    ns, _ = cli.options(["-n", "a", "--webhook", "--webhook-service", "openforge/hook"])
    assert ns.webhook_service == ("openforge", "hook") and ns.webhook_host == "hook.openforge.svc"
    ns, _ = cli.options(
        ["-n", "a", "--webhook-service", "openforge/hook", "--webhook-host", "hook.example"]
    )
    assert ns.webhook_host == "hook.example"


def test_the_openforge_command_knows_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "operator", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert (
        "--all-namespaces" in done.stdout
        and "--webhook" in done.stdout
        and "--sidecar-image" in done.stdout
    )


def test_the_identity_needs_no_password_database_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the chart's pod the user (uid 65532) has no passwd entry: kopf's default identity
    (getpass.getuser) raised KeyError and the operator crashed on start; ours does not ask."""
    import pwd

    from kopf._core.engines import peering

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    for variable in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(KeyError):
        peering.detect_own_id(manual=False)
    name = cli.identity()
    assert name.endswith(f"@{os.getpid()}") and len(name) > 2
