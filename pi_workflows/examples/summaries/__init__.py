"""The `summaries` example: a resource manager that keeps a folder's files summarised,
and the one-agent-step workflow it starts per changed file.

These are a manager file and a workflow file, loaded by path once copied into a
project's `.pi/` (`pi_workflows.examples.install_example`); nothing imports them.
"""

__all__: list[str] = []
