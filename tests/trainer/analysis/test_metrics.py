from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from openforge_trainer.analysis import episodes as ep
from openforge_trainer.analysis import metrics as analysis
from openforge_trainer.analysis.metrics import Kind

DOC = Path(__file__).resolve().parents[3] / "docs" / "analysis.md"


def act(
    name: str,
    arguments: Any = None,
    result: str | None = "ok",
    *,
    flagged: bool | None = None,
    call: int = 0,
) -> ep.Action:
    outcome = None if result is None else ep.ToolResult(result, flagged)
    return ep.Action(call, 0, "", name, {} if arguments is None else arguments, outcome)


def episode(
    actions: Sequence[ep.Action] = (),
    *,
    texts: Sequence[str] | None = None,
    reward: float | None = 1.0,
    tools: Sequence[str] | None = None,
    harness: str = "h",
    version: int = 0,
) -> ep.Episode:
    """An episode; by default one model call per action plus a final one."""
    if texts is None:
        texts = [""] * (max((a.call_index for a in actions), default=-1) + 2)
    turns = tuple(
        ep.Turn(
            call_index=i,
            wire_api="WIRE_API_OPENAI_CHAT",
            policy_version=version,
            text=text,
            actions=sum(a.call_index == i for a in actions),
            failed=False,
            final=i == len(texts) - 1,
        )
        for i, text in enumerate(texts)
    )
    offered = {a.name for a in actions} if tools is None else set(tools)
    return ep.Episode(
        rollout_id="r", job="j", task_id="t", harness=harness, policy_version=version,
        status="succeeded", reward=reward, turns=turns, actions=tuple(actions),
        tools_offered=frozenset(offered),
    )  # fmt: skip


def calls(*actions: ep.Action) -> list[ep.Action]:
    """The actions, each in its own model call, in order."""
    return [ep.Action(i, 0, a.id, a.name, a.arguments, a.result) for i, a in enumerate(actions)]


# -- tool kinds ---------------------------------------------------------------------------


def test_the_documented_mapping_is_the_code_mapping() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("<!-- tool-kinds:begin -->")[1].split("<!-- tool-kinds:end -->")[0]
    rows = re.findall(r"^\| `([^`]+)` \| (\w+) \|", table, re.MULTILINE)
    assert {name: Kind(kind) for name, kind in rows} == analysis.TOOL_KINDS
    assert len(rows) == len(analysis.TOOL_KINDS)  # no row twice


@pytest.mark.parametrize(
    ("name", "arguments", "kind"),
    [
        ("read_file", {}, Kind.READ),  # ReAct / Gemini CLI
        ("apply_patch", {}, Kind.EDIT),  # Codex
        ("update_plan", {}, Kind.PLAN),
        ("Bash", {}, Kind.SHELL),  # Claude Code
        ("TodoWrite", {}, Kind.PLAN),
        ("exec", {}, Kind.SHELL),  # OpenClaw
        ("run_shell_command", {}, Kind.SHELL),  # Gemini CLI
        ("file_write", {}, Kind.WRITE),  # ZeroClaw
        ("WRITE_FILE", {}, Kind.WRITE),  # case-insensitive lookup
        ("runTerminalCommand", {}, Kind.SHELL),  # heuristic from here on
        ("createFile", {}, Kind.WRITE),
        ("create_issue", {}, Kind.OTHER),
        ("view_image", {}, Kind.READ),
        ("todo_list", {}, Kind.PLAN),
        ("str_edit", {}, Kind.EDIT),
        ("lookup_color", {}, Kind.OTHER),
        ("thread_summary", {}, Kind.OTHER),  # "read" inside a word is no read
        ("str_replace_editor", {"command": "view"}, Kind.READ),
        ("str_replace_based_edit_tool", {"command": "create"}, Kind.WRITE),
        ("str_replace_editor", {"command": "str_replace"}, Kind.EDIT),
    ],
)
def test_kind_of(name: str, arguments: dict[str, Any], kind: Kind) -> None:
    assert analysis.kind_of(act(name, arguments)) is kind


def test_name_tokens() -> None:
    assert analysis.name_tokens("runShellCommand") == ["run", "shell", "command"]
    assert analysis.name_tokens("read-many_files.v2") == ["read", "many", "files", "v2"]


