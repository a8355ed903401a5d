"""piw's settings: the theme, from `PIW_THEME` or `~/.config/piw/config.toml`.

The file holds one key today (`theme = "nord"`). It is read with `tomllib` and written
whole, atomically (a temporary file renamed over it), in a folder made 0700.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = ["CONFIG_ENV", "THEMES", "THEME_ENV", "config_path", "load_theme", "save_theme"]

THEMES: Final = (
    "textual-dark",
    "textual-light",
    "nord",
    "gruvbox",
    "tokyo-night",
    "dracula",
    "monokai",
    "solarized-light",
)
"""Textual's built-in themes piw offers, in the picker's order (the first is the default)."""
CONFIG_ENV: Final = "PIW_CONFIG_PATH"
THEME_ENV: Final = "PIW_THEME"


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """`$PIW_CONFIG_PATH`, else `~/.config/piw/config.toml`."""
    env = os.environ if environ is None else environ
    configured = env.get(CONFIG_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".config/piw/config.toml"


def load_theme(environ: Mapping[str, str] | None = None) -> str:
    """The theme to start with: `PIW_THEME`, else the file's, else the first of `THEMES`.

    A name piw does not offer, or a file that cannot be read, falls back to the default:
    a viewer should open even when its settings are broken.
    """
    env = os.environ if environ is None else environ
    for name in (env.get(THEME_ENV, "").strip(), _file_theme(config_path(env))):
        if name in THEMES:
            return name
    return THEMES[0]


def save_theme(name: str, environ: Mapping[str, str] | None = None) -> None:
    """Remember `name` in the settings file (other keys are kept).

    Raises:
        ValueError: `name` is not one of `THEMES`.
        OSError: the file could not be written.
    """
    if name not in THEMES:
        raise ValueError(f"no theme {name!r}; choose one of {', '.join(THEMES)}")
    path = config_path(environ)
    settings = _read(path)
    settings["theme"] = name
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = "".join(f"{key} = {_toml_string(value)}\n" for key, value in sorted(settings.items()))
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".toml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _file_theme(path: Path) -> str:
    return _read(path).get("theme", "")


def _read(path: Path) -> dict[str, str]:
    """The file's string settings ({} when absent or unreadable)."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return {key: value for key, value in data.items() if isinstance(value, str)}


def _toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
