"""values.yaml and values.schema.json: helm rejects bad values naming the field,
the schema and the defaults describe the same keys, and every value is documented."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from helm_chart import CHART, Helm, HelmError

VALUES = CHART / "values.yaml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())

BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"operator": {"replicas": 2}}, "/operator", "additional properties 'replicas' not allowed"),
    ({"operatr": {}}, "", "additional properties 'operatr' not allowed"),
    ({"operator": {"image": {"tag": "bad:tag"}}}, "/operator/image/tag", "does not match pattern"),
    (
        {"operator": {"image": {"digest": "sha256:xyz"}}},
        "/operator/image/digest",
        "does not match pattern",
    ),
    ({"operator": {"image": {"pullPolicy": "Sometimes"}}}, "/operator/image/pullPolicy", "Always"),
    (
        {"operator": {"watchNamespaces": ["Team_A"]}},
        "/operator/watchNamespaces/0",
        "does not match pattern",
    ),
    (
        {"operator": {"watchNamespaces": ["a", "a"]}},
        "/operator/watchNamespaces",
        "items at 0 and 1 are equal",
    ),
    ({"operator": {"webhook": {"port": 0}}}, "/operator/webhook/port", "minimum"),
    ({"operator": {"fenceWaitSeconds": 120}}, "/operator/fenceWaitSeconds", "maximum"),
    (
        {"operator": {"resources": {"limit": {"cpu": 1}}}},
        "/operator/resources",
        "additional properties 'limit' not allowed",
    ),
    ({"crds": {"install": "yes"}}, "/crds/install", "got string, want boolean"),
    (
        {"collectorTokens": {"existingSecret": "Key_1"}},
        "/collectorTokens/existingSecret",
        "does not match pattern",
    ),
    ({"collectorTokens": {"key": ""}}, "/collectorTokens/key", "minLength"),
    (
        {"collectorTokens": {"enabled": "yes"}},
        "/collectorTokens/enabled",
        "got string, want boolean",
    ),
    ({"trainer": {"collector": {"port": 70000}}}, "/trainer/collector/port", "maximum"),
    ({"trainer": {"train": {"enabled": True}}}, "/trainer/train/job", "minLength"),
    ({"trainer": {"train": {"enabled": True, "job": "j"}}}, "/trainer/train/model", "minLength"),
    ({"trainer": {"train": {"device": "tpu"}}}, "/trainer/train/device", "does not match pattern"),
    (
        {"trainer": {"train": {"serve": ["policy:8000"]}}},
        "/trainer/train/serve/0",
        "does not match pattern",
    ),
    (
        {"trainer": {"persistence": {"size": "lots"}}},
        "/trainer/persistence/size",
        "does not match pattern",
    ),
    ({"trainer": {"service": {"type": "ExternalName"}}}, "/trainer/service/type", "ClusterIP"),
    ({"imagePullSecrets": [{"name": "x"}]}, "/imagePullSecrets/0", "got object, want string"),
]


@pytest.mark.parametrize(
    ("values", "field", "message"),
    BAD,
    ids=[f"{field or 'root'}:{message[:20]}" for _, field, message in BAD],
)
def test_bad_values_are_rejected_naming_the_field(
    helm: Helm, values: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(HelmError) as caught:
        helm.template(values)
    stderr = caught.value.stderr
    assert f"at '{field}'" in stderr, stderr
    assert message in stderr, stderr


def _ours(schema: dict[str, Any]) -> bool:
    """Whether a schema node is one of the chart's own groups of values, not a Kubernetes type."""
    return "properties" in schema and not str(schema.get("$comment", "")).startswith("a Kubernetes")


def _leaf_paths(
    schema: dict[str, Any], prefix: tuple[str, ...] = ()
) -> dict[tuple[str, ...], dict[str, Any]]:
    """Every key the schema declares, down to values that are free-form or Kubernetes types."""
    paths: dict[tuple[str, ...], dict[str, Any]] = {}
    for key, sub in schema.get("properties", {}).items():
        paths[(*prefix, key)] = sub
        if _ours(sub):
            paths.update(_leaf_paths(sub, (*prefix, key)))
    return paths


def _value_nodes(
    node: yaml.MappingNode, prefix: tuple[str, ...] = ()
) -> dict[tuple[str, ...], int]:
    """values.yaml's keys, as paths, with the line each is on (0-based); stops at free-form
    values."""
    found: dict[tuple[str, ...], int] = {}
    for key, value in node.value:
        path = (*prefix, key.value)
        found[path] = key.start_mark.line
        if isinstance(value, yaml.MappingNode) and _ours(_leaf_paths(SCHEMA).get(path, {})):
            found.update(_value_nodes(value, path))
    return found


def _values_root() -> yaml.MappingNode:
    root = yaml.compose(VALUES.read_text())
    assert isinstance(root, yaml.MappingNode)
    return root


def test_every_schema_key_has_a_default_and_a_description() -> None:
    declared = _leaf_paths(SCHEMA)
    defaults = _value_nodes(_values_root())
    assert set(defaults) == set(declared) - {("global",)}
    undescribed = [".".join(path) for path, sub in declared.items() if not sub.get("description")]
    assert not undescribed


def test_every_value_is_commented() -> None:
    lines = VALUES.read_text().splitlines()
    declared = _leaf_paths(SCHEMA)
    uncommented = [
        ".".join(path)
        for path, line in _value_nodes(_values_root()).items()
        if not _ours(declared[path]) and not lines[line - 1].strip().startswith("#")
    ]  # fmt: skip
    assert not uncommented, f"values without a comment line above them: {uncommented}"


def test_the_defaults_pass_the_schema(helm: Helm) -> None:
    helm.template(yaml.safe_load(VALUES.read_text()))
