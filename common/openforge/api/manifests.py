"""Reading HarnessEnv and RolloutJob manifests, with errors that point at the line.

:func:`load_manifests` parses a (multi-document) YAML file or text, validates
each document with the API models, and reports every problem at once, one
line each::

    jobs.yaml:14: spec.samplesPerTask: input should be greater than or equal to 1, got 0
        (expected an integer >= 1)

The YAML is composed into nodes first (``yaml.compose``), which keep their
positions, so a pydantic error location such as ``spec.tasks.inline[2].id``
can be walked down the node tree to the line of the offending key. A field
that is missing points at the mapping that should hold it.

:func:`parse` is the same validation for an object that did not come from a
file (the operator's view of a custom resource): the problems carry no line.
Both accept camelCase field names only, as the API server does.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml

from openforge.api import structural, v1alpha1

Loc = tuple[str | int, ...]
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest; ``str()`` gives
    ``file:line: path: message (expected ...)``."""

    path: str
    message: str
    expected: str | None = None
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line}: " if self.line is not None else f"{self.file}: "
        field = f"{self.path}: " if self.path else ""
        tail = f" (expected {self.expected})" if self.expected else ""
        return f"{where}{field}{self.message}{tail}"


class ManifestError(ValueError):
    """Manifests that do not validate; ``problems`` lists each, in document order."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


@dataclasses.dataclass(frozen=True)
class _Raw:
    loc: Loc
    message: str
    expected: str | None = None


def parse(body: Mapping[str, Any]) -> v1alpha1.Resource:
    """Validate one object (a dict from the API server or a test) into its model."""
    resource, problems = _validate(body)
    if resource is None:
        raise ManifestError(
            [Problem(_path(raw.loc), raw.message, raw.expected) for raw in problems]
        )
    return resource


def load_manifests(source: str | os.PathLike[str]) -> list[v1alpha1.Resource]:
    """Every HarnessEnv and RolloutJob in a YAML file (a path) or YAML text (a str).

    A str is read as YAML text unless it is a single line naming an existing
    file. Empty documents are skipped. Raises ManifestError listing every
    problem in every document, each with its file and line.
    """
    if isinstance(source, os.PathLike) or ("\n" not in source and Path(source).is_file()):
        name, text = os.fspath(source), read(source)
    else:
        name, text = "<string>", source
        if len(text.encode()) > MAX_BYTES:
            raise ManifestError(
                [
                    Problem(
                        "",
                        f"the manifests are {len(text.encode())} bytes; "
                        f"at most {MAX_BYTES} are read",
                        None,
                        name,
                    )
                ]
            )
    resources: list[v1alpha1.Resource] = []
    problems: list[Problem] = []
    seen: dict[tuple[str, str | None], int] = {}
    for node, data in _documents(name, text, problems=problems):
        duplicates = [
            Problem(_path(loc), "duplicate key", None, name, line)
            for loc, line in _duplicate_keys(node, ())
        ]
        resource, raws = _validate(data)
        found = [
            Problem(_path(raw.loc), raw.message, raw.expected, name, _line(node, raw.loc))
            for raw in raws
        ]
        problems.extend(sorted([*duplicates, *found], key=lambda problem: problem.line or 0))
        if resource is not None and not duplicates:
            key = (resource.kind, resource.metadata.name)
            if key in seen:
                where = _line(node, ("metadata", "name"))
                problems.append(
                    Problem(
                        "metadata.name",
                        f"a second {key[0]} named {key[1]!r} (first at line {seen[key]})",
                        None,
                        name,
                        where,
                    )
                )
            seen[key] = _line(node, ("metadata", "name"))
            resources.append(resource)
    if problems:
        raise ManifestError(problems)
    return resources


MAX_BYTES = 4 * 1024 * 1024
"""The largest manifest file read (the API server takes objects of at most 1.5 MiB)."""


def read(path: str | os.PathLike[str]) -> str:
    """A manifest file's text, checked before any parsing: its size, and that it is UTF-8
    (ManifestError naming the file and the byte offset at fault)."""
    name = os.fspath(path)
    size = os.stat(path).st_size
    if size > MAX_BYTES:
        raise ManifestError(
            [
                Problem(
                    "",
                    f"the file is {size} bytes; a manifest file holds at most {MAX_BYTES}",
                    None,
                    name,
                )
            ]
        )
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ManifestError(
            [Problem("", f"not UTF-8 text (at byte offset {error.start})", None, name, line)]
        ) from None


def line_of(source: str | os.PathLike[str], kind: str, *, name: str, loc: Loc) -> int | None:
    """The line of ``loc`` (its deepest part present) in the ``kind`` named ``name`` in a
    YAML file, for a problem found after loading (a reference to another object); None
    when the file no longer holds that object."""
    problems: list[Problem] = []
    for node, data in _documents(os.fspath(source), read(source), problems=problems):
        if (
            isinstance(data, Mapping)
            and data.get("kind") == kind
            and (data.get("metadata") or {}).get("name") == name
        ):
            return _line(node, loc)
    return None


# -- YAML -------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """YAML as kubectl reads it: ``1e-6`` is a float and ``2025-01-01`` a string.

    PyYAML follows YAML 1.1 to the letter, where a float needs a dot and a
    date-like scalar becomes a datetime; the Go YAML library behind kubectl
    reads both the other way, and a manifest must mean the same in both.

    Aliases (``*name``, and the ``<<: *name`` merges they make) are read, but a document
    whose aliases expand it past :data:`MAX_NODES` is refused before it is constructed: a
    few lines of nested aliases make billions of nodes (a "billion laughs"), and
    validating those hung the reader.
    """


MAX_NODES = 1_000_000
"""The most nodes a document may expand to through its aliases."""


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes ``root`` holds with every alias expanded (each shared node counted
    at each of its uses), capped at :data:`MAX_NODES` + 1."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if not children_done and id(node) in visiting:
            return MAX_NODES + 1  # an alias inside its own anchor: no end to it
        visiting.add(id(node))
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        sizes[id(node)] = min(MAX_NODES + 1, 1 + sum(sizes.get(id(child), 1) for child in children))
    return sizes[id(root)]


_Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+0123456789."),
)


def _documents(name: str, text: str, *, problems: list[Problem]) -> Iterator[tuple[yaml.Node, Any]]:
    """(node, data) per non-empty document; a YAML syntax error ends the stream as a problem."""
    loader = _Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None or (
                isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"
            ):
                continue
            if _expanded_size(node) > MAX_NODES:
                line = node.start_mark.line + 1
                message = (
                    f"the document's aliases expand it to more than {MAX_NODES} nodes (a billion "
                    "laughs?): write it out"
                )
                problems.append(Problem("", message, None, name, line))
                return
            yield node, loader.construct_document(node)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else None
        problems.append(
            Problem("", f"invalid YAML: {error.problem or error.context}", None, name, line)
        )
    finally:
        loader.dispose()


def _line(node: yaml.Node, loc: Loc) -> int:
    """The line (1-based) of the deepest key or item of ``loc`` present in the node tree."""
    line = node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            entry = next(
                (e for e in node.value if isinstance(e[0], yaml.ScalarNode) and e[0].value == part),
                None,
            )
            if entry is None:
                break
            line, node = entry[0].start_mark.line + 1, entry[1]
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _duplicate_keys(node: yaml.Node, loc: Loc) -> Iterator[tuple[Loc, int]]:
    """(path, line) of each key repeated within its mapping: YAML loaders keep the last
    silently, the API server refuses the object."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name in seen:
                yield (*loc, name), key.start_mark.line + 1
            if name is not None:
                seen.add(name)
            yield from _duplicate_keys(value, (*loc, name) if name is not None else loc)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, (*loc, i))


