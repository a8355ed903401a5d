"""A browser client of `piw serve`: headless Chromium loads a local page whose script
opens a WebSocket to the relay, sends a canonical `server.status` request and writes the
response into the page, which the test reads back over the DevTools protocol.

`--dump-dom` cannot wait for it: virtual time does not wait for WebSocket traffic, so
the DOM is read once the page says the exchange ended. The page may talk only to the
relay on 127.0.0.1 (its Content-Security-Policy says so). Without Chromium the test
fails and says what to install.
"""

from __future__ import annotations

import html
import itertools
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from pi_workflows.wire import CLIENT_SCHEMA
from tests.cli.test_relay import Rig, _start_relay, _start_server
from tests.conftest import Processes

pytestmark = pytest.mark.timeout(240)

CHROMIUM_HINT = (
    "install Chromium: `apt-get install -y chromium` (or `make browser`); "
    ".ci/run does on a fresh machine"
)
START_S = 90.0
"""Chromium's start on a loaded machine can take long; bounded all the same."""
EXCHANGE_S = 60.0

PAGE = """<!doctype html>
<html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
  content="default-src 'none'; script-src 'unsafe-inline'; connect-src {relay}">
<title>piw relay</title></head>
<body><pre id="state">waiting</pre><pre id="response"></pre>
<script>
// Keys in sorted order and ASCII strings: JSON.stringify writes canonical JSON here.
const request = {{
  clientId: "browser", idempotencyKey: "browser-status-1", operation: "server.status",
  payload: {{}}, requestId: "browser-r1", schema: "{schema}", type: "request"
}};
const state = document.getElementById("state");
window.exchange = new Promise((settle) => {{
  const ws = new WebSocket("{relay}");
  ws.onmessage = (event) => {{
    const message = JSON.parse(event.data);
    if (message.type === "hello") {{
      ws.send(JSON.stringify(request));
      state.textContent = "sent";
    }} else if (message.type === "response" && message.requestId === request.requestId) {{
      document.getElementById("response").textContent = event.data;
      state.textContent = "answered";
      ws.close();
      settle(state.textContent);
    }}
  }};
  ws.onclose = (event) => {{
    if (state.textContent !== "answered") {{
      state.textContent = "closed " + event.code + " " + event.reason;
      settle(state.textContent);
    }}
  }};
}});
</script></body></html>
"""


def _chromium() -> str:
    """The Chromium binary; fail (never skip) without it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(f"the browser test needs Chromium: {CHROMIUM_HINT}")
    return found


class DevTools:
    """A DevTools protocol session on one page of a headless Chromium (flat sessions)."""

    def __init__(self, websocket: ClientConnection) -> None:
        self._ws = websocket
        self._ids = itertools.count(1)
        self._session: str | None = None
        self._events: list[dict[str, Any]] = []

    def call(self, method: str, timeout: float, /, **params: Any) -> dict[str, Any]:
        """Send one command (to the page once attached) and return its result."""
        command: dict[str, Any] = {"id": next(self._ids), "method": method, "params": params}
        if self._session is not None:
            command["sessionId"] = self._session
        self._ws.send(json.dumps(command))
        deadline = time.monotonic() + timeout
        while True:
            message = self._receive(deadline, method)
            if message.get("id") == command["id"]:
                assert "error" not in message, f"{method}: {message['error']}"
                return dict(message["result"])
            self._events.append(message)

    def wait_event(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(event.get("method") == method for event in self._events):
            self._events.append(self._receive(deadline, method))

    def attach(self, url: str, timeout: float) -> None:
        """Open a page target, attach to it and load `url` (until its load event)."""
        target = self.call("Target.createTarget", timeout, url="about:blank")["targetId"]
        attached = self.call("Target.attachToTarget", timeout, targetId=target, flatten=True)
        self._session = str(attached["sessionId"])
        self.call("Page.enable", timeout)
        self._events.clear()
        self.call("Page.navigate", timeout, url=url)
        self.wait_event("Page.loadEventFired", timeout)

    def evaluate(self, expression: str, timeout: float) -> Any:
        """The value of `expression` in the page (a promise is awaited)."""
        result = self.call(
            "Runtime.evaluate",
            timeout,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
            timeout=int(timeout * 1000),
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def _receive(self, deadline: float, what: str) -> dict[str, Any]:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"Chromium did not answer {what} in time"
        text = self._ws.recv(timeout=remaining)
        message = json.loads(text)
        assert isinstance(message, dict)
        return message


def _devtools_url(profile: Path, chromium: subprocess.Popen[str]) -> str:
    """The browser's DevTools WebSocket, from the port file Chromium writes once it listens."""
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_S
    pause = threading.Event()
    while True:
        lines = port_file.read_text().splitlines() if port_file.exists() else []
        if len(lines) >= 2:
            return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        assert chromium.poll() is None, f"Chromium exited with {chromium.returncode}"
        assert time.monotonic() < deadline, f"Chromium did not start within {START_S:.0f} s"
        pause.wait(0.05)


@pytest.fixture
def rig(processes: Processes, state_dir: Path) -> Rig:
    server = _start_server(processes, state_dir)
    relay, url = _start_relay(processes, state_dir)
    return Rig(state_dir, server, relay, url)


@pytest.fixture
def devtools(processes: Processes, short_tmp: Path) -> Iterator[DevTools]:
    binary = _chromium()
    profile = short_tmp / "chromium"
    chromium = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",  # tests run as root in CI containers
            "--disable-gpu",
            "--no-first-run",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # the teardown kills its whole group (renderers too)
    )
    processes.started.append(chromium)
    url = _devtools_url(profile, chromium)
    with connect(url, open_timeout=START_S, max_size=None, proxy=None) as websocket:
        tools = DevTools(websocket)
        yield tools
        tools.call("Browser.close", EXCHANGE_S)
    chromium.wait(EXCHANGE_S)


def test_a_browser_page_gets_a_server_status_through_the_relay(
    rig: Rig, devtools: DevTools, short_tmp: Path
) -> None:
    assert rig.url.startswith("ws://127.0.0.1:")
    page = short_tmp / "relay.html"
    page.write_text(PAGE.format(relay=rig.url, schema=CLIENT_SCHEMA))
    devtools.attach(page.as_uri(), EXCHANGE_S)

    ended = devtools.evaluate("window.exchange", EXCHANGE_S)
    assert ended == "answered", f"the page's WebSocket exchange ended with {ended!r}"
    dom = devtools.evaluate("document.documentElement.outerHTML", EXCHANGE_S)
    assert '<pre id="state">answered</pre>' in dom
    text = devtools.evaluate("document.getElementById('response').textContent", EXCHANGE_S)
    assert f'<pre id="response">{html.escape(text, quote=False)}</pre>' in dom
    response = json.loads(text)
    assert response["type"] == "response" and response["requestId"] == "browser-r1"
    assert response["outcome"] == "accepted"
    assert response["receipt"]["pid"] == rig.server_pid
