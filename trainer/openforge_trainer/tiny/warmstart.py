"""Supervised warm-start of the tiny policy on the toy tool-calling task.

A policy built from a seed (:mod:`model_build`) emits noise; RL from there
never sees a reward. So before the RL demo we fine-tune it on synthetic
demonstrations of the toy-tools task (``examples/tasks/toy-tools``), rendered
exactly as the built-in ReAct harness (``examples/harnesses/react``) asks
through the sidecar: its system prompt and tool schemas, the chat template,
a tool call ``<tool_call>\\n{"name": "lookup_color", "arguments": {"item":
...}}\\n</tool_call>``, the tool's answer, then the color copied from it.
The loss covers the assistant tokens only (each turn's text and its
``<|im_end|>``).

Another harness's requests are described the same way, in a JSON file of the
same shape (``--harness``): ``examples/harnesses/codex/harness.json`` holds
what Codex CLI sends for these tasks (its instructions, its four tools, the
line run.py appends to the task) and a ``lookup`` entry saying how the
demonstrations look the color up there: Codex's ``exec_command`` running
``cat colors.json``, answered in Codex's own output framing (:class:`Lookup`).

The warm-start must leave something for RL to fix. In ``direct_fraction`` of
the demonstrations the first turn answers at once with a guessed color, so
the policy learns to call the tool only sometimes (its first token is
``<tool_call>`` with probability about ``1 - direct_fraction``) and, sampled
at temperature 1, passes about ``(1 - direct_fraction) + direct_fraction /
len(colors)`` of the tasks; calling the tool is what earns the reward. The
guesses favour one color (``guess_bias``), so that color, not the tool call,
is the single most likely first token: greedy decoding guesses it every time
and passes only the tasks whose answer it happens to be. To learn the copying skills well
without moving that probability, ``drill_fraction`` of the demonstrations
are tool-calling ones whose first assistant token (the decision) carries no
loss. Everything is a function of the seed.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import DynamicCache, PreTrainedModel

from openforge_trainer.tiny import model_build, tokenizer_build

END_OF_TURN = tokenizer_build.EOS_TOKEN
LOOKUP_TOOL = "lookup_color"


def examples_dir() -> Path:
    """The repository's ``examples/`` (present in a checkout, not in a wheel)."""
    return Path(__file__).resolve().parents[3] / "examples"


DEFAULT_HARNESS = examples_dir() / "harnesses" / "react" / "harness.json"
DEFAULT_TASK_SPEC = examples_dir() / "tasks" / "toy-tools" / "spec.json"


# --- the harness's requests and the task's shape ---------------------------------


@dataclass(frozen=True, slots=True)
class Lookup:
    """How a demonstration looks the color up in a harness: the call and its answer.

    ``result`` is the shape of the tool's answer: ``color``, the color alone
    (the ReAct harness's ``lookup_color``), or ``codex-exec``, Codex CLI's
    framing of a finished ``exec_command`` around the database file's text
    (:func:`codex_exec_output`).
    """

    tool: str = LOOKUP_TOOL
    arguments_json: str = "{}"
    result: str = "color"

    @classmethod
    def parse(cls, value: Any, path: Path) -> Lookup:
        if not isinstance(value, dict) or not isinstance(value.get("tool"), str):
            raise ValueError(f"{path}: 'lookup.tool' must be a string")
        arguments = value.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ValueError(f"{path}: 'lookup.arguments' must be an object")
        result = value.get("result", "color")
        if result not in LOOKUP_RESULTS:
            raise ValueError(
                f"{path}: 'lookup.result' must be one of {', '.join(LOOKUP_RESULTS)}, got "
                f"{result!r}"
            )
        return cls(value["tool"], json.dumps(arguments), result)

    def call(self) -> dict[str, Any]:
        arguments = json.loads(self.arguments_json)
        return {"type": "function", "function": {"name": self.tool, "arguments": arguments}}

    def answer(self, rng: random.Random, *, color: str, database: str) -> str:
        """The tool's answer when the database file's text is ``database``."""
        if self.result == "color":
            return color
        chunk = "".join(rng.choice("0123456789abcdef") for _ in range(6))
        return codex_exec_output(
            database, chunk_id=chunk, wall_seconds=rng.choice((0.0, rng.random() / 100))
        )


LOOKUP_RESULTS = ("color", "codex-exec")


