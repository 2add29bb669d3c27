"""Encoding in pieces between special tokens gives the IDs of encoding whole texts.

Checked against the tokenizer itself on generated texts, with a small cache
so that eviction is exercised too, and the cases where pieces are refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiny_policy
from hypothesis import given, settings
from hypothesis import strategies as st
from openforge_sidecar.policy import segments, stored
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from traced import traced

POLICY = tiny_policy.load()
WHOLE = POLICY._tokenizer
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>"]
PIECES = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "a",
    "ab",
    " the",
    "über",
    "日本",
    "🙂",
    "123",
    "'s",
    "!",
    "<",
    "|",
    ">",
    "im_end",
]


def whole(texts: list[str]) -> list[list[int]]:
    return [e.ids for e in WHOLE.encode_batch_fast(texts, add_special_tokens=False)]


def test_the_policy_tokenizer_encodes_in_pieces_where_the_tokenizer_allows_it() -> None:
    assert POLICY._segments is not None
    text = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n"
        "hi <tool_call> 日本<|im_end|>\n"
    )
    assert POLICY.encode(text) == whole([text])[0]
    assert POLICY.encode(text) == whole([text])[0]  # from the cache


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(SPECIALS + PIECES), max_size=25), min_size=1, max_size=4))
def test_pieces_give_the_ids_of_the_whole_text(texts: list[list[str]]) -> None:
    encoder = segments.SegmentEncoder.for_tokenizer(WHOLE, whole)
    assert encoder is not None
    small = segments.SegmentEncoder(whole, encoder._ids, max_cached_chars=16)
    # batches of a few characters: pieces are evicted while a window still needs them
    batched = segments.SegmentEncoder(whole, encoder._ids, max_cached_chars=16, batch_chars=3)
    for text in map("".join, texts):
        expected = whole([text])[0]
        assert encoder.encode(text) == expected
        assert small.encode(text) == expected
        assert batched.encode(text) == expected
        assert encoder.encode(text) == expected  # again, from the cache


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(SPECIALS + PIECES + ["word " * 6]), max_size=30),
    st.lists(st.integers(0, 400), max_size=10),
)
def test_chunks_give_the_ids_of_their_text_however_it_is_cut(
    parts: list[str], cuts: list[int]
) -> None:
    """A chat template writes its text in chunks cut anywhere: inside a piece, inside a
    cut token, at its edges, several chunks to one token."""
    encoder = segments.SegmentEncoder.for_tokenizer(WHOLE, whole)
    assert encoder is not None
    text = "".join(parts)
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    expected = whole([text])[0]
    assert encoder.encode_chunks(chunks).tolist() == expected
    small = segments.SegmentEncoder(
        whole, encoder._ids, max_cached_chars=16, max_piece_chars=8, batch_chars=4
    )
    assert small.encode_chunks(iter(chunks)).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from([*PIECES, "word", " word", "Word", " x", "don't", "  ", ",", " 42"]),
        max_size=200,
    )
)
def test_a_long_piece_is_encoded_in_parts_to_the_same_ids(words: list[str]) -> None:
    encoder = segments.SegmentEncoder.for_tokenizer(WHOLE, whole)
    assert encoder is not None
    text = "".join(words)
    cut_small = segments.SegmentEncoder(whole, encoder._ids, max_piece_chars=8)
    assert cut_small.encode(text) == whole([text])[0]


def test_a_10_mb_message_is_never_encoded_more_than_a_part_at_a_time() -> None:
    """The tokenizer's memory while encoding is ~90 bytes per character: a 10 MB
    piece took ~1 GB. Cut into 16 K-character parts it takes a few MB."""
    sizes: list[int] = []

    def spy(texts: list[str]) -> list[list[int]]:
        sizes.append(sum(map(len, texts)))
        return whole(texts)

    encoder = segments.SegmentEncoder.for_tokenizer(WHOLE, spy)
    assert encoder is not None
    sizes.clear()
    text = "<|im_start|>user\n" + "Some words, and 42 more words. " * 340_000 + "<|im_end|>"
    ids = encoder.encode(text)
    assert max(sizes) <= segments.BATCH_CHARS and sum(sizes) == len(text) - len(
        "<|im_start|><|im_end|>"
    )
    assert ids == whole([text])[0]


def test_a_long_conversation_is_given_to_the_tokenizer_a_batch_at_a_time() -> None:
    """5,000 messages are 5,000 new pieces: given to the tokenizer in one call, a 10 MB
    conversation took 28 times its size. Each call now gets about a batch."""
    calls: list[int] = []

    def spy(texts: list[str]) -> list[list[int]]:
        calls.append(sum(map(len, texts)))
        return whole(texts)

    encoder = segments.SegmentEncoder.for_tokenizer(WHOLE, spy)
    assert encoder is not None
    calls.clear()
    message = "turn {} " + "Some words, and 42 more. " * 40
    text = "".join(
        f"<|im_start|>{('user', 'assistant')[i % 2]}\n{message.format(i)}<|im_end|>\n"
        for i in range(5_000)
    )
    assert encoder.encode(text) == whole([text])[0]
    longest = len(message) + 10
    assert len(calls) > 50 and max(calls) <= segments.BATCH_CHARS + longest, max(calls)


def test_the_cache_is_bounded_and_keeps_the_recently_used() -> None:
    encoder = segments.SegmentEncoder(whole, {"<|im_end|>": 2}, max_cached_chars=80)
    for index in range(50):
        encoder.encode(f"message number {index}<|im_end|>tail")
        assert encoder._chars <= 80
    assert "tail" in encoder._cache
    assert "message number 0" not in encoder._cache
    huge = "x" * 11  # over an eighth of the bound: encoded, not kept
    assert encoder.encode(huge) == whole([huge])[0] and huge not in encoder._cache


def _bpe(*, pre: Any = None, added: list[AddedToken] = ()) -> Tokenizer:  # type: ignore[assignment]
    vocab = {c: i for i, c in enumerate(["a", "b", "▁", "Ġ", "<", ">", "s"])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    if pre is not None:
        tokenizer.pre_tokenizer = pre
    tokenizer.add_special_tokens(list(added))
    return tokenizer


def test_pieces_are_refused_where_the_tokenizer_looks_across_a_cut() -> None:
    def encoder(tokenizer: Tokenizer) -> segments.SegmentEncoder | None:
        return segments.SegmentEncoder.for_tokenizer(
            tokenizer,
            lambda ts: [e.ids for e in tokenizer.encode_batch(ts, add_special_tokens=False)],
        )

    assert encoder(
        _bpe(
            pre=pre_tokenizers.ByteLevel(),
            added=[AddedToken("<s>", special=True, normalized=False)],
        )
    )
    assert (
        encoder(
            _bpe(
                pre=pre_tokenizers.Metaspace(prepend_scheme="first"),
                added=[AddedToken("<s>", special=True, normalized=False)],
            )
        )
        is None
    )
    assert (
        encoder(_bpe(added=[AddedToken("<s>", special=True, normalized=False, lstrip=True)]))
        is None
    )
    assert (
        encoder(_bpe(added=[AddedToken("<s>", special=True, normalized=True)])) is None
    )  # no raw-text token
    truncating = _bpe(added=[AddedToken("<s>", special=True, normalized=False)])
    truncating.enable_truncation(8)
    assert encoder(truncating) is None


def test_a_token_another_could_take_the_place_of_is_no_cut() -> None:
    assert segments._conflict("<s>x", "<s>")  # contains it
    assert segments._conflict("a<", "<s>")  # starts before it and overlaps
    assert not segments._conflict("</s>", "<s>")
    tokenizer = _bpe(
        added=[AddedToken(t, special=True, normalized=False) for t in ("<s>", "a<", "</s>")]
    )
    cut, _ = segments._cut_tokens(tokenizer)
    assert set(cut) == {"a<"}  # "<s>" and "</s>" could each be overlapped by a match of "a<"


def test_a_long_piece_is_encoded_where_it_lies_with_no_copy_of_it() -> None:
    """Cut out of the prompt, then into parts, a 10 MB message was two more copies of
    itself while it was encoded: what Python holds on the way is now its IDs."""
    encoder = segments.SegmentEncoder.for_tokenizer(WHOLE, whole)
    assert encoder is not None
    text = "<|im_start|>user\n" + "Some words, and 42 more words. " * 340_000 + "<|im_end|>"
    encoded = traced(lambda: encoder.encode_ids(text))
    ids, peak = encoded.value, encoded.peak
    assert ids.tolist() == whole([text])[0]
    assert peak < len(ids) * ids.itemsize + len(text) // 2


def test_chunks_that_fail_half_way_leave_no_file_of_their_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stored, "SPILL_IDS", 10)
    encoder = segments.SegmentEncoder.for_tokenizer(WHOLE, whole)
    assert encoder is not None

    def chunks() -> Iterator[str]:
        yield "word " * 200
        raise ValueError("the template failed")

    with pytest.raises(ValueError, match="the template failed"):
        encoder.encode_chunks(chunks(), spill=tmp_path / "p.ids")
    assert not (tmp_path / "p.ids").exists()
    ids = encoder.encode_chunks(iter(["word " * 200, "<|im_end|>"]), spill=tmp_path / "p.ids")
    assert isinstance(ids, stored.StoredIds)
    assert ids.load().tolist() == whole(["word " * 200 + "<|im_end|>"])[0]
