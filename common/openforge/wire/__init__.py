"""The wire APIs a harness speaks, parsed and written one way for every component.

:mod:`~openforge.wire.conversation` is the canonical model (messages, parts,
tools, completions, stream events) and :class:`~openforge.wire.conversation.WireApi`
the one spelling of each API's name. :mod:`openforge.wire.codecs` holds one
pure codec per API (OpenAI Chat Completions, OpenAI Responses, Anthropic
Messages, Gemini): the sidecar parses requests and writes responses with
them, and the trainer reads stored bodies back with the same ones.
:mod:`~openforge.wire.sse` and :mod:`~openforge.wire.fastjson` are the
grammar and JSON helpers they share.
"""