# -- paths and commands -----------------------------------------------------------------------

PATCH = """*** Begin Patch
*** Update File: src/app.py
@@
-a
+b
*** Add File: ./new.txt
+x
*** Delete File: old.txt
*** Update File: a.py
*** Move to: b.py
*** End Patch
"""


@pytest.mark.parametrize(
    ("name", "arguments", "found"),
    [
        ("Write", {"file_path": "/w/./a.py", "content": ""}, ("/w/a.py",)),
        ("read", {"path": "src/../b.py"}, ("b.py",)),
        ("read_file", {"absolute_path": "/x/c.py"}, ("/x/c.py",)),
        ("read_many_files", {"paths": ["a", 3, "b"]}, ("a", "b")),
        ("apply_patch", {"input": PATCH}, ("src/app.py", "new.txt", "old.txt", "a.py", "b.py")),
        ("apply_patch", PATCH, ("src/app.py", "new.txt", "old.txt", "a.py", "b.py")),
        ("patch", {"diff": "--- a/x.c\n+++ b/x.c\n@@\n"}, ("x.c",)),
        ("Bash", {"command": "ls"}, ()),
    ],
)
def test_paths(name: str, arguments: Any, found: tuple[str, ...]) -> None:
    assert analysis.paths(act(name, arguments)) == found


def test_command() -> None:
    assert analysis.command(act("shell", {"command": "ls -l"})) == "ls -l"
    assert analysis.command(act("shell", {"command": ["bash", "-lc", "ls"]})) == "bash -lc ls"
    assert analysis.command(act("exec_command", {"cmd": "pwd"})) == "pwd"
    assert analysis.command(act("local_shell", {"type": "exec", "command": ["ls"]})) == "ls"
    assert analysis.command(act("shell", {"other": 1})) is None


def test_same_path() -> None:
    assert analysis.same_path("/w/src/x.py", "src/x.py")
    assert analysis.same_path("x.py", "x.py")
    assert not analysis.same_path("/w/src/x.py", "rc/x.py")
    assert not analysis.same_path("src", "src/x.py")


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("echo hi > out.txt", ("out.txt",)),
        ("echo hi >> ./logs/a.log && cat logs/a.log", ("logs/a.log",)),
        ("cat > a.py <<'EOF'\nprint(1 > 2)\nEOF\npython a.py", ("a.py",)),
        ("ls 2>&1", None),
        ("make > /dev/null", None),
        ("echo 'a > b'", None),
        ("echo x | tee -a log.txt", ("log.txt",)),
        ("sed -i 's/a/b/' f.py", ("f.py",)),
        ("perl -pi -e 's/a/b/' g.pl", ("g.pl",)),
        ("cp a.txt b.txt", ("b.txt",)),
        ("cd d; mv -f a b", ("b",)),
        ("touch x y", ("x", "y")),
        ("git apply fix.diff", ()),
        ("sudo FOO=1 tee conf", ("conf",)),
        ("apply_patch '*** Begin Patch\n*** Update File: m.py\n*** End Patch'", ("m.py",)),
        ("python x.py", None),
        ("grep -n foo a.py | head", None),
        ("cp a.txt", None),
        ("sed 's/a/b/' f.py", None),
        ('echo "unterminated > x', ("x",)),  # no quote pairs: the redirect is seen
        ("", None),
    ],
)
def test_shell_write(text: str, written: tuple[str, ...] | None) -> None:
    found = analysis.shell_write(text)
    assert (found.paths if found else None) == written


@pytest.mark.parametrize(
    ("text", "runs"),
    [
        ("pytest -q", True),
        ("cd x && make test", True),
        ("npm run test", True),
        ("yarn test", True),
        ("cargo test --all", True),
        ("go vet ./...", True),
        ("python -m pytest", True),
        ("cmake ..", False),
        ("python -c 'print(1)'", False),
        ("ls pytest_cache", False),
    ],
)
def test_runs_checks(text: str, runs: bool) -> None:
    assert analysis.runs_checks(text) is runs


