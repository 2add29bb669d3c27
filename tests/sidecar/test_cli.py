from pathlib import Path

import pytest
from openforge_sidecar import addon, cli


def args(*argv: str) -> list[str]:
    return cli.mitmdump_args(cli.build_parser().parse_args(["--spool", "/tmp/s", *argv]))


def test_reverse_tokens_mode_targets_the_engine_and_loads_the_addon():
    out = args("--engine", "http://127.0.0.1:8000", "--listen", "127.0.0.1:9000", "--job", "j1")
    assert out[out.index("--mode") + 1] == "reverse:http://127.0.0.1:8000"
    assert out[out.index("--listen-port") + 1] == "9000"
    assert out[out.index("-s") + 1] == str(Path(addon.__file__))
    assert "openforge_job=j1" in out and "openforge_mode=tokens" in out


def test_regular_proxy_mode_and_passthrough():
    out = args("--mode", "regular", "--capture", "passthrough", "--confdir", "/tmp/ca")
    assert out[out.index("--mode") + 1] == "regular"
    assert "confdir=/tmp/ca" in out and "openforge_mode=passthrough" in out


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
        args(*argv)


def test_the_sidecar_connects_upstream_lazily_in_every_mode():
    assert "connection_strategy=lazy" in args("--engine", "http://127.0.0.1:8000")
    assert "connection_strategy=lazy" in args("--engine", "http://127.0.0.1:8000", "--mode", "regular")
