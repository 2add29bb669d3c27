"""The token history: which calls merge into earlier ones, and why the others do not."""

from __future__ import annotations

import dataclasses
import json
from array import array
from pathlib import Path
from typing import Any

import pytest
import tiny_policy
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge.wire import conversation as cv
from openforge_sidecar.policy import history, stored, template

SHELL = cv.Tool(name="shell", parameters={"type": "object", "properties": {}})


tiny = tiny_policy.load


def text(role: str, body: str) -> cv.Message:
    return cv.Message(role, (cv.TextPart(body),))  # type: ignore[arg-type]


def call(call_id: str, arguments: str) -> cv.Message:
    return cv.Message("assistant", (cv.ToolCallPart(call_id, "shell", arguments),))


def result(call_id: str, body: str) -> cv.Message:
    return cv.Message("tool", (cv.ToolResultPart(call_id, (cv.TextPart(body),)),))


def request(*messages: cv.Message, tools: tuple[cv.Tool, ...] = (SHELL,)) -> cv.ChatRequest:
    return cv.ChatRequest(api=cv.WireApi.OPENAI_CHAT, model="m", messages=messages, tools=tools)


BASE = (text("system", "You are terse."), text("user", "List the files."))
REPLY = call("call_1", '{"command": "ls"}')


def first_call() -> tuple[history.TokenHistory, history.Plan]:
    tokens = history.TokenHistory(tiny())
    plan = tokens.plan(request(*BASE))
    tokens.record(
        request(*BASE), plan, reply=REPLY, completion_ids=[5, 6, 7, *tiny().stop_token_ids]
    )
    return tokens, plan


def test_a_continuation_extends_the_earlier_call_tokens_exactly() -> None:
    tokens, first = first_call()
    plan = tokens.plan(request(*BASE, REPLY, result("call_1", "a.txt")))
    head = [*first.prompt_ids, 5, 6, 7, *tiny().stop_token_ids]
    assert plan.segment_reason == "" and plan.segment_index == first.segment_index
    assert list(plan.prompt_ids[: len(head)]) == head and plan.prefix_token_count == len(head)
    assert tokens.merge_rate == 1.0


def test_the_merge_rate_counts_the_calls_after_each_conversations_first() -> None:
    """A side conversation between two turns neither merges nor counts against the rate."""
    tokens, _ = first_call()
    title = request(text("system", "Write a title."), text("user", "List the files."[::-1]))
    assert tokens.plan(title).segment_reason == "new_conversation"
    assert tokens.plan(request(*BASE, REPLY, result("call_1", "a.txt"))).segment_reason == ""
    assert (tokens.calls, tokens.conversations, tokens.merged, tokens.merge_rate) == (3, 2, 1, 1.0)
    rewritten = request(BASE[0], text("user", "Summary: files listed."))
    assert tokens.plan(rewritten).segment_reason == "history_rewritten"  # same system prompt
    assert tokens.merge_rate == 0.5


def test_rewritten_ids_and_reformatted_arguments_still_merge() -> None:
    tokens, _ = first_call()
    echo = call("toolu_other_id", '{ "command":  "ls" }')
    assert tokens.plan(request(*BASE, echo, result("toolu_other_id", "a.txt"))).segment_reason == ""


def test_what_does_not_continue_starts_a_segment_with_its_reason() -> None:
    cases = {
        "history_rewritten": request(BASE[0], text("user", "Other."), REPLY, result("c", "x")),
        "system_changed": request(text("system", "Be verbose."), BASE[1], REPLY, result("c", "x")),
        "retry": request(*BASE),
        "tools_changed": request(*BASE, REPLY, result("c", "x"), tools=()),
        "new_conversation": request(text("system", "Write a title."), text("user", "Chat 1")),
    }
    for reason, asked in cases.items():
        tokens, first = first_call()
        plan = tokens.plan(asked)
        assert (plan.segment_reason, plan.prefix_token_count) == (reason, 0), reason
        assert plan.segment_index == first.segment_index + 1


