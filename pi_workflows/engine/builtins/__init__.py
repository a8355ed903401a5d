"""Built-in workflows shipped with pi-workflows, found after project and agent workflows.

Implements python-port.md § Names and places (built-ins are discovered last). Each
`NAME.workflow.py` here is loaded by path like any other workflow file, never imported.
"""

__all__: list[str] = []