# -- validation ---------------------------------------------------------------------------


def _validate(data: Any) -> tuple[v1alpha1.Resource | None, list[_Raw]]:
    expected_kinds = " or ".join(v1alpha1.KINDS)
    if not isinstance(data, Mapping):
        hint = " (to load a file, pass a pathlib.Path)" if isinstance(data, str) else ""
        return None, [
            _Raw(
                (),
                f"a manifest must be a mapping, got {type(data).__name__}{hint}",
                "apiVersion, kind, metadata, spec",
            )
        ]
    if data.get("apiVersion") != v1alpha1.API_VERSION:
        got = data.get("apiVersion")
        message = "apiVersion is missing" if got is None else f"unsupported apiVersion {got!r}"
        return None, [_Raw(("apiVersion",), message, v1alpha1.API_VERSION)]
    model = v1alpha1.KINDS.get(data.get("kind"))  # type: ignore[arg-type]
    if model is None:
        got = data.get("kind")
        message = "kind is missing" if got is None else f"unknown kind {got!r}"
        return None, [_Raw(("kind",), message, expected_kinds)]
    try:
        return model.model_validate(data, by_name=False), []
    except pydantic.ValidationError as error:
        return None, [_raw(problem, _schema(model)) for problem in error.errors(include_url=False)]