def test_mentions() -> None:
    assert analysis.mentions("cat src/a.py", "/w/src/a.py")
    assert analysis.mentions("python a.py.", "a.py")
    assert not analysis.mentions("python a.pyc", "a.py")
    assert not analysis.mentions("cat ba.py", "a.py")
    assert not analysis.mentions("echo x", "/w/x")  # basename shorter than 3


# -- self-verification --------------------------------------------------------------------------


def verified(*actions: ep.Action) -> list[bool]:
    return [m.verified for m in analysis.mutations(actions)]


def test_a_write_read_back_is_verified() -> None:
    assert verified(act("write_file", {"path": "a.py"}), act("read_file", {"path": "./a.py"})) == [
        True
    ]


def test_reading_another_file_or_reading_before_does_not_verify() -> None:
    assert verified(
        act("read_file", {"path": "a.py"}),
        act("write_file", {"path": "a.py"}),
        act("read_file", {"path": "b.py"}),
    ) == [False]


def test_running_the_file_or_the_tests_verifies() -> None:
    assert verified(act("Write", {"file_path": "/w/a.py"}), act("Bash", {"command": "python a.py"}))
    assert verified(act("Edit", {"file_path": "/w/src/m.py"}), act("Bash", {"command": "pytest"}))
    assert verified(act("write_file", {"path": "x.txt"}), act("shell", {"command": "ls"})) == [
        False
    ]


def test_a_patch_is_verified_through_its_files() -> None:
    assert verified(
        act("apply_patch", {"input": PATCH}), act("shell", {"command": ["cat", "src/app.py"]})
    ) == [True]


def test_a_shell_write_then_a_shell_read() -> None:
    assert verified(act("shell", {"command": "echo x > out"}), act("shell", {"command": "cat out"}))


def test_a_second_write_naming_the_file_is_not_a_check() -> None:
    assert verified(
        act("shell", {"command": "echo x > out.txt"}),
        act("shell", {"command": "sed -i s/x/y/ out.txt"}),
    ) == [False, False]


def test_a_mutation_does_not_verify_itself() -> None:
    assert verified(act("shell", {"command": "pytest -q > report.txt"})) == [False]


def test_a_pathless_mutation_is_verified_only_by_running_checks() -> None:
    assert verified(act("shell", {"command": "git apply p"}), act("read_file", {"path": "p"})) == [
        False
    ]
    assert verified(act("shell", {"command": "git apply p"}), act("shell", {"command": "make"}))


def test_episode_level_verification_uses_the_last_mutation() -> None:
    checked = calls(
        act("write_file", {"path": "a"}),
        act("write_file", {"path": "b.py"}),
        act("read_file", {"path": "b.py"}),
    )
    unchecked = calls(act("write_file", {"path": "a.py"}), act("read_file", {"path": "a.py"}))
    unchecked.append(ep.Action(2, 0, "", "write_file", {"path": "a.py"}, None))
    summary = analysis.summarize(
        [analysis.measure(episode(checked)), analysis.measure(episode(unchecked))]
    )
    assert summary.self_verification == analysis.Ratio(2, 4)
    assert summary.verified_episodes == analysis.Ratio(1, 2)


# -- failed tool calls ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "flagged", "failed"),
    [
        ("all good", None, False),
        ("boom", True, True),  # Anthropic is_error / Gemini error
        ("error: no such file", False, True),  # an explicit false flag does not hide the text
        ("Error: File not found", None, True),
        ("  ERROR : x", None, True),
        ("<tool_use_error>File does not exist.</tool_use_error>", None, True),
        ("Error executing tool read_file: denied", None, True),
        ("out\n[exit code 2]", None, True),  # ReAct
        ("out\n[exit code 0]", None, False),
        ("Exit code: 1\nWall time: 0.1 seconds\nOutput:\n", None, True),  # Codex
        ("Process exited with code 0\nOutput:\nok", None, False),
        ("Command: ls\nStdout: x\nError: (none)\nExit Code: 1", None, True),  # Gemini CLI
        ("Command: ls\nExit Code: (none)", None, False),
        ("exit status 3", None, True),
        ("returncode=-9", None, True),
        ('{"output": "error: x", "metadata": {"exit_code": 0}}', None, False),  # Codex legacy
        ('{"output": "", "metadata": {"exit_code": 1}}', None, True),
        ('{"exit_code": 0}', None, False),
        ('{"error": "denied"}', None, True),
        ('{"error": null, "output": "x"}', None, False),
        ("[1, 2]", None, False),
        ("the word error: appears mid-text", None, False),
        ("no errors found", None, False),
        ("", None, False),
    ],
)
def test_failed(text: str, flagged: bool | None, failed: bool) -> None:
    assert analysis.failed(ep.ToolResult(text, flagged)) is failed


