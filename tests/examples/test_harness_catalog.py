"""The harness catalog (examples/harnesses/<name>/): complete, valid, runnable both ways.

Without any harness CLI: every entry's HarnessEnv validates, is Ready for a
cluster and becomes a rollout pod; its local recipe runs its own launcher in
the rollout's directory; its Dockerfile pins the CLI at the version the
install script pins, runs non-root and copies every file the manifest's
commands name; its launcher builds the CLI's configuration and environment
and keeps its answer (tried with stand-in CLIs, as real processes); and the
committed conformance matrix has a row for it. The runs with the real CLIs
are tests/harnesses/test_conformance.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from openforge.api import manifests, v1alpha1
from openforge_operator import pods, readiness, settings, tasks
from openforge_runner import plan

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "examples" / "harnesses"
TOY_TASKS = ROOT / "examples" / "tasks" / "toy-tools" / "tasks.jsonl"
INSTALL_SCRIPTS = (
    ROOT / "scripts" / "install_harnesses.sh",
    ROOT / "scripts" / "install_zeroclaw.sh",
)
NAMES = sorted(p.parent.name for p in CATALOG.glob("*/harnessenv.yaml"))
BUILT_IN = {"react", "gui-browser"}  # agents of this repository: no third-party CLI to pin
LAUNCHED = [n for n in NAMES if (CATALOG / n / "run.py").is_file() and n != "codex"]

sys.path.insert(0, str(ROOT / "tests" / "harnesses"))
import conformance  # noqa: E402


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"catalog_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def harness_env(name: str) -> v1alpha1.HarnessEnv:
    (env,) = manifests.load_manifests(CATALOG / name / "harnessenv.yaml")
    assert isinstance(env, v1alpha1.HarnessEnv)
    return env


def toy_task(task_id: str = "train-000") -> dict[str, Any]:
    rows = [json.loads(line) for line in TOY_TASKS.read_text().splitlines() if line.strip()]
    return next(row for row in rows if row["id"] == task_id)


def on_toy_tasks(name: str) -> bool:
    """Whether the entry runs the toy tasks (the GUI agent has web-forms tasks of its own)."""
    tasks: Path = conformance.CATALOG[name].tasks
    return tasks == TOY_TASKS


def own_task(name: str) -> dict[str, Any]:
    """The first task the entry's conformance run uses, from its own task file."""
    entry = conformance.CATALOG[name]
    rows = [json.loads(line) for line in entry.tasks.read_text().splitlines() if line.strip()]
    return next(row for row in rows if row["id"] == entry.task_ids[0])


def test_the_catalog_holds_the_harnesses_and_each_folder_is_complete() -> None:
    assert {"react", "codex", "claude-code", "openclaw", "gemini-cli"} <= set(NAMES)
    assert set(NAMES) <= set(conformance.CATALOG), (
        "register every catalog harness in conformance.CATALOG"
    )
    for name in NAMES:
        for part in ("harnessenv.yaml", "Dockerfile", "README.md"):
            assert (CATALOG / name / part).is_file(), f"{name}/{part}"


@pytest.mark.parametrize("name", NAMES)
def test_the_manifest_is_a_valid_harness_env_ready_for_a_cluster(name: str) -> None:
    env = harness_env(name)
    assert env.metadata.name == name
    assert readiness.check(env).ready, readiness.check(env)
    container = env.spec.harness_container()
    assert container.image == f"ghcr.io/openforge/{name}-harness:0.1.0"
    assert env.spec.grader is not None and env.spec.grader.reward_from == "stdout-json"
    if on_toy_tasks(name):
        assert env.spec.task.env is not None
        assert "{{ task.prompt }}" in env.spec.task.env["TASK_PROMPT"]
    else:  # reads its task from its own task file, by id
        assert '--task-id "$OPENFORGE_TASK_ID"' in " ".join(container.args or [])