def test_a_call_beside_one_still_answered_in_the_same_conversation_is_concurrent() -> None:
    tokens = history.TokenHistory(tiny())
    answering = tokens.plan(request(*BASE))
    beside = tokens.plan(request(*BASE))  # the same conversation asked again, at once
    sub_agent = tokens.plan(request(BASE[0], text("user", "Count the files.")))
    assert [p.segment_reason for p in (answering, beside, sub_agent)] == [
        "first",
        "concurrent",
        "first",  # a system prompt in common is not one conversation
    ]
    assert len({p.segment_index for p in (answering, beside, sub_agent)}) == 3
    for plan in (answering, beside, sub_agent):
        tokens.finished(plan)
    assert tokens.plan(request(*BASE)).segment_reason == "first"  # none is answered now
    # the same turn asked twice once it has a history: both extend it, no new segment
    extended, _ = first_call()
    turn = (*BASE, REPLY, result("call_1", "a.txt"))
    assert [extended.plan(request(*turn)).segment_reason for _ in range(2)] == ["", ""]


# --- the head search, against the list-of-normalized-messages form it had -----------


def _reference_find_head(
    heads: list[tuple[history._Head, tuple[cv.Message, ...]]],
    messages: tuple[cv.Message, ...],
    tools: tuple[cv.Tool, ...],
) -> tuple[history._Head | None, str]:
    """The head search on the messages themselves: each head with the messages it ended."""
    norm = history._norm_message
    if not heads:
        return None, "first"
    normalized = [norm(m) for m in messages]

    def opening(found: tuple[cv.Message, ...]) -> cv.Message | None:
        return next((m for m in found if m.role not in ("system", "developer")), None)

    def related(known: tuple[cv.Message, ...]) -> bool:
        if not messages or not known:
            return False
        mine, theirs = opening(messages), opening(known)
        return normalized[0] == norm(known[0]) or (
            mine is not None and theirs is not None and norm(mine) == norm(theirs)
        )

    if not any(related(conv) for _, conv in heads):
        return None, "new_conversation"
    reason = "history_rewritten"
    for head, conv in reversed(heads):
        known = len(conv)
        if len(messages) <= known:
            if len(messages) == known - 1 and normalized == [norm(m) for m in conv[:-1]]:
                reason = "retry"
            continue
        if normalized[:known] != [norm(m) for m in conv]:
            if messages and conv and normalized[0] != norm(conv[0]):
                reason = "system_changed" if reason == "history_rewritten" else reason
            continue
        if head.tools != tools:
            reason = "tools_changed"
            continue
        return head, ""
    return None, reason


_messages = st.sampled_from(
    [
        BASE[0],
        text("system", "You are terse. "),  # the same once stripped
        text("system", "Be verbose."),
        BASE[1],
        text("user", "List the files."),  # equal, another object
        REPLY,
        call("other_id", '{"command":"ls"}'),  # same call, other id and spacing
        call("call_1", '{"command": "pwd"}'),
        call("call_1", "not json"),
        result("call_1", "a.txt"),
        result("call_9", " a.txt\n"),
    ]
)
_conversations = st.lists(_messages, min_size=1, max_size=5).map(tuple)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_conversations, st.booleans()), max_size=4),
    _conversations,
    st.booleans(),
)
def test_the_head_search_decides_as_the_normalized_comparison_did(
    heads: list[tuple[tuple[cv.Message, ...], bool]],
    messages: tuple[cv.Message, ...],
    with_tools: bool,
) -> None:
    tokens = history.TokenHistory(tiny())
    kept = [
        (history._Head(keys(conv), (SHELL,) if tooled else (), array("i"), False, index), conv)
        for index, (conv, tooled) in enumerate(heads)
    ]
    tokens._heads = [head for head, _ in kept]
    tools = (SHELL,) if with_tools else ()
    assert tokens._find_head(tokens._keys(messages), tools) == _reference_find_head(
        kept, messages, tools
    )


def keys(messages: tuple[cv.Message, ...]) -> tuple[history._Key, ...]:
    return tuple(map(history._key, messages))


def same(a: cv.Message, b: cv.Message) -> bool:
    return history._same(history._key(a), history._key(b))


def test_normalizing_compares_arguments_as_json() -> None:
    assert same(call("a", '{"x": 1, "y": 2}'), call("b", '{"y":2,"x":1}'))
    assert not same(call("a", '{"x": 1}'), call("a", '{"x": 1.0}'))
    assert json.loads('{"x": 1}') == json.loads('{"x": 1.0}')  # why not parsed equality


