"""What the catalog's launchers share: find the CLI, give it a clean home, keep its answer.

Each ``examples/harnesses/<name>/run.py`` runs one unmodified agent CLI on one
task. It only writes the configuration the CLI reads (in a fresh, temporary
HOME of its own, so nothing from the user's real HOME leaks in and nothing is
left behind), starts the CLI headless in the task's working directory with
stdin closed, and writes the CLI's final message to ``answer.txt`` there,
where the task's grader reads it.

The environment the CLI sees is built, not inherited: ``PATH``, the fresh
``HOME``, the variables the launcher sets, and from the caller only the
proxy and CA-trust variables (which the operator sets in the Proxy and
Transparent capture modes). Stdlib only: the harness images carry no
OpenForge package.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ANSWER_FILE = "answer.txt"
# Exit statuses of a launcher besides the CLI's own.
EXIT_USAGE, EXIT_NO_ANSWER = 2, 3
# Kept from the caller's environment: the capture modes that route through a proxy need them.
PASS_THROUGH = (
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
)  # fmt: skip


class LauncherError(Exception):
    """A bad argument, a missing variable or CLI; the launcher exits 2."""


def harness_root(environ: Mapping[str, str] = os.environ) -> Path:
    """Where ``scripts/install_harnesses.sh`` installs the npm CLIs."""
    default = Path.home() / ".cache" / "openforge" / "npm"
    return Path(environ.get("OPENFORGE_HARNESS_ROOT") or default)


def find_binary(
    variable: str, installed: Path, name: str, environ: Mapping[str, str] = os.environ
) -> str:
    """``$variable`` if set, else the installed copy, else ``name`` on ``PATH``."""
    if environ.get(variable):
        return environ[variable]
    if installed.is_file():
        return str(installed)
    found = shutil.which(name, path=environ.get("PATH"))
    if found is None:
        raise LauncherError(
            f"no {name}: set {variable}, or install it ({installed} is missing, "
            f"nor is {name} on PATH)"
        )
    return found


def required(variable: str, environ: Mapping[str, str] = os.environ) -> str:
    value = environ.get(variable)
    if not value:
        raise LauncherError(f"{variable} is not set")
    return value


def clean_env(
    home: Path, extra: Mapping[str, str], *, path: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, str]:  # fmt: skip
    """The CLI's whole environment: ``PATH``, a fresh ``HOME``, ``extra``, proxies and CAs."""
    env = {
        "PATH": path or environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
    }
    env.update({name: environ[name] for name in PASS_THROUGH if name in environ})
    env.update(extra)
    return env


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments every launcher takes: the task's prompt and where to work."""
    parse = argparse.ArgumentParser(description=description)
    parse.add_argument("--prompt", required=True, help="the task, as the user would type it")
    parse.add_argument("--workdir", type=Path, default=Path("."), help="where the CLI works")
    parse.add_argument(
        "--timeout", type=float, default=None, help="kill the CLI after this many seconds"
    )
    return parse


def run_json(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float | None
) -> tuple[int, Any]:
    """Run a CLI that prints one JSON document on stdout; its stderr passes through.

    Returns the exit status and the parsed document (``None`` when stdout
    held no JSON). Stdout is echoed to our stderr, so a rollout's log shows it.
    """
    done = subprocess.run(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip
    sys.stderr.write(done.stdout)
    sys.stderr.flush()
    return done.returncode, last_json(done.stdout)


def last_json(stdout: str) -> Any:
    """The JSON document a CLI printed: all of stdout, else its last line that parses."""
    try:
        return json.loads(stdout)
    except ValueError:
        pass
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def keep_answer(workdir: Path, answer: str | None, *, exit_code: int, cli: str) -> int:
    """Write the final message where the grader reads it; the launcher's exit status."""
    if answer is None:
        print(f"{cli} gave no final answer (exit {exit_code})", file=sys.stderr)
        return exit_code or EXIT_NO_ANSWER
    (workdir / ANSWER_FILE).write_text(answer + "\n", encoding="utf-8")
    print(answer)
    return exit_code