def test_error_recovery_counts_rewarded_error_episodes() -> None:
    failing = act("shell", {"command": "x"}, "error: nope")
    measured = [
        analysis.measure(episode([failing, act("shell", {"command": "y"})], reward=1.0)),
        analysis.measure(episode([failing], reward=0.0)),
        analysis.measure(episode([failing], reward=None)),  # no reward: no success value
        analysis.measure(episode([act("shell", {"command": "y"})], reward=0.0)),
        analysis.measure(episode([act("shell", {"command": "z"}, result=None)], reward=1.0)),
    ]
    summary = analysis.summarize(measured)
    assert summary.error_episodes == 3
    assert summary.error_recovery == analysis.Ratio(1, 2)
    assert summary.failed_tool_calls == analysis.Ratio(3, 5)  # the unanswered call not counted
    assert summary.success == analysis.Ratio(2, 4)


def test_success_is_strictly_above_the_threshold() -> None:
    assert analysis.measure(episode(reward=0.0)).success is False
    assert analysis.measure(episode(reward=0.5), success_threshold=0.5).success is False
    assert analysis.measure(episode(reward=0.6), success_threshold=0.5).success is True
    assert analysis.measure(episode(reward=None)).success is None


# -- plans -------------------------------------------------------------------------------------


def plan_call(key: str, statuses: Sequence[str], *, call: int = 0) -> ep.Action:
    items = [{"step": f"s{i}", "status": status} for i, status in enumerate(statuses)]
    return act({"plan": "update_plan", "todos": "TodoWrite"}[key], {key: items}, call=call)


def test_a_tool_plan_is_judged_by_its_last_state() -> None:
    actions = [
        plan_call("plan", ["in_progress", "pending", "pending"], call=0),
        act("shell", {"command": "ls"}, call=1),
        plan_call("plan", ["completed", "completed", "in_progress"], call=2),
    ]
    plan = analysis.plan_of(episode(actions), success=True)
    assert plan == analysis.Plan("tool", 3, 2, False)
    assert plan.completion == pytest.approx(2 / 3)


def test_todo_tools_of_each_harness() -> None:
    todos = plan_call("todos", ["completed", "Completed"])
    assert analysis.plan_of(episode([todos]), success=False) == analysis.Plan("tool", 2, 2, True)
    gemini = act(
        "write_todos",
        {
            "todos": [
                {"description": "a", "status": "completed"},
                {"description": "b", "status": "cancelled"},
            ]
        },
    )
    assert analysis.plan_of(episode([gemini]), success=True) == analysis.Plan("tool", 2, 1, False)


def test_a_one_item_plan_is_not_multi_step_and_bad_items_are_no_plan() -> None:
    assert analysis.plan_of(episode([plan_call("plan", ["completed"])]), success=True) is None
    odd = act("update_plan", {"plan": [{"step": "a"}, {"step": "b"}]})  # no statuses
    assert analysis.plan_of(episode([odd]), success=True) is None


TEXT_PLAN = "Plan:\n1. read the file\n2. fix the bug\n3. run the tests\n"


def test_a_text_plan_counts_distinct_later_actions() -> None:
    actions = [
        act("read_file", {"path": "a"}, call=0),
        act("read_file", {"path": "a"}, call=1),  # the same call again counts once
        act("Edit", {"file_path": "a"}, call=1),
    ]
    texts = [TEXT_PLAN, "", "done"]
    plan = analysis.plan_of(episode(actions, texts=texts), success=True)
    assert plan == analysis.Plan("text", 3, 2, False)
    actions.append(act("Bash", {"command": "pytest"}, call=1))
    plan = analysis.plan_of(episode(actions, texts=texts), success=True)
    assert plan == analysis.Plan("text", 3, 3, True)
    assert analysis.plan_of(episode(actions, texts=texts), success=False) == analysis.Plan(
        "text", 3, 3, False
    )


