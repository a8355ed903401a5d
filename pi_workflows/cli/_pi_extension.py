"""`pi-workflows pi-extension path|install`: where the Pi extension is, and linking it
into Pi's extensions folder.

Pi discovers `<agent dir>/extensions/*/index.ts` (docs/extensions.md § Extension
Locations), where the agent dir is `$PI_CODING_AGENT_DIR`, else `~/.pi/agent`. The
install is a symbolic link `<agent dir>/extensions/pi-workflows` to the installed
package's `pi_workflows/pi/extension/` folder: the extension imports `../common/` and
the wire schemas beside it, so it is linked, never copied, and an upgrade of the
package updates it in place.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pi_workflows._paths import agent_dir
from pi_workflows.cli._main import EXIT_FAILED, main
from pi_workflows.pi import extension_dir

LINK_NAME = "pi-workflows"


def extensions_folder() -> Path:
    """Pi's global extensions folder, `<agent dir>/extensions`."""
    return agent_dir() / "extensions"


@main.group("pi-extension")
def pi_extension() -> None:
    """The Pi extension: /workflow and /piw commands, widget and status line.

    Example: pi-workflows pi-extension install
    """


@pi_extension.command("path")
def pi_extension_path() -> None:
    """Print the extension's folder (for `pi -e PATH`, or a link of your own).

    Example: pi -e "$(pi-workflows pi-extension path)"
    """
    click.echo(str(extension_dir()))


@pi_extension.command("install")
def pi_extension_install() -> None:
    """Link the extension into Pi's extensions folder (running it again changes nothing).

    Example: pi-workflows pi-extension install
    """
    target = extension_dir()
    link = extensions_folder() / LINK_NAME
    if link.is_symlink():
        current = link.readlink()
        if not current.is_absolute():
            current = link.parent / current
        if current.resolve() == target.resolve():
            click.echo(f"already installed: {link} -> {target}")
            return
        link.unlink()  # a link to another installation (an older virtualenv): replace it
        verb = "relinked"
    elif link.exists():
        click.echo(
            f"pi-workflows: {link} exists and is not a link; move it away, then run "
            "`pi-workflows pi-extension install` again",
            err=True,
        )
        sys.exit(EXIT_FAILED)
    else:
        verb = "installed"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)
    click.echo(
        f"{verb}: {link} -> {target}\n"
        "Pi loads it at its next start (or /reload in a running Pi); try /workflow help."
    )
