"""Channel profiles: `<agent dir>/workflows/channels.json`, read and checked, never echoed.

Implements workflow-server.md § Supervised channel adapters (one transport-only child
per configured Telegram profile). The file holds bot tokens, so it must be private
(mode 0600: refused when group or others may read it), and nothing here ever puts a
token, a chat ID, a user ID or the file's path into an error, a log line or a status:
errors name the place in the file and the rule it breaks, as `wire/schema_errors` does.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from pi_workflows.wire.schema_check import SchemaCheck

__all__ = [
    "CHANNELS_FILE",
    "CHANNELS_SCHEMA",
    "DEFAULT_API_BASE",
    "ChannelConfig",
    "ChannelProfile",
    "ProfilesError",
    "channel_name",
    "channels_path",
    "load_profiles",
]

CHANNELS_FILE: Final = "channels.json"
CHANNELS_SCHEMA: Final = "pi-workflows.channels.v1"
DEFAULT_API_BASE: Final = "https://api.telegram.org"
MAX_FILE_BYTES: Final = 256 * 1024
_FILE_WORDS: Final = "<agent dir>/workflows/channels.json"
"""How errors name the file: never the user's real path."""

_PROFILE_NAME = "^[a-z0-9][a-z0-9_-]{0,31}$"
_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["schema", "profiles"],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": CHANNELS_SCHEMA},
        "profiles": {
            "type": "object",
            "maxProperties": 16,
            "propertyNames": {"pattern": _PROFILE_NAME},
            "additionalProperties": {
                "type": "object",
                "required": ["botToken", "chatId", "allowedUserIds"],
                "additionalProperties": False,
                "properties": {
                    "kind": {"const": "telegram"},
                    "botToken": {"type": "string", "pattern": "^[0-9]{1,20}:[A-Za-z0-9_-]{20,80}$"},
                    "chatId": {"type": "integer"},
                    "allowedUserIds": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 64,
                        "items": {"type": "integer", "minimum": 1},
                    },
                    "workflows": {
                        "type": "array",
                        "maxItems": 256,
                        "items": {"type": "string", "minLength": 1, "maxLength": 256},
                    },
                    "decisions": {
                        "type": "array",
                        "maxItems": 256,
                        "items": {"type": "string", "minLength": 1, "maxLength": 512},
                    },
                    "apiBase": {"type": "string", "pattern": "^https?://[^\\s/]+(:[0-9]+)?/?$"},
                },
            },
        },
    },
}
_CHECK = SchemaCheck(_SCHEMA)


class ProfilesError(Exception):
    """The profiles file cannot be used; the message is safe to show (no contents)."""


@dataclass(frozen=True, slots=True)
class ChannelProfile:
    """One Telegram profile. `repr` hides the credential and the chat."""

    name: str
    bot_token: str = field(repr=False)
    chat_id: int = field(repr=False)
    allowed_user_ids: tuple[int, ...] = field(repr=False)
    workflows: frozenset[str] = frozenset()
    decisions: frozenset[str] = frozenset()
    """Node paths of decisions this profile serves (whatever their workflow)."""
    api_base: str = DEFAULT_API_BASE

    @property
    def channel(self) -> str:
        """The `channel_messages.channel` of this profile."""
        return channel_name(self.name)

    def serves(self, workflow_name: str, node_path: str) -> bool:
        """Whether a decision of this workflow at this node path is delivered here."""
        return workflow_name in self.workflows or node_path in self.decisions

    def fingerprint(self) -> tuple[Any, ...]:
        """Everything a running child was started with: a reload restarts it on change."""
        return (
            self.bot_token,
            self.chat_id,
            self.allowed_user_ids,
            self.api_base,
        )


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """What the profiles file gave: its state and the profiles, by name."""

    state: str
    """`missing` (no file: no channels), `loaded`, or `refused` (see `error`)."""
    profiles: dict[str, ChannelProfile] = field(default_factory=dict)
    error: str | None = None


def channel_name(profile: str) -> str:
    """`telegram:<profile>`, the channel column of a profile's deliveries."""
    return f"telegram:{profile}"


def channels_path(agent_dir: Path) -> Path:
    """`<agent dir>/workflows/channels.json`."""
    return agent_dir / "workflows" / CHANNELS_FILE


def load_profiles(path: Path) -> ChannelConfig:
    """Read and check the profiles file; never raises for a bad file.

    A missing file is no channels. A file readable by group or others is refused
    before it is read (a token must not be left readable). A file that is not JSON or
    breaks the schema is refused with the place and rule, never its contents.
    """
    try:
        return ChannelConfig("loaded", _read(path))
    except FileNotFoundError:
        return ChannelConfig("missing")
    except ProfilesError as exc:
        return ChannelConfig("refused", error=str(exc))


def _read(path: Path) -> dict[str, ChannelProfile]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ProfilesError(f"{_FILE_WORDS} is not a regular file")
        if info.st_mode & 0o077:
            mode = stat.S_IMODE(info.st_mode)
            raise ProfilesError(
                f"{_FILE_WORDS} is readable by others (mode {mode:04o}); it holds bot "
                "tokens: run `chmod 600` on it, then `pi-workflows channel reload`"
            )
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ProfilesError(f"{_FILE_WORDS} is larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ProfilesError(f"{_FILE_WORDS} is not valid JSON") from None
    violation = _CHECK.first_violation(document)
    if violation is not None:
        raise ProfilesError(f"{_FILE_WORDS} {violation.describe('the whole file')}")
    profiles: dict[str, ChannelProfile] = {}
    for name, raw in document["profiles"].items():
        profiles[name] = ChannelProfile(
            name=name,
            bot_token=raw["botToken"],
            chat_id=raw["chatId"],
            allowed_user_ids=tuple(raw["allowedUserIds"]),
            workflows=frozenset(raw.get("workflows", ())),
            decisions=frozenset(raw.get("decisions", ())),
            api_base=str(raw.get("apiBase") or DEFAULT_API_BASE).rstrip("/"),
        )
    return profiles
