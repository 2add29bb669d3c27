"""The configuration reference (docs/reference.md) is what the models generate."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import pydantic
import pytest
from openforge.api import crds, reference, v1alpha1

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reference.md"


def test_committed_reference_is_what_the_models_generate() -> None:
    assert DOC.read_text() == reference.render(), "docs/reference.md is stale: run `openforge crds`"


def _models(annotation: object) -> list[type[pydantic.BaseModel]]:
    """The API models inside a field's type (``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def field_paths(model: type[pydantic.BaseModel], prefix: str) -> list[str]:
    """Every field path below ``model``, walked from the pydantic fields themselves."""
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}"
        paths.append(path)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get("x-openforge-opaque"):
            continue  # the pod template: kept whole, documented as one field
        container = typing.get_origin(field.annotation) in (list, dict) or any(
            typing.get_origin(arg) in (list, dict) for arg in typing.get_args(field.annotation)
        )
        for inner in _models(field.annotation):
            paths += field_paths(inner, path + ("[]" if container else ""))
    return paths


@pytest.mark.parametrize("model", [v1alpha1.HarnessEnv, v1alpha1.RolloutJob])
def test_every_spec_and_status_field_has_a_row(
    model: type[v1alpha1.HarnessEnv] | type[v1alpha1.RolloutJob],
) -> None:
    text = reference.kind_reference(model)
    rows = {line.split("`")[1] for line in text.splitlines() if line.startswith("| `")}
    spec = model.model_fields["spec"].annotation
    status = typing.get_args(model.model_fields["status"].annotation)[0]
    expected = field_paths(spec, "spec") + field_paths(status, "status")  # type: ignore[arg-type]
    assert sorted(rows) == sorted(expected)


def test_a_row_says_type_default_required_and_validation() -> None:
    text = reference.kind_reference(v1alpha1.RolloutJob)
    row = next(line for line in text.splitlines() if line.startswith("| `spec.samplesPerTask`"))
    cells = [cell.strip() for cell in row.strip("|").split(" | ")]
    assert cells == [
        "`spec.samplesPerTask`",
        "`integer`",
        "`1`",
        "",
        "Rollouts per task: the GRPO group size.",
        ">= 1; <= 4096; samplesPerTask is immutable (rollout indexes depend on it)",
    ]
    assert "| `spec.policy.model` | `string` |  | yes |" in text
    assert "| `spec.tasks.inline[].id` | `string` |  | yes |" in text
    assert "one of `Retry`, `FailRollout`, `Ignore`" in text
    assert "Object rule: a RolloutJob name has at most 63 characters" in text


def test_table_cells_escape_pipes() -> None:
    row = reference.Row("spec.x", "string", "", False, "a | b", "matches `x|y`")
    assert (
        reference.table([row]).splitlines()[-1]
        == "| `spec.x` | `string` |  |  | a \\| b | matches `x\\|y` |"
    )


def test_crds_command_writes_and_checks_the_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "docs" / "reference.md"
    argv = ["--output-dir", str(tmp_path / "crds"), "--reference", str(doc)]
    assert crds.main([*argv, "--check"]) == 1
    assert crds.main(argv) == 0
    assert doc.read_text() == reference.render()
    assert crds.main([*argv, "--check"]) == 0
    doc.write_text("stale")
    assert crds.main([*argv, "--check"]) == 1
    assert f"stale {doc}" in capsys.readouterr().err
