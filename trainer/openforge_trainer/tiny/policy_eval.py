"""Run the toy-tools task in-process, token for token as the ReAct harness would.

The real path is harness -> sidecar -> engine -> grader, one process each.
To measure a policy quickly (and for small policy-gradient experiments) this
module plays all of them with plain ``transformers``: it renders the
harness's first request with the chat template (:class:`warmstart.HarnessSpec`
holds the same system prompt and tool schemas the agent sends), samples a
reply, parses tool calls the way the sidecar does (Hermes ``<tool_call>``
JSON; a malformed call stays text), runs ``lookup_color`` on the task's
database, and extends the prompt the way the sidecar's token history does:
the earlier prompt and completion token ids, exactly, then the tokens of the
new turns only. The final answer is graded like ``grade.py``.

Only ``lookup_color``, ``read_file`` of the task's own files and Codex CLI's
``exec_command`` running ``cat`` on one of them (answered in Codex's framing,
for a :class:`warmstart.HarnessSpec` loaded from
``examples/harnesses/codex/harness.json``) are played; any other tool
answers with an error here (the episode is marked divergent).
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedModel

from openforge_trainer.tiny import tokenizer_build, warmstart

DEFAULT_TASKS = warmstart.examples_dir() / "tasks" / "toy-tools" / "tasks.jsonl"
DATABASE = "colors.json"
_CALL = re.compile(r"\n?<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Turn:
    prompt_ids: list[int]
    completion_ids: list[int]


@dataclass
class Episode:
    task_id: str
    expected: str
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    answer: str | None = None  # None: no final answer within the turns
    reward: float = 0.0
    called_lookup: bool = False
    divergent: bool = False
    done: bool = False

    def sequence(self) -> tuple[list[int], list[int], int]:
        """(all token ids, response mask over them, prompt length) of the whole episode.

        The mask is 1 on tokens the policy generated and 0 on the first prompt
        and on the tool-response tokens inserted between turns (veRL's layout).
        """
        first = len(self.turns[0].prompt_ids)
        ids = list(self.turns[-1].prompt_ids) + list(self.turns[-1].completion_ids)
        mask = [0] * len(ids)
        for turn in self.turns:
            start = len(turn.prompt_ids)
            mask[start : start + len(turn.completion_ids)] = [1] * len(turn.completion_ids)
        return ids, mask, first


def load_tasks(path: Path = DEFAULT_TASKS, split: str | None = None) -> list[dict[str, Any]]:
    tasks = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                task = json.loads(line)
                if not isinstance(task, dict) or "id" not in task or "answer" not in task:
                    raise ValueError(f"{path}:{number}: a task needs 'id' and 'answer'")
                tasks.append(task)
    return [t for t in tasks if split is None or t.get("split") == split]


def normalize(answer: str) -> str:
    """As the toy task's grader: lower case, no surrounding whitespace/quotes/final dot."""
    return answer.strip().strip(string.whitespace + "\"'`.!").lower()


def parse_reply(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(content, [(tool name, arguments JSON)]) of a generated turn without its stop token."""
    calls: list[tuple[str, str]] = []

    def take(match: re.Match[str]) -> str:
        try:
            call = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        name = call.get("name") if isinstance(call, dict) else None
        if not isinstance(name, str) or not name or "arguments" not in call:
            return match.group(0)
        calls.append(
            (name, json.dumps(call["arguments"], ensure_ascii=False, separators=(",", ":")))
        )
        return ""

    return _CALL.sub(take, text), calls


def run_tool(task: dict[str, Any], name: str, *, arguments_json: str) -> tuple[str, bool]:
    """(result text, played faithfully) for one tool call, as the agent would answer."""
    try:
        arguments = json.loads(arguments_json)
    except ValueError as error:
        return f"error: the arguments are not valid JSON ({error})", True
    files: dict[str, str] = task.get("files", {})
    if name == "lookup_color" and isinstance(arguments, dict) and set(arguments) <= {"item"}:
        items = json.loads(files.get(DATABASE, "{}")).get("items", {})
        if "item" not in arguments:
            if len(items) != 1:
                return f"error: the database holds {len(items)} items; name one", True
            return str(next(iter(items.values()))), True
        item = arguments["item"]
        color = items.get(str(item).strip())
        return (str(color) if color is not None else f"error: no item named {item!r}"), True
    if name == "read_file" and isinstance(arguments, dict) and arguments.get("path") in files:
        return files[arguments["path"]], True
    if name == "exec_command" and isinstance(arguments, dict):
        return _codex_exec(task["id"], files, command=arguments.get("cmd"))
    return f"error: {name} is not played by this evaluator", False


def _codex_exec(task_id: str, files: dict[str, str], *, command: Any) -> tuple[str, bool]:
    """Codex CLI's ``exec_command`` when it runs ``cat FILE`` on one of the task's files."""
    words = command.split() if isinstance(command, str) else []
    path = words[1].removeprefix("./") if len(words) == 2 and words[0] == "cat" else None
    if path not in files:
        return f"error: exec_command {command!r} is not played by this evaluator", False
    chunk = hashlib.sha256(f"{task_id}:{command}".encode()).hexdigest()[:6]
    return warmstart.codex_exec_output(files[path], chunk_id=chunk, wall_seconds=0.0), True


# --- sampling -------------------------------------------------------------------------


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    stop_ids: frozenset[int],
    pad_id: int,
    generator: torch.Generator,
) -> list[list[int]]:
    """Sample one completion per prompt, batched (left-padded, KV cache).

    A completion ends with its stop token, or at ``max_new_tokens``.
    ``temperature`` 0 is greedy.
    """
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt))
        attention[row, width - len(prompt) :] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
    stops = torch.tensor(sorted(stop_ids))
    done = torch.zeros(len(prompts), dtype=torch.bool)
    generated: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        logits = out.logits[:, -1].float()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            token = logits.argmax(-1)
        token = torch.where(done, torch.full_like(token, pad_id), token)
        generated.append(token)
        done |= torch.isin(token, stops)
        if bool(done.all()):
            break
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
        out = model(
            input_ids=token[:, None],
            attention_mask=attention,
            position_ids=positions,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    rows = torch.stack(generated, dim=1).tolist() if generated else [[] for _ in prompts]
    completions = []
    for row in rows:
        stop = next((i for i, t in enumerate(row) if t in stop_ids), None)
        completions.append(row if stop is None else row[: stop + 1])
    return completions


# --- episodes ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 1.0
    max_turns: int = 6  # the agent's default --max-turns
    max_new_tokens: int = 96
    seed: int = 0


class Player:
    """Plays harness, sidecar and grader around a model for toy-tools episodes."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: Tokenizer, *, harness: warmstart.HarnessSpec
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.harness = harness
        self.tools = list(harness.tools)
        self.eos = tokenizer_build.EOS_TOKEN
        self.stop_ids = frozenset(
            {self._id(tokenizer_build.EOS_TOKEN), self._id(tokenizer_build.PAD_TOKEN)}
        )
        self.pad_id = self._id(tokenizer_build.PAD_TOKEN)

    def _id(self, token: str) -> int:
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise ValueError(f"token {token!r} is not in the tokenizer")
        return int(found)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def first_prompt(self, task: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
        """The harness's first request for ``task`` and its prompt token ids."""
        messages = self.harness.messages(task["prompt"])
        text = tokenizer_build.render_chat(messages, self.tools, add_generation_prompt=True)
        return messages, self.encode(text)

    def play(
        self, tasks: Sequence[dict[str, Any]], *, samples: int, sampling: Sampling
    ) -> list[Episode]:
        """``samples`` episodes per task, all advanced together turn by turn."""
        generator = torch.Generator().manual_seed(sampling.seed)
        episodes: list[Episode] = []
        prompts: list[list[int]] = []
        by_task = []
        for task in tasks:
            for _ in range(samples):
                messages, prompt = self.first_prompt(task)
                episodes.append(Episode(task["id"], str(task["answer"]), messages=messages))
                prompts.append(prompt)
                by_task.append(task)
        for turn in range(sampling.max_turns):
            active = [i for i, e in enumerate(episodes) if not e.done]
            if not active:
                break
            completions = sample(
                self.model,
                [prompts[i] for i in active],
                max_new_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                stop_ids=self.stop_ids,
                pad_id=self.pad_id,
                generator=generator,
            )
            for i, completion in zip(active, completions, strict=True):
                last = turn == sampling.max_turns - 1
                prompts[i] = self.advance(
                    episodes[i], by_task[i], prompt=prompts[i], completion=completion, last=last
                )
        return episodes

    def advance(
        self,
        episode: Episode,
        task: dict[str, Any],
        *,
        prompt: list[int],
        completion: list[int],
        last: bool,
    ) -> list[int]:
        """Record one turn; return the next prompt (the sidecar's prefix + new turns)."""
        episode.turns.append(Turn(prompt, completion))
        stopped = bool(completion) and completion[-1] in self.stop_ids
        body = completion[:-1] if stopped else completion
        content, calls = parse_reply(self.tokenizer.decode(body, skip_special_tokens=False))
        if not calls:
            episode.answer = content.strip()
            episode.reward = 1.0 if normalize(episode.answer) == episode.expected else 0.0
            episode.done = True
            return prompt
        reply = {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
            ],
        }
        results = []
        for name, arguments in calls:
            result, faithful = run_tool(task, name, arguments_json=arguments)
            episode.called_lookup |= name == self.harness.lookup.tool
            episode.divergent |= not faithful
            results.append({"role": "tool", "content": result})
        before = tokenizer_build.render_chat([*episode.messages, reply], self.tools)
        episode.messages += [reply, *results]
        if last:
            episode.done = True
            return prompt
        after = tokenizer_build.render_chat(
            episode.messages, self.tools, add_generation_prompt=True
        )
        if not after.startswith(before):
            raise ValueError("the chat template is not prefix-stable for this conversation")
        separator = before[before.rfind(self.eos) + len(self.eos) :]
        delta = ("" if stopped else self.eos) + separator + after[len(before) :]
        return prompt + completion + self.encode(delta)


def summary(episodes: Sequence[Episode]) -> dict[str, float]:
    """Pass rate, how often the lookup was called, and pass rate when it was."""
    count = max(1, len(episodes))
    looked = [e for e in episodes if e.called_lookup]
    return {
        "episodes": float(len(episodes)),
        "pass_rate": sum(e.reward for e in episodes) / count,
        "lookup_rate": len(looked) / count,
        "pass_rate_with_lookup": sum(e.reward for e in looked) / max(1, len(looked)),
        "pass_rate_without_lookup": sum(e.reward for e in episodes if not e.called_lookup)
        / max(1, len(episodes) - len(looked)),
        "no_answer_rate": sum(e.answer is None for e in episodes) / count,
        "divergent_rate": sum(e.divergent for e in episodes) / count,
    }
