"""The RBAC rules are well-formed and say exactly what the modules use."""

from __future__ import annotations

import re
from pathlib import Path

from openforge_operator import permissions

SOURCE = Path(permissions.__file__).parent


def test_rules_are_policy_rules() -> None:
    for rule in permissions.rules(webhook=True, peering=True):
        assert set(rule) == {"apiGroups", "resources", "verbs"}
        assert rule["verbs"] and all(
            v in {"get", "list", "watch", "create", "update", "patch", "delete"}
            for v in rule["verbs"]
        )
        assert "*" not in rule["resources"] and "*" not in rule["verbs"]


def test_no_secret_is_readable() -> None:
    secrets = [r for r in permissions.RULES if "secrets" in r["resources"]]
    assert secrets == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]


def test_the_extras_are_opt_in() -> None:
    assert permissions.rules() == permissions.RULES
    assert permissions.rules(webhook=True) == permissions.RULES + permissions.WEBHOOK_RULES


def test_every_resource_the_operator_writes_has_a_rule() -> None:
    """A cheap cross-check of the code against the rules (the e2e tests run the operator
    under exactly these rules, which is the real check)."""
    code = "\n".join(p.read_text() for p in SOURCE.glob("*.py"))
    granted = {res for rule in permissions.RULES for res in rule["resources"]}
    for resource in set(re.findall(r'k8s\.namespaced\([^,]+, "([a-z]+)"', code)):
        assert resource in granted, resource
