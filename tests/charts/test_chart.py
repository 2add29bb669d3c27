"""The chart through the pinned helm: lint, and what it renders with default and
non-default values (objects, secure defaults, image pins, arguments, NOTES)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml
from helm_chart import CHART, Helm, HelmError, find, one
from openforge_operator import cli, settings, webhook

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
MASTER_KEY_FILE = "/var/run/openforge/collector-master-key/master-key"

NON_DEFAULT: dict[str, Any] = {
    "fullnameOverride": "forge",
    "commonLabels": {"team": "rl"},
    "imagePullSecrets": ["ghcr-pull"],
    "crds": {"install": False},
    "operator": {
        "image": {"digest": "sha256:" + "a" * 64},
        "sidecarImage": {"tag": "0.1.0-rc1"},
        "sidecarResources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
        "watchNamespaces": ["rl-a", "rl-b"],
        "extraArgs": ["--verbose"],
        "webhook": {"enabled": True},
        "nodeSelector": {"kubernetes.io/os": "linux"},
    },
    "trainer": {
        "collector": {"tokenSecret": {"name": "collector-token", "key": "bearer"}},
        "train": {
            "enabled": True,
            "job": "react-toy",
            "model": "/opt/openforge/models/tiny-react",
            "serve": ["http://policy.rl.svc:8000"],
            "device": "cuda",
            "resources": {
                "limits": {"nvidia.com/gpu": 1, "cpu": "8", "memory": "64Gi"},
                "requests": {"cpu": "4", "memory": "32Gi"},
            },
        },
        "persistence": {"existingClaim": "trajectories"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def test_app_version_is_the_packages_and_the_operators_default_sidecar() -> None:
    import tomllib

    version = tomllib.loads((CHART.parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert version == APP_VERSION
    assert f"ghcr.io/openforge/sidecar:{APP_VERSION}" == settings.DEFAULT_SIDECAR_IMAGE


def test_lint_is_clean_with_default_values(helm: Helm) -> None:
    out = helm.run("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_lint_is_clean_with_non_default_values(helm: Helm) -> None:
    out = helm.run("lint", "--strict", str(CHART), values=NON_DEFAULT)
    assert "0 chart(s) failed" in out


def test_default_render_makes_the_operator_the_collector_and_the_crds(helm: Helm) -> None:
    objects = helm.template()
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == sorted([
        ("CustomResourceDefinition", "harnessenvs.openforge.dev"),
        ("CustomResourceDefinition", "rolloutjobs.openforge.dev"),
        ("ServiceAccount", "of-openforge-operator"),
        ("ClusterRole", "of-openforge-operator"),
        ("ClusterRoleBinding", "of-openforge-operator"),
        ("Deployment", "of-openforge-operator"),
        ("ServiceAccount", "of-openforge-trainer"),
        ("PersistentVolumeClaim", "of-openforge-trainer-store"),
        ("Deployment", "of-openforge-trainer"),
        ("Service", "of-openforge-collector"),
        ("Secret", "of-openforge-collector-master-key"),
    ])  # fmt: skip
    assert not find(objects, "MutatingWebhookConfiguration"), "the webhook is off by default"
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "of"
        if obj["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "openforge"


def test_operator_runs_once_recreated_standalone_on_every_namespace(helm: Helm) -> None:
    deployment = one(helm.template(), "Deployment", "of-openforge-operator")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    operator = containers(deployment)["operator"]
    assert operator["command"] == ["openforge", "operator"]
    assert operator["args"] == [
        "--standalone",
        "--all-namespaces",
        f"--sidecar-image=ghcr.io/openforge/sidecar:{APP_VERSION}",
        "--fence-wait-seconds=60",
        "--liveness=http://0.0.0.0:8080/healthz",
        f"--collector-master-key-file={MASTER_KEY_FILE}",
    ]
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert {"name": "healthz", "containerPort": 8080, "protocol": "TCP"} in operator["ports"]


def test_every_pod_runs_with_secure_defaults(helm: Helm) -> None:
    for values in (None, NON_DEFAULT):
        for deployment in find(helm.template(values), "Deployment"):
            name = deployment["metadata"]["name"]
            pod = deployment["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, name
            assert pod["securityContext"]["runAsUser"] != 0, name
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert "hostNetwork" not in pod and "hostPID" not in pod, name
            for container in pod["containers"]:
                where = f"{name}/{container['name']}"
                context = container["securityContext"]
                assert context["readOnlyRootFilesystem"] is True, where
                assert context["allowPrivilegeEscalation"] is False, where
                assert context["capabilities"] == {"drop": ["ALL"]}, where
                assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
                assert "privileged" not in context, where
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(container["resources"][kind]), f"{where} {kind}"


def test_image_tags_default_to_the_app_version(helm: Helm) -> None:
    objects = helm.template()
    images = {
        c["image"]
        for d in find(objects, "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {
        f"ghcr.io/openforge/operator:{APP_VERSION}",
        f"ghcr.io/openforge/trainer:{APP_VERSION}",
    }
    for deployment in find(objects, "Deployment"):
        assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == APP_VERSION


def test_trainer_has_no_api_token_and_serves_grpc(helm: Helm) -> None:
    objects = helm.template()
    deployment = one(objects, "Deployment", "of-openforge-trainer")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert pod["automountServiceAccountToken"] is False
    assert (
        one(objects, "ServiceAccount", "of-openforge-trainer")["automountServiceAccountToken"]
        is False
    )
    assert list(containers(deployment)) == ["collector"], "the trainer container is off by default"
    collector = containers(deployment)["collector"]
    assert collector["args"] == [
        "--store=/data/store.db",
        "--listen=0.0.0.0:50051",
        "--grace=10",
        f"--master-key-file={MASTER_KEY_FILE}",
    ]
    assert {
        "name": "data",
        "persistentVolumeClaim": {"claimName": "of-openforge-trainer-store"},
    } in pod["volumes"]
    service = one(objects, "Service", "of-openforge-collector")
    assert service["spec"]["ports"] == [
        {
            "name": "grpc",
            "port": 50051,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "grpc",
        }
    ]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    claim = one(objects, "PersistentVolumeClaim")
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"


def test_non_default_values_reach_the_objects(helm: Helm) -> None:
    objects = helm.template(NON_DEFAULT)
    assert not find(objects, "CustomResourceDefinition")
    assert not find(objects, "PersistentVolumeClaim"), "an existing claim is used, none made"
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == "rl"
        assert obj["metadata"]["name"].startswith(("forge-", "forge."))
    operator_deployment = one(objects, "Deployment", "forge-operator")
    operator = containers(operator_deployment)["operator"]
    assert operator["image"] == "ghcr.io/openforge/operator@sha256:" + "a" * 64
    assert operator["args"][:4] == [
        "--standalone",
        "--namespace=rl-a",
        "--namespace=rl-b",
        "--sidecar-image=ghcr.io/openforge/sidecar:0.1.0-rc1",
    ]
    assert operator["args"][-1] == "--verbose"
    assert "--all-namespaces" not in operator["args"]
    pod = operator_deployment["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "ghcr-pull"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}

    trainer_deployment = one(objects, "Deployment", "forge-trainer")
    pod = trainer_deployment["spec"]["template"]["spec"]
    assert list(containers(trainer_deployment)) == ["collector", "trainer"]
    collector = containers(trainer_deployment)["collector"]
    assert "--token-file=/var/run/openforge/collector-token/token" in collector["args"]
    token_volume = next(v for v in pod["volumes"] if v["name"] == "collector-token")
    assert token_volume["secret"]["secretName"] == "collector-token"
    assert token_volume["secret"]["items"] == [{"key": "bearer", "path": "token"}]
    trainer = containers(trainer_deployment)["trainer"]
    assert trainer["args"] == [
        "--store=/data/store.db",
        "--job=react-toy",
        "--model=/opt/openforge/models/tiny-react",
        "--run-dir=/data/runs/react-toy",
        "--device=cuda",
        "--serve=http://policy.rl.svc:8000",
        # the policy server is another pod: it cannot read the trainer's checkpoint path
        "--serve-publish=bytes",
    ]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "trajectories"}} in pod[
        "volumes"
    ]
    assert pod["tolerations"] == NON_DEFAULT["trainer"]["tolerations"]


def master_key_mounts(deployment: dict[str, Any], container: str) -> list[str]:
    """The Secret and key each container's master-key file comes from (the volume behind its
    mount)."""
    pod = deployment["spec"]["template"]["spec"]
    mount = next(
        (
            m
            for m in containers(deployment)[container].get("volumeMounts", [])
            if m["name"] == "collector-master-key"
        ),
        None,
    )
    if mount is None:
        return []
    assert mount["readOnly"] is True and MASTER_KEY_FILE.startswith(mount["mountPath"] + "/")
    volume = next(v for v in pod["volumes"] if v["name"] == "collector-master-key")["secret"]
    assert volume["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 65532
    [item] = volume["items"]
    assert item["path"] == MASTER_KEY_FILE.rsplit("/", 1)[1]
    return [volume["secretName"], item["key"]]


def test_the_operator_and_the_collector_share_a_generated_master_key(helm: Helm) -> None:
    objects = helm.template()
    secret = one(objects, "Secret", "of-openforge-collector-master-key")
    key = base64.b64decode(secret["data"]["master-key"]).decode()
    assert len(key) == 64 and key.isalnum()
    assert secret["immutable"] is True, "a render that cannot read the key back must not replace it"
    assert base64.b64decode(one(helm.template(), "Secret")["data"]["master-key"]).decode() != key, (
        "random per install"
    )
    operator = one(objects, "Deployment", "of-openforge-operator")
    trainer = one(objects, "Deployment", "of-openforge-trainer")
    assert (
        master_key_mounts(operator, "operator")
        == master_key_mounts(trainer, "collector")
        == ["of-openforge-collector-master-key", "master-key"]
    )
    parsed, _ = cli.options(containers(operator)["operator"]["args"])
    assert parsed.collector_master_key_file == MASTER_KEY_FILE
    assert f"--master-key-file={MASTER_KEY_FILE}" in containers(trainer)["collector"]["args"]
    notes = helm.run("install", "of", str(CHART), "--namespace", "rl", "--dry-run=client").split(
        "NOTES:", 1
    )[1]
    assert "master key in Secret of-openforge-collector-master-key" in notes


def test_an_existing_master_key_secret_is_mounted_and_none_is_made(helm: Helm) -> None:
    objects = helm.template({"collectorTokens": {"existingSecret": "forge-key", "key": "k"}})
    assert not find(objects, "Secret")
    operator = one(objects, "Deployment", "of-openforge-operator")
    trainer = one(objects, "Deployment", "of-openforge-trainer")
    assert (
        master_key_mounts(operator, "operator")
        == master_key_mounts(trainer, "collector")
        == ["forge-key", "k"]
    )


def test_collector_tokens_off_leave_no_key_anywhere(helm: Helm) -> None:
    objects = helm.template({"collectorTokens": {"enabled": False}})
    assert not find(objects, "Secret")
    operator = one(objects, "Deployment", "of-openforge-operator")
    trainer = one(objects, "Deployment", "of-openforge-trainer")
    assert master_key_mounts(operator, "operator") == master_key_mounts(trainer, "collector") == []
    assert not any(
        "master-key" in arg
        for arg in containers(operator)["operator"]["args"]
        + containers(trainer)["collector"]["args"]
    )
    assert "collector-master-key" not in {
        v["name"] for d in (operator, trainer) for v in d["spec"]["template"]["spec"]["volumes"]
    }


def test_persistence_off_uses_an_empty_dir(helm: Helm) -> None:
    objects = helm.template({"trainer": {"persistence": {"enabled": False}}})
    assert not find(objects, "PersistentVolumeClaim")
    pod = one(objects, "Deployment", "of-openforge-trainer")["spec"]["template"]["spec"]
    assert {"name": "data", "emptyDir": {}} in pod["volumes"]


def test_the_verl_engine_needs_the_jobs_tasks(helm: Helm) -> None:
    train = {"enabled": True, "job": "j", "model": "/m", "engine": "verl"}
    with pytest.raises(HelmError, match=r"trainer\.train\.tasks is required"):
        helm.template({"trainer": {"train": train}})
    with pytest.raises(HelmError, match="engine"):  # the schema names the field
        helm.template({"trainer": {"train": {**train, "engine": "ray"}}})
    objects = helm.template({"trainer": {"train": {**train, "tasks": ["a", "b"]}}})
    (trainer,) = [
        c
        for c in one(objects, "Deployment", "of-openforge-trainer")["spec"]["template"]["spec"][
            "containers"
        ]
        if c["name"] == "trainer"
    ]
    assert trainer["command"] == ["openforge", "train-verl"]
    assert trainer["args"][-4:] == ["--task=a", "--task=b", "--batch=", "--keep-running"]


def test_trainer_off_leaves_only_the_operator(helm: Helm) -> None:
    objects = helm.template({"trainer": {"enabled": False}})
    assert {o["kind"] for o in objects} == {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Secret",
    }
    assert one(objects, "Secret")["metadata"]["name"] == "of-openforge-collector-master-key", (
        "the operator still issues tokens"
    )
    assert [d["metadata"]["name"] for d in find(objects, "Deployment")] == ["of-openforge-operator"]


@pytest.mark.parametrize(
    ("release", "expected"), [("openforge", "openforge-operator"), ("rl", "rl-openforge-operator")]
)
def test_names_do_not_repeat_the_chart_name(helm: Helm, release: str, expected: str) -> None:
    assert one(helm.template(release=release), "Deployment", expected)


def test_operator_arguments_parse_with_the_operators_own_cli(helm: Helm) -> None:
    for values, sidecar in (
        (None, f"ghcr.io/openforge/sidecar:{APP_VERSION}"),
        (NON_DEFAULT, "ghcr.io/openforge/sidecar:0.1.0-rc1"),
    ):
        name = "forge-operator" if values else "of-openforge-operator"
        operator = containers(one(helm.template(values), "Deployment", name))["operator"]
        parsed, config = cli.options(operator["args"])
        assert parsed.standalone is True
        assert config.sidecar_image == sidecar
        assert config.sidecar_resources == (
            values["operator"]["sidecarResources"]
            if values
            else settings.Settings().sidecar_resources
        )
    assert parsed.namespace == ["rl-a", "rl-b"] and not parsed.all_namespaces
    assert parsed.webhook is True


def test_webhook_gets_a_service_and_a_configuration_the_operator_fills(helm: Helm) -> None:
    objects = helm.template({"operator": {"webhook": {"enabled": True}}})
    operator_deployment = one(objects, "Deployment", "of-openforge-operator")
    operator = containers(operator_deployment)["operator"]
    parsed, _ = cli.options(operator["args"])
    service = one(objects, "Service", "of-openforge-operator-webhook")
    assert parsed.webhook_host == "of-openforge-operator-webhook.openforge.svc"
    # the API server reaches it through the Service (its resolver knows no *.svc names)
    assert parsed.webhook_service == ("openforge", "of-openforge-operator-webhook")
    assert service["spec"]["ports"] == [
        {
            "name": "webhook",
            "port": parsed.webhook_port,
            "targetPort": "webhook",
            "protocol": "TCP",
            "appProtocol": "https",
        }
    ]
    assert {"name": "webhook", "containerPort": parsed.webhook_port, "protocol": "TCP"} in operator[
        "ports"
    ]
    assert service["spec"]["selector"] == operator_deployment["spec"]["selector"]["matchLabels"]
    for kind in (
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ):  # kopf manages both
        configuration = one(objects, kind)
        assert (
            configuration["metadata"]["name"]
            == parsed.webhook_configuration
            == "of-openforge-capture"
        )
        assert "webhooks" not in configuration, (
            "the operator owns the webhooks; Helm must not overwrite them"
        )
    # kopf names each webhook HANDLER.CONFIGURATION; the API server wants >= 3 segments.
    assert len(f"{webhook.HANDLER_ID}.{parsed.webhook_configuration}".split(".")) >= 3


def test_notes_print_the_collector_endpoint(helm: Helm) -> None:
    out = helm.run("install", "of", str(CHART), "--namespace", "rl", "--dry-run=client")
    notes = out.split("NOTES:", 1)[1]
    assert "of-openforge-collector.rl.svc:50051" in notes
    assert "every namespace" in notes
    out = helm.run(
        "install", "of", str(CHART), "--namespace", "rl", "--dry-run=client", values=NON_DEFAULT
    )
    notes = out.split("NOTES:", 1)[1]
    assert "the namespaces rl-a, rl-b" in notes
    assert "crds.install=false" in notes
    assert "RolloutJob react-toy" in notes