@pytest.mark.parametrize("name", NAMES)
def test_the_operator_builds_a_rollout_pod_that_delivers_the_task(name: str) -> None:
    env = harness_env(name)
    task = own_task(name)
    job = v1alpha1.RolloutJob.model_validate({
        "apiVersion": "openforge.dev/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": "catalog", "namespace": "rl",
                     "uid": "0b6e5c1a-2f43-4c55-9d8e-3a1f6f0e7c11"},
        "spec": {"harnessEnvRef": {"name": name}, "tasks": {"inline": [task]},
                 "policy": {"model": "policy", "endpoint": "http://policy.rl.svc:8000"}},
    })  # fmt: skip
    env = env.model_copy(update={"metadata": env.metadata.model_copy(update={"namespace": "rl"})})
    rollout = tasks.rollout([task], 1, index=0)
    config = settings.Settings()
    pod = pods.build_pod(job=job, env=env, rollout=rollout, attempt=0, config=config)
    harness = next(c for c in pod["spec"]["containers"] if c["name"] == v1alpha1.HARNESS_CONTAINER)
    environment = {e["name"]: e.get("value") for e in harness["env"]}
    if on_toy_tasks(name):
        assert environment["TASK_PROMPT"].startswith(task["prompt"])
    assert environment["OPENFORGE_TASK_ID"] == task["id"]
    assert env.spec.base_url is not None
    for variable in env.spec.base_url.env:
        assert (
            environment[variable]
            == f"http://127.0.0.1:{config.sidecar_port}{env.spec.base_url.suffix}"
        )
    assert f"/opt/openforge/harnesses/{name}/" in " ".join(harness["args"])
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def job_for(name: str, tmp_path: Path) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(
        conformance.job_yaml(
            name, tasks_file=conformance.CATALOG[name].tasks, engine_url="http://127.0.0.1:9"
        )
    )
    return job


@pytest.mark.parametrize("name", NAMES)
def test_the_local_recipe_runs_its_own_files_in_the_rollouts_directory(
    name: str, tmp_path: Path
) -> None:
    bundle = plan.load([CATALOG / name / "harnessenv.yaml", job_for(name, tmp_path)])
    rollout = plan.rollouts_for(bundle, 0)[0]
    work = tmp_path / "rollout" / "work"
    command = plan.harness_command(bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=work)
    assert command.cwd == work  # not the container's /work
    assert command.env["OPENFORGE_HARNESS_DIR"] == str(CATALOG / name)
    if on_toy_tasks(name):
        assert command.env["TASK_PROMPT"].startswith(rollout.task["prompt"])
    assert command.env["OPENFORGE_TASK_ID"] == rollout.task_id
    # Files named by "$OPENFORGE_HARNESS_DIR/..." in a shell line, or by ${...} (expanded here).
    named = re.findall(r'"\$OPENFORGE_HARNESS_DIR/([^"]+)"', " ".join(command.argv))
    named += [
        a.removeprefix(f"{CATALOG / name}/")
        for a in command.argv
        if a.startswith(f"{CATALOG / name}/")
    ]
    assert named, command.argv
    for relative in named:
        assert (CATALOG / name / relative).resolve().is_file(), relative
    grader = plan.grader_command(
        bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=work, harness_exit=0
    )
    assert grader is not None and grader.env["OPENFORGE_HARNESS_DIR"] == str(CATALOG / name)