def codex_exec_output(
    output: str, *, chunk_id: str, wall_seconds: float, exit_code: int = 0
) -> str:
    """What Codex CLI (0.171) hands the model for a finished ``exec_command``.

    Captured through the sidecar (``function_call_output.output``): a chunk
    id of six hex digits, the wall time, the exit code, Codex's approximate
    token count of the output (a quarter of its bytes, rounded up), then the
    output itself.
    """
    tokens = -(-len(output.encode("utf-8")) // 4)
    return (
        f"Chunk ID: {chunk_id}\nWall time: {wall_seconds:.4f} seconds\n"
        f"Process exited with code {exit_code}\nOriginal token count: {tokens}\nOutput:\n{output}"
    )


@dataclass(frozen=True, slots=True)
class HarnessSpec:
    """What a harness sends: system prompt, tool schemas, what it appends to the task.

    ``lookup`` is how the demonstrations look the color up in this harness.
    """

    system_prompt: str
    tools: tuple[dict[str, Any], ...]
    user_suffix: str = ""
    lookup: Lookup = Lookup()

    @classmethod
    def load(cls, path: Path = DEFAULT_HARNESS) -> HarnessSpec:
        spec = _read_json(path)
        if not isinstance(spec.get("system_prompt"), str):
            raise ValueError(f"{path}: 'system_prompt' must be a string")
        tools = spec.get("tools")
        if not isinstance(tools, list) or not tools:
            raise ValueError(f"{path}: 'tools' must be a non-empty list")
        suffix = spec.get("user_suffix", "")
        if not isinstance(suffix, str):
            raise ValueError(f"{path}: 'user_suffix' must be a string")
        lookup = Lookup.parse(spec["lookup"], path) if "lookup" in spec else Lookup()
        rendered = tuple(_as_rendered(t, path, index=i) for i, t in enumerate(tools))
        if lookup.tool not in {t["function"]["name"] for t in rendered}:
            raise ValueError(f"{path}: 'lookup.tool' {lookup.tool!r} is not one of the tools")
        return cls(spec["system_prompt"], rendered, suffix, lookup)

    def messages(self, question: str) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question + self.user_suffix},
        ]

    def without_system_turn(self) -> HarnessSpec:
        """The same requests with an empty system prompt and no tools (cheap early steps)."""
        return replace(self, system_prompt="", tools=())


def _as_rendered(tool: Any, path: Path, *, index: int) -> dict[str, Any]:
    """A tool schema as the sidecar renders it: name, description, parameters, in that order."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError(f"{path}: tools[{index}].function.name is missing")
    return {
        "type": "function",
        "function": {
            "name": function["name"],
            "description": function.get("description", ""),
            "parameters": function.get("parameters", {}),
        },
    }


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """The toy-tools task's prompt, palette and item names (its spec.json)."""

    prompt: str
    colors: tuple[str, ...]
    items: tuple[str, ...]

    @classmethod
    def load(cls, path: Path = DEFAULT_TASK_SPEC) -> TaskSpec:
        spec = _read_json(path)
        for key in ("prompt", "colors", "items"):
            if key not in spec:
                raise ValueError(f"{path}: field {key!r} is missing")
        return cls(str(spec["prompt"]), tuple(spec["colors"]), tuple(spec["items"]))

    def item_name(self, rng: random.Random) -> str:
        return rng.choice(self.items)

    def question(self, item: str) -> str:
        return self.prompt.replace("{item}", item)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (outside a checkout, pass its path)")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


# --- demonstrations -----------------------------------------------------------------


def lookup_call(item: str | None = None) -> dict[str, Any]:
    """A ``lookup_color`` call; without ``item`` it asks for the database's only item."""
    arguments = {} if item is None else {"item": item}
    return {"type": "function", "function": {"name": LOOKUP_TOOL, "arguments": arguments}}


@dataclass(frozen=True, slots=True)
class Demo:
    messages: list[dict[str, Any]]
    train_decision: bool  # whether the first assistant token carries loss


def make_demo(
    rng: random.Random, harness: HarnessSpec, *, task: TaskSpec, kind: str, guess_bias: float = 0.0
) -> Demo:
    """One demonstration: ``direct`` (guess a color), ``tool`` or ``drill`` (look it up).

    A guess is the palette's first color with probability ``guess_bias``,
    else a uniformly drawn one.
    """
    item = task.item_name(rng)
    color = rng.choice(task.colors)
    messages = harness.messages(task.question(item))
    if kind == "direct":
        guess = task.colors[0] if rng.random() < guess_bias else rng.choice(task.colors)
        messages.append({"role": "assistant", "content": guess})
        return Demo(messages, train_decision=True)
    if kind not in ("tool", "drill"):
        raise ValueError(f"kind: {kind!r} is not one of direct, tool, drill")
    messages.append({"role": "assistant", "content": "", "tool_calls": [harness.lookup.call()]})
    database = (
        json.dumps({"items": {item: color}}, indent=2) + "\n"
    )  # as toytools writes colors.json
    messages.append(
        {"role": "tool", "content": harness.lookup.answer(rng, color=color, database=database)}
    )
    messages.append({"role": "assistant", "content": color})
    return Demo(messages, train_decision=kind == "tool")


