"""`python -m pi_workflows.examples NAME [--project DIR]`: copy a shipped example into a
project's `.pi/` folder and say which files it wrote."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pi_workflows.examples import EXAMPLES, ExampleExistsError, install_example


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pi_workflows.examples",
        description="Copy an example shipped with pi-workflows into a project's .pi/ folder.",
    )
    parser.add_argument("name", choices=sorted(EXAMPLES), help="the example to install")
    parser.add_argument(
        "--project", type=Path, default=Path(), help="the project folder (default: this one)"
    )
    args = parser.parse_args(argv)
    if not args.project.is_dir():
        parser.error(f"--project {args.project} is not a folder")
    try:
        installed = install_example(args.name, args.project)
    except ExampleExistsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    for file in installed:
        sys.stdout.write(f"{'installed' if file.changed else 'unchanged'} {file.path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
