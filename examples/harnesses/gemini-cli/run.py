"""Run the real Gemini CLI (``gemini -p``) on one task, against ``GOOGLE_GEMINI_BASE_URL``.

Gemini CLI speaks only Google's Gemini API (``POST
{base}/v1beta/models/{model}:streamGenerateContent?alt=sse``, and
``:countTokens`` before a turn that carries an image). This launcher writes
its ``settings.json`` in a fresh, temporary HOME (API-key auth, no usage
statistics, telemetry or update checks) and starts

    gemini -p "<prompt>" --yolo --output-format json --model <model>

in the task's working directory with stdin closed and
``GEMINI_CLI_TRUST_WORKSPACE=true``. The explicit model matters: with the
default (``auto``) every turn first makes a router side call. The final
message (``response`` of the JSON it prints) lands in ``answer.txt``.

    python run.py --prompt "..." --workdir DIR

Which ``gemini``: ``$GEMINI_BIN``, else the one ``scripts/install_harnesses.sh``
installs under ``${OPENFORGE_HARNESS_ROOT:-~/.cache/openforge/npm}``, else
``gemini`` on ``PATH``. Environment: ``GOOGLE_GEMINI_BASE_URL`` (required;
the base without ``/v1beta``), ``GEMINI_API_KEY`` (optional),
``OPENFORGE_MODEL`` (the model name to send; default ``policy``).
Exit status: Gemini CLI's; 2 bad arguments or no ``gemini``; 3 no answer.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import launcher

INSTALLED = Path("gemini-cli", "node_modules", ".bin", "gemini")

# API-key auth (with GOOGLE_GEMINI_BASE_URL set and no selected type Gemini CLI
# infers the "gateway" type, which headless mode refuses); no Clearcut usage
# statistics (CONNECT play.googleapis.com otherwise), telemetry or update checks.
SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


def command(gemini: str, prompt: str, model: str) -> list[str]:
    return [gemini, "-p", prompt, "--yolo", "--output-format", "json", "--model", model]


def environment(base_url: str, api_key: str) -> dict[str, str]:
    return {
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_API_KEY": api_key,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }


def answer(output: object) -> str | None:
    """The final message of ``--output-format json`` output, unless it reports an error."""
    if not isinstance(output, dict) or "error" in output:
        return None
    response = output.get("response")
    return response if isinstance(response, str) else None


def main(argv: list[str]) -> int:
    args = launcher.parser("Run Gemini CLI on one task against GOOGLE_GEMINI_BASE_URL.").parse_args(
        argv
    )
    try:
        base_url = launcher.required("GOOGLE_GEMINI_BASE_URL")
        gemini = launcher.find_binary("GEMINI_BIN", launcher.harness_root() / INSTALLED, "gemini")
    except launcher.LauncherError as error:
        print(f"gemini-cli/run.py: {error}", file=sys.stderr)
        return launcher.EXIT_USAGE
    workdir = args.workdir.resolve()
    with tempfile.TemporaryDirectory(prefix="gemini-home-") as home:
        (Path(home) / ".gemini").mkdir()
        (Path(home) / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS, indent=2))
        settings = environment(base_url, os.environ.get("GEMINI_API_KEY") or "openforge")
        code, output = launcher.run_json(
            command(gemini, args.prompt, os.environ.get("OPENFORGE_MODEL") or "policy"),
            env=launcher.clean_env(Path(home), settings), cwd=workdir, timeout=args.timeout,
        )  # fmt: skip
    return launcher.keep_answer(workdir, answer(output), exit_code=code, cli="gemini")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
