"""The `pi-workflows` command group and the `piw` viewer entry point.

Commands parse their arguments, call the client, render the result and map
errors to exit codes. Commands whose issue has not landed say so and exit 2.
"""

from __future__ import annotations

import sys

import click

from pi_workflows._version import __version__

NOT_YET_EXIT_CODE = 2


def _not_yet(what: str) -> None:
    click.echo(f"pi-workflows: '{what}' is not built yet in version {__version__}.", err=True)
    sys.exit(NOT_YET_EXIT_CODE)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pi-workflows")
def main() -> None:
    """Durable, crash-correct workflows for the Pi coding agent.

    Example: pi-workflows server status --json
    """


@main.group()
def server() -> None:
    """Start, stop and inspect the workflow server."""


@server.command("status")
def server_status() -> None:
    """Show the server state. Example: pi-workflows server status"""
    _not_yet("server status")


@main.group()
def run() -> None:
    """Start and control workflow runs."""


@run.command("list")
def run_list() -> None:
    """List runs. Example: pi-workflows run list"""
    _not_yet("run list")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="piw")
@click.argument("run_id", required=False)
def piw_main(run_id: str | None) -> None:
    """Terminal viewer for workflow runs. Example: piw RUN_ID"""
    _not_yet("piw")
