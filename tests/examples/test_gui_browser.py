"""The GUI browser harness's parts on real Chromium: the display, the CDP pipe, the tools.

Chromium (Debian's) and Xvfb come from scripts/install_gui_deps.sh; without
them the tests that need them skip, naming the script. The pages are the
web-forms site (examples/tasks/web-forms) served on 127.0.0.1. The whole
agent through the sidecar is tests/harnesses/test_gui_conformance.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openforge.api import manifests, v1alpha1
from openforge_operator import pods, readiness, settings, tasks

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "examples" / "harnesses" / "gui-browser"
TASKS = ROOT / "examples" / "tasks" / "web-forms"
for folder in (HARNESS, TASKS):
    sys.path.insert(0, str(folder))
import agent  # noqa: E402
import browser  # noqa: E402
import webforms  # noqa: E402

HAVE_CHROMIUM = (
    os.access(browser.DEBIAN_BROWSER_BINARY, os.X_OK) or shutil.which("chromium") is not None
)
needs_gui = pytest.mark.skipif(
    not (HAVE_CHROMIUM and shutil.which("Xvfb")),
    reason="Chromium or Xvfb is not installed; run scripts/install_gui_deps.sh",
)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture
def site(tmp_path: Path) -> Iterator[webforms.Site]:
    with webforms.Site(tmp_path) as served:
        yield served


@pytest.fixture(params=["xvfb", "headless"])
def page(request: pytest.FixtureRequest) -> Iterator[browser.Browser]:
    if not (HAVE_CHROMIUM and shutil.which("Xvfb")):
        pytest.skip("Chromium or Xvfb is not installed; run scripts/install_gui_deps.sh")
    display = browser.Display(width=640, height=480) if request.param == "xvfb" else None
    try:
        opened = browser.Browser(binary=browser.find_chromium(), width=640, height=480,
                                 display=display.name if display else None)  # fmt: skip
        try:
            yield opened
        finally:
            opened.close()
    finally:
        if display is not None:
            display.close()


def element(page: browser.Browser, role: str, label: str) -> browser.Element:
    return next(e for e in page.elements() if (e.role, e.label) == (role, label))


def test_clicks_and_keys_fill_and_submit_forms_and_screenshots_are_the_viewport(
    page: browser.Browser, site: webforms.Site, tmp_path: Path
) -> None:
    page.navigate(site.url + "/newsletter")
    assert page.location() == (site.url + "/newsletter", "Newsletter")
    listed = [e.describe() for e in page.elements()]
    assert 'textbox "Email" at' in listed[6] and listed[7].endswith("unchecked"), listed
    email = element(page, "textbox", "Email")
    page.click(email.x, email.y)
    page.type_text("alan@example.org")
    digest = element(page, "checkbox", "Weekly digest")
    page.click(digest.x, digest.y)
    assert element(page, "textbox", "Email").value == "alan@example.org"
    assert element(page, "checkbox", "Weekly digest").checked is True
    shot = page.screenshot()
    assert png_size(shot) == (640, 480)
    button = element(page, "button", "Subscribe")
    page.click(button.x, button.y)  # navigates: the click waits for the new page
    assert page.location()[1] == "Subscribed"

    page.navigate(site.url + "/search")
    search = element(page, "textbox", "Search")  # not the menu's "Search" link
    page.click(search.x, search.y)
    page.type_text("blue kettle")
    page.press_key("Enter")
    assert page.location() == (site.url + "/search/results?q=blue+kettle", "Search results")
    submitted = [e for e in webforms.read_log(tmp_path) if e["event"] == "submit"]
    assert submitted == [
        {
            "event": "submit",
            "form": "newsletter",
            "fields": {"email": "alan@example.org", "digest": "on"},
        }
    ]


def test_the_browser_reaches_no_host_but_the_local_one(page: browser.Browser) -> None:
    with pytest.raises(browser.BrowserError, match="ERR_NAME_NOT_RESOLVED"):
        page.navigate("http://example.com/")
    page.navigate("about:blank")  # still alive


@needs_gui
def test_tools_report_bad_calls_to_the_model(site: webforms.Site) -> None:
    page = browser.Browser(binary=browser.find_chromium(), width=400, height=300, display=None)
    try:
        page.navigate(site.url + "/orders")
        tools = agent.Tools(page, origin=site.url)
        assert tools.run("drag", "{}") == "error: there is no tool named 'drag'"
        assert tools.run("click", "{x: 1}").startswith("error: the arguments are not valid JSON")
        assert tools.run("click", "[1, 2]") == "error: the arguments must be a JSON object"
        assert tools.run("click", '{"x": 1}').startswith("error: bad arguments for click:")
        assert (
            tools.run("click", '{"x": 400, "y": 10}')
            == "error: (400, 10) is outside the 400x300 screenshot"
        )
        assert (
            tools.run("click", '{"x": true, "y": 10}')
            == "error: x and y must be numbers, got True and 10"
        )
        assert tools.run("press_key", '{"key": "F13"}').startswith("error: unknown key 'F13'")
        assert tools.run("navigate", '{"url": "http://example.com/"}') == (
            f"error: 'http://example.com/' is not on the task's site ({site.url})"
        )
        assert (
            tools.run("navigate", f'{{"url": "{site.url}/orders/1042"}}')
            == f"opened {site.url}/orders/1042"
        )
        assert (
            tools.run("scroll", '{"x": 10, "y": 10, "delta_y": 120}')
            == "scrolled by 120 at (10, 10)"
        )
        assert page.location()[1] == "Order 1042"
    finally:
        page.close()


def run_agent(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HARNESS / "agent.py"), *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_agent_usage_errors_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("WEB_TASK_PROMPT", raising=False)

    def error(*args: str) -> str:
        assert agent.main(list(args)) == agent.EXIT_USAGE
        return capsys.readouterr().err

    assert "OPENAI_BASE_URL is not set" in error(
        "--prompt", "p", "--start-url", "http://127.0.0.1:9/"
    )
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert "--start-url must be an http(s) URL" in error(
        "--prompt", "p", "--start-url", "file:///etc/passwd"
    )
    assert "give --prompt" in error("--start-url", "http://127.0.0.1:9/")
    tasks = str(TASKS / "tasks.jsonl")
    assert "no task with id 'nope'" in error(
        "--task-file", tasks, "--task-id", "nope", "--start-url", "http://x/"
    )
    with pytest.raises(SystemExit) as exited:
        agent.main(["--prompt", "p", "--viewport", "10x10"])
    assert exited.value.code == 2 and "--viewport must be WIDTHxHEIGHT" in capsys.readouterr().err


def test_agent_exits_5_when_the_browser_cannot_start(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    done = run_agent("--prompt", "p", "--start-url", "http://127.0.0.1:9/", "--headless",
                     "--chromium", str(tmp_path / "no-such-chromium"), "--workdir", str(tmp_path),
                     env=env)  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert "the browser failed: cannot start" in done.stderr


# --- the manifests and the image --------------------------------------------------------


def harness_env() -> v1alpha1.HarnessEnv:
    (env,) = manifests.load_manifests(HARNESS / "harnessenv.yaml")
    assert isinstance(env, v1alpha1.HarnessEnv)
    return env


def test_the_harness_env_is_ready_and_becomes_a_rollout_pod() -> None:
    env = harness_env()
    assert readiness.check(env).ready, readiness.check(env)
    (job,) = manifests.load_manifests(HARNESS / "web-forms-job.yaml")
    assert (
        isinstance(job, v1alpha1.RolloutJob) and job.spec.harness_env_ref.name == env.metadata.name
    )
    job = job.model_copy(
        update={
            "metadata": job.metadata.model_copy(
                update={"namespace": "rl", "uid": "6f1c2d7e-0a9b-4c3d-8e5f-1a2b3c4d5e6f"}
            )
        }
    )
    env = env.model_copy(update={"metadata": env.metadata.model_copy(update={"namespace": "rl"})})
    task = {"id": "contact-ada"}
    pod = pods.build_pod(
        job=job,
        env=env,
        rollout=tasks.rollout([task], 1, index=0),
        attempt=0,
        config=settings.Settings(),
    )
    harness = next(c for c in pod["spec"]["containers"] if c["name"] == v1alpha1.HARNESS_CONTAINER)
    assert "/opt/openforge/harnesses/gui-browser/agent.py --no-sandbox" in " ".join(harness["args"])
    assert {e["name"]: e.get("value") for e in harness["env"]}["OPENFORGE_TASK_ID"] == "contact-ada"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_grader_command_finds_the_tasks_locally_and_in_the_image(tmp_path: Path) -> None:
    env = harness_env()
    assert env.spec.grader is not None and env.spec.grader.reward_from == "stdout-json"
    script = env.spec.grader.command[-1]
    assert (
        "${OPENFORGE_HARNESS_DIR:-/opt/openforge/harnesses/gui-browser}/../../tasks/web-forms/grade.py"
        in script
    )
    base = {
        "PATH": os.environ["PATH"],
        "OPENFORGE_TASK_ID": "order-1042",
        "OPENFORGE_WORKDIR": str(tmp_path),
    }
    (tmp_path / webforms.LOG_FILE).write_text(
        '{"event": "view", "path": "/orders/1042", "query": {}}\n'
    )
    done = subprocess.run(env.spec.grader.command,
                          env={**base, "OPENFORGE_HARNESS_DIR": str(HARNESS)},
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert json.loads(done.stdout)["reward"] == 1.0, done.stderr


def test_the_dockerfile_installs_the_browser_and_copies_what_the_manifest_runs() -> None:
    text = (HARNESS / "Dockerfile").read_text()
    assert "-t ghcr.io/openforge/gui-browser-harness:0.1.0 ." in text
    assert (
        harness_env().spec.harness_container().image
        == "ghcr.io/openforge/gui-browser-harness:0.1.0"
    )
    assert "apt-get install -y --no-install-recommends chromium xvfb fonts-dejavu-core" in text
    assert re.findall(r"^USER (\S+)$", text, re.MULTILINE)[-1] == "1000:1000"
    copies = re.findall(r"^COPY (\S+) (\S+)$", text, re.MULTILINE)
    container = harness_env().spec.harness_container()
    for path in re.findall(r"/opt/openforge/\S+\.py", " ".join(container.args or [])):
        source = next(
            (
                ROOT / src / Path(path).relative_to(dst)
                for src, dst in copies
                if path.startswith(dst)
            ),
            None,
        )
        assert source is not None and source.is_file(), f"{path} is not copied into the image"


def children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@needs_gui
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_the_agent_leaves_no_browser_or_display_behind(
    sig: signal.Signals, site: webforms.Site, tmp_path: Path
) -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # a model endpoint that never answers
    try:
        env = {
            "PATH": os.environ["PATH"],
            "OPENAI_BASE_URL": f"http://127.0.0.1:{silent.getsockname()[1]}/v1",
        }
        agent_process = subprocess.Popen(
            [sys.executable, str(HARNESS / "agent.py"), "--prompt", "p",
             "--start-url", site.url + "/", "--workdir", str(tmp_path)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not (tmp_path / "screenshots" / "step-000.png").exists():  # browser up, model asked
            assert agent_process.poll() is None and time.monotonic() < deadline, (
                agent_process.stderr
            )
            time.sleep(0.1)
        started = children(agent_process.pid)
        assert len(started) == 2, started  # Xvfb and Chromium
        agent_process.send_signal(sig)
        agent_process.wait(20)
        assert agent_process.returncode == (
            128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL
        )
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in started), started
    finally:
        silent.close()
