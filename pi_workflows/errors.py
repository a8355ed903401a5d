"""The one error tree of pi-workflows.

Subclasses follow workflow-server.md § Failure classification. `retryable`
says whether repeating the same call may succeed.
"""

from __future__ import annotations

__all__ = ["PiWorkflowsError"]


class PiWorkflowsError(Exception):
    """Base class of every error this package raises on purpose."""

    retryable: bool = False
