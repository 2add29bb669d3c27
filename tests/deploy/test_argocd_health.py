"""The Argo CD health checks in deploy/argocd, run with a real Lua interpreter.

Argo CD runs a health script with the resource bound to the global ``obj`` and
reads ``status`` and ``message`` from the table it returns. Argo CD embeds
gopher-lua, a Lua 5.1; lupa's Lua 5.1 runtime stands in for it, with the
libraries Argo CD does not offer (io, os, debug, loaders) removed so a script
that leans on them fails here too. The cases live next to each script in Argo
CD's own ``health_test.yaml`` format, and every input is first validated with
the API models, so the checks are exercised on objects the operator can write.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import lupa.lua51 as lua51
import pytest
import yaml
from openforge.api import manifests, v1alpha1
from openforge_operator import readiness

ROOT = Path(__file__).resolve().parents[2]
CUSTOMIZATIONS = ROOT / "deploy" / "argocd" / "resource_customizations" / "openforge.dev"
ARGOCD_CM = ROOT / "deploy" / "argocd" / "argocd-cm.yaml"
DOCS = ROOT / "docs" / "cluster.md"
KINDS = ("RolloutJob", "HarnessEnv")
STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
UNSAFE_GLOBALS = (
    "io",
    "os",
    "debug",
    "require",
    "dofile",
    "loadfile",
    "load",
    "loadstring",
    "package",
)


def run_health(script: str, obj: dict[str, Any]) -> dict[str, str]:
    """Run ``script`` as Argo CD does: ``obj`` bound globally, the returned table read."""
    runtime = lua51.LuaRuntime(register_eval=False, register_builtins=False)
    lua_globals = runtime.globals()
    for name in UNSAFE_GLOBALS:
        lua_globals[name] = None
    lua_globals.obj = runtime.table_from(obj, recursive=True)
    result = runtime.execute(script)
    assert lua51.lua_type(result) == "table", f"the script returned {result!r}, not a table"
    return {key: result[key] for key in ("status", "message")}


def cases() -> list[Any]:
    found = []
    for kind in KINDS:
        spec = yaml.safe_load((CUSTOMIZATIONS / kind / "health_test.yaml").read_text())
        for case in spec["tests"]:
            found.append(pytest.param(kind, case, id=f"{kind}-{Path(case['inputPath']).stem}"))
    return found


@pytest.mark.parametrize(("kind", "case"), cases())
def test_health_of_each_sample_object(kind: str, case: dict[str, Any]) -> None:
    obj = yaml.safe_load((CUSTOMIZATIONS / kind / case["inputPath"]).read_text())
    parsed = manifests.parse(obj)  # a shape the API accepts, or this raises naming the field
    assert parsed.kind == kind
    script = (CUSTOMIZATIONS / kind / "health.lua").read_text()
    assert run_health(script, obj) == case["healthStatus"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_sample_is_a_case_and_the_statuses_are_argocds(kind: str) -> None:
    spec = yaml.safe_load((CUSTOMIZATIONS / kind / "health_test.yaml").read_text())
    inputs = {case["inputPath"] for case in spec["tests"]}
    on_disk = {
        f"testdata/{path.name}" for path in (CUSTOMIZATIONS / kind / "testdata").glob("*.yaml")
    }
    assert inputs == on_disk
    assert {case["healthStatus"]["status"] for case in spec["tests"]} <= STATUSES


def test_harnessenv_samples_say_what_the_operator_would() -> None:
    """Each sample's Ready condition, where it is for the current spec and not Unknown,
    is the operator's own verdict on that spec (reason and message)."""
    checked = 0
    for path in sorted((CUSTOMIZATIONS / "HarnessEnv" / "testdata").glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        status = obj.get("status") or {}
        ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
        if (
            ready is None
            or ready["status"] == "Unknown"
            or status.get("observedGeneration") != obj["metadata"]["generation"]
        ):
            continue
        env = manifests.parse(obj)
        assert isinstance(env, v1alpha1.HarnessEnv)
        verdict = readiness.check(env)
        assert (ready["status"] == "True", ready["reason"], ready["message"]) == (
            verdict.ready,
            verdict.reason,
            verdict.message,
        ), path.name
        checked += 1
    assert checked == 2


def test_rolloutjob_cases_cover_every_status_the_script_returns() -> None:
    spec = yaml.safe_load((CUSTOMIZATIONS / "RolloutJob" / "health_test.yaml").read_text())
    assert {case["healthStatus"]["status"] for case in spec["tests"]} == {
        "Healthy",
        "Progressing",
        "Degraded",
        "Suspended",
    }


def test_a_script_using_a_library_argocd_lacks_fails_here() -> None:
    with pytest.raises(lua51.LuaError, match="os"):
        run_health("return {status = os.getenv('HOME')}", {"metadata": {}})


def test_failed_wins_over_complete_and_suspended() -> None:
    conditions = [
        {
            "type": kind,
            "status": "True",
            "reason": kind,
            "message": f"{kind} says so",
            "lastTransitionTime": "2026-01-05T10:00:00Z",
        }
        for kind in ("Suspended", "Complete", "Failed")
    ]
    obj = {
        "metadata": {"name": "j", "generation": 1},
        "status": {"observedGeneration": 1, "conditions": conditions},
    }
    script = (CUSTOMIZATIONS / "RolloutJob" / "health.lua").read_text()
    assert run_health(script, obj) == {"status": "Degraded", "message": "Failed says so"}


def test_argocd_cm_carries_each_script_verbatim() -> None:
    patch = yaml.safe_load(ARGOCD_CM.read_text())
    assert list(patch) == ["data"], (
        "a merge patch of data only (metadata would have to match the namespace)"
    )
    assert patch["data"] == {
        f"resource.customizations.health.openforge.dev_{kind}": (
            CUSTOMIZATIONS / kind / "health.lua"
        ).read_text()
        for kind in KINDS
    }


def test_docs_show_the_argocd_cm_file() -> None:
    text = DOCS.read_text()
    blocks = re.findall(
        r"<!-- argocd-cm:begin -->\n```yaml\n(.*?)```\n<!-- argocd-cm:end -->", text, re.DOTALL
    )
    assert blocks == [ARGOCD_CM.read_text()], (
        "docs/cluster.md's argocd-cm block differs from deploy/argocd/argocd-cm.yaml; run "
        "scripts/sync_deploy_files.py"
    )