@dataclass(frozen=True, slots=True)
class Encoded:
    ids: list[int]
    mask: list[int]  # 1 on assistant tokens (loss), 0 elsewhere


def segments(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
) -> list[tuple[str, bool]]:
    """The rendered conversation cut into (text, is_assistant) pieces.

    An assistant piece is what the policy generates for that turn: the text
    after the generation prompt, through ``<|im_end|>``. The pieces join to
    the whole rendering.
    """
    pieces: list[tuple[str, bool]] = []
    done = ""
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer_build.render_chat(messages[:index], tools, add_generation_prompt=True)
        full = tokenizer_build.render_chat(messages[: index + 1], tools)
        if not (prompt.startswith(done) and full.startswith(prompt)):
            raise ValueError(f"messages[{index}]: the chat template is not prefix-stable here")
        turn = full[len(prompt) :]
        turn = turn[: turn.index(END_OF_TURN) + len(END_OF_TURN)]
        pieces += [(prompt[len(done) :], False), (turn, True)]
        done = prompt + turn
    whole = tokenizer_build.render_chat(messages, tools)
    if not whole.startswith(done):
        raise ValueError("the chat template is not prefix-stable at the end")
    if whole[len(done) :]:
        pieces.append((whole[len(done) :], False))
    return [(text, assistant) for text, assistant in pieces if text]


def encode(tokenizer: Tokenizer, demo: Demo, *, tools: Sequence[dict[str, Any]]) -> Encoded:
    """Token ids of the whole rendering, with the assistant-token mask."""
    ids: list[int] = []
    mask: list[int] = []
    for text, assistant in segments(demo.messages, tools):
        piece = tokenizer.encode(text, add_special_tokens=False).ids
        if assistant and not demo.train_decision and not any(mask):
            mask += [0] + [1] * (len(piece) - 1)
        else:
            mask += [int(assistant)] * len(piece)
        ids += piece
    whole = tokenizer.encode(
        tokenizer_build.render_chat(demo.messages, tools), add_special_tokens=False
    )
    if whole.ids != ids:
        raise ValueError("tokenizing the turns one by one differs from tokenizing the whole")
    return Encoded(ids, mask)


def load_tokenizer(model_dir: Path | None = None) -> Tokenizer:
    directory = model_dir if model_dir is not None else tokenizer_build.committed_assets()
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


# --- training -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WarmstartConfig:
    """How to warm-start. Defaults take about two minutes on two CPU cores."""

    steps: int = 600
    short_steps: int = 300  # the first steps drop the system turn (see train())
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    seed: int = 0
    direct_fraction: float = 0.8  # first turns that guess instead of calling the tool
    guess_bias: float = 0.5  # guesses that are the palette's first color (else uniform)
    drill_fraction: float = 0.5  # tool demos without loss on the decision token

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.short_steps <= self.steps:
            raise ValueError(
                f"short_steps must be within [0, steps={self.steps}], got {self.short_steps}"
            )
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("direct_fraction", "guess_bias", "drill_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value}")
        if self.drill_fraction == 1.0:
            raise ValueError(
                "drill_fraction must be below 1, got 1.0: nothing would train the decision"
            )


def demo_kind(rng: random.Random, config: WarmstartConfig) -> str:
    if rng.random() < config.drill_fraction:
        return "drill"
    return "direct" if rng.random() < config.direct_fraction else "tool"


def collate(batch: Sequence[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """A batch as a shared ``prefix_ids`` [1, P] and right-padded rows [batch, length].

    Every demonstration opens with the same system turn (the harness's system
    prompt and tool schemas, most of the tokens), so its keys and values are
    computed once per batch and broadcast; gradients still flow through them.
    The prefix stops before the first token any row trains on.
    """
    prefix = _shared_prefix(batch)
    length = max(len(e.ids) for e in batch) - prefix
    ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), length), dtype=torch.long)
    loss_mask = torch.zeros((len(batch), length), dtype=torch.float32)
    for row, encoded in enumerate(batch):
        size = len(encoded.ids) - prefix
        ids[row, :size] = torch.tensor(encoded.ids[prefix:])
        attention[row, :size] = 1
        loss_mask[row, :size] = torch.tensor(encoded.mask[prefix:], dtype=torch.float32)
    return {
        "prefix_ids": torch.tensor([batch[0].ids[:prefix]], dtype=torch.long),
        "input_ids": ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
    }


