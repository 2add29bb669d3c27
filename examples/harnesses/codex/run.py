"""Run the real Codex CLI (``codex exec``) on one toy task, against ``OPENAI_BASE_URL``.

Codex is not modified or wrapped: this script only writes the configuration
Codex reads (a ``config.toml`` with a custom model provider whose base URL is
``OPENAI_BASE_URL``, in a fresh ``CODEX_HOME`` of its own) and starts

    codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox \\
        --ephemeral --output-last-message answer.txt "<the task's prompt>"

in the task's working directory with stdin closed. Codex speaks the OpenAI
Responses API (``POST {base_url}/responses``, streamed); its final message
lands in ``answer.txt``, where the toy task's grader reads the answer.

    python run.py --task-file tasks.jsonl --task-id train-000 --workdir DIR
    python run.py --prompt "..." --workdir DIR

Which ``codex``: ``$CODEX_BIN``, else the one ``scripts/install_harnesses.sh``
installs under ``${OPENFORGE_HARNESS_ROOT:-~/.cache/openforge/npm}``, else
``codex`` on ``PATH``. ``--instructions FILE`` replaces Codex's own 17 KB
system prompt (``model_instructions_file``); the demo uses it because the
tiny policy's context is 4,096 tokens. Leave it out with a real model.

Exit status: Codex's own; 2 for bad arguments or a missing ``codex``.
Environment: ``OPENAI_BASE_URL`` (required), ``OPENAI_API_KEY`` (optional),
``OPENFORGE_MODEL`` (the model name to send; default ``policy``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ANSWER_FILE = "answer.txt"
# The toy tasks say "use the lookup tool"; Codex's tool is its shell.
TOY_HINT = (
    "The lookup tool here is your shell: the database is colors.json in the working directory."
)

# Kept from the caller's environment; everything else Codex sees is set here.
PASS_THROUGH = (
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
)  # fmt: skip

CONFIG = """\
model = {model}
model_provider = "openforge"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
model_reasoning_effort = "low"
web_search = "disabled"
{instructions}
[model_providers.openforge]
name = "openforge"
base_url = {base_url}
env_key = "OPENFORGE_CODEX_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[history]
persistence = "none"

[features]
plugins = false
remote_plugin = false
enable_request_compression = false
goals = false

[agents]
enabled = false

[skills]
include_instructions = false
"""


def codex_binary() -> str | None:
    if os.environ.get("CODEX_BIN"):
        return os.environ["CODEX_BIN"]
    root = Path(
        os.environ.get("OPENFORGE_HARNESS_ROOT") or Path.home() / ".cache" / "openforge" / "npm"
    )
    installed = root / "codex" / "node_modules" / ".bin" / "codex"
    if installed.is_file():
        return str(installed)
    return shutil.which("codex")


def config_toml(*, base_url: str, model: str, instructions: Path | None) -> str:
    """Codex's config: one custom provider, nothing that reaches beyond ``base_url``.

    ``json.dumps`` quotes a string the way TOML reads a basic string.
    """
    lines = ""
    if instructions is not None:
        lines = (
            f"model_instructions_file = {json.dumps(str(instructions.resolve()))}\n"
            "include_permissions_instructions = false\n"
            "include_environment_context = false\n"
        )
    return CONFIG.format(model=json.dumps(model), base_url=json.dumps(base_url), instructions=lines)


def task_prompt(task_file: Path, task_id: str) -> str:
    for line in task_file.read_text().splitlines():
        if line.strip() and (task := json.loads(line)).get("id") == task_id:
            return f"{task['prompt']}\n{TOY_HINT}"
    raise ValueError(f"{task_file}: no task with id {task_id!r}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="Run Codex CLI on one task against OPENAI_BASE_URL."
    )
    parser.add_argument("--prompt", help="the task (instead of --task-file/--task-id)")
    parser.add_argument("--task-file", type=Path)
    parser.add_argument("--task-id")
    parser.add_argument("--workdir", type=Path, default=Path("."))
    parser.add_argument(
        "--instructions", type=Path, help="replace Codex's system prompt with this file"
    )
    args = parser.parse_args(argv)
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        parser.error("OPENAI_BASE_URL is not set")
    if args.prompt is None and (args.task_file is None or args.task_id is None):
        parser.error("give --prompt, or --task-file and --task-id")
    try:
        prompt = args.prompt or task_prompt(args.task_file, args.task_id)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    codex = codex_binary()
    if codex is None:
        print(
            "run.py: no codex: set CODEX_BIN or run scripts/install_harnesses.sh", file=sys.stderr
        )
        return 2
    workdir = args.workdir.resolve()
    with tempfile.TemporaryDirectory(prefix="codex-home-") as home:
        config = config_toml(
            base_url=base_url,
            model=os.environ.get("OPENFORGE_MODEL", "policy"),
            instructions=args.instructions,
        )
        Path(home, "config.toml").write_text(config)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "CODEX_HOME": home,
            "OPENFORGE_CODEX_API_KEY": os.environ.get("OPENAI_API_KEY") or "openforge",
            # the Proxy and Transparent capture modes route and trust through these
            **{name: os.environ[name] for name in PASS_THROUGH if name in os.environ},
        }
        command = [
            codex, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--ephemeral", "--color", "never",
            "--output-last-message", str(workdir / ANSWER_FILE), prompt,
        ]  # fmt: skip
        return subprocess.run(
            command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, check=False
        ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