def test_parts_of_another_kind_with_the_same_fields_are_not_the_same() -> None:
    """Dataclasses hash their fields alone: an image and a reasoning part with one text
    hash alike; the key tells them apart."""
    image = cv.Message("assistant", (cv.ImagePart("https://x/a.png"),))
    thought = cv.Message("assistant", (cv.ReasoningPart("https://x/a.png"),))
    assert hash(image.parts[0]) == hash(thought.parts[0])
    assert history._key(image).exact != history._key(thought).exact


def test_a_head_keeps_no_message_text_but_one_to_render_ahead_until_it_is_rendered() -> None:
    tokens, _ = first_call()
    head = tokens._heads[-1]
    assert head.messages == (*BASE, REPLY) and head.rendered is None  # a reply calling tools
    tokens.prerender()
    assert head.messages is None and head.rendered is not None
    # a request whose messages were let go of after planning (a large call) keeps none
    planned = tokens.plan(request(*BASE, REPLY, result("call_1", "a.txt")))
    tokens.record(request(), planned, reply=REPLY, completion_ids=[9])
    assert tokens._heads[-1].messages is None and len(tokens._heads[-1].keys) == 5
    tokens.prerender()
    assert tokens._heads[-1].rendered is None
    again = tokens.plan(request(*BASE, REPLY, result("call_1", "a.txt"), REPLY, result("c", "b")))
    assert again.segment_reason == "" and again.prefix_token_count == len(planned.prompt_ids) + 1


class CountingRenderer:
    """The tiny tokenizer, counting whole-template renders."""

    def __init__(self) -> None:
        self.renders = 0
        self.eos_token = tiny().eos_token
        self.stop_token_ids = tiny().stop_token_ids

    def render(self, messages, tools, *, add_generation_prompt):  # type: ignore[no-untyped-def]
        self.renders += 1
        return tiny().render(messages, tools, add_generation_prompt=add_generation_prompt)

    def encode_ids(self, text: str) -> array[int]:
        return tiny().encode_ids(text)

    def render_ids(self, messages, tools, *, add_generation_prompt, spill=None):  # type: ignore[no-untyped-def]
        self.renders += 1
        return tiny().render_ids(
            messages, tools, add_generation_prompt=add_generation_prompt, spill=spill
        )


def continued(
    echo: cv.Message, reply: cv.Message = REPLY
) -> tuple[int, history.Plan, history.TokenHistory]:
    """Plan a continuation echoing ``echo`` after a prerendered head: (renders, plan, history)."""
    renderer = CountingRenderer()
    tokens = history.TokenHistory(renderer)
    plan = tokens.plan(request(*BASE))
    tokens.record(request(*BASE), plan, reply=reply, completion_ids=[5, 6, *tiny().stop_token_ids])
    tokens.prerender()
    before = renderer.renders
    planned = tokens.plan(request(*BASE, echo, result("x", "a.txt")))
    return renderer.renders - before, planned, tokens


def unprerendered(echo: cv.Message, reply: cv.Message = REPLY) -> history.Plan:
    """The same continuation planned by a history that never rendered ahead."""
    plain = history.TokenHistory(tiny())
    first = plain.plan(request(*BASE))
    plain.record(request(*BASE), first, reply=reply, completion_ids=[5, 6, *tiny().stop_token_ids])
    return plain.plan(request(*BASE, echo, result("x", "a.txt")))


def test_an_exact_echo_uses_the_prerendered_head_and_plans_the_same_prompt() -> None:
    renders, planned, _ = continued(REPLY)
    assert renders == 1  # only the new request; the head was rendered between calls
    assert planned == unprerendered(REPLY)


def test_rewrites_the_template_does_not_show_still_use_the_prerendered_head() -> None:
    # The tiny template renders neither tool-call ids nor the arguments' spacing.
    echo = call("other_id", '{ "command":  "ls" }')
    renders, planned, tokens = continued(echo)
    assert renders == 1 and planned.segment_reason == ""
    assert planned == unprerendered(echo)
    tokens.record(
        request(*BASE, echo, result("x", "a.txt")), planned, reply=REPLY, completion_ids=[9]
    )
    tokens.prerender()
    assert tokens._heads[-1].rendered is not None  # still worth it for this harness


