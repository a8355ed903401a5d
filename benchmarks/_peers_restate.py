"""Restate in bench_peers.py: the pinned server from npm and a Python service under hypercorn.

This runs inside a network namespace of its own (`unshare --net`, with only `lo` up),
which bench_peers.py sets up: the Restate server reaches for the internet as it starts
(telemetry, version checks, DNS), and nothing of this benchmark may leave the machine.
The server's telemetry is also switched off in its configuration (`disable-telemetry`).
In the namespace: restate-server (admin on 127.0.0.1:9070, ingress on 127.0.0.1:8080,
node-to-node on 127.0.0.1:5122, data in the temp folder), the service on
127.0.0.1:9080, registered through the admin API, and the clients, which call
`POST /Chain/run` on the ingress and get the result in the response.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _peers_common import chain_outputs, figures, latency, throughput

ROOT = Path(__file__).resolve().parent.parent
SERVICE = Path(__file__).resolve().parent / "_restate_service.py"
HOST = "127.0.0.1"
ADMIN, INGRESS, FABRIC, SERVICE_PORT = 9070, 8080, 5122, 9080
START_TIMEOUT_S = 90.0

CONFIG = f"""\
# bench_peers.py: a one-node Restate on loopback, telemetry off.
disable-telemetry = true
cluster-name = "bench-peers"
node-name = "bench-peers"
listen-mode = "tcp"
bind-address = "{HOST}:{FABRIC}"
advertised-address = "http://{HOST}:{FABRIC}/"

[admin]
bind-address = "{HOST}:{ADMIN}"

[ingress]
bind-address = "{HOST}:{INGRESS}"
"""


def server_binary() -> Path | None:
    """The restate-server binary that `npm ci` put in node_modules, if it is there."""
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    system = sys.platform if sys.platform != "linux" else "linux"
    path = (
        ROOT / "node_modules" / "@restatedev" / f"restate-server-{system}-{arch}" / "bin"
    ) / "restate-server"
    return path if path.exists() else None


def server_version() -> str:
    manifest = ROOT / "node_modules" / "@restatedev" / "restate-server" / "package.json"
    with contextlib.suppress(OSError, ValueError):
        return str(json.loads(manifest.read_text())["version"])
    return "unknown"


def _wait_until(check: Callable[[], bool], what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready in {timeout:.0f} s")
        time.sleep(0.05)


def _request(port: int, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if body is None else {"content-type": "application/json"}
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _answers(port: int, path: str) -> bool:
    with contextlib.suppress(OSError):
        return _request(port, "GET", path)[0] == 200
    return False


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def _process(command: list[str], log: Path, cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    try:
        yield child
    finally:
        child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)


def _log_tail(log: Path) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
    return ""


@contextlib.contextmanager
def restate(folder: Path) -> Iterator[None]:
    """The server and the service, started, registered and answering; stopped after."""
    binary = server_binary()
    if binary is None:
        raise RuntimeError("restate-server is not in node_modules: run `npm ci`")
    config = folder / "restate.toml"
    config.write_text(CONFIG)
    server_log, service_log = folder / "restate-server.log", folder / "service.log"
    server_command = [str(binary), "--config-file", str(config), "--base-dir", str(folder)]
    service_command = [sys.executable, str(SERVICE), f"{HOST}:{SERVICE_PORT}"]
    with (
        _process(server_command, server_log, folder) as server,
        _process(service_command, service_log, folder) as service,
    ):
        try:
            _wait_until(lambda: _answers(ADMIN, "/health"), "the Restate admin API")
            _wait_until(lambda: _answers(INGRESS, "/restate/health"), "the Restate ingress")
            _wait_until(lambda: _listening(SERVICE_PORT), "the hypercorn service")
            _register()
            _wait_until(lambda: _invoke_once(3) is None, "the registered service", 30)
        except Exception as exc:
            exc.add_note(f"restate-server (exit {server.poll()}): {_log_tail(server_log)}")
            exc.add_note(f"service (exit {service.poll()}): {_log_tail(service_log)}")
            raise
        yield


def _register() -> None:
    """Register the service's deployment through the admin API."""
    status, body = _request(ADMIN, "POST", "/deployments", {"uri": f"http://{HOST}:{SERVICE_PORT}"})
    if status >= 300:
        raise RuntimeError(f"registering the service failed: {status} {body[:200]!r}")


def _invoke_once(nodes: int) -> str | None:
    """One call on a fresh connection: None if it returned the chain's output, else why."""
    with contextlib.suppress(OSError):
        status, body = _request(INGRESS, "POST", "/Chain/run", {"nodes": nodes})
        return None if status == 200 and json.loads(body) == chain_outputs(nodes) else str(status)
    return "unreachable"


class Client:
    """One keep-alive HTTP/1.1 connection to the ingress."""

    def __init__(self) -> None:
        self.connection = http.client.HTTPConnection(HOST, INGRESS, timeout=30)

    def run(self, nodes: int = 3) -> None:
        body = json.dumps({"nodes": nodes}).encode()
        self.connection.request(
            "POST", "/Chain/run", body=body, headers={"content-type": "application/json"}
        )
        response = self.connection.getresponse()
        result = response.read()
        if response.status != 200 or json.loads(result) != chain_outputs(nodes):
            raise RuntimeError(f"Chain/run answered {response.status}: {result[:200]!r}")

    def close(self) -> None:
        self.connection.close()


def main_phase(folder: Path, runs: int, clients: int, seconds: float) -> dict[str, Any]:
    data = folder / "restate"
    data.mkdir()
    with restate(data):
        client = Client()
        opened = [Client() for _ in range(clients)]
        try:
            samples = latency(client.run, runs)
            flow = throughput([c.run for c in opened], seconds)
        finally:
            for each in [client, *opened]:
                each.close()
    return figures(samples, flow, version=server_version(), pid=os.getpid())
