"""`python -m pi_workflows.cli`: the same as the `pi-workflows` console script."""

from pi_workflows.cli._main import main

main()