def test_a_rewrite_the_template_shows_renders_both_and_stops_prerendering_until_an_exact_echo() -> (
    None
):
    thinking = cv.Message("assistant", (cv.ReasoningPart("look first"), *REPLY.parts))
    renders, planned, tokens = continued(REPLY, reply=thinking)  # the harness drops the reasoning
    assert renders == 2 and planned.segment_reason == ""
    assert planned == unprerendered(REPLY, reply=thinking)
    asked = (*BASE, REPLY, result("x", "a.txt"))
    tokens.record(request(*asked), planned, reply=thinking, completion_ids=[9])
    tokens.prerender()
    assert tokens._heads[-1].rendered is None  # not worth it for this harness
    echoed = (*asked, thinking, result("y", "b.txt"))  # an exact echo of the head
    tokens.record(request(*echoed), tokens.plan(request(*echoed)), reply=REPLY, completion_ids=[9])
    tokens.prerender()
    assert tokens._heads[-1].rendered is not None


def test_only_a_reply_that_calls_tools_is_rendered_ahead() -> None:
    renderer = CountingRenderer()
    tokens = history.TokenHistory(renderer)
    plan = tokens.plan(request(*BASE))
    tokens.record(
        request(*BASE),
        plan,
        reply=text("assistant", "Nothing to run."),
        completion_ids=[5, *tiny().stop_token_ids],
    )
    before = renderer.renders
    tokens.prerender()
    assert renderer.renders == before and tokens._heads[-1].rendered is None


def test_a_large_head_keeps_its_ids_in_a_file_until_it_is_replaced_or_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stored, "SPILL_IDS", 5)
    left = tmp_path / "heads" / "head-9.ids"
    left.parent.mkdir()
    left.write_bytes(b"an earlier history's")
    tokens = history.TokenHistory(tiny(), spill=tmp_path / "heads", max_heads=2)
    assert not left.exists()
    first = tokens.plan(request(*BASE))
    tokens.record(request(*BASE), first, reply=REPLY, completion_ids=[5, *tiny().stop_token_ids])
    head = tokens._heads[-1]
    assert isinstance(head.token_ids, stored.StoredIds) and head.token_ids.path.exists()
    ids = head.token_ids.load()
    assert ids.tolist() == [*stored.loaded(first.prompt_ids), 5, *tiny().stop_token_ids]
    turn = (*BASE, REPLY, result("call_1", "a.txt"))
    plan = tokens.plan(request(*turn))
    # the prompt that continues it is the head's file copied, the new turn's IDs after
    assert isinstance(plan.prompt_ids, stored.StoredIds) and plan.prompt_ids.path.exists()
    assert plan.segment_reason == "" and plan.prompt_ids.load()[: len(ids)] == ids
    tokens.record(request(*turn), plan, reply=REPLY, completion_ids=[6])
    assert not head.token_ids.path.exists()  # its conversation's new head replaced it
    plan.prompt_ids.discard()  # the caller's, once the call is recorded
    for n in range(2):  # two other conversations push it out
        side = request(text("system", f"Side {n}."), text("user", f"Title {n}."))
        tokens.record(side, tokens.plan(side), reply=text("assistant", "T"), completion_ids=[7])
    assert len(tokens._heads) == 2 and len(list((tmp_path / "heads").iterdir())) == 2


