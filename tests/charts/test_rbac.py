"""The operator's RBAC in the chart is exactly openforge_operator.permissions:
RULES always, WEBHOOK_RULES only with the webhook, in a ClusterRole when the
operator serves every namespace and in per-namespace Roles (plus a ClusterRole
for cluster-scoped resources only) when it serves a list."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from helm_chart import CHART, ROOT, Helm, find, grants, one
from openforge_operator import permissions

OPERATOR = "of-openforge-operator"
SUBJECT = [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": "openforge"}]


def sync_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sync_deploy_files", ROOT / "scripts" / "sync_deploy_files.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rbac_file_is_generated_from_permissions() -> None:
    assert (CHART / "files" / "rbac.yaml").read_text() == sync_script().rbac_yaml(), (
        "charts/openforge/files/rbac.yaml is stale; run scripts/sync_deploy_files.py"
    )


def test_cluster_wide_role_is_exactly_the_rules(helm: Helm) -> None:
    objects = helm.template()
    assert one(objects, "ClusterRole", OPERATOR)["rules"] == permissions.RULES
    binding = one(objects, "ClusterRoleBinding", OPERATOR)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": OPERATOR,
    }
    assert binding["subjects"] == SUBJECT
    assert not find(objects, "Role") and not find(objects, "RoleBinding")


def test_webhook_adds_exactly_the_webhook_rules(helm: Helm) -> None:
    objects = helm.template({"operator": {"webhook": {"enabled": True}}})
    assert (
        one(objects, "ClusterRole", OPERATOR)["rules"]
        == permissions.RULES + permissions.WEBHOOK_RULES
    )


def test_per_namespace_roles_grant_the_rules_in_those_namespaces_only(helm: Helm) -> None:
    for webhook in (False, True):
        objects = helm.template(
            {"operator": {"watchNamespaces": ["rl-a", "rl-b"], "webhook": {"enabled": webhook}}}
        )
        roles = find(objects, "Role")
        assert sorted(role["metadata"]["namespace"] for role in roles) == ["rl-a", "rl-b"]
        for role in roles:
            namespace = role["metadata"]["namespace"]
            binding = one(objects, "RoleBinding", OPERATOR, namespace)
            assert binding["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": OPERATOR,
            }
            assert binding["subjects"] == SUBJECT
        cluster_roles = find(objects, "ClusterRole")
        cluster_rules = cluster_roles[0]["rules"] if cluster_roles else []
        wanted = permissions.RULES + (permissions.WEBHOOK_RULES if webhook else [])
        for role in roles:
            assert grants(role["rules"]) | grants(cluster_rules) == grants(wanted)
        # Nothing namespaced is granted cluster-wide.
        assert grants(cluster_rules) <= grants(permissions.WEBHOOK_RULES if webhook else [])
        assert bool(find(objects, "ClusterRoleBinding")) == bool(cluster_roles) == webhook


def test_rbac_off_renders_no_roles(helm: Helm) -> None:
    objects = helm.template({"operator": {"rbac": {"create": False}}})
    assert not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} & {
        o["kind"] for o in objects
    }


def test_existing_service_account_is_used_by_name(helm: Helm) -> None:
    objects = helm.template({"operator": {"serviceAccount": {"create": False, "name": "forge-op"}}})
    assert not find(objects, "ServiceAccount", "forge-op")
    assert (
        one(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]["serviceAccountName"]
        == "forge-op"
    )
    assert one(objects, "ClusterRoleBinding", OPERATOR)["subjects"][0]["name"] == "forge-op"
