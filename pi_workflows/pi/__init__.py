"""The Pi side of pi-workflows: TypeScript shipped as package data, and how to use it.

`bridge/` is the headless bridge extension that a `pi --mode rpc` child loads with `-e`
(pi compiles TypeScript itself with jiti, so there is no build step). It registers the
`workflow` tool and reads the step it serves from a canonical JSON file that the runner
writes and names in `PI_WORKFLOWS_BRIDGE_CONFIG` (one pi child serves one attempt).

`extension/` is the Pi extension for people in a Pi session (`/workflow`, `/piw`, the
widget and status line); `pi-workflows pi-extension install` links it into Pi's
extensions folder. `common/` is the protocol client both share (canonical JSON, the
`client.v1` codec, `SocketTransport`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pi_workflows.wire.canonical import dumps

__all__ = [
    "BRIDGE_CONFIG_ENV",
    "BRIDGE_CONFIG_SCHEMA",
    "PI_BINARY_ENV",
    "BridgeConfig",
    "bridge_extension_path",
    "extension_dir",
    "extension_path",
    "write_bridge_config",
]

PI_BINARY_ENV = "PI_WORKFLOWS_PI"
"""Names the `pi` binary (a path, or a name looked up on PATH); unset means `pi` on PATH."""
BRIDGE_CONFIG_ENV = "PI_WORKFLOWS_BRIDGE_CONFIG"
BRIDGE_CONFIG_SCHEMA = "pi-workflows.bridge-config.v1"


def bridge_extension_path() -> Path:
    """The absolute path of the bridge's entry file, for pi's `-e`.

    The wire schemas it validates against ship beside it (`pi_workflows/wire/schemas`).
    """
    entry = resources.files(__name__).joinpath("bridge", "workflow-bridge.ts")
    return Path(str(entry)).absolute()


def extension_dir() -> Path:
    """The absolute path of the Pi extension's folder (its entry is `index.ts`).

    pi loads it from a link in `<agent dir>/extensions/` or with `-e`; it imports
    `../common/` and the wire schemas, so the folder is linked, never copied.
    """
    return Path(str(resources.files(__name__).joinpath("extension"))).absolute()


def extension_path() -> Path:
    """The absolute path of the Pi extension's entry file, for pi's `-e`."""
    return extension_dir() / "index.ts"


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """The step one pi child serves, as the bridge's `workflow` tool needs it."""

    run_id: str
    interaction_id: str
    """The step's interactive request ID; submissions name it exactly."""
    step: str
    """The node ID the step contract names."""
    attempt: str
    """The attempt ID the step contract names."""
    client_id: str
    """The bridge's client ID on the live client protocol."""
    output_schema: Any = None
    """The node's `output_schema` (JSON Schema): the tool's `output` parameter."""
    socket_path: str | None = None
    """The server's client socket (`<state dir>/host/host.sock`), where the bridge sends
    `interaction.submit`/`update` and waits for the held response. None: every call of
    the tool fails, saying the bridge has no server."""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": BRIDGE_CONFIG_SCHEMA,
            "runId": self.run_id,
            "interactionId": self.interaction_id,
            "step": self.step,
            "attempt": self.attempt,
            "clientId": self.client_id,
            "outputSchema": self.output_schema,
            "socketPath": self.socket_path,
        }


def write_bridge_config(path: Path, config: BridgeConfig) -> dict[str, str]:
    """Write `config` as canonical JSON, readable by the user only (it names the step).

    Returns the environment entry that points the bridge at it, for
    `pi_environment(extra=...)`.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(dumps(config.to_json()))
    return {BRIDGE_CONFIG_ENV: str(path)}
