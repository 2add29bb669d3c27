"""Run the real ZeroClaw (``zeroclaw agent -m``) on one task, against ``OPENAI_BASE_URL``.

ZeroClaw (the Rust crate ``zeroclaw`` from crates.io, built by
``scripts/install_zeroclaw.sh``) reads one ``config.toml`` from its config
directory. This launcher writes one in a fresh, temporary directory: a single
OpenAI-compatible provider (``[providers.models.custom.openforge]``) whose
``uri`` is ``OPENAI_BASE_URL``, with native tool calling (without it ZeroClaw
describes its tools in a 56 KB system prompt and parses ``<tool_call>`` tags
out of the reply text) and no retries; one agent, ``main``, whose workspace is
the task's working directory (ZeroClaw's shell tool runs there, not in the
process's cwd) and whose risk profile runs tools without approval. Then it
starts

    zeroclaw --config-dir <that directory> agent -a main -m "<prompt>"

in the working directory with stdin closed and a fresh HOME. ZeroClaw posts
``{uri}/chat/completions`` (OpenAI Chat Completions, not streamed) and
prints its final message on stdout, which lands in ``answer.txt``. Its
memory, sessions and traces stay in the temporary directory.

    python run.py --prompt "..." --workdir DIR

Which ``zeroclaw``: ``$ZEROCLAW_BIN``, else the one ``scripts/install_zeroclaw.sh``
builds under ``${OPENFORGE_CARGO_ROOT:-~/.cache/openforge/cargo}``, else
``zeroclaw`` on ``PATH``. Environment: ``OPENAI_BASE_URL`` (required),
``OPENAI_API_KEY`` (optional), ``OPENFORGE_MODEL`` (the model name to send;
default ``policy``).
Exit status: ZeroClaw's; 2 bad arguments or no ``zeroclaw``; 3 no answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import launcher

CONFIG = """\
schema_version = 3

[providers.models.custom.openforge]
uri = {base_url}
model = {model}
api_key = {api_key}
native_tools = true

[agents.main]
enabled = true
model_provider = "custom.openforge"
risk_profile = "rollout"

[agents.main.workspace]
path = {workdir}

[risk_profiles.rollout]
level = "full"

[reliability]
provider_retries = 0

[gateway]
check_updates = false
"""


def cargo_root(environ: Mapping[str, str] = os.environ) -> Path:
    default = Path.home() / ".cache" / "openforge" / "cargo"
    return Path(environ.get("OPENFORGE_CARGO_ROOT") or default)


def config_toml(*, base_url: str, model: str, api_key: str, workdir: Path) -> str:
    """ZeroClaw's config; ``json.dumps`` quotes a string the way TOML reads a basic string."""
    return CONFIG.format(
        base_url=json.dumps(base_url),
        model=json.dumps(model),
        api_key=json.dumps(api_key),
        workdir=json.dumps(str(workdir)),
    )


def command(zeroclaw: str, config_dir: Path, prompt: str) -> list[str]:
    return [zeroclaw, "--config-dir", str(config_dir), "agent", "-a", "main", "-m", prompt]


def main(argv: list[str]) -> int:
    args = launcher.parser("Run ZeroClaw on one task against OPENAI_BASE_URL.").parse_args(argv)
    try:
        base_url = launcher.required("OPENAI_BASE_URL")
        zeroclaw = launcher.find_binary(
            "ZEROCLAW_BIN", cargo_root() / "bin" / "zeroclaw", "zeroclaw"
        )
    except launcher.LauncherError as error:
        print(f"zeroclaw/run.py: {error}", file=sys.stderr)
        return launcher.EXIT_USAGE
    workdir = args.workdir.resolve()
    with tempfile.TemporaryDirectory(prefix="zeroclaw-") as scratch:
        home, config_dir = Path(scratch, "home"), Path(scratch, "config")
        home.mkdir()
        config_dir.mkdir()
        (config_dir / "config.toml").write_text(
            config_toml(
                base_url=base_url,
                model=os.environ.get("OPENFORGE_MODEL") or "policy",
                api_key=os.environ.get("OPENAI_API_KEY") or "openforge",
                workdir=workdir,
            )
        )
        done = subprocess.run(
            command(zeroclaw, config_dir, args.prompt), cwd=workdir,
            env=launcher.clean_env(home, {}), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            text=True, timeout=args.timeout, check=False,
        )  # fmt: skip
    sys.stderr.write(done.stdout)
    answer = done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None
    return launcher.keep_answer(workdir, answer, exit_code=done.returncode, cli="zeroclaw")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
