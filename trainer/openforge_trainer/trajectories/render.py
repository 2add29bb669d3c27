"""``openforge trajectories show``: one rollout, turn by turn, and what training sees of it.

:func:`build` reads a rollout from the store into a :class:`RolloutView`:
per model call, the messages the harness sent (only the new ones when the
call continues the previous one), the tools it offered, the reply with its
tool calls, token counts and the sidecar's segment decision; and the
training rows exactly as ``openforge train`` builds them
(``export.rollout_rows``), with each row's response mask cut into runs of
trained (the policy's own tokens) and masked (tokens the harness appended:
tool results, new user turns) spans, decoded with the policy's tokenizer
when one is given.

Three renderings of the same view: :func:`to_json` (``--json``),
:func:`render_plain` (not a terminal) and :func:`render_rich` (a terminal).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Protocol, TextIO

from openforge.wire import conversation
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from openforge_trainer.collection import store as store_module
from openforge_trainer.trajectories import export, outcome, transcript

TEXT_LIMIT = 600  # characters of one message shown unless --full
BAR_WIDTH = 64  # characters of a mask bar
TRAINED, MASKED = "T", "·"
_ROLE_STYLES = {
    "system": "magenta",
    "developer": "magenta",
    "user": "cyan",
    "assistant": "green",
    "tool": "yellow",
}


class Tokenizer(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclasses.dataclass(frozen=True, slots=True)
class CallView:
    call: store_module.ModelCall
    messages: list[transcript.Message]  # what this call added to the conversation
    repeated: int  # earlier messages not shown again (they were in the previous call)
    tools: list[str]
    response: transcript.Message | None


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    trained: bool
    token_ids: list[int]
    text: str | None  # decoded, when a tokenizer was given


@dataclasses.dataclass(frozen=True, slots=True)
class RowView:
    row: export.Row
    spans: list[Span]

    @property
    def trained(self) -> int:
        return sum(self.row.response_mask)

    @property
    def masked(self) -> int:
        return len(self.row.response_mask) - self.trained


@dataclasses.dataclass(frozen=True, slots=True)
class ConversationView:
    """One conversation of a rollout: its rows (a row per segment, rewrites after the
    first) and where it branched from."""

    index: int
    rows: list[RowView]

    @property
    def calls(self) -> int:
        return sum(len(r.row.call_indices) for r in self.rows)

    @property
    def merge_rate(self) -> float:
        """Calls that extended an earlier call / calls after the conversation's first."""
        followers = self.calls - 1
        return (self.calls - len(self.rows)) / followers if followers else 0.0


def conversations(rows: list[RowView]) -> list[ConversationView]:
    """The rows grouped by conversation, in the order conversations began."""
    grouped: dict[int, list[RowView]] = {}
    for row_view in rows:
        grouped.setdefault(row_view.row.conversation, []).append(row_view)
    return [ConversationView(index, found) for index, found in grouped.items()]


@dataclasses.dataclass(frozen=True, slots=True)
class RolloutView:
    rollout: store_module.Rollout
    grader_output: str
    calls: list[CallView]
    rows: list[RowView]
    stats: export.ExportStats
    lost: list[store_module.LostRecord]
    row_error: str  # why no rows could be built, if so


def load_tokenizer(path: Path) -> Tokenizer:
    """A ``tokenizers`` tokenizer from ``tokenizer.json`` or a directory holding it."""
    from tokenizers import Tokenizer as HFTokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    tokenizer: Tokenizer = HFTokenizer.from_file(str(file))
    return tokenizer


def find_tokenizer(store_path: Path) -> Path | None:
    """The newest checkpoint's tokenizer in the run directory holding the store, if any."""
    steps = sorted((store_path.parent / "train" / "checkpoints").glob("step-*/tokenizer.json"))
    return steps[-1] if steps else None


