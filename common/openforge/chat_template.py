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


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with a shortcut for ``message.role`` on the dicts we render.

    Jinja looks ``x.name`` up as an attribute first and, when that raises,
    as a key. On a plain dict only dict's own attributes can be found, so
    for any other name the answer is the key or undefined, as the sandbox
    would give it, without paying for the exception (a sixth of a render
    or more).
    """

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)
