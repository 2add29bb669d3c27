"""How a policy's chat template is rendered: one Jinja environment, as transformers makes it.

The sidecar renders every prompt through it (``openforge_sidecar.policy.template``);
the trainer's tiny policy renders its warm-start demos and the test engine its chats
through it (``openforge_trainer.tiny.tokenizer_build``). A template rendered two ways
would train the tiny policy on text the sidecar never sends, so there is one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

import jinja2
from jinja2 import compiler, nodes
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def environment() -> ImmutableSandboxedEnvironment:
    """A sandboxed Jinja environment configured like transformers' chat-template one:
    ``trim_blocks``, ``lstrip_blocks``, loop controls, its ``tojson`` filter and its
    ``raise_exception`` global."""
    env = _Environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Sequence[str] | None = None,
    sort_keys: bool = False,
) -> str:
    """The `tojson` filter exactly as transformers defines it for chat templates (the same
    parameters, positional as there: a template may pass them so)."""
    seps = None if separators is None else (separators[0], separators[1])
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=seps, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


_DICT_ATTRIBUTES = frozenset(dir(dict))


class _Sum:
    """``a + b + c`` as Jinja computes it, left to right, but strings joined in one copy:
    ``_Sum(a).then(b).then(c).value()``.

    Chat templates write a turn as ``'<|im_start|>' + role + '\n' + content + ...``:
    added in turn, a 30 MB message's content is copied once per ``+`` after it, and two
    of those copies are alive at once (the sum so far, and the next): three times the
    message, with it. Joined, the turn is made once. Each operand is evaluated after the
    sum before it, as with ``+``, so the same operand fails first."""

    __slots__ = ("_strings", "_sum")

    def __init__(self, first: Any) -> None:
        self._sum = first
        self._strings: list[str] | None = [first] if type(first) is str else None

    def then(self, operand: Any) -> _Sum:
        if self._strings is not None and type(operand) is str:
            self._strings.append(operand)
            return self
        self._sum = self.value() + operand  # as Jinja adds it, or its error
        self._strings = None
        return self

    def value(self) -> Any:
        if self._strings is not None and len(self._strings) > 1:
            self._strings = ["".join(self._strings)]
        return self._strings[0] if self._strings is not None else self._sum


class _CodeGenerator(compiler.CodeGenerator):
    """Jinja's code generator, with a chain of ``+`` (``a + b + c``) computed by
    :class:`_Sum`: the same value, or the same error."""

    def visit_Add(self, node: nodes.BinExpr, frame: compiler.Frame) -> None:
        operands: list[nodes.Expr] = [node.right]
        left = node.left
        while isinstance(left, nodes.Add):
            operands.append(left.right)
            left = left.left
        if len(operands) < 2 or self.environment.intercepted_binops:  # type: ignore[attr-defined]
            super().visit_Add(node, frame)  # one copy either way (or the sandbox's own +)
            return
        self.write("environment.added(")
        self.visit(left, frame)
        self.write(")")
        for operand in reversed(operands):
            self.write(".then(")
            self.visit(operand, frame)
            self.write(")")
        self.write(".value()")


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with a chain of ``+`` added in one go (:class:`_Sum`), and a
    shortcut for ``message.role`` on the dicts we render.

    Jinja looks ``x.name`` up as an attribute first and, when that raises,
    as a key. On a plain dict only dict's own attributes can be found, so
    for any other name the answer is the key or undefined, as the sandbox
    would give it, without paying for the exception (a sixth of a render
    or more).
    """

    code_generator_class = _CodeGenerator
    added = _Sum

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)
