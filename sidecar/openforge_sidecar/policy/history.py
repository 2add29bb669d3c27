"""One rollout's token history: which prompt tokens a model call gets.

A sidecar serves one rollout, so it sees every call of that rollout. When a
request continues an earlier conversation (same system prompt and tools, the
earlier messages unchanged, the assistant reply we generated echoed back,
then new turns) the new prompt is the earlier call's prompt + completion
token IDs, exactly, followed by the tokens of the new turns only: past
assistant turns are never re-rendered, so what is trained on is exactly
what was sampled. Anything else starts a new segment, with the reason.

Several conversations may interleave (a harness's side calls for titles,
sub-agents, compaction), so the history keeps the last few conversation
heads and continues whichever one the request extends. A call that shares
neither the system prompt nor the opening turn with any head starts a
``new_conversation``; one that does but extends none is a rewrite of a
conversation (``history_rewritten``, ``system_changed``, ``tools_changed``,
``retry``), a new segment of it. A call that extends
no head while a call with the same leading messages is still being answered
(a harness sampling one conversation several times at once, sub-agents fanned
out from one context) starts a segment marked ``concurrent``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from openforge.wire import conversation

from openforge_sidecar.policy import stored

log = logging.getLogger(__name__)


class Renderer(Protocol):
    """The policy tokenizer + chat template, as the history needs it."""

    eos_token: str
    stop_token_ids: frozenset[int]

    def render(
        self,
        messages: Sequence[conversation.Message],
        tools: Sequence[conversation.Tool],
        *,
        add_generation_prompt: bool,
    ) -> str: ...

    def encode_ids(self, text: str) -> array[int]: ...

    def render_ids(
        self,
        messages: Sequence[conversation.Message],
        tools: Sequence[conversation.Tool],
        *,
        add_generation_prompt: bool,
        spill: Path | None = None,
    ) -> stored.Ids: ...


def token_array(ids: Sequence[int]) -> array[int]:
    """Token IDs as a machine-int array: 4 bytes each instead of a list's 8-byte
    pointer to a 28-byte int object (IDs above 256 are objects of their own).
    A prompt's IDs live as long as its call and a conversation's as long as its
    head, so under 50 calls in flight this is megabytes."""
    return array("i", ids)


@dataclass(frozen=True, slots=True)
class Plan:
    """The prompt for one call and how it relates to the calls before it."""

    prompt_ids: stored.Ids  # in a file past stored.SPILL_IDS (see TokenHistory)
    segment_index: int
    segment_reason: str  # "" when the call extends an earlier one
    prefix_token_count: int
    ticket: int = 0  # which call of the history planned it (see TokenHistory.finished)
    keys: tuple[_Key, ...] = ()  # the request's messages, as the history keeps them


@dataclass(frozen=True, slots=True)
class _Key:
    """What the history keeps of a message: enough to tell whether a later request
    repeats it (:func:`_same`), not its text, which a large conversation's head would
    otherwise keep resident between calls (a 30 MB prompt's, 30 MB).

    Hashes, not digests: Python's string hash is SipHash, keyed at random per
    process, so no harness can make two different messages collide on purpose.
    """

    role: str
    exact: int  # equal messages, equal values (:func:`_exact`)
    norm: int  # the hash of :func:`_norm_message`


@dataclass(slots=True)
class _Head:
    """The end of one conversation: everything the next call may extend."""

    keys: tuple[_Key, ...]  # request messages + our reply
    tools: tuple[conversation.Tool, ...]
    token_ids: stored.Ids  # prompt + completion, exactly as the engine saw them
    stopped: bool  # the completion ended with a stop token
    segment_index: int
    # The messages, only until they are rendered ahead (see prerender), and only for a
    # reply that calls tools; then the template's text of them and the tools.
    messages: tuple[conversation.Message, ...] | None = None
    rendered: str | None = None


def _norm_message(message: conversation.Message) -> tuple[object, ...]:
    """What must match for a message to count as unchanged.

    Tool-call ids and reasoning are left out: harnesses rewrite ids into their
    API's style and many drop reasoning from history, neither of which
    changes the tokens we keep. Arguments compare as parsed JSON.
    """
    calls = tuple(
        (call.name, json.dumps(call.parsed_arguments(), sort_keys=True))
        for call in message.tool_calls
    )
    results = tuple(
        (
            part.text.strip(),
            tuple(p.url for p in part.content if isinstance(p, conversation.ImagePart)),
        )
        for part in message.parts
        if isinstance(part, conversation.ToolResultPart)
    )
    images = tuple(p.url for p in message.parts if isinstance(p, conversation.ImagePart))
    return (message.role, message.text.strip(), calls, results, images)


def _exact(message: conversation.Message) -> int:
    """A hash equal for equal messages; each part's type counts (dataclasses hash their
    fields alone: an image's URL and a reasoning text would hash alike)."""
    return hash((message.role, tuple((type(part), part) for part in message.parts)))


def _key(message: conversation.Message) -> _Key:
    return _Key(message.role, _exact(message), hash(_norm_message(message)))


def _same(a: _Key, b: _Key) -> bool:
    """Whether ``a`` counts as ``b`` unchanged (:func:`_norm_message`)."""
    return a.exact == b.exact or a.norm == b.norm


def _all_same(keys: Sequence[_Key], known: Sequence[_Key]) -> bool:
    return len(keys) == len(known) and all(map(_same, keys, known))


def _opening(keys: Sequence[_Key]) -> _Key | None:
    """A conversation's first turn after its system prompt (its task), if any."""
    return next((k for k in keys if k.role not in ("system", "developer")), None)


def _related(keys: Sequence[_Key], known: Sequence[_Key]) -> bool:
    """Whether ``keys`` may be the conversation ``known`` rewritten: they share the
    system prompt or the opening turn. A side call (a title, a summary) or a
    sub-agent shares neither, so it starts a conversation of its own."""
    if not keys or not known:
        return False
    if _same(keys[0], known[0]):
        return True
    opening, known_opening = _opening(keys), _opening(known)
    return opening is not None and known_opening is not None and _same(opening, known_opening)


class TokenHistory:
    """Plans each call's prompt tokens and remembers what was generated."""

    def __init__(
        self,
        renderer: Renderer,
        *,
        max_heads: int = 8,
        first_reason: str = "first",
        spill: Path | None = None,
    ) -> None:
        """``spill``: a folder where IDs past ``stored.SPILL_IDS`` are kept, a head's
        between its calls, a prompt's from when it is encoded (emptied here: an earlier
        history's files are not this one's). A plan's prompt file is then its caller's,
        to discard once the call is recorded; a head's is the history's."""
        self._renderer = renderer
        self._spill = spill
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)
        self._heads: list[_Head] = []
        self._max_heads = max_heads
        self._segments = 0
        self._first_reason = first_reason
        self.calls = 0
        self.merged = 0
        self.conversations = 0  # calls that started a conversation (first, new_conversation)
        self._prerender = True  # the harness sent the last head back exactly as we kept it
        self._spilled = 0  # files written, for their names
        self._answering: dict[int, tuple[_Key, ...]] = {}  # ticket -> its messages' keys

    @property
    def merge_rate(self) -> float:
        """Calls that extended an earlier call, over calls after their conversation's first."""
        followers = self.calls - self.conversations
        return self.merged / followers if followers > 0 else 0.0

    def plan(self, request: conversation.ChatRequest) -> Plan:
        """The prompt of a call; the call is being answered until :meth:`finished`."""
        self.calls += 1
        messages = request.messages
        keys = self._keys(messages)
        found = self._plan(
            messages, keys=keys, tools=request.tools
        )  # before this call counts as answering
        self._answering[self.calls] = keys
        return dataclasses.replace(found, ticket=self.calls, keys=keys)

    def finished(self, plan: Plan) -> None:
        """The call ``plan`` was made for is no longer being answered (answered or not)."""
        self._answering.pop(plan.ticket, None)

    def _keys(self, messages: Sequence[conversation.Message]) -> tuple[_Key, ...]:
        """The messages' keys; a message a head or a call being answered has is not
        normalized again (a harness resends its history on every call)."""
        known = {key.exact: key for head in self._heads for key in head.keys}
        for keys in self._answering.values():
            known.update((key.exact, key) for key in keys)
        out: list[_Key] = []
        for message in messages:
            exact = _exact(message)
            found = known.get(exact)
            out.append(found if found is not None else _key(message))
        return tuple(out)

    def _plan(
        self,
        messages: tuple[conversation.Message, ...],
        *,
        keys: tuple[_Key, ...],
        tools: tuple[conversation.Tool, ...],
    ) -> Plan:
        head, reason = self._find_head(keys, tools)
        if head is not None:
            delta = self._delta_text(head, messages, keys=keys, tools=tools)
            ids = None if delta is None else self._continued(head, self._renderer.encode_ids(delta))
            if ids is not None:
                self.merged += 1
                return Plan(ids, head.segment_index, "", len(head.token_ids))
            reason = "template_not_prefix_stable" if delta is None else "history_lost"
        elif self._concurrent(keys):
            reason = "concurrent"
        if reason in (self._first_reason, "new_conversation"):
            self.conversations += 1
        segment = self._segments
        self._segments += 1
        ids = self._renderer.render_ids(
            messages, tools, add_generation_prompt=True, spill=self._spill_path("prompt")
        )
        return Plan(ids, segment, reason, 0)

    def _concurrent(self, keys: tuple[_Key, ...]) -> bool:
        """Whether a call being answered has the same messages, or the same before its last
        one and more than a system prompt."""
        for asked in self._answering.values():
            lead = asked[:-1]
            if _all_same(keys, asked) or (
                any(k.role != "system" for k in lead)
                and len(keys) > len(lead)
                and _all_same(keys[: len(lead)], lead)
            ):
                return True
        return False

    def record(
        self,
        request: conversation.ChatRequest,
        plan: Plan,
        *,
        reply: conversation.Message,
        completion_ids: Sequence[int],
    ) -> None:
        """Remember the conversation this call ended, for the next call to extend (the call
        is answered: no longer being answered, see :meth:`finished`). The head keeps the
        keys of the messages (``plan.keys``), and the messages themselves only when the
        reply calls tools and ``request`` still has them, to be rendered ahead."""
        self.finished(plan)
        stopped = bool(completion_ids) and completion_ids[-1] in self._renderer.stop_token_ids
        ahead = bool(reply.tool_calls) and len(request.messages) == len(plan.keys)
        head = _Head(
            (*plan.keys, _key(reply)),
            request.tools,
            self._joined(plan.prompt_ids, token_array(completion_ids), name="head"),
            stopped,
            plan.segment_index,
            messages=(*request.messages, reply) if ahead else None,
        )
        heads = [h for h in self._heads if h.segment_index != plan.segment_index]
        heads.append(head)
        kept = heads[-self._max_heads :]
        for gone in self._heads:
            if isinstance(gone.token_ids, stored.StoredIds) and not any(gone is h for h in kept):
                gone.token_ids.discard()
        self._heads = kept

    def _continued(self, head: _Head, delta: array[int]) -> stored.Ids | None:
        """The head's IDs, then ``delta``; None when the head's file is gone or cut short,
        and the head with it (the conversation then starts a segment, ``history_lost``,
        instead of failing every call that continues it)."""
        try:
            return self._joined(head.token_ids, delta, name="prompt")
        except OSError as exc:
            log.error("a conversation's head is lost (%s): its next call starts a segment", exc)
            self._heads = [h for h in self._heads if h is not head]
            if isinstance(head.token_ids, stored.StoredIds):
                head.token_ids.discard()
            return None

    def _joined(self, ids: stored.Ids, more: array[int], *, name: str) -> stored.Ids:
        """``ids``, then ``more``: past ``stored.SPILL_IDS``, in a file of its own, copied
        from the file of ``ids`` where they have one (a 10 MB prompt's IDs are not read
        in, and not joined in memory); in memory when that file cannot be written. OSError
        when the file of ``ids`` is unreadable."""
        path = self._spill_path(name) if len(ids) + len(more) > stored.SPILL_IDS else None
        if path is None:
            return stored.loaded(ids) + more
        try:
            if isinstance(ids, stored.StoredIds):
                return ids.extended(path, more)
            return stored.StoredIds.write(path, ids + more)
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            joined = stored.loaded(ids) + more  # OSError: their own file is unreadable
            log.warning("token IDs stay in memory (%s)", exc)
            return joined

    def _spill_path(self, name: str) -> Path | None:
        """A new file in the spill folder, if there is one."""
        if self._spill is None:
            return None
        self._spilled += 1
        return self._spill / f"{name}-{self._spilled}.ids"

    def prerender(self) -> None:
        """Render the newest head now, ahead of the call that will continue it.

        A call that continues a head needs the template's rendering of the
        head (:meth:`_delta_text`). Ours, of the messages as we kept them, is
        made here, between calls, instead of before the next call's first
        token; it serves whenever the next call's rendering starts with it,
        which is the case when the harness's rewrites (other tool-call ids,
        reformatted arguments) are invisible to the template. After a call
        whose rendering did not start with it, this waits for an exact echo
        of a head before rendering ahead again: that harness's rewrites show
        in the template, and the work would be wasted. Only a reply that
        calls tools is rendered ahead: the harness comes back with their
        results at once, while an answer in text ends the agent's turn, and
        often the rollout. Never raises: a head that does not render here is
        rendered (and its error reported) when a call continues it.
        """
        if not self._heads:
            return
        head = self._heads[-1]
        messages, head.messages = head.messages, None  # rendered or not, not kept
        if not self._prerender or head.rendered is not None or messages is None:
            return
        try:
            head.rendered = self._renderer.render(messages, head.tools, add_generation_prompt=False)
        except Exception:  # the plan renders it again and reports the error there
            head.rendered = None

    def _find_head(
        self, keys: tuple[_Key, ...], tools: tuple[conversation.Tool, ...]
    ) -> tuple[_Head | None, str]:
        if not self._heads:
            return None, self._first_reason
        if not any(_related(keys, head.keys) for head in self._heads):
            return None, "new_conversation"
        reason = "history_rewritten"
        for head in reversed(self._heads):
            known = len(head.keys)
            if len(keys) <= known:
                if len(keys) == known - 1 and _all_same(keys, head.keys[:-1]):
                    reason = "retry"
                continue
            if not _all_same(keys[:known], head.keys):
                if keys and head.keys and not _same(keys[0], head.keys[0]):
                    reason = "system_changed" if reason == "history_rewritten" else reason
                continue
            if head.tools != tools:
                reason = "tools_changed"
                continue
            return head, ""
        return None, reason

    def _delta_text(
        self,
        head: _Head,
        messages: tuple[conversation.Message, ...],
        *,
        keys: tuple[_Key, ...],
        tools: tuple[conversation.Tool, ...],
    ) -> str | None:
        """The text the new turns add after the head's tokens, or None.

        The template's rendering of the head (ending in its end-of-turn token
        and separator) must be a prefix of the new rendering; the delta is
        what follows, preceded by the end-of-turn token when the completion
        stopped without one (cut by length) and by the separator the template
        puts after it.
        """
        render = self._renderer.render
        after = render(messages, tools, add_generation_prompt=True)
        before = head.rendered
        if before is not None and after.startswith(before):
            # The head as we kept it, rendered between calls: the new
            # rendering continues it, so whatever the harness rewrote in
            # the history did not reach the template's text.
            self._prerender = True
        else:
            # The harness's view of the history, so that details it rewrites
            # (ids, dropped reasoning) cancel out of the delta. When that view
            # is exactly the head, it is also our rendering: worth making
            # ahead of the next call again.
            count = len(head.keys)
            self._prerender = before is None and all(
                a.exact == b.exact for a, b in zip(keys[:count], head.keys, strict=True)
            )
            before = render(messages[:count], tools, add_generation_prompt=False)
            if not after.startswith(before):
                return None
        eos = self._renderer.eos_token
        cut = before.rfind(eos)
        if cut < 0:
            return None
        separator = before[cut + len(eos) :]
        closing = "" if head.stopped else eos
        return closing + separator + after[len(before) :]