def _raw(error: Mapping[str, Any], schema: Mapping[str, Any]) -> _Raw:
    loc: Loc = tuple(part for part in error["loc"] if part != "[key]")
    context = error.get("ctx") or {}
    if error["type"] == "openforge":
        return _Raw((*loc, *context["path"]), context["message"], context.get("expected"))
    if error["type"] == "missing":
        return _Raw(loc, "required field is missing", _describe(_at(schema, loc)))
    if error["type"] == "extra_forbidden":
        return _Raw(loc, "unknown field" + _did_you_mean(schema, loc), _known_fields(schema, loc))
    expected = _describe(_at(schema, loc))
    if error["type"] in ("literal_error", "enum"):
        return _Raw(loc, f"{_short(error.get('input'))} is not allowed", expected)
    if error["type"] == "string_pattern_mismatch":
        return _Raw(loc, f"{_short(error.get('input'))} does not match the pattern", expected)
    message = str(error["msg"]).removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    if error["type"] != "value_error":
        message += f", got {_short(error.get('input'))}"
    return _Raw(loc, message, expected)


@functools.cache
def _schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The model's schema in the simple, $ref-free form the CRD uses: easy to walk."""
    return structural.structural(model.model_json_schema(by_alias=True, mode="validation"))


def _at(schema: Mapping[str, Any] | None, loc: Loc) -> Mapping[str, Any] | None:
    node = schema
    for part in loc:
        if node is None:
            return None
        if isinstance(part, int):
            node = node.get("items")
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        else:
            node = node.get("additionalProperties")
    return node


def _known_fields(schema: Mapping[str, Any], loc: Loc) -> str | None:
    fields = list((_at(schema, loc[:-1]) or {}).get("properties", {}))
    return f"one of {', '.join(fields)}" if fields else None


def _did_you_mean(schema: Mapping[str, Any], loc: Loc) -> str:
    fields = list((_at(schema, loc[:-1]) or {}).get("properties", {}))
    close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _describe(node: Mapping[str, Any] | None) -> str | None:
    """A short phrase for what a schema node accepts: 'an integer >= 1', 'one of A, B'."""
    if node is None:
        return None
    if "enum" in node:
        return "one of " + ", ".join(str(value) for value in node["enum"])
    kind = node.get("type")
    if kind in ("integer", "number"):
        bounds = []
        if "minimum" in node:
            bounds.append((">" if node.get("exclusiveMinimum") else ">=") + f" {node['minimum']}")
        if "maximum" in node:
            bounds.append(("<" if node.get("exclusiveMaximum") else "<=") + f" {node['maximum']}")
        return " ".join(
            ["an integer" if kind == "integer" else "a number", " and ".join(bounds)]
        ).strip()
    if kind == "string":
        if node.get("format") == "date-time":
            return "an RFC 3339 date-time"
        text = "a non-empty string" if node.get("minLength", 0) >= 1 else "a string"
        return text + (f" matching {node['pattern']}" if "pattern" in node else "")
    if kind == "boolean":
        return "true or false"
    if kind == "array":
        items = _describe(node.get("items"))
        return "a list" + (f" of items each {items}" if items else "")
    if kind == "object" and node.get("properties"):
        return "a mapping with fields " + ", ".join(node["properties"])
    if kind == "object" and "additionalProperties" in node:
        return f"a mapping of names to {_describe(node['additionalProperties'])}"
    return "a mapping" if kind == "object" else None


def _path(loc: Loc) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
