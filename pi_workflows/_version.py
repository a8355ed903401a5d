"""The package version, read from the installed distribution metadata.

Every client command compares it with the server's, so it is read without loading
`importlib.metadata` (about 30 ms, a tenth of a command's start): the first
`pi_workflows` metadata folder on `sys.path`, which is the one `importlib.metadata` finds.
"""

import sys
from pathlib import Path

__all__ = ["__version__"]

_DISTRIBUTION = "pi_workflows"
_METADATA_FILES = {".dist-info": "METADATA", ".egg-info": "PKG-INFO"}


def _metadata_version(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8") as metadata:
            for line in metadata:
                if line.startswith("Version:"):
                    return line.removeprefix("Version:").strip()
                if not line.strip():  # the headers end at the first empty line
                    return None
    except OSError:
        return None
    return None


def _version_on_path() -> str | None:
    for entry in sys.path:
        try:
            folders = sorted(Path(entry or ".").iterdir())
        except OSError:  # a zip file, a missing folder
            continue
        for folder in folders:
            stem, dot, suffix = folder.name.rpartition(".")
            file_name = _METADATA_FILES.get(dot + suffix)
            distribution = stem.lower().partition("-")[0].replace("-", "_").replace(".", "_")
            if file_name is None or distribution != _DISTRIBUTION:
                continue
            found = _metadata_version(folder / file_name)
            if found is not None:
                return found
    return None


def _version() -> str:
    found = _version_on_path()
    if found is not None:
        return found
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 (fallback)

    try:
        return version("pi-workflows")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"


__version__ = _version()
