"""piw's settings: the theme, from `PIW_THEME` or `~/.config/piw/config.toml`."""

from __future__ import annotations

from typing import Final

__all__ = ["THEMES"]

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
