"""The `pi-workflows-state` schema: DDL text, its normalized form and its digest.

Implements workflow-server.md § Alpha state policy and python-port.md decision 2.
Internal module; `pi_workflows.storage` exports the names other subpackages use.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from functools import cache
from importlib import resources

__all__ = [
    "DDL_DIGEST",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "compute_ddl_digest",
    "ddl_statements",
    "load_ddl",
    "normalize_ddl",
]

SCHEMA_NAME = "pi-workflows-state"
"""The schema name stored in `schema_info`; never changes while the project is alpha."""

SCHEMA_VERSION = 1
"""The schema version stored in `schema_info`; stays 1 under the alpha state policy."""

# The digest of the normalized schema.sql. A test recomputes it, so changing the DDL
# without updating this constant fails loudly rather than silently accepting old files.
DDL_DIGEST = "sha256:3afa32ccc7092bfb98d7fa76a2deb7173491d9f1ea29da17586b598e195627b7"

# A SQL line comment: from `--` to the end of the line. schema.sql has no string
# literal that contains `--`, so this needs no tokenizer.
_LINE_COMMENT = re.compile(r"--[^\n]*")
_WHITESPACE = re.compile(r"\s+")


@cache
def load_ddl() -> str:
    """Return the text of `schema.sql` shipped in this package."""
    return resources.files("pi_workflows.storage").joinpath("schema.sql").read_text("utf-8")


def normalize_ddl(ddl: str) -> str:
    """Return `ddl` without comments and with every run of white space made one space."""
    return _WHITESPACE.sub(" ", _LINE_COMMENT.sub(" ", ddl)).strip()


def compute_ddl_digest(ddl: str) -> str:
    """Return `sha256:<hex>` of the UTF-8 bytes of the normalized `ddl`."""
    return "sha256:" + hashlib.sha256(normalize_ddl(ddl).encode("utf-8")).hexdigest()


@cache
def ddl_statements() -> tuple[str, ...]:
    """Split `schema.sql` into complete statements (triggers stay whole)."""
    statements: list[str] = []
    pending = ""
    for line in _LINE_COMMENT.sub("", load_ddl()).splitlines(keepends=True):
        pending += line
        if pending.strip() and sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError("schema.sql ends with an incomplete statement")
    return tuple(statements)