def build(
    store: store_module.Store, rollout_id: str, *, tokenizer: Tokenizer | None = None
) -> RolloutView | None:
    rollout = store.rollout(rollout_id)
    if rollout is None:
        return None
    calls = store.calls(rollout_id)
    row_error = ""
    try:
        rows, stats = export.rollout_rows(rollout, calls)
    except export.ExportError as exc:
        rows, stats, row_error = [], export.ExportStats(), str(exc)
    return RolloutView(
        rollout=rollout,
        grader_output=_grader_output(store, rollout_id),
        calls=_call_views(calls),
        rows=[RowView(row, spans(row, tokenizer)) for row in rows],
        stats=stats,
        lost=[lost for lost in store.lost(rollout.job) if lost.rollout_id == rollout_id],
        row_error=row_error,
    )


def _grader_output(store: store_module.Store, rollout_id: str) -> str:
    for record in store.records(rollout_id):
        if record.WhichOneof("body") == "finished":
            return str(record.finished.grader_output)
    return ""


def _call_views(calls: list[store_module.ModelCall]) -> list[CallView]:
    views: list[CallView] = []
    previous: tuple[store_module.ModelCall, int] | None = None
    for call in calls:
        request = transcript.read_request(call.wire_api, call.request_json)
        messages, repeated = request.messages, 0
        if previous is not None and _continues(previous[0], call):
            repeated = min(previous[1], len(messages))
            while repeated < len(messages) and messages[repeated].role == "assistant":
                repeated += 1  # the previous reply, echoed back: shown with that call
            messages = messages[repeated:]
        response = transcript.read_response(call.wire_api, call.response_json)
        views.append(CallView(call, messages, repeated, request.tools, response))
        previous = (call, len(request.messages))
    return views


def _continues(previous: store_module.ModelCall, call: store_module.ModelCall) -> bool:
    """Whether ``call`` extends ``previous``: by the tokens, or by the sidecar's word
    when there are no tokens (passthrough)."""
    if call.prompt_token_ids and previous.prompt_token_ids:
        return export.extends(previous, call)
    return call.segment_index == previous.segment_index and not call.segment_reason


def spans(row: export.Row, tokenizer: Tokenizer | None) -> list[Span]:
    """A row's response cut into runs of equal mask, decoded when a tokenizer is given."""
    runs: list[Span] = []
    start = 0
    mask = row.response_mask
    for end in range(1, len(mask) + 1):
        if end == len(mask) or mask[end] != mask[start]:
            ids = row.response_ids[start:end]
            text = tokenizer.decode(ids, skip_special_tokens=False) if tokenizer else None
            runs.append(Span(bool(mask[start]), ids, text))
            start = end
    return runs


