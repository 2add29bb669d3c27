"""The committed CRDs are exactly what the models generate, and are structural.

The structural checks here are written from the Kubernetes rules for CRD
schemas, independently of ``openforge.api.structural``, so a generator bug
cannot hide behind its own assumptions.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openforge.api import crds, v1alpha1

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
FILES = ["openforge.dev_harnessenvs.yaml", "openforge.dev_rolloutjobs.yaml"]
VALID = (Path(__file__).parent / "fixtures" / "valid.yaml").read_text()  # as in test_models

# JSONSchemaProps fields the API server accepts in a structural schema (apiextensions v1).
ALLOWED = {
    "description",
    "type",
    "format",
    "title",
    "default",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "multipleOf",
    "enum",
    "maxProperties",
    "minProperties",
    "required",
    "items",
    "properties",
    "additionalProperties",
    "nullable",
    "example",
    "externalDocs",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
}
TYPES = {"object", "array", "string", "integer", "number", "boolean"}
PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((CRD_DIR / name).read_text())
    return document


def schema_of(name: str) -> dict[str, Any]:
    result: dict[str, Any] = load(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return result


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}.*")


# -- golden -------------------------------------------------------------------------------


def test_committed_crds_are_what_the_models_generate() -> None:
    rendered = crds.render()
    assert sorted(rendered) == FILES
    for name, text in rendered.items():
        assert (CRD_DIR / name).read_text() == text, f"crds/{name} is stale: run `openforge crds`"


def test_main_writes_the_files_and_check_reports_staleness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert crds.main(["--check", "--output-dir", str(tmp_path)]) == 1
    assert crds.main(["--output-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == FILES
    capsys.readouterr()
    assert crds.main(["--check", "--output-dir", str(tmp_path)]) == 0
    assert (
        capsys.readouterr().out
        == f"up to date: {', '.join(str(tmp_path / name) for name in FILES)}\n"
    )
    assert crds.main(["--output-dir", str(tmp_path)]) == 0  # nothing to write: said so
    assert capsys.readouterr().out.startswith("up to date: ")
    (tmp_path / FILES[0]).write_text("stale")
    assert crds.main(["--check", "--output-dir", str(tmp_path)]) == 1
    assert f"stale {tmp_path / FILES[0]}" in capsys.readouterr().err


# -- structural ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", FILES)
def test_schema_is_structural(name: str) -> None:
    for path, node in nodes(schema_of(name)):
        where = path or "<root>"
        assert set(node) <= ALLOWED, f"{where}: {sorted(set(node) - ALLOWED)}"
        assert (
            node.get("type") in TYPES or node.get("x-kubernetes-preserve-unknown-fields") is True
        ), f"{where}: no type"
        if node.get("nullable"):
            assert "type" in node, f"{where}: nullable without a type"
        if node.get("type") == "object":
            assert not ("properties" in node and "additionalProperties" in node), where
            assert set(node.get("required", [])) <= set(node.get("properties", {})), (
                f"{where}: required names an unknown field"
            )
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict), f"{where}: array without items"
        if "exclusiveMinimum" in node or "exclusiveMaximum" in node:
            assert isinstance(node.get("exclusiveMinimum", False), bool), (
                f"{where}: OpenAPI v3.0 wants a boolean"
            )
        for value in node.get("enum", []):
            assert isinstance(value, PYTHON_TYPES[node["type"]]), (
                f"{where}: enum {value!r} is not a {node['type']}"
            )
        if "default" in node:
            assert isinstance(node["default"], PYTHON_TYPES[node["type"]]), f"{where}: default"
            assert node["default"] in node.get("enum", [node["default"]]), (
                f"{where}: default outside enum"
            )
        if node.get("x-kubernetes-list-type") == "map":
            keys = node["x-kubernetes-list-map-keys"]
            assert set(keys) <= set(node["items"].get("required", [])), (
                f"{where}: map keys must be required"
            )
        for rule in node.get("x-kubernetes-validations", []):
            assert set(rule) <= {
                "rule",
                "message",
                "messageExpression",
                "reason",
                "fieldPath",
                "optionalOldSelf",
            }
            assert isinstance(rule["rule"], str) and isinstance(rule["message"], str)


@pytest.mark.parametrize("name", FILES)
def test_envelope_is_the_standard_one(name: str) -> None:
    schema = schema_of(name)
    assert schema["type"] == "object" and schema["required"] == ["spec"]
    assert schema["properties"]["metadata"] == {"type": "object"}, (
        "metadata may restrict only name/generateName"
    )
    assert (
        schema["properties"]["apiVersion"]["type"]
        == schema["properties"]["kind"]["type"]
        == "string"
    )
    text = (CRD_DIR / name).read_text()
    assert "$ref" not in text and "anyOf" not in text and "title:" not in text and "&id" not in text


def test_pod_template_and_task_records_keep_unknown_fields() -> None:
    template = schema_of(FILES[0])["properties"]["spec"]["properties"]["template"]
    assert template == {
        "description": template["description"],
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    inline = schema_of(FILES[1])["properties"]["spec"]["properties"]["tasks"]["properties"][
        "inline"
    ]
    assert inline["items"]["x-kubernetes-preserve-unknown-fields"] is True
    assert inline["items"]["required"] == ["id"]
    assert inline["maxItems"] >= 1000


def test_optional_fields_are_nullable_and_not_required() -> None:
    spec = schema_of(FILES[1])["properties"]["spec"]
    assert spec["required"] == ["harnessEnvRef", "tasks", "policy"]
    for field in ("failurePolicy", "trainer", "training", "activeDeadlineSeconds"):
        assert spec["properties"][field]["nullable"] is True
    assert "nullable" not in spec["properties"]["parallelism"]


# -- CEL rules ------------------------------------------------------------------------------


def rules(node: dict[str, Any]) -> list[str]:
    return [rule["rule"] for rule in node.get("x-kubernetes-validations", [])]


def test_immutable_fields_have_transition_rules_and_parallelism_does_not() -> None:
    spec = schema_of(FILES[1])["properties"]["spec"]["properties"]
    for field in ("harnessEnvRef", "tasks", "samplesPerTask"):
        assert "self == oldSelf" in rules(spec[field]), field
        messages = [rule["message"] for rule in spec[field]["x-kubernetes-validations"]]
        assert any(message.startswith(f"{field} is immutable") for message in messages)
    assert rules(spec["parallelism"]) == []
    every_rule = [rule for _, node in nodes(schema_of(FILES[1])) for rule in rules(node)]
    assert sum("oldSelf" in rule for rule in every_rule) == 3


def test_exactly_one_task_source_and_one_failure_matcher_are_cel_rules() -> None:
    spec = schema_of(FILES[1])["properties"]["spec"]["properties"]
    (one_source,) = [rule for rule in rules(spec["tasks"]) if "exists_one" in rule]
    assert all(f"has(self.{field})" in one_source for field in ("inline", "configMapRef", "file"))
    matcher = spec["failurePolicy"]["properties"]["rules"]["items"]
    assert rules(matcher) == ["has(self.onExitCodes) != has(self.onReasons)"]
    assert rules(schema_of(FILES[1])) == ["size(self.metadata.name) <= 63"]


def test_cel_rules_name_only_fields_that_exist() -> None:
    for name in FILES:
        for path, node in nodes(schema_of(name)):
            for rule in rules(node):
                for field in re.findall(r"self\.(\w+)", rule):
                    assert field in node.get("properties", {}) or field == "metadata", (
                        f"{path}: {rule}"
                    )


# -- presentation -------------------------------------------------------------------------


def resolve(schema: dict[str, Any], json_path: str) -> dict[str, Any] | None:
    """The schema node a printer-column JSONPath reaches (filters step into list items)."""
    node: dict[str, Any] | None = schema
    for part in re.sub(r"\[\?\(.*?\)\]", "[]", json_path).strip(".").split("."):
        name, _, rest = part.partition("[")
        node = (node or {}).get("properties", {}).get(name)
        if rest:
            node = (node or {}).get("items")
    return node


@pytest.mark.parametrize("name", FILES)
def test_printer_columns_point_at_fields_of_their_type(name: str) -> None:
    version = load(name)["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    assert [c["name"] for c in version["additionalPrinterColumns"]][-1:] != []
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            continue
        node = resolve(schema, column["jsonPath"])
        assert node is not None, column
        assert node["type"] == column["type"], column


def test_names_subresources_and_columns() -> None:
    harness, job = load(FILES[0])["spec"], load(FILES[1])["spec"]
    assert harness["names"]["shortNames"] == ["henv"] and job["names"]["shortNames"] == ["rj"]
    assert [c["name"] for c in harness["versions"][0]["additionalPrinterColumns"]] == [
        "API",
        "Capture",
        "Ready",
        "Age",
    ]
    job_columns = [c["name"] for c in job["versions"][0]["additionalPrinterColumns"]]
    assert {"Succeeded", "Failed", "Active", "Age"} <= set(job_columns)
    assert harness["versions"][0]["subresources"] == {"status": {}}
    scale = job["versions"][0]["subresources"]["scale"]
    schema = job["versions"][0]["schema"]["openAPIV3Schema"]
    assert (
        resolve(schema, scale["specReplicasPath"])
        == schema["properties"]["spec"]["properties"]["parallelism"]
    )
    assert (resolve(schema, scale["statusReplicasPath"]) or {})["type"] == "integer"
    for spec, model in ((harness, v1alpha1.HarnessEnv), (job, v1alpha1.RolloutJob)):
        assert (
            load(FILES[0 if model is v1alpha1.HarnessEnv else 1])["metadata"]["name"]
            == f"{spec['names']['plural']}.{spec['group']}"
        )
        assert spec["names"]["kind"] == model.KIND and spec["group"] == v1alpha1.GROUP


# -- the CRD schema and the models agree --------------------------------------------------


def as_json_schema(node: Any) -> Any:
    """OpenAPI v3.0 (as the CRD has it) -> JSON Schema draft 4, which shares boolean
    exclusiveMinimum."""
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: as_json_schema(v)
        for k, v in node.items()
        if not k.startswith("x-") and k not in ("nullable", "default")
    }
    if k_props := node.get("properties"):
        out["properties"] = {name: as_json_schema(child) for name, child in k_props.items()}
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def test_the_crd_schemas_accept_what_the_models_accept_and_refuse_some_of_what_they_refuse() -> (
    None
):
    jsonschema = pytest.importorskip("jsonschema")
    validators = {
        kind: jsonschema.Draft4Validator(as_json_schema(schema_of(name)))
        for kind, name in (("HarnessEnv", FILES[0]), ("RolloutJob", FILES[1]))
    }
    for document in yaml.safe_load_all(VALID):
        errors = list(validators[document["kind"]].iter_errors(document))
        assert errors == [], [error.message for error in errors]
    job = list(yaml.safe_load_all(VALID))[1]
    for field, value in (
        ("samplesPerTask", 0),
        ("parallelism", "2"),
        ("suspend", "no"),
        ("policy", {"version": 1}),
    ):
        bad = job | {"spec": job["spec"] | {field: value}}
        assert list(validators["RolloutJob"].iter_errors(bad)), field