def _shared_prefix(batch: Sequence[Encoded]) -> int:
    first = batch[0].ids
    size = min(len(e.ids) for e in batch)
    for encoded in batch:
        trained = next((i for i, m in enumerate(encoded.mask) if m), len(encoded.ids))
        same = next(
            (i for i, (a, b) in enumerate(zip(first, encoded.ids, strict=False)) if a != b), size
        )
        size = min(size, trained, same)
    return size


def masked_loss(model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the tokens whose ``loss_mask`` is 1."""
    weights = batch["loss_mask"][:, 1:]
    return (token_nll(model, batch) * weights).sum() / weights.sum().clamp(min=1.0)


def token_nll(model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's next-token negative log-likelihoods, [batch, length - 1].

    Entry ``[r, t]`` is ``-log p(input_ids[r, t + 1] | everything before)``,
    the prefix included.
    """
    rows, length = batch["input_ids"].shape
    prefix = int(batch["prefix_ids"].shape[1])
    attention = batch["attention_mask"]
    cache = None
    if prefix:
        shared = model(input_ids=batch["prefix_ids"], use_cache=True).past_key_values
        cache = DynamicCache()
        for index, layer in enumerate(shared.layers):
            keys, values = layer.keys, layer.values
            cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), index)
        attention = torch.cat([torch.ones((rows, prefix), dtype=attention.dtype), attention], dim=1)
    positions = torch.arange(prefix, prefix + length).expand(rows, -1)
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=attention,
        position_ids=positions,
        past_key_values=cache,
        use_cache=cache is not None,
    ).logits
    targets = batch["input_ids"][:, 1:]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2).float(), targets, reduction="none"
    )


def _schedule(config: WarmstartConfig) -> Any:
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


@dataclass
class WarmstartResult:
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def train(
    model: PreTrainedModel,
    tokenizer: Tokenizer,
    *,
    harness: HarnessSpec,
    task: TaskSpec,
    config: WarmstartConfig,
    log_every: int = 0,
) -> WarmstartResult:
    """Fine-tune ``model`` in place on freshly drawn demonstrations.

    The first ``short_steps`` steps train on demonstrations without the
    system turn (no system prompt, no tool schemas): some 50 tokens instead
    of 390, so they are cheap, and copying the color from the tool's answer
    forms sooner there, with nothing else to attend to. The remaining steps
    use the harness's exact rendering.
    """
    rng = random.Random(config.seed)
    short = harness.without_system_turn()
    torch.manual_seed(config.seed)
    pad_id = tokenizer.token_to_id(tokenizer_build.PAD_TOKEN)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config))
    result = WarmstartResult()
    started = time.monotonic()
    model.train()
    for step in range(config.steps):
        spec = short if step < config.short_steps else harness
        demos = [
            make_demo(
                rng, spec, task=task, kind=demo_kind(rng, config), guess_bias=config.guess_bias
            )
            for _ in range(config.batch_size)
        ]
        batch = collate([encode(tokenizer, d, tools=spec.tools) for d in demos], pad_id)
        loss = masked_loss(model, batch)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        result.losses.append(float(loss.detach()))
        if log_every and (step % log_every == 0 or step == config.steps - 1):
            print(f"step {step:4d}  loss {result.losses[-1]:.4f}", file=sys.stderr, flush=True)
    torch.nn.Module.train(model, False)
    result.seconds = time.monotonic() - started
    return result


def warmstart(
    model_dir: Path,
    out_dir: Path,
    *,
    config: WarmstartConfig,
    harness_path: Path = DEFAULT_HARNESS,
    task_spec_path: Path = DEFAULT_TASK_SPEC,
    log_every: int = 0,
) -> WarmstartResult:
    """Load ``model_dir``, warm-start it, save it with the tokenizer into ``out_dir``."""
    model = model_build.load_model(model_dir)
    result = train(
        model,
        load_tokenizer(model_dir),
        harness=HarnessSpec.load(harness_path),
        task=TaskSpec.load(task_spec_path),
        config=config,
        log_every=log_every,
    )
    model_build.save_model(model, out_dir)
    summary = {"config": asdict(config), "losses": [round(x, 5) for x in result.losses]}
    (out_dir / "warmstart.json").write_text(json.dumps(summary) + "\n", encoding="utf-8")
    return result