def test_a_large_calls_head_is_copied_from_its_prompts_file_not_read_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large call's prompt IDs wait in a file (Recorder.stash_ids): its head is that
    file copied, the completion appended, and the prompt's own file is left as it was
    (the record reads it next)."""
    monkeypatch.setattr(stored, "SPILL_IDS", 5)
    tokens = history.TokenHistory(tiny(), spill=tmp_path / "heads")
    first = tokens.plan(request(*BASE))
    prompt = stored.StoredIds.write(tmp_path / "stash" / "0.ids", stored.loaded(first.prompt_ids))
    loads = []
    monkeypatch.setattr(stored.StoredIds, "load", lambda self: loads.append(self) or 1 / 0)
    planned = dataclasses.replace(first, prompt_ids=prompt)
    tokens.record(request(*BASE), planned, reply=REPLY, completion_ids=[5, 6])
    head = tokens._heads[-1].token_ids
    assert isinstance(head, stored.StoredIds) and head.path.parent == tmp_path / "heads"
    assert not loads  # the prompt was never read into memory
    monkeypatch.undo()
    assert head.load().tolist() == [*stored.loaded(first.prompt_ids), 5, 6]
    assert prompt.load() == stored.loaded(first.prompt_ids)


def test_a_large_calls_prompt_file_gone_keeps_no_head_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call's own prompt file gone before its end: no head is made of what is left
    (it raises, which the capture addon counts as history_failed), none half-written."""
    monkeypatch.setattr(stored, "SPILL_IDS", 5)
    tokens = history.TokenHistory(tiny(), spill=tmp_path / "heads")
    first = tokens.plan(request(*BASE))
    prompt = stored.StoredIds.write(tmp_path / "stash" / "0.ids", stored.loaded(first.prompt_ids))
    prompt.path.unlink()
    planned = dataclasses.replace(first, prompt_ids=prompt)
    with pytest.raises(OSError):
        tokens.record(request(*BASE), planned, reply=REPLY, completion_ids=[5, 6])
    assert not tokens._heads and not list((tmp_path / "heads").glob("*"))


def test_a_head_whose_file_is_gone_starts_a_segment_instead_of_failing_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stored, "SPILL_IDS", 5)
    tokens = history.TokenHistory(tiny(), spill=tmp_path / "heads")
    first = tokens.plan(request(*BASE))
    tokens.record(request(*BASE), first, reply=REPLY, completion_ids=[5])
    head = tokens._heads[-1]
    assert isinstance(head.token_ids, stored.StoredIds)
    head.token_ids.path.write_bytes(b"\0\0\0")  # cut short (or deleted) under the sidecar
    turn = request(*BASE, REPLY, result("call_1", "a.txt"))
    lost = tokens.plan(turn)
    assert (lost.segment_reason, lost.prefix_token_count) == ("history_lost", 0)
    assert not tokens._heads  # dropped: the next call is a conversation's first again
    tokens.finished(lost)
    assert tokens.plan(turn).segment_reason == "first"


def test_a_long_new_prompt_is_planned_into_a_file_of_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new conversation's long prompt is written to the spill folder as it is encoded
    (never all in memory); the call's caller discards it once the call is recorded, and
    the head is a copy of it."""
    monkeypatch.setattr(stored, "SPILL_IDS", 5)
    monkeypatch.setattr(template, "WHOLE_PROMPT_CHARS", 0)
    expected = history.TokenHistory(tiny()).plan(request(*BASE)).prompt_ids
    tokens = history.TokenHistory(tiny(), spill=tmp_path / "heads")
    plan = tokens.plan(request(*BASE))
    assert isinstance(plan.prompt_ids, stored.StoredIds)
    assert plan.prompt_ids.path.parent == tmp_path / "heads"
    assert plan.prompt_ids.load() == expected
    tokens.record(request(*BASE), plan, reply=REPLY, completion_ids=[5])
    plan.prompt_ids.discard()
    head = tokens._heads[-1].token_ids
    assert isinstance(head, stored.StoredIds) and head.load() == expected + array("i", [5])


def test_a_continued_prompt_that_cannot_be_written_stays_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk when the head's file is copied for the next prompt is not a lost
    history: the prompt is joined in memory. A head whose own file is unreadable is lost,
    and its file goes with it."""
    monkeypatch.setattr(stored, "SPILL_IDS", 5)
    tokens = history.TokenHistory(tiny(), spill=tmp_path / "heads")
    first = tokens.plan(request(*BASE))
    tokens.record(request(*BASE), first, reply=REPLY, completion_ids=[5])
    head = tokens._heads[-1].token_ids
    assert isinstance(head, stored.StoredIds)

    def full(self: stored.StoredIds, path: Path, more: Any) -> stored.StoredIds:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(stored.StoredIds, "extended", full)
    turn = request(*BASE, REPLY, result("call_1", "a.txt"))
    plan = tokens.plan(turn)
    assert plan.segment_reason == "" and isinstance(plan.prompt_ids, array)
    assert plan.prompt_ids[: len(head)] == head.load()
    tokens.finished(plan)
    head.path.write_bytes(b"\0")  # now cut short
    lost = tokens.plan(turn)
    assert lost.segment_reason == "history_lost" and not head.path.exists()
