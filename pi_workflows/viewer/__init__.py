"""`piw`: the terminal viewer of workflow runs, over the client protocol only.

It opens no SQLite file and reads no state folder: it subscribes to the server's run
list and run views (through the Unix socket, or through `piw serve` at a ws:// URL)
and renders what the server produced. See docs/operator-guide.md § piw.
"""

from pi_workflows.viewer._target import Target, open_client, open_live

__all__ = ["Target", "list_themes", "open_client", "open_live", "print_once", "run_app"]


def print_once(target: Target, run_id: str, *, timeout: float) -> int:
    """`piw RUN_ID --once`: print one plain-text 120 × 40 frame; return the exit code."""
    from pi_workflows.viewer._once import print_once as _print_once  # noqa: PLC0415

    return _print_once(target, run_id, timeout=timeout)


def run_app(
    target: Target, run_id: str | None, *, theme: str | None, session_id: str | None = None
) -> int:
    """`piw` and `piw RUN_ID`: the textual app until the user quits; return the exit code.
    `session_id`: the Pi origin session piw was opened from (Clear acts on its view)."""
    from pi_workflows.viewer._app import run_app as _run_app  # noqa: PLC0415

    return _run_app(target, run_id, theme=theme, session_id=session_id)


def list_themes() -> list[str]:
    """The theme names `--theme` accepts, in the picker's order."""
    from pi_workflows.viewer._config import THEMES  # noqa: PLC0415

    return list(THEMES)
