"""Chromium on an X display, driven over the DevTools protocol (stdlib only).

:class:`Display` starts an ``Xvfb`` server on a free display number
(``-displayfd``: the server picks the number and writes it back, so parallel
rollouts never race for ``:99``). :class:`Browser` starts Chromium with
``--remote-debugging-pipe``: the DevTools protocol (CDP) runs over two pipes,
file descriptors 3 (commands in) and 4 (replies and events out), one JSON
message per NUL-terminated frame. No debugging port is opened and no
websocket client is needed.

Chromium is started offline and quiet (:data:`OFFLINE_FLAGS`): no first-run
UI, no background networking, component updates, sync, metrics, crash
reports or safe-browsing pings, and a host resolver that fails every name but
``localhost``/``127.0.0.1``, so a page or the browser itself cannot reach the
internet. Debian's ``/usr/bin/chromium`` is a shell wrapper that adds Google
API keys and remote extensions from ``/etc/chromium.d``; the browser binary
behind it (``/usr/lib/chromium/chromium``) is run directly when present.

The page viewport is fixed (``Emulation.setDeviceMetricsOverride``, scale 1),
so a screenshot is exactly ``width`` x ``height`` pixels and a point in it is
the CSS pixel that :meth:`Browser.click` dispatches the mouse event to.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

DEBIAN_BROWSER_BINARY = "/usr/lib/chromium/chromium"

OFFLINE_FLAGS = (
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-breakpad",
    "--no-pings",
    "--metrics-recording-only",
    "--password-store=basic",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication,"
    "CertificateTransparencyComponentUpdater,InterestFeedContentSuggestions,DialMediaRouteProvider",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
    "--disable-gpu",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    "--disable-dev-shm-usage",  # containers give /dev/shm 64 MiB; use /tmp
)

# The elements a model may want to act on, with their label and the centre of
# their box in viewport (= screenshot) pixels. Read once per observation.
ELEMENTS_JS = r"""
(() => {
  const clean = s => (s || '').replace(/\s+/g, ' ').trim().slice(0, 80);
  const roleOf = el => {
    const role = el.getAttribute('role');
    if (role) return role;
    const tag = el.tagName.toLowerCase(), type = (el.type || '').toLowerCase();
    if (tag === 'a') return 'link';
    if (tag === 'button' || ['submit', 'button', 'reset'].includes(type)) return 'button';
    if (tag === 'select') return 'combobox';
    if (type === 'checkbox' || type === 'radio') return type;
    return 'textbox';
  };
  const labelOf = el => {
    const byLabel = el.labels && el.labels.length ? el.labels[0].innerText : '';
    return clean(byLabel || el.getAttribute('aria-label') || el.getAttribute('placeholder')
      || el.innerText || (['submit', 'button'].includes(el.type) ? el.value : '')
      || el.getAttribute('title') || el.name);
  };
  const out = [];
  const selector = 'a[href], button, input, select, textarea, '
    + '[role=button], [role=link], [role=checkbox]';
  for (const el of document.querySelectorAll(selector)) {
    if (el.type === 'hidden' || el.disabled) continue;
    const box = el.getBoundingClientRect(), style = getComputedStyle(el);
    if (box.width < 1 || box.height < 1 || style.visibility === 'hidden') continue;
    const x = Math.round(box.left + box.width / 2), y = Math.round(box.top + box.height / 2);
    if (x < 0 || y < 0 || x >= innerWidth || y >= innerHeight) continue;
    const role = roleOf(el), item = {role, label: labelOf(el), x, y};
    if (role === 'textbox' && el.value) item.value = clean(el.value);
    if (role === 'checkbox' || role === 'radio') item.checked = !!el.checked;
    out.push(item);
  }
  return out;
})()
"""

NAVIGATING = (
    "Page.frameStartedNavigating",
    "Page.frameStartedLoading",
    "Page.frameRequestedNavigation",
)
LOADED = ("Page.loadEventFired",)

# Key name -> (key, code, Windows virtual key code, text typed).
KEYS: dict[str, tuple[str, str, int, str]] = {
    "Enter": ("Enter", "Enter", 13, "\r"),
    "Tab": ("Tab", "Tab", 9, ""),
    "Backspace": ("Backspace", "Backspace", 8, ""),
    "Escape": ("Escape", "Escape", 27, ""),
    "Space": (" ", "Space", 32, " "),
    "ArrowUp": ("ArrowUp", "ArrowUp", 38, ""),
    "ArrowDown": ("ArrowDown", "ArrowDown", 40, ""),
    "ArrowLeft": ("ArrowLeft", "ArrowLeft", 37, ""),
    "ArrowRight": ("ArrowRight", "ArrowRight", 39, ""),
    "PageUp": ("PageUp", "PageUp", 33, ""),
    "PageDown": ("PageDown", "PageDown", 34, ""),
    "Home": ("Home", "Home", 36, ""),
    "End": ("End", "End", 35, ""),
}


class BrowserError(RuntimeError):
    """Chromium or Xvfb could not be started, or a CDP command failed (names which)."""


@dataclass(frozen=True, slots=True)
class Element:
    role: str
    label: str
    x: int
    y: int
    value: str | None = None
    checked: bool | None = None

    def describe(self) -> str:
        """One line of the element list the model reads: ``button "Send" at (96, 310)``."""
        line = f"{self.role} {json.dumps(self.label, ensure_ascii=False)} at ({self.x}, {self.y})"
        if self.value is not None:
            line += f" value {json.dumps(self.value, ensure_ascii=False)}"
        if self.checked is not None:
            line += " checked" if self.checked else " unchecked"
        return line


def find_chromium(explicit: str | None = None) -> str:
    """The browser binary: ``explicit``, Debian's real binary, or ``chromium`` on PATH."""
    if explicit:
        return explicit
    if os.access(DEBIAN_BROWSER_BINARY, os.X_OK):
        return DEBIAN_BROWSER_BINARY
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise BrowserError(
        "no Chromium found; install it (scripts/install_gui_deps.sh) or pass --chromium"
    )