@pytest.mark.parametrize("name", NAMES)
def test_the_grader_finds_the_tasks_locally_and_in_the_image(name: str, tmp_path: Path) -> None:
    """The same grader command, run locally (harness dir set) and as in the image (unset)."""
    env = harness_env(name)
    assert env.spec.grader is not None
    task = own_task(name)
    solve(name, task, tmp_path)
    base = {
        "PATH": os.environ["PATH"],
        "OPENFORGE_TASK_ID": task["id"],
        "OPENFORGE_WORKDIR": str(tmp_path),
    }
    local = subprocess.run(
        env.spec.grader.command, env={**base, "OPENFORGE_HARNESS_DIR": str(CATALOG / name)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert json.loads(local.stdout)["reward"] == 1.0, local.stderr
    script = env.spec.grader.command[-1]
    task_dir = conformance.CATALOG[name].tasks.parent.name
    assert (
        f"${{OPENFORGE_HARNESS_DIR:-/opt/openforge/harnesses/{name}}}/../../tasks/{task_dir}"
        in script
    )
    (tmp_path / "answer.txt").unlink(missing_ok=True)
    (tmp_path / "web-forms-log.jsonl").unlink(missing_ok=True)
    unsolved = subprocess.run(
        env.spec.grader.command, env={**base, "OPENFORGE_HARNESS_DIR": str(CATALOG / name)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert json.loads(unsolved.stdout)["reward"] == 0.0, unsolved.stderr


def solve(name: str, task: dict[str, Any], workdir: Path) -> None:
    """Leave in ``workdir`` what the grader reads when the task was done."""
    if on_toy_tasks(name):
        (workdir / "answer.txt").write_text(task["answer"] + "\n")
        return
    # The web-forms site's log (examples/tasks/web-forms/webforms.py): the form submitted
    # with the task's values, or the task's page viewed last.
    expect = task["expect"]
    if "submit" in expect:
        submit = expect["submit"]
        events = [{"event": "submit", "form": submit["form"], "fields": submit["fields"]}]
    else:
        page = urllib.parse.urlsplit(expect["page"])
        events = [
            {"event": "view", "path": page.path, "query": dict(urllib.parse.parse_qsl(page.query))}
        ]
    (workdir / "web-forms-log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def install_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for script in INSTALL_SCRIPTS:
        pins.update(
            re.findall(r'^([A-Z0-9_]+_VERSION)="([^"]+)"$', script.read_text(), re.MULTILINE)
        )
    return pins


@pytest.mark.parametrize("name", NAMES)
def test_the_dockerfile_pins_runs_non_root_and_copies_what_the_manifest_runs(name: str) -> None:
    text = (CATALOG / name / "Dockerfile").read_text()
    assert f"-t ghcr.io/openforge/{name}-harness:0.1.0 ." in text
    for image in re.findall(r"^ARG [A-Z_]+_IMAGE=(\S+)$", text, re.MULTILINE):
        assert re.search(r":\d+(\.\d+)+-", image), f"unpinned base image {image}"
    pins = install_pins()
    versions = dict(re.findall(r"^ARG ([A-Z0-9_]+_VERSION)=(\S+)$", text, re.MULTILINE))
    pinned = {variable: pins[variable] for variable in versions if variable in pins}
    assert {variable: versions[variable] for variable in pinned} == pinned, (
        "as the install script pins"
    )
    assert pinned or name in BUILT_IN, "the CLI's version is an ARG named as in its install script"
    assert re.findall(r"^USER (\S+)$", text, re.MULTILINE)[-1] == "1000:1000"
    copies = re.findall(r"^COPY (\S+) (\S+)$", text, re.MULTILINE)
    for source, _ in copies:
        assert (ROOT / source).exists(), source
    env = harness_env(name)
    container = env.spec.harness_container()
    command = " ".join([*(container.command or []), *(container.args or [])])
    for path in re.findall(r"/opt/openforge/\S+\.py", command):
        source = next(
            (
                ROOT / src / Path(path).relative_to(dst)
                for src, dst in copies
                if path.startswith(dst)
            ),
            None,
        )
        assert source is not None and source.is_file(), f"{path} is not copied into the image"


# --- the launchers, with stand-in CLIs ----------------------------------------------------

STAND_IN = """\
#!{python}
import json, os, sys, tomllib
from pathlib import Path
record = {{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}
if "--config" in sys.argv:
    record["config"] = json.loads(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
if "--config-dir" in sys.argv:
    config_dir = Path(sys.argv[sys.argv.index("--config-dir") + 1])
    record["toml"] = tomllib.loads((config_dir / "config.toml").read_text())
settings = Path(os.environ["HOME"], ".gemini", "settings.json")
if settings.exists():
    record["settings"] = json.loads(settings.read_text())
Path({record!r}).write_text(json.dumps(record))
sys.stdout.write({output!r})
sys.exit({code})
"""


def printed(body: dict[str, Any]) -> str:
    """A JSON-printing CLI's stdout, after a line of noise."""
    return "some banner\n" + json.dumps(body) + "\n"


# Per launcher: the variable naming the CLI, its base-URL variable, what the CLI prints.
OUTPUTS = {
    "claude-code": (
        "CLAUDE_BIN", "ANTHROPIC_BASE_URL",
        printed({"type": "result", "is_error": False, "result": "Teal"}),
    ),
    "gemini-cli": (
        "GEMINI_BIN", "GOOGLE_GEMINI_BASE_URL", printed({"session_id": "s", "response": "Teal"}),
    ),
    "openclaw": (
        "OPENCLAW_BIN", "OPENAI_BASE_URL", printed({"ok": True, "status": "ok", "final": "Teal"}),
    ),
    "zeroclaw": ("ZEROCLAW_BIN", "OPENAI_BASE_URL", "Teal\n"),  # the final message only
}  # fmt: skip
FAILED = {
    "claude-code": printed({"type": "result", "is_error": True, "result": "API Error: 500"}),
    "gemini-cli": printed({"session_id": "s", "error": {"type": "x", "message": "m", "code": 1}}),
    "openclaw": printed({"ok": False, "status": "error", "final": ""}),
    "zeroclaw": "",
}


def stand_in(tmp_path: Path, output: str, code: int = 0) -> Path:
    path = tmp_path / "stand-in-cli"
    record = str(tmp_path / "record.json")
    path.write_text(STAND_IN.format(python=sys.executable, record=record, output=output, code=code))
    path.chmod(0o755)
    return path


def launch(
    name: str, tmp_path: Path, output: str, *, code: int = 0
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    variable, base_url, _ = OUTPUTS[name]
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ["PATH"], variable: str(stand_in(tmp_path, output, code)),
        base_url: "http://127.0.0.1:9/v1",
        "HTTPS_PROXY": "http://127.0.0.1:8", "SSL_CERT_FILE": "/ca.pem", "SECRET_TOKEN": "leak",
        "OPENFORGE_HARNESS_ROOT": str(tmp_path / "nothing-installed"),
        "OPENFORGE_CARGO_ROOT": str(tmp_path / "nothing-installed"),
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(CATALOG / name / "run.py"),
         "--prompt", "What color?", "--workdir", str(work)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    record = json.loads((tmp_path / "record.json").read_text())
    return done, record


@pytest.mark.parametrize("name", LAUNCHED)
def test_the_launcher_runs_the_cli_headless_in_a_clean_home_and_keeps_its_answer(
    name: str, tmp_path: Path
) -> None:
    output = OUTPUTS[name][2]
    done, record = launch(name, tmp_path, output)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "work" / "answer.txt").read_text() == "Teal\n"
    assert record["cwd"] == str(tmp_path / "work")
    assert "What color?" in record["argv"]
    env = record["env"]
    assert "SECRET_TOKEN" not in env  # the caller's environment does not leak in
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:8" and env["SSL_CERT_FILE"] == "/ca.pem"
    assert (
        env["HOME"] != os.environ.get("HOME") and not Path(env["HOME"]).exists()
    )  # fresh, then removed
    if name == "claude-code":
        assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/v1"
        assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["IS_SANDBOX"] == "1"
        assert {"-p", "--dangerously-skip-permissions", "--no-session-persistence"} <= set(
            record["argv"]
        )
        assert "--model" not in record["argv"]
    if name == "gemini-cli":
        assert env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:9/v1"
        assert env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
        assert record["argv"][record["argv"].index("--model") + 1] == "policy"
        assert record["settings"]["privacy"]["usageStatisticsEnabled"] is False
        assert record["settings"]["security"]["auth"]["selectedType"] == "gemini-api-key"
    if name == "zeroclaw":
        assert record["argv"][-5:] == ["agent", "-a", "main", "-m", "What color?"]
        config = record["toml"]
        provider = config["providers"]["models"]["custom"]["openforge"]
        assert provider["uri"] == "http://127.0.0.1:9/v1" and provider["native_tools"] is True
        assert config["agents"]["main"]["model_provider"] == "custom.openforge"
        assert config["agents"]["main"]["workspace"]["path"] == str(tmp_path / "work")
        assert config["risk_profiles"][config["agents"]["main"]["risk_profile"]]["level"] == "full"
        assert config["reliability"]["provider_retries"] == 0
    if name == "openclaw":
        provider = record["config"]["models"]["providers"]["openforge"]
        assert (
            provider["baseUrl"] == "http://127.0.0.1:9/v1" and provider["api"] == "openai-responses"
        )
        assert record["config"]["models"]["mode"] == "replace"
        assert record["config"]["update"]["checkOnStart"] is False
        assert env["OPENCLAW_NO_AUTO_UPDATE"] == "1" and env["DO_NOT_TRACK"] == "1"
        assert record["argv"][:2] == ["agent", "exec"]


@pytest.mark.parametrize("name", LAUNCHED)
def test_a_failed_cli_run_leaves_no_answer_and_fails(name: str, tmp_path: Path) -> None:
    done, _ = launch(name, tmp_path, FAILED[name], code=0)
    assert done.returncode == 3, done.stderr
    assert not (tmp_path / "work" / "answer.txt").exists()
    done, _ = launch(name, tmp_path, FAILED[name], code=1)
    assert done.returncode == 1


@pytest.mark.parametrize("name", LAUNCHED)
def test_the_launcher_needs_its_base_url_and_its_cli(name: str, tmp_path: Path) -> None:
    variable, base_url, _ = OUTPUTS[name]
    script = [
        sys.executable,
        str(CATALOG / name / "run.py"),
        "--prompt",
        "hi",
        "--workdir",
        str(tmp_path),
    ]
    bare = {
        "PATH": "/usr/bin:/bin",
        "OPENFORGE_HARNESS_ROOT": str(tmp_path),
        "OPENFORGE_CARGO_ROOT": str(tmp_path),
    }
    done = subprocess.run(script, env=bare, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and f"{base_url} is not set" in done.stderr
    done = subprocess.run(
        script,
        env={**bare, base_url: "http://127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and variable in done.stderr


# --- the conformance matrix -----------------------------------------------------------------


def test_the_committed_matrix_has_a_row_for_every_catalog_harness() -> None:
    doc = conformance.MATRIX_DOC.read_text()
    rows = conformance.parse_table(doc)
    assert rows and all(list(row) == list(conformance.COLUMNS) for row in rows)
    assert [row["harness"].strip("`") for row in rows if row["harness"].strip("`") in NAMES] == [
        n for n in conformance.CATALOG if n in NAMES
    ]
    assert set(NAMES) <= {row["harness"].strip("`") for row in rows}
    assert conformance.COMMAND in doc


def test_the_refusing_proxy_records_whoever_tries_to_leave() -> None:
    with conformance.refusing_proxy() as (proxy, seen):
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"http": proxy, "https": proxy})
        )
        with pytest.raises(OSError):
            opener.open("http://vendor.invalid/telemetry", timeout=10)
        with pytest.raises(OSError):
            opener.open("https://vendor.invalid/", timeout=10)
    assert seen == ["GET http://vendor.invalid/telemetry", "CONNECT vendor.invalid:443"]


def test_side_calls_are_counted_per_task() -> None:
    assert conformance.side_calls({}, escaped=0, tasks=2) == "none"
    counters = {"non_llm_passed": 2, "token_counts_answered": 4, "calls": 9}
    assert (
        conformance.side_calls(counters, escaped=1, tasks=2)
        == "1 non-model request, 2 token count, 0.5 outbound"
    )
