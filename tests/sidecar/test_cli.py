import socket

import pytest
from openforge_sidecar import cli


def settings(*argv: str) -> list[str]:
    return cli.settings(cli.build_parser().parse_args(["--spool", "/tmp/s", *argv]))


def test_reverse_tokens_mode_targets_the_engine():
    out = settings("--engine", "http://127.0.0.1:8000", "--listen", "127.0.0.1:9000", "--job", "j1")
    assert "mode=reverse:http://127.0.0.1:8000" in out
    assert "listen_host=127.0.0.1" in out and "listen_port=9000" in out
    assert "openforge_job=j1" in out and "openforge_mode=tokens" in out


def test_regular_proxy_mode_and_passthrough():
    out = settings("--mode", "regular", "--capture", "passthrough", "--confdir", "/tmp/ca")
    assert "mode=regular" in out
    assert "confdir=/tmp/ca" in out and "openforge_mode=passthrough" in out


def test_quiet_unless_verbose():
    assert "termlog_verbosity=warn" in settings("--engine", "http://e")
    assert not [s for s in settings("--engine", "http://e", "--verbose") if s.startswith("termlog")]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "http://e", "--listen", "nohostport"], "--listen must be host:port"),
        ([], "--engine is required"),
        (["--capture", "passthrough"], "--upstream is required"),
    ],
)
def test_bad_flags_fail_with_the_flag_named(argv, message):
    with pytest.raises(SystemExit, match=message):
        settings(*argv)


def test_the_sidecar_connects_upstream_lazily_in_every_mode():
    assert "connection_strategy=lazy" in settings("--engine", "http://127.0.0.1:8000")
    assert "connection_strategy=lazy" in settings(
        "--engine", "http://127.0.0.1:8000", "--mode", "regular"
    )


def test_an_inherited_socket_must_listen_on_the_listen_address() -> None:
    with socket.socket() as listening, socket.socket() as idle:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        adopted = cli.inherited(listening.fileno(), f"127.0.0.1:{port}")
        assert adopted is not None and adopted.getsockname() == ("127.0.0.1", port)
        adopted.detach()
        assert cli.inherited(-1, "127.0.0.1:1") is None
        with pytest.raises(
            SystemExit,
            match=r"--listen-fd \d+ is not a TCP socket listening on --listen 127.0.0.1:1 ",
        ):
            cli.inherited(listening.fileno(), "127.0.0.1:1")
        idle.bind(("127.0.0.1", 0))
        with pytest.raises(SystemExit, match=r"--listen-fd \d+ is not a TCP socket listening"):
            cli.inherited(idle.fileno(), f"127.0.0.1:{idle.getsockname()[1]}")


def test_the_declared_api_is_passed_on_and_only_a_spec_api_name_is_taken(capsys):
    assert "openforge_api=gemini" in settings("--engine", "http://e", "--api", "gemini")
    assert "openforge_api=" in settings("--engine", "http://e")
    with pytest.raises(SystemExit):
        settings("--engine", "http://e", "--api", "openai_chat")
    assert "--api: invalid choice: 'openai_chat'" in capsys.readouterr().err
