"""The in-process toy-tools evaluator: sampling, parsing, episodes, the committed policy."""

from __future__ import annotations

import pytest
import torch
from openforge_trainer.tiny import model_build, policy_eval, tokenizer_build, warmstart

torch.set_num_threads(1)

COMMITTED = warmstart.examples_dir() / "models" / "tiny-react"


@pytest.fixture(scope="module")
def random_player(tmp_path_factory: pytest.TempPathFactory) -> policy_eval.Player:
    directory = model_build.build_model(tmp_path_factory.mktemp("m"), seed=3)
    model = model_build.load_model(directory)
    return policy_eval.Player(
        model, warmstart.load_tokenizer(directory), harness=warmstart.HarnessSpec.load()
    )


def test_parse_reply_takes_well_formed_calls_and_keeps_the_rest_as_text() -> None:
    call = '<tool_call>\n{"name": "lookup_color", "arguments": {"item": "x"}}\n</tool_call>'
    assert policy_eval.parse_reply(call) == ("", [("lookup_color", '{"item":"x"}')])
    assert policy_eval.parse_reply("Let me see.\n" + call) == (
        "Let me see.",
        [("lookup_color", '{"item":"x"}')],
    )
    broken = '<tool_call>\n{"name": "lookup_color", "arguments": {</tool_call>'
    assert policy_eval.parse_reply(broken) == (broken, [])
    assert policy_eval.parse_reply("red") == ("red", [])


def test_batched_sampling_matches_one_prompt_at_a_time(random_player: policy_eval.Player) -> None:
    prompts = [
        random_player.encode(text)
        for text in ("<|im_start|>user\nhi", "a much longer prompt than the other one", "x")
    ]

    def run(batch: list[list[int]]) -> list[list[int]]:
        return policy_eval.sample(
            random_player.model,
            batch,
            max_new_tokens=12,
            temperature=0.0,
            stop_ids=random_player.stop_ids,
            pad_id=random_player.pad_id,
            generator=torch.Generator(),
        )

    together = run(prompts)
    assert together == [run([p])[0] for p in prompts]
    assert all(0 < len(c) <= 12 for c in together)


def test_episode_sequence_masks_only_generated_tokens() -> None:
    episode = policy_eval.Episode("t", "red")
    episode.turns = [
        policy_eval.Turn([1, 2, 3], [4, 5]),
        policy_eval.Turn([1, 2, 3, 4, 5, 6, 7], [8, 9]),
    ]
    assert episode.sequence() == ([1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 0, 0, 1, 1, 0, 0, 1, 1], 3)


def test_second_prompt_extends_the_first_exactly(random_player: policy_eval.Player) -> None:
    task = policy_eval.load_tasks(split="eval")[0]
    messages, prompt = random_player.first_prompt(task)
    episode = policy_eval.Episode(task["id"], task["answer"], messages=messages)
    completion = random_player.encode(
        '<tool_call>\n{"name": "lookup_color", "arguments": {}}\n</tool_call><|im_end|>'
    )
    following = random_player.advance(
        episode, task, prompt=prompt, completion=completion, last=False
    )
    assert following[: len(prompt) + len(completion)] == prompt + completion
    assert random_player.tokenizer.decode(
        following[len(prompt) + len(completion) :], skip_special_tokens=False
    ) == (
        f"\n<|im_start|>user\n<tool_response>\n{task['answer']}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert episode.called_lookup and not episode.done


def test_first_prompt_is_the_rendered_harness_request(random_player: policy_eval.Player) -> None:
    task = policy_eval.load_tasks(split="train")[0]
    _, prompt = random_player.first_prompt(task)
    text = tokenizer_build.render_chat(
        [
            {"role": "system", "content": random_player.harness.system_prompt},
            {"role": "user", "content": task["prompt"]},
        ],
        list(random_player.harness.tools),
        add_generation_prompt=True,
    )
    assert prompt == random_player.encode(text)


def test_the_committed_warm_start_leaves_room_for_rl() -> None:
    """Sampled, it looks the color up only sometimes and copies it when it does; greedy, it
    guesses."""
    model = model_build.load_model(COMMITTED)
    player = policy_eval.Player(
        model, warmstart.load_tokenizer(COMMITTED), harness=warmstart.HarnessSpec.load()
    )
    tasks = policy_eval.load_tasks(split="eval")
    sampled = policy_eval.summary(
        player.play(tasks, samples=8, sampling=policy_eval.Sampling(seed=0))
    )
    assert 0.08 < sampled["lookup_rate"] < 0.4, sampled
    assert sampled["pass_rate_with_lookup"] > 0.9, sampled
    assert 0.1 < sampled["pass_rate"] < 0.45, sampled
    greedy = policy_eval.summary(
        player.play(tasks, samples=1, sampling=policy_eval.Sampling(temperature=0.0))
    )
    assert greedy["lookup_rate"] == 0.0
    assert greedy["pass_rate"] == sum(
        t["answer"] == warmstart.TaskSpec.load().colors[0] for t in tasks
    ) / len(tasks)


def test_codex_exec_of_a_task_file_is_played_in_codex_framing() -> None:
    task = policy_eval.load_tasks(split="eval")[0]
    result, faithful = policy_eval.run_tool(
        task, "exec_command", arguments_json='{"cmd": "cat colors.json"}'
    )
    assert faithful and result.startswith("Chunk ID: ")
    assert result.endswith("Output:\n" + task["files"]["colors.json"])
    assert (
        policy_eval.run_tool(task, "exec_command", arguments_json='{"cmd": "cat ./colors.json"}')[0]
        == policy_eval.run_tool(
            task, "exec_command", arguments_json='{"cmd": "cat ./colors.json"}'
        )[0]
    )
    for command in ('{"cmd": "ls"}', '{"cmd": "cat other.json"}', '{"command": "cat colors.json"}'):
        assert policy_eval.run_tool(task, "exec_command", arguments_json=command)[1] is False, (
            command
        )


def test_a_codex_player_renders_codex_requests_and_counts_its_lookup(
    random_player: policy_eval.Player,
) -> None:
    codex = warmstart.HarnessSpec.load(
        warmstart.examples_dir() / "harnesses" / "codex" / "harness.json"
    )
    player = policy_eval.Player(random_player.model, random_player.tokenizer, harness=codex)
    task = policy_eval.load_tasks(split="eval")[0]
    messages, prompt = player.first_prompt(task)
    assert messages[1]["content"] == task["prompt"] + (
        "\nThe lookup tool here is your shell: "
        "the database is colors.json in the working directory."
    )
    assert 1500 < len(prompt) < 1600  # Codex's four tool schemas are most of it
    episode = policy_eval.Episode(task["id"], task["answer"], messages=messages)
    call = (
        '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "cat colors.json"}}\n'
        "</tool_call><|im_end|>"
    )
    following = player.advance(
        episode, task, prompt=prompt, completion=player.encode(call), last=False
    )
    assert episode.called_lookup and not episode.divergent
    assert "Process exited with code 0" in player.tokenizer.decode(
        following[len(prompt) :], skip_special_tokens=False
    )