def test_actions_before_the_plan_do_not_count() -> None:
    actions = [act("ls", call=0), act("read_file", {"path": "a"}, call=1)]
    texts = ["", "- look\n- read\n", "done"]
    assert analysis.plan_of(episode(actions, texts=texts), success=True) == analysis.Plan(
        "text", 2, 1, False
    )


def test_a_closing_summary_is_not_a_plan_and_a_tool_plan_wins() -> None:
    assert analysis.plan_of(episode([], texts=["Done:\n1. a\n2. b"]), success=True) is None
    assert analysis.plan_of(episode([], texts=["1. only one item"]), success=True) is None
    assert analysis.list_items("1. a\n- b\n- c") == 2  # numbered first, else bullets
    actions = [plan_call("plan", ["completed", "pending"], call=1)]
    plan = analysis.plan_of(episode(actions, texts=[TEXT_PLAN, "", "x"]), success=True)
    assert plan is not None and plan.source == "tool"


# -- tool coverage, empty episodes, groups ------------------------------------------------------


def test_tool_coverage_and_unknown_tools() -> None:
    actions = [act("read"), act("read"), act("ghost")]
    measured = analysis.measure(episode(actions, tools=["read", "write", "exec", "edit"]))
    assert measured.coverage == 0.25
    assert measured.unknown_tool_calls == 1
    assert measured.tools_used == {"read"}


def test_an_episode_offered_no_tools_and_an_empty_episode() -> None:
    empty = analysis.measure(episode([], texts=[], tools=[]))
    assert empty.coverage is None
    assert (empty.mutations, empty.failed_tool_calls, empty.plan) == ((), 0, None)
    summary = analysis.summarize([empty])
    assert summary.episodes == 1
    assert summary.turns == analysis.Ratio(0, 1)
    for metric in ("self_verification", "verified_episodes", "tool_coverage", "error_recovery"):
        assert getattr(summary, metric).value is None, metric
    assert summary.plan_completion.value is None
    assert summary.failed_tool_calls == analysis.Ratio(0, 0)


def test_summarize_nothing() -> None:
    summary = analysis.summarize([])
    assert (summary.episodes, summary.tools_offered, summary.mean_reward.value) == (0, (), None)


def test_basic_statistics() -> None:
    measured = [
        analysis.measure(episode(calls(act("a"), act("b")), reward=1.0)),
        analysis.measure(episode([], texts=["x"], reward=0.0, tools=["a"])),
    ]
    summary = analysis.summarize(measured)
    assert summary.mean_reward == analysis.Ratio(1.0, 2)
    assert summary.turns == analysis.Ratio(4, 2)  # 3 calls + 1 call
    assert summary.tool_calls == analysis.Ratio(2, 2)
    assert summary.tool_coverage == analysis.Ratio(1.0, 2)
    assert summary.tools_offered == ("a", "b")
    assert summary.tools_used == ("a", "b")


def test_grouping() -> None:
    measured = [
        analysis.measure(episode(harness="codex", version=1)),
        analysis.measure(episode(harness="react", version=0)),
        analysis.measure(episode(harness="codex", version=0)),
        analysis.measure(episode(harness="", version=0)),
    ]
    both = analysis.grouped(measured, "both")
    assert [key.label() for key in both] == ["(unnamed) v0", "codex v0", "codex v1", "react v0"]
    assert [s.episodes for s in analysis.grouped(measured, "harness").values()] == [1, 2, 1]
    versions = analysis.grouped(measured, "policy-version")
    assert {key.label(): s.episodes for key, s in versions.items()} == {"v0": 3, "v1": 1}
    with pytest.raises(ValueError, match="by must be one of harness, policy-version, both"):
        analysis.grouped(measured, "task")


def test_ratio_and_delta() -> None:
    assert analysis.Ratio.of([True, False, None, 1.0]).value == pytest.approx(2 / 3)
    assert analysis.Ratio().value is None
    assert analysis.delta(analysis.Ratio(1, 4), analysis.Ratio(3, 4)) == 0.5
    assert analysis.delta(analysis.Ratio(), analysis.Ratio(3, 4)) is None
