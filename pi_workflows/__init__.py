"""pi-workflows: a durable, crash-correct workflow server for the Pi coding agent.

The package root re-exports the names users need; everything else lives in the
subpackages `wire`, `storage`, `actors`, `supervision` and `cli`.
"""

from pi_workflows._version import __version__
from pi_workflows.errors import PiWorkflowsError

__all__ = ["PiWorkflowsError", "__version__"]