def mask_bar(mask: list[int], width: int = BAR_WIDTH) -> str:
    """The mask in at most ``width`` characters, each the majority of its tokens."""
    if not mask:
        return ""
    per = max(1, -(-len(mask) // width))
    chunks = [mask[i : i + per] for i in range(0, len(mask), per)]
    return "".join(TRAINED if 2 * sum(c) >= len(c) else MASKED for c in chunks)


def _per_char(mask: list[int], width: int = BAR_WIDTH) -> int:
    return max(1, -(-len(mask) // width))


# --- JSON --------------------------------------------------------------------------


def to_json(view: RolloutView) -> dict[str, Any]:
    rollout = view.rollout
    return {
        "rollout": {
            **dataclasses.asdict(rollout),
            "complete": rollout.complete,
            "grader_output": view.grader_output,
        },
        "calls": [_call_json(c) for c in view.calls],
        "rows": [_row_json(r) for r in view.rows],
        "conversations": [
            {
                "conversation": c.index,
                "rows": [r.row.segment_index for r in c.rows],
                "calls": c.calls,
                "merge_rate": c.merge_rate,
            }
            for c in conversations(view.rows)
        ],
        "row_error": view.row_error,
        "stats": {**dataclasses.asdict(view.stats), "merge_rate": view.stats.merge_rate},
        "lost": [dataclasses.asdict(lost) for lost in view.lost],
    }


def _call_json(view: CallView) -> dict[str, Any]:
    call = view.call
    return {
        "call_index": call.call_index,
        "wire_api": call.wire_api,
        "capture_mode": call.capture_mode,
        "stream": call.stream,
        "model": call.model,
        "http_status": call.http_status,
        "finish_reason": call.finish_reason,
        "error": call.error,
        "policy_version": call.policy_version,
        "segment_index": call.segment_index,
        "segment_reason": call.segment_reason,
        "token_exact": call.token_exact,
        "prompt_tokens": len(call.prompt_token_ids),
        "completion_tokens": len(call.completion_token_ids),
        "prefix_tokens": call.prefix_token_count,
        "time_to_first_token_ms": call.time_to_first_token_ms,
        "total_ms": call.total_ms,
        "tools": view.tools,
        "repeated_messages": view.repeated,
        "messages": [m.to_dict() for m in view.messages],
        "response": view.response.to_dict() if view.response else None,
    }


def _row_json(view: RowView) -> dict[str, Any]:
    row = view.row
    return {
        "segment_index": row.segment_index,
        "branch_of": row.branch_of,
        "branch_tokens": row.branch_tokens,
        "conversation": row.conversation,
        "call_indices": row.call_indices,
        "prompt_tokens": len(row.prompt_ids),
        "response_tokens": len(row.response_ids),
        "trained_tokens": view.trained,
        "masked_tokens": view.masked,
        "reward": row.reward,
        "policy_version": row.policy_version,
        "spans": [
            {
                "trained": s.trained,
                "tokens": len(s.token_ids),
                "token_ids": s.token_ids,
                "text": s.text,
            }
            for s in view.spans
        ],
    }


# --- plain text --------------------------------------------------------------------


def _clip(text: str, full: bool, *, limit: int = TEXT_LIMIT) -> str:
    if full or len(text) <= limit:
        return text
    return f"{text[:limit]}… [+{len(text) - limit} chars; --full shows all]"


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines() or [""])


def _status(rollout: store_module.Rollout) -> str:
    if not rollout.finished:
        return "running"
    if not rollout.complete:
        return f"{rollout.status or 'finished'} (incomplete)"
    return rollout.status or "finished"


def _reward(rollout: store_module.Rollout) -> str:
    return f"{rollout.reward:g}" if rollout.has_reward else "-"


def _calls(rollout: store_module.Rollout) -> str:
    if rollout.finished:
        return f"{rollout.calls_stored}/{rollout.call_count_expected}"
    return str(rollout.calls_stored)


def header_lines(view: RolloutView) -> list[str]:
    r = view.rollout
    lines = [
        f"rollout {r.rollout_id}  job {r.job}  task {r.task_id}  sample {r.sample_index}"
        f"  attempt {r.attempt}  harness {r.harness or '-'}",
        f"status {_status(r)}  exit {r.exit_code}  reward {_reward(r)}  calls {_calls(r)}"
        f"  policy v{r.policy_version}"
        + (f"  trained into {r.trained_checkpoint}" if r.trained_checkpoint else ""),
    ]
    if view.grader_output:
        lines.append(f"grader: {view.grader_output}")
    return lines


def _api_name(stored: str) -> str:
    """A stored call's API as ``spec.api`` spells it; an unknown name as it is stored."""
    try:
        return conversation.WireApi.from_proto_name(stored).spec_name
    except ValueError:
        return stored


def call_title(view: CallView) -> str:
    c = view.call
    parts = [
        f"call #{c.call_index}",
        _api_name(c.wire_api),
        "stream" if c.stream else "no stream",
        f"finish {c.finish_reason or '-'}",
        f"policy v{c.policy_version}",
        f"http {c.http_status}",
        f"{c.total_ms:.0f} ms",
    ]
    return " · ".join(parts)


def token_line(view: CallView) -> str:
    c = view.call
    segment = f"segment {c.segment_index}" + (
        f" ({c.segment_reason})" if c.segment_reason else " (continues)"
    )
    kept = f", {c.prefix_token_count} kept from the previous call" if c.prefix_token_count else ""
    exact = "" if c.token_exact or not c.prompt_token_ids else ", not token-exact"
    return (
        f"{segment} · tokens: prompt {len(c.prompt_token_ids)}{kept}, "
        f"completion {len(c.completion_token_ids)}{exact}"
    )


def message_lines(message: transcript.Message, full: bool) -> list[str]:
    label = f"[{message.role}]" + (
        f" (result of {message.tool_call_id})" if message.tool_call_id else ""
    )
    lines = [label]
    if message.reasoning:
        lines.append(_indent("(reasoning) " + _clip(message.reasoning, full)))
    if message.text:
        lines.append(_indent(_clip(message.text, full)))
    for call in message.tool_calls:
        lines.append(f"    tool call {call.name} {_clip(call.arguments, full)}")
    return lines


def render_plain(view: RolloutView, out: TextIO, *, full: bool = False) -> None:
    def emit(line: str = "") -> None:
        out.write(line + "\n")

    for line in header_lines(view):
        emit(line)
    for call_view in view.calls:
        emit()
        emit(f"── {call_title(call_view)} ──")
        emit(token_line(call_view))
        if call_view.call.error:
            emit(f"error: {call_view.call.error}")
        if call_view.repeated:
            emit(
                f"({call_view.repeated} earlier messages not repeated: "
                "the previous call's, and its reply)"
            )
        elif call_view.tools:
            emit("tools offered: " + ", ".join(call_view.tools))
        for message in call_view.messages:
            for line in message_lines(message, full):
                emit(line)
        if call_view.response is not None:
            emit("→ reply")
            for line in message_lines(call_view.response, full):
                emit(line)
    for lost in view.lost:
        emit(
            f"lost {'whole rollout' if lost.whole_rollout else f'call #{lost.call_index}'}: "
            f"{lost.reason}"
        )
    emit()
    for line in rows_plain(view, full):
        emit(line)


def no_rows_reason(stats: export.ExportStats) -> str:
    """Why a rollout has no training rows: no completed calls, or none with tokens."""
    failed = outcome.describe(stats.failures())
    if failed:
        return f"no completed tokenized calls; failed calls not trained: {failed}"
    return "no tokenized calls"


def rows_plain(view: RolloutView, full: bool) -> list[str]:
    lines = [f"── training rows ({TRAINED} = trained, {MASKED} = masked) ──"]
    if view.row_error:
        return [*lines, f"no rows: {view.row_error}"]
    if not view.rows:
        return [*lines, f"no rows ({no_rows_reason(view.stats)})"]
    reasons = {c.call.call_index: c.call.segment_reason for c in view.calls}
    for talk in conversations(view.rows):
        lines.append(conversation_summary(talk))
        for position, row_view in enumerate(talk.rows):
            last = position == len(talk.rows) - 1
            branch, stem = ("└─ ", "   ") if last else ("├─ ", "│  ")
            lines.append(branch + row_summary(row_view, reasons=reasons, first=position == 0))
            mask = row_view.row.response_mask
            per = _per_char(mask)
            plural = "" if per == 1 else "s"
            lines.append(f"{stem}  mask {mask_bar(mask)}  (1 char = {per} token{plural})")
            for span in row_view.spans:
                kind = "trained" if span.trained else "masked"
                text = (
                    ""
                    if span.text is None
                    else " " + json.dumps(_clip(span.text, full), ensure_ascii=False)
                )
                lines.append(f"{stem}  {kind} {len(span.token_ids)}{text}")
    if view.stats.split_on_mismatch:
        lines.append(
            f"{view.stats.split_on_mismatch} call(s) split: "
            "the sidecar said 'same segment', the tokens did not"
        )
    return lines


def conversation_summary(view: ConversationView) -> str:
    """A conversation's line: its rows and calls, its merge rate, where it branched from."""
    head = view.rows[0].row
    branch = (
        f" · branches from row {head.branch_of} after {head.branch_tokens} tokens"
        if view.index > 0 and head.branch_of >= 0
        else ""
    )
    rows = f"{len(view.rows)} row{'' if len(view.rows) == 1 else 's'}"
    calls = f"{view.calls} call{'' if view.calls == 1 else 's'}"
    rate = f" · merge rate {view.merge_rate:.0%}" if view.calls > 1 else ""
    return f"conversation {view.index}{branch} · {rows}, {calls}{rate}"


def row_summary(view: RowView, *, reasons: dict[int, str], first: bool) -> str:
    """A row's line; a row after its conversation's first is a rewrite of it (with the
    sidecar's reason)."""
    row = view.row
    calls = ", ".join(f"#{i}" for i in row.call_indices)
    reward = f" · reward {row.reward:g}" if row.has_reward else ""
    rewrite = ""
    if not first:
        reason = reasons.get(row.call_indices[0]) or "tokens differ"
        after = (
            f"row {row.branch_of} after {row.branch_tokens} tokens" if row.branch_of >= 0 else ""
        )
        rewrite = f" · rewrites {after or 'the conversation'} ({reason})"
    return (
        f"row {row.segment_index}{rewrite} · calls {calls} · prompt {len(row.prompt_ids)} tokens"
        f" · response {len(row.response_ids)} tokens: {view.trained} trained, {view.masked} masked"
        f"{reward}"
    )


# --- rich ---------------------------------------------------------------------------


def render_rich(view: RolloutView, console: Console, *, full: bool = False) -> None:
    for line in header_lines(view):
        console.print(Text(line, style="bold" if line.startswith("rollout") else ""))
    for call_view in view.calls:
        console.print(
            Panel(_call_body(call_view, full), title=call_title(call_view), title_align="left")
        )
    for lost in view.lost:
        what = "whole rollout" if lost.whole_rollout else f"call #{lost.call_index}"
        console.print(Text(f"lost {what}: {lost.reason}", style="red"))
    console.print(Panel(_rows_body(view, full), title="training rows", title_align="left"))


def _call_body(view: CallView, full: bool) -> RenderableType:
    parts: list[RenderableType] = [Text(token_line(view), style="dim")]
    if view.call.error:
        parts.append(Text(f"error: {view.call.error}", style="red"))
    if view.repeated:
        parts.append(
            Text(
                f"({view.repeated} earlier messages not repeated: "
                "the previous call's, and its reply)",
                style="dim",
            )
        )
    elif view.tools:
        parts.append(Text("tools offered: " + ", ".join(view.tools), style="dim"))
    parts += [_message(m, full) for m in view.messages]
    if view.response is not None:
        parts.append(Text("→ reply", style="bold"))
        parts.append(_message(view.response, full))
    return Group(*parts)


def _message(message: transcript.Message, full: bool) -> Text:
    text = Text()
    text.append(f"[{message.role}]", style=f"bold {_ROLE_STYLES.get(message.role, '')}".strip())
    if message.tool_call_id:
        text.append(f" (result of {message.tool_call_id})", style="dim")
    if message.reasoning:
        text.append(
            "\n" + _indent("(reasoning) " + _clip(message.reasoning, full)), style="italic dim"
        )
    if message.text:
        text.append("\n" + _indent(_clip(message.text, full)))
    for call in message.tool_calls:
        text.append("\n    tool call ", style="bold yellow")
        text.append(f"{call.name} ", style="bold")
        text.append(_clip(call.arguments, full))
    return text


def _rows_body(view: RolloutView, full: bool) -> RenderableType:
    if view.row_error:
        return Text(f"no rows: {view.row_error}", style="red")
    if not view.rows:
        return Text(f"no rows ({no_rows_reason(view.stats)})", style="dim")
    parts: list[RenderableType] = [
        Text.assemble(
            ("trained", "bold green"),
            " = the policy's tokens, ",
            ("masked", "dim"),
            " = appended by the harness",
        )
    ]
    reasons = {c.call.call_index: c.call.segment_reason for c in view.calls}
    for talk in conversations(view.rows):
        parts.append(Text(conversation_summary(talk), style="bold cyan"))
        for position, row_view in enumerate(talk.rows):
            parts += _row_parts(row_view, full, reasons=reasons, first=position == 0)
    return Group(*parts)


def _row_parts(
    row_view: RowView, full: bool, *, reasons: dict[int, str], first: bool
) -> list[RenderableType]:
    """A row under its conversation: its line, its mask bar, its decoded spans."""
    summary = Text("  " + row_summary(row_view, reasons=reasons, first=first), style="bold")
    bar = Text("    ")
    for char in mask_bar(row_view.row.response_mask):
        bar.append("█" if char == TRAINED else "░", style="green" if char == TRAINED else "dim")
    decoded = Text("    ")
    for span in row_view.spans:
        label = (
            span.text
            if span.text is not None
            else f"[{'trained' if span.trained else 'masked'} {len(span.token_ids)}]"
        )
        decoded.append(_clip(label, full), style="bold green" if span.trained else "dim")
    return [summary, bar, decoded]
