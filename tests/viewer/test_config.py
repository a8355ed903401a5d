"""piw's theme settings: `PIW_THEME`, then the settings file, then the default."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from textual.theme import BUILTIN_THEMES

from pi_workflows.viewer._config import THEMES, config_path, load_theme, save_theme

pytestmark = pytest.mark.timeout(30)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PIW_CONFIG_PATH": str(tmp_path / "piw" / "config.toml"), **extra}


def test_the_default_theme_is_the_first_offered(tmp_path: Path) -> None:
    assert load_theme(_env(tmp_path)) == THEMES[0]


def test_a_saved_theme_is_loaded_and_other_settings_are_kept(tmp_path: Path) -> None:
    env = _env(tmp_path)
    path = config_path(env)
    path.parent.mkdir()
    path.write_text('layout = "wide"\ntheme = "nord"\n')
    save_theme("dracula", env)
    assert load_theme(env) == "dracula"
    assert 'layout = "wide"' in path.read_text()


def test_saving_makes_a_private_folder(tmp_path: Path) -> None:
    env = _env(tmp_path)
    save_theme("gruvbox", env)
    folder = config_path(env).parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert load_theme(env) == "gruvbox"
    assert not list(folder.glob(".config-*"))  # no temporary file left


def test_the_environment_wins_over_the_file(tmp_path: Path) -> None:
    env = _env(tmp_path, PIW_THEME="monokai")
    save_theme("nord", env)
    assert load_theme(env) == "monokai"


def test_an_unknown_or_broken_setting_falls_back_to_the_default(tmp_path: Path) -> None:
    env = _env(tmp_path, PIW_THEME="no-such-theme")
    path = config_path(env)
    path.parent.mkdir()
    path.write_text("theme = [unclosed\n")
    assert load_theme(env) == THEMES[0]


def test_saving_an_unknown_theme_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no theme 'plaid'"):
        save_theme("plaid", _env(tmp_path))
    assert not config_path(_env(tmp_path)).exists()


def test_every_offered_theme_is_a_textual_builtin() -> None:
    assert set(THEMES) <= set(BUILTIN_THEMES)
