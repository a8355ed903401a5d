"""What `state status` shows of automatic retention, shared by its actor and the status read.

Implements client-protocol.md § Maintenance (`state.status`) for workflow-server.md
§ State retention: the setting, the last sweep and when the next one is due.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["RetentionReport"]


class RetentionReport:
    """What `state status` shows of automatic retention: the setting, the last sweep
    and when the next is due. Written only by the retention actor (`publish`), read by
    the status operation; a lock keeps each read whole. Safe data only: times and
    counts, no run IDs, paths or content."""

    def __init__(self, days: int) -> None:
        self.days = days
        """The retention setting (0: automatic cleanup off); fixed for the process."""
        self._lock = threading.Lock()
        self._report: dict[str, Any] = {
            "retentionDays": days,
            "enabled": days > 0,
            "lastSweep": None,
            "nextDueAt": None,
            "state": "off" if days == 0 else "due",
        }

    def publish(self, **changes: Any) -> None:
        with self._lock:
            self._report.update(changes)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._report)
