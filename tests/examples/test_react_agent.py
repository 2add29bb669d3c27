"""The built-in ReAct harness and the toy-tools task, as separate real processes.

The agent runs against the deterministic test engine through a real sidecar
(which records into a real collector); the task's own scripts prepare the
working directory and grade. The captured prompts must be exactly what the
warm-start's demonstrations and the in-process evaluator render for the same
task: that is what lets a policy trained on those renderings behave the
same inside the harness.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from openforge_trainer.collection import store
from openforge_trainer.tiny import policy_eval, tokenizer_build, warmstart
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "harnesses" / "react" / "agent.py"
TASKS_DIR = ROOT / "examples" / "tasks" / "toy-tools"
TASK_FILE = TASKS_DIR / "tasks.jsonl"
TASK_ID = "eval-003"


def load_agent() -> ModuleType:
    spec = importlib.util.spec_from_file_location("react_agent", AGENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def task(task_id: str = TASK_ID) -> dict[str, Any]:
    return next(t for t in policy_eval.load_tasks(TASK_FILE) if t["id"] == task_id)


def script(
    name: str, *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def prepare(workdir: Path, task_id: str = TASK_ID) -> None:
    done = script(
        TASKS_DIR / "prepare.py",
        "--task-file",
        TASK_FILE,
        "--task-id",
        task_id,
        "--workdir",
        workdir,
    )
    assert done.returncode == 0, done.stderr


def grade(workdir: Path, task_id: str = TASK_ID) -> dict[str, Any]:
    done = script(
        TASKS_DIR / "grade.py", "--task-file", TASK_FILE, "--task-id", task_id, "--workdir", workdir
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_agent(base_url: str | None, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    if base_url is not None:
        env["OPENAI_BASE_URL"] = base_url
    return script(AGENT, *args, env=env)


@pytest.fixture
def stack(procs: Any, tmp_path: Path) -> dict[str, Any]:
    engine = procs.engine()
    collector = procs.collector()
    sidecar = procs.sidecar(
        "--collector",
        f"127.0.0.1:{collector.port}",
        "--job",
        "react",
        "--rollout-id",
        "r1",
        "--task-id",
        TASK_ID,
        "--harness",
        "react",
        engine=engine,
    )
    return {"sidecar": sidecar, "store": tmp_path / "store.db"}


def captured_calls(path: Path, sidecar: Any) -> list[store.ModelCall]:
    import httpx

    response = httpx.post(
        f"{sidecar.url}/openforge/v1/rollout/finish",
        json={"exit_code": 0, "wait_seconds": 20},
        timeout=30,
    )
    response.raise_for_status()
    with store.Store(path) as db:
        return db.calls("r1")


@pytest.mark.parametrize("stream", [False, True])
def test_agent_solves_a_task_through_the_sidecar_and_is_graded(
    stack: dict[str, Any], tmp_path: Path, stream: bool
) -> None:
    workdir = tmp_path / "work"
    prepare(workdir)
    transcript = tmp_path / "transcript.json"
    flags = ["--stream"] if stream else []
    done = run_agent(
        f"{stack['sidecar'].url}/v1",
        "--task-file",
        TASK_FILE,
        "--task-id",
        TASK_ID,
        "--workdir",
        workdir,
        "--transcript",
        transcript,
        *flags,
    )
    assert done.returncode == 0, done.stderr
    expected = task()["answer"]
    assert done.stdout.strip() == expected
    assert (workdir / "answer.txt").read_text().strip() == expected
    assert grade(workdir) == {
        "reward": 1.0,
        "task_id": TASK_ID,
        "answer": expected,
        "expected": expected,
    }
    messages = json.loads(transcript.read_text())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    call = messages[2]["tool_calls"][0]["function"]
    assert call["name"] == "lookup_color" and json.loads(call["arguments"]) == {
        "item": task()["item"]
    }
    assert messages[3]["content"] == expected

    # What the sidecar fed the policy is exactly what the warm-start and the
    # in-process evaluator render for this task.
    first, second = captured_calls(stack["store"], stack["sidecar"])
    player = policy_eval.Player(
        model=None,
        tokenizer=Tokenizer.from_file(str(tokenizer_build.committed_assets() / "tokenizer.json")),
        harness=warmstart.HarnessSpec.load(),
    )  # type: ignore[arg-type]
    _, prompt = player.first_prompt(task())
    assert list(first.prompt_token_ids) == prompt
    episode = policy_eval.Episode(
        TASK_ID, expected, messages=player.harness.messages(task()["prompt"])
    )
    following = player.advance(
        episode, task(), prompt=prompt, completion=list(first.completion_token_ids), last=False
    )
    assert list(second.prompt_token_ids) == following
    demo = warmstart.Demo(
        [
            *player.harness.messages(task()["prompt"]),
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [warmstart.lookup_call(task()["item"])],
            },
            {"role": "tool", "content": expected},
            {"role": "assistant", "content": expected},
        ],
        train_decision=True,
    )
    encoded = warmstart.encode(player.tokenizer, demo, tools=player.harness.tools)
    assert encoded.ids == list(second.prompt_token_ids) + list(
        second.completion_token_ids
    ) + player.encode("\n")


def test_grader_gives_zero_for_a_wrong_or_missing_answer(tmp_path: Path) -> None:
    prepare(tmp_path)
    assert grade(tmp_path)["reward"] == 0.0 and grade(tmp_path)["answer"] is None
    wrong = next(c for c in warmstart.TaskSpec.load().colors if c != task()["answer"])
    (tmp_path / "answer.txt").write_text(wrong)
    assert grade(tmp_path)["reward"] == 0.0
    (tmp_path / "answer.txt").write_text(f"  {task()['answer'].capitalize()}.\n")
    assert grade(tmp_path)["reward"] == 1.0


def test_agent_exit_codes(procs: Any, tmp_path: Path) -> None:
    assert run_agent(None, "--prompt", "hi", "--workdir", tmp_path).returncode == 2
    missing = run_agent(
        "http://127.0.0.1:9/v1",
        "--task-file",
        TASK_FILE,
        "--task-id",
        "nope",
        "--workdir",
        tmp_path,
    )
    assert missing.returncode == 2 and "no task with id 'nope'" in missing.stderr
    assert (
        run_agent("http://127.0.0.1:9/v1", "--prompt", "hi", "--workdir", tmp_path).returncode == 3
    )
    sidecar = procs.sidecar(engine=procs.engine())
    prepare(tmp_path)
    out_of_turns = run_agent(
        f"{sidecar.url}/v1",
        "--task-file",
        TASK_FILE,
        "--task-id",
        TASK_ID,
        "--workdir",
        tmp_path,
        "--max-turns",
        "1",
    )
    assert out_of_turns.returncode == 4, out_of_turns.stderr
    assert not (tmp_path / "answer.txt").exists()


def test_agent_runs_a_shell_task(procs: Any, tmp_path: Path) -> None:
    sidecar = procs.sidecar(engine=procs.engine())
    done = run_agent(
        f"{sidecar.url}/v1",
        "--prompt",
        "Please run `echo hello > out.txt && echo written`.",
        "--workdir",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Done: written"
    assert (tmp_path / "out.txt").read_text() == "hello\n"


def test_the_in_process_evaluator_answers_tools_as_the_agent_does(tmp_path: Path) -> None:
    prepare(tmp_path)
    tools = load_agent().Tools(tmp_path, shell_timeout=5)
    calls = [
        ("lookup_color", "{}"),
        ("lookup_color", json.dumps({"item": task()["item"]})),
        ("lookup_color", '{"item": "nothing"}'),
        ("read_file", '{"path": "colors.json"}'),
    ]
    for name, arguments in calls:
        result, faithful = policy_eval.run_tool(task(), name, arguments_json=arguments)
        assert faithful and result == tools.run(name, arguments), (name, arguments)
    assert policy_eval.run_tool(task(), "shell", arguments_json='{"command": "ls"}')[1] is False


def test_tools_run_locally_and_report_errors_to_the_model(tmp_path: Path) -> None:
    agent = load_agent()
    prepare(tmp_path)
    tools = agent.Tools(tmp_path, shell_timeout=0.5)
    assert tools.run("lookup_color", json.dumps({"item": task()["item"]})) == task()["answer"]
    assert tools.run("lookup_color", "{}") == task()["answer"]
    assert tools.run("lookup_color", '{"item": "nothing"}') == "error: no item named 'nothing'"
    (tmp_path / "colors.json").write_text('{"items": {"a": "red", "b": "blue"}}')
    assert tools.run("lookup_color", "{}") == "error: the database holds 2 items; name one"
    assert tools.run("lookup_color", '{"item": "b"}') == "blue"
    assert (
        tools.run("write_file", '{"path": "a/b.txt", "content": "hé"}')
        == "wrote 3 bytes to a/b.txt"
    )
    assert tools.run("read_file", '{"path": "a/b.txt"}') == "hé"
    assert tools.run("read_file", '{"path": "../outside"}').startswith(
        "error: path '../outside' is outside"
    )
    assert tools.run("shell", '{"command": "cat a/b.txt; exit 3"}') == "hé\n[exit code 3]"
    assert (
        tools.run("shell", '{"command": "sleep 5"}') == "error: the command timed out after 0.5 s"
    )
    assert tools.run("nope", "{}") == "error: there is no tool named 'nope'"
    assert tools.run("shell", "{not json").startswith("error: the arguments are not valid JSON")
    assert tools.run("shell", '{"cmd": "ls"}').startswith("error: bad arguments for shell")
