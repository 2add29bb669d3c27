"""Task templates: how a task record is spliced into env vars, args and files.

A template is plain text with placeholders ``{{ task }}`` (the whole record)
or ``{{ task.<field> }}`` (one field; dots reach into nested objects, e.g.
``{{ task.repo.url }}``). Nothing else is recognised between ``{{`` and
``}}``; there are no filters or conditionals, so a template means the same to
the operator, to ``openforge run`` and to whoever reads the manifest.

A string value is inserted as is; any other value (numbers, lists, objects,
the whole record) as compact JSON. With ``json_values=True`` (task files of
format ``json``) every value is inserted as JSON, strings quoted and escaped,
so ``{"prompt": {{ task.prompt }}}`` stays valid JSON whatever the prompt holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_REFERENCE = re.compile(r"^\s*task((?:\.[A-Za-z_][A-Za-z0-9_-]*)*)\s*$")


class TemplateError(ValueError):
    """A template that cannot be parsed, or a record that lacks a field it uses."""


def references(template: str) -> list[tuple[str, ...]]:
    """The field paths a template uses (``()`` for the whole record); raise if malformed."""
    paths: list[tuple[str, ...]] = []
    for match in _PLACEHOLDER.finditer(template):
        reference = _REFERENCE.match(match[1])
        if reference is None:
            raise TemplateError(
                f"placeholder {match[0]!r} is not {{{{ task }}}} or {{{{ task.<field> }}}}"
            )
        paths.append(tuple(part for part in reference[1].split(".") if part))
    leftover = _PLACEHOLDER.sub("", template)
    if "{{" in leftover:
        raise TemplateError(f"unclosed placeholder in {template!r} ('{{{{' without '}}}}')")
    return paths


def render(template: str, task: Mapping[str, Any], *, json_values: bool = False) -> str:
    """Fill every placeholder from ``task``; raise TemplateError naming a missing field."""
    references(template)

    def fill(match: re.Match[str]) -> str:
        reference = _REFERENCE.match(match[1])
        assert reference is not None  # references() checked every placeholder
        value = _lookup(task, tuple(part for part in reference[1].split(".") if part))
        if isinstance(value, str) and not json_values:
            return value
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    return _PLACEHOLDER.sub(fill, template)


def _lookup(task: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = task
    for depth, part in enumerate(path):
        if not isinstance(value, Mapping) or part not in value:
            where = "task." + ".".join(path[: depth + 1])
            raise TemplateError(f"task {task.get('id', '?')!r} has no field {where}")
        value = value[part]
    return value
