"""Run the real Claude Code (``claude -p``) on one task, against ``ANTHROPIC_BASE_URL``.

Claude Code needs no configuration file: everything is environment. This
launcher gives it a fresh, temporary HOME and starts

    claude -p "<prompt>" --output-format json --dangerously-skip-permissions \\
        --no-session-persistence

in the task's working directory with stdin closed, with
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` (no telemetry, error
reporting, update or feature-flag calls to api.anthropic.com) and
``IS_SANDBOX=1`` (which lets ``--dangerously-skip-permissions`` run as
root, as it does in a throwaway container). Claude Code speaks the Anthropic
Messages API (``POST {base}/v1/messages?beta=true``, streamed). Its final
message (``result`` of the JSON it prints) lands in ``answer.txt``.

    python run.py --prompt "..." --workdir DIR

Which ``claude``: ``$CLAUDE_BIN``, else the one ``scripts/install_harnesses.sh``
installs under ``${OPENFORGE_HARNESS_ROOT:-~/.cache/openforge/npm}``, else
``claude`` on ``PATH``. Environment: ``ANTHROPIC_BASE_URL`` (required),
``ANTHROPIC_API_KEY`` (optional), ``OPENFORGE_MODEL`` (sent as ``--model``
when set; Claude Code's default model otherwise: a name it does not know
makes it warn and change its request's ``max_tokens`` and effort).
Exit status: Claude Code's; 2 bad arguments or no ``claude``; 3 no answer.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import launcher

INSTALLED = Path("claude-code", "node_modules", ".bin", "claude")


def command(claude: str, prompt: str, model: str | None) -> list[str]:
    argv = [
        claude, "-p", prompt, "--output-format", "json", "--dangerously-skip-permissions",
        "--no-session-persistence",
    ]  # fmt: skip
    return [*argv, "--model", model] if model else argv


def environment(base_url: str, api_key: str) -> dict[str, str]:
    """Claude Code's settings: the endpoint, and nothing else reachable."""
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "IS_SANDBOX": "1",
    }


def answer(output: object) -> str | None:
    """The final message of ``--output-format json`` output, unless it reports an error."""
    if not isinstance(output, dict) or output.get("is_error") is not False:
        return None
    result = output.get("result")
    return result if isinstance(result, str) else None


def main(argv: list[str]) -> int:
    args = launcher.parser("Run Claude Code on one task against ANTHROPIC_BASE_URL.").parse_args(
        argv
    )
    try:
        base_url = launcher.required("ANTHROPIC_BASE_URL")
        claude = launcher.find_binary("CLAUDE_BIN", launcher.harness_root() / INSTALLED, "claude")
    except launcher.LauncherError as error:
        print(f"claude-code/run.py: {error}", file=sys.stderr)
        return launcher.EXIT_USAGE
    workdir = args.workdir.resolve()
    with tempfile.TemporaryDirectory(prefix="claude-home-") as home:
        settings = environment(base_url, os.environ.get("ANTHROPIC_API_KEY") or "openforge")
        code, output = launcher.run_json(
            command(claude, args.prompt, os.environ.get("OPENFORGE_MODEL")),
            env=launcher.clean_env(Path(home), settings), cwd=workdir, timeout=args.timeout,
        )  # fmt: skip
    return launcher.keep_answer(workdir, answer(output), exit_code=code, cli="claude")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
