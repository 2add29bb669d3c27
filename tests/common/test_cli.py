"""The ``openforge`` front door: every subcommand it lists can be dispatched."""

from __future__ import annotations

import importlib
import inspect

import pytest
from openforge import cli


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_resolves_to_a_function(name: str) -> None:
    module_name, function_name, summary = cli.COMMANDS[name]
    assert summary, f"{name}: no help line"
    module = importlib.import_module(module_name)
    function = getattr(module, function_name, None)
    assert callable(function), f"{name}: {module_name}.{function_name} is not a function"
    parameters = inspect.signature(function).parameters
    assert len(parameters) >= 1, f"{name}: {function_name} must take the argument list"


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, (_, _, summary) in cli.COMMANDS.items():
        assert f"{name}  " in out and summary in out


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_commands_help_is_plain_text(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No reST markup of the docstrings it comes from (``literal``, :mod:`x`) in --help."""
    with pytest.raises(SystemExit) as exited:
        cli.main([name, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ") or "usage" in out.lower()
    for markup in ("``", ":mod:", ":class:", ":func:"):
        assert markup not in out, f"openforge {name} --help shows {markup!r}:\n{out}"


def test_description_writes_a_docstrings_first_paragraph_plain() -> None:
    doc = """``openforge x``: does :mod:`openforge.y` things
    over two lines.

    More that --help leaves out."""
    assert cli.description(doc) == "openforge x: does openforge.y things over two lines."
    assert cli.description(None) is None
