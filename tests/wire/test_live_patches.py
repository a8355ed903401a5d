"""`LiveViews` against a scripted server peer on a real Unix socket: the events a correct
server never sends (a patch from another base revision) and the end of a subscription.

The real server's patches are tested in tests/server/test_live_client.py; here the peer
sends a `runPatch` whose `baseRevision` is not the one the client holds, and the client
must not apply it: it subscribes again without a revision and takes the snapshot.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from pi_workflows._version import __version__
from pi_workflows.wire.framing import SocketFrameReader, encode_frame
from pi_workflows.wire.live import LiveViews, ViewKey, ViewUnavailableError
from pi_workflows.wire.protocol import CLIENT_SCHEMA

pytestmark = pytest.mark.timeout(60)


def _view(revision: int, status: str) -> dict[str, Any]:
    return {
        "schema": "pi-workflows.run-view.v1",
        "revision": revision,
        "runId": "run-1",
        "workflow": "hello",
        "status": "queued",
        "display": {"status": status, "activity": None, "controls": ["cancel"]},
        "lineage": {"rootRunId": "run-1"},
        "trace": {"count": 0, "omitted": 0, "items": []},
    }


def _event(subscription: str, kind: str, revision: int, payload: dict[str, Any]) -> bytes:
    return encode_frame(
        {
            "schema": CLIENT_SCHEMA,
            "type": "event",
            "subscriptionId": subscription,
            "kind": kind,
            "revision": revision,
            "payload": payload,
        }
    )


class ScriptedPeer:
    """One connection: the script below, then `accepted` for every further request."""

    def __init__(self, path: Path) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.requests: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection:
            reader = SocketFrameReader(connection)
            send = connection.sendall
            send(
                encode_frame(
                    {
                        "schema": CLIENT_SCHEMA,
                        "type": "hello",
                        "connectionId": "connection-1",
                        "packageVersion": __version__,
                    }
                )
            )
            self._answer(reader, send, {"subscriptionId": "sub-1", "kind": "run"})
            send(_event("sub-1", "runSnapshot", 5, _view(5, "queued")))
            patch = [
                {"op": "replace", "path": "/revision", "value": 6},
                {"op": "replace", "path": "/display/status", "value": "running"},
            ]
            send(_event("sub-1", "runPatch", 6, {"baseRevision": 5, "operations": patch}))
            wrong = [{"op": "replace", "path": "/display/status", "value": "failed"}]
            send(_event("sub-1", "runPatch", 8, {"baseRevision": 7, "operations": wrong}))
            self._answer(reader, send, {"subscriptionId": "sub-1"})  # the unsubscribe
            self._answer(reader, send, {"subscriptionId": "sub-2", "kind": "run"})
            send(_event("sub-2", "runSnapshot", 8, _view(8, "paused")))
            gone = {"code": "runNotFound", "message": "the run no longer exists"}
            send(_event("sub-2", "unavailable", 8, gone))
            while self._answer(reader, send, {}):
                pass

    def _answer(self, reader: SocketFrameReader, send: Any, receipt: dict[str, Any]) -> bool:
        request = reader.read_message()
        if request is None:
            return False
        self.requests.append(request)
        send(
            encode_frame(
                {
                    "schema": CLIENT_SCHEMA,
                    "type": "response",
                    "requestId": request["requestId"],
                    "outcome": "accepted",
                    "receipt": receipt,
                }
            )
        )
        return True

    def close(self) -> None:
        self.listener.close()
        self.thread.join(10)


def test_a_patch_from_another_base_is_never_applied_and_a_snapshot_replaces_it(
    short_tmp: Path,
) -> None:
    state_dir = short_tmp / "workflows"
    (state_dir / "host").mkdir(parents=True)
    peer = ScriptedPeer(state_dir / "host" / "host.sock")
    try:
        with LiveViews(state_dir, autostart=False, timeout=10) as live:
            key = ViewKey.run("run-1")
            views = live.watch_run("run-1", timeout=30)
            assert next(views)["display"]["status"] == "queued"  # the snapshot at 5
            patched = next(views)
            assert patched["display"]["status"] == "running"  # base 5 = held: applied
            assert patched["revision"] == 6 and live.revision(key) == 6
            after = next(views)
            # Base 7 is not the held 6: not applied ("failed" never shows); the client
            # subscribed again without a revision and took the snapshot at 8.
            assert after["display"]["status"] == "paused" and after["revision"] == 8
            assert live.revision(key) == 8
            with pytest.raises(ViewUnavailableError) as ended:
                next(views)
            assert ended.value.code == "runNotFound"
            assert live.view(key) is None  # an ended subscription is not wanted
    finally:
        peer.close()
    operations = [(r["operation"], r["payload"]) for r in peer.requests]
    assert operations[:3] == [
        ("view.subscribe", {"kind": "run"}),
        ("view.unsubscribe", {"subscriptionId": "sub-1"}),
        ("view.subscribe", {"kind": "run"}),  # no revision: a snapshot, not a patch
    ]
    assert all(r.get("runId") == "run-1" for r in peer.requests if r["payload"].get("kind"))
