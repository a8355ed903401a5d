"""The one part of the build pyproject.toml cannot declare without a warning: the
optional C pre-check that lets canonical JSON keep orjson's speed. Without a compiler
the build still succeeds and pi_workflows.wire.canonical scans in Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pi_workflows.wire._jcs_scan",
            sources=["pi_workflows/wire/_jcs_scan.c"],
            optional=True,
        )
    ]
)