class Display:
    """An ``Xvfb`` server on a free display number; ``name`` is e.g. ``":3"``."""

    def __init__(
        self, *, width: int, height: int, xvfb: str = "Xvfb", timeout: float = 15.0
    ) -> None:
        binary = shutil.which(xvfb)
        if binary is None:
            raise BrowserError(
                f"{xvfb} is not installed; run scripts/install_gui_deps.sh or use --headless"
            )
        read_end, write_end = os.pipe()
        screen = f"{width}x{height}x24"
        self._process = subprocess.Popen(
            [binary, "-displayfd", str(write_end), "-screen", "0", screen,
             "-nolisten", "tcp", "-noreset"],
            pass_fds=(write_end,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        os.close(write_end)
        try:
            number = _read_line(read_end, timeout, what="Xvfb's display number")
        except BrowserError:
            self.close()
            raise
        finally:
            os.close(read_end)
        self.name = f":{number}"

    def close(self) -> None:
        _stop(self._process, timeout=5.0)


class Browser:
    """One Chromium and its one page, driven over CDP on pipes."""

    def __init__(
        self,
        *,
        binary: str,
        width: int,
        height: int,
        display: str | None,
        log: IO[bytes] | None = None,
        no_sandbox: bool = False,
        command_timeout: float = 20.0,
    ) -> None:
        self.width, self.height = width, height
        self.command_timeout = command_timeout
        self.navigation_window = 0.3  # seconds an action has to start a navigation
        self.load_timeout = 15.0
        self._profile = tempfile.mkdtemp(prefix="gui-browser-profile-")
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._process, self._to_browser, from_browser = _launch(
            binary,
            self._profile,
            width=width,
            height=height,
            display=display,
            log=log,
            no_sandbox=no_sandbox or os.geteuid() == 0,  # the sandbox refuses to run as root
        )
        self._reader = threading.Thread(target=self._read, args=(from_browser,), daemon=True)
        self._reader.start()
        try:
            self._session = self._open_page()
        except BrowserError:
            self.close()
            raise

    # -- the page ------------------------------------------------------------------

    def navigate(self, url: str) -> None:
        mark = self._mark()
        reply = self.call("Page.navigate", {"url": url})
        if reply.get("errorText"):
            raise BrowserError(f"navigating to {url}: {reply['errorText']}")
        self._wait_event(LOADED, since=mark, timeout=self.load_timeout)
        self._paint()

    def click(self, x: int, y: int) -> None:
        base = {"x": x, "y": y, "button": "left", "clickCount": 1}
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        self.call("Input.dispatchMouseEvent", {"type": "mousePressed", **base})
        self._act(lambda: self.call("Input.dispatchMouseEvent", {"type": "mouseReleased", **base}))

    def type_text(self, text: str) -> None:
        """Types ``text`` into the focused element, one key event per character."""
        for char in text:
            if char == "\n":
                self.press_key("Enter")
                continue
            self.call(
                "Input.dispatchKeyEvent",
                {"type": "keyDown", "text": char, "unmodifiedText": char, "key": char},
            )
            self.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": char})
        self._paint()

    def press_key(self, name: str) -> None:
        if name not in KEYS:
            raise ValueError(f"unknown key {name!r}; known: {', '.join(KEYS)}")
        key, code, vk, text = KEYS[name]
        ids = {"key": key, "code": code, "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk}
        down: dict[str, Any] = {"type": "keyDown" if text else "rawKeyDown", **ids}
        if text:
            down.update(text=text, unmodifiedText=text)

        def send() -> None:
            self.call("Input.dispatchKeyEvent", down)
            self.call("Input.dispatchKeyEvent", {"type": "keyUp", **ids})

        self._act(send)

    def scroll(self, x: int, y: int, delta_y: int) -> None:
        self.call(
            "Input.dispatchMouseEvent",
            {"type": "mouseWheel", "x": x, "y": y, "deltaX": 0, "deltaY": delta_y},
        )
        self._paint()

    def screenshot(self) -> bytes:
        """The viewport as PNG bytes, exactly as Chromium encoded them."""
        reply = self.call("Page.captureScreenshot", {"format": "png", "fromSurface": True})
        return base64.b64decode(reply["data"], validate=True)

    def location(self) -> tuple[str, str]:
        """The page's (URL, title)."""
        value = self.evaluate("[location.href, document.title]")
        return str(value[0]), str(value[1])

    def elements(self) -> list[Element]:
        return [Element(**item) for item in self.evaluate(ELEMENTS_JS)]

    def evaluate(self, expression: str, *, await_promise: bool = False) -> Any:
        reply = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": await_promise},
        )
        if "exceptionDetails" in reply:
            raise BrowserError(f"page script failed: {reply['exceptionDetails'].get('text')}")
        return reply["result"].get("value")

    # -- waiting -----------------------------------------------------------------------

    def _act(self, send: Callable[[], object]) -> None:
        """Runs an input action; when it started a navigation (a link, a form submitted
        by a click or Enter), waits for the new page's load event. Then waits for paint.

        A navigation whose first event comes after ``navigation_window`` (a busy
        machine) is still caught: it shows up by the time the paint is over, or
        takes the document away under it; then the load is awaited and painted.
        """
        mark = self._mark()
        send()
        navigating = (
            self._wait_event(NAVIGATING, since=mark, timeout=self.navigation_window) is not None
        )
        while True:
            if navigating:
                self._wait_event(LOADED, since=mark, timeout=self.load_timeout)
            try:
                self._paint()
            except BrowserError:
                if navigating:
                    raise
                navigating = True
                continue
            if navigating or self._wait_event(NAVIGATING, since=mark, timeout=0) is None:
                return
            navigating = True

    def _paint(self) -> None:
        """Waits until two animation frames have run, so a screenshot shows the action."""
        self.evaluate(
            "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))",
            await_promise=True,
        )

    def _mark(self) -> int:
        with self._cond:
            return len(self._events)

    # -- CDP ----------------------------------------------------------------------------

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, session: bool = True
    ) -> dict[str, Any]:
        """Send one CDP command (to the page's session unless ``session=False``) and wait."""
        with self._cond:
            self._next_id += 1
            message_id = self._next_id
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        try:
            os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        except OSError as error:
            raise BrowserError(f"{method}: Chromium's pipe is closed ({error})") from error
        deadline = time.monotonic() + self.command_timeout
        with self._cond:
            while message_id not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    why = (
                        "Chromium exited"
                        if self._closed
                        else f"no reply in {self.command_timeout:g} s"
                    )
                    raise BrowserError(f"{method}: {why}")
                self._cond.wait(left)
            reply = self._replies.pop(message_id)
        if "error" in reply:
            raise BrowserError(
                f"{method}: {reply['error'].get('message')} ({reply['error'].get('code')})"
            )
        result: dict[str, Any] = reply.get("result") or {}
        return result

    def _open_page(self) -> str:
        targets = self.call("Target.getTargets", session=False)["targetInfos"]
        pages = [t["targetId"] for t in targets if t["type"] == "page"]
        target = (
            pages[0]
            if pages
            else self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        )
        session = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, session=False
        )["sessionId"]
        self._session = str(session)
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                   "mobile": False})  # fmt: skip
        return self._session

    def _read(self, pipe: int) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(pipe, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buffer += chunk
            *frames, buffer = buffer.split(b"\0")
            with self._cond:
                for frame in frames:
                    message = json.loads(frame)
                    if "id" in message:
                        self._replies[int(message["id"])] = message
                    else:
                        self._events.append(message)
                self._cond.notify_all()
        os.close(pipe)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _wait_event(
        self, methods: tuple[str, ...], *, since: int, timeout: float
    ) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self._events[since:]:
                    if event.get("method") in methods and event.get("sessionId") == self._session:
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return None
                self._cond.wait(left)

    def close(self) -> None:
        if self._process.poll() is None:
            with contextlib.suppress(BrowserError):
                self.call("Browser.close", session=False)
        _stop(self._process, timeout=5.0)
        with contextlib.suppress(OSError):
            os.close(self._to_browser)
        shutil.rmtree(self._profile, ignore_errors=True)


def _launch(
    binary: str,
    profile: str,
    *,
    width: int,
    height: int,
    display: str | None,
    log: IO[bytes] | None,
    no_sandbox: bool,
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start Chromium with CDP on fds 3 (its input) and 4 (its output)."""
    flags = [*OFFLINE_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "--window-position=0,0"]  # fmt: skip
    if display is None:
        flags.append("--headless")
    if no_sandbox:
        flags.append("--no-sandbox")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": profile, "LANG": "C.UTF-8",
           "DBUS_SESSION_BUS_ADDRESS": "disabled:"}  # fmt: skip
    if display is not None:
        env["DISPLAY"] = display
    to_read, to_write = os.pipe()  # us -> Chromium
    from_read, from_write = os.pipe()  # Chromium -> us

    def wire_fds() -> None:  # runs in the child, before exec
        os.dup2(to_read, 3)
        os.dup2(from_write, 4)
        _die_with_parent()

    try:
        process = subprocess.Popen(
            [binary, *flags, "about:blank"], env=env, stdin=subprocess.DEVNULL,
            stdout=log or subprocess.DEVNULL, stderr=log or subprocess.DEVNULL,
            preexec_fn=wire_fds, pass_fds=(3, 4),
        )  # fmt: skip
    except OSError as error:
        for fd in (to_read, to_write, from_read, from_write):
            os.close(fd)
        raise BrowserError(f"cannot start {binary}: {error}") from error
    os.close(to_read)
    os.close(from_write)
    return process, to_write, from_read


def _read_line(fd: int, timeout: float, *, what: str) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise BrowserError(f"no {what} after {timeout:g} s")
        chunk = os.read(fd, 64)
        if not chunk:
            raise BrowserError(f"the process exited before writing {what}")
        data += chunk
    return data.decode().strip()


def _die_with_parent() -> None:
    """In a child before exec: be killed when the agent dies, even by SIGKILL.

    Chromium and Xvfb stay in the agent's process group (a runner that kills
    the group kills them too); this covers the agent alone being killed.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def _stop(process: subprocess.Popen[bytes], *, timeout: float) -> None:
    """Ends a process: SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
