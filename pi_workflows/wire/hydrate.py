"""Page collection and content hydration of a run view, with verification.

Implements client-protocol.md § Run and session views for a non-interactive client:
it assembles every `view.page` window of one revision and hydrates every referenced
value before it shows a complete view.

- A page is applied only when it echoes the requested cursor and the view's revision;
  a page of another revision means the run changed between requests, and collection
  starts again from a fresh `run.get` (at most `MAX_COLLECT_ATTEMPTS` times).
- Content comes in `view.content` chunks. The assembled bytes are checked against the
  response digest and byte count and against the advertised reference; any mismatch
  raises `ContentVerificationError` before a byte of it is shown.
- Only the view's own reference positions are followed (input, output, result, error,
  traceback, reason, definition). Decoded content is data: a user value that looks
  like a reference is never followed.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final, Protocol

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire.views import ContentRef, RunPage

__all__ = [
    "MAX_COLLECT_ATTEMPTS",
    "ContentRef",
    "ContentVerificationError",
    "RunChangingError",
    "RunPage",
    "collect_trace",
    "hydrate_run_view",
    "load_content",
]

MAX_COLLECT_ATTEMPTS: Final = 5
"""Collections started again after the run changed between pages before giving up."""
CHUNK_BYTES: Final = 256 * 1024
"""The most bytes the server sends per `view.content` chunk (the contract's bound)."""
MAX_TRACE_PAGES: Final = 100_000


class ContentVerificationError(PiWorkflowsError):
    """Referenced content failed verification (digest, length or chunk framing); it was
    not shown. The message names the reference, never the content."""


class RunChangingError(PiWorkflowsError):
    """The run changed between the pages of every attempt to collect its history."""

    retryable = True


class _PageChangedError(Exception):
    """A page echoed another cursor or revision: this collection is void."""


class Caller(Protocol):
    """What hydration needs of `WorkflowClient`: one accepted call per request."""

    def call(
        self, operation: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> Mapping[str, Any]: ...


# --- content -----------------------------------------------------------------------------


def _check_ref(ref: Any) -> tuple[str, str, int]:
    if not isinstance(ref, Mapping) or ref.get("marker") != "server":
        raise ContentVerificationError("not a server content reference")
    digest, media_type, count = ref.get("digest"), ref.get("mediaType"), ref.get("byteCount")
    if not isinstance(digest, str) or not isinstance(media_type, str):
        raise ContentVerificationError("a content reference without digest or media type")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ContentVerificationError(f"content {digest}: a bad byte count")
    return digest, media_type, count


def _chunk(
    receipt: Mapping[str, Any], digest: str, media_type: str, count: int, offset: int
) -> bytes:
    if (receipt.get("digest"), receipt.get("mediaType")) != (digest, media_type):
        raise ContentVerificationError(f"content {digest}: the server answered for other content")
    if receipt.get("byteCount") != count:
        raise ContentVerificationError(
            f"content {digest}: the server holds {receipt.get('byteCount')} bytes, "
            f"the reference says {count}"
        )
    if receipt.get("offset") != offset:
        raise ContentVerificationError(f"content {digest}: a chunk for another offset")
    try:
        data = base64.b64decode(str(receipt.get("data", "")), validate=True)
    except (binascii.Error, ValueError):
        raise ContentVerificationError(f"content {digest}: a chunk that is not base64") from None
    if len(data) > CHUNK_BYTES or offset + len(data) > count:
        raise ContentVerificationError(f"content {digest}: an oversized chunk")
    return data


def load_content(client: Caller, run_id: str, ref: Mapping[str, Any]) -> bytes:
    """Return the complete bytes of one advertised reference, verified.

    Raises:
        ContentVerificationError: a chunk or the assembled bytes do not match the
            response or the reference (a damaged or tampered row, say).
        RequestFailedError: `view.content` refused (`contentUnavailable`, ...).
    """
    digest, media_type, count = _check_ref(ref)
    parts: list[bytes] = []
    offset = 0
    while True:
        payload = {"digest": digest, "mediaType": media_type, "offset": offset}
        receipt = client.call("view.content", payload, run_id=run_id)["receipt"]
        data = _chunk(receipt, digest, media_type, count, offset)
        parts.append(data)
        offset += len(data)
        following = receipt.get("nextOffset")
        if following is None:
            break
        if following != offset or not data:
            raise ContentVerificationError(f"content {digest}: chunks do not follow each other")
    whole = b"".join(parts)
    if len(whole) != count:
        raise ContentVerificationError(
            f"content {digest}: {len(whole)} bytes arrived, the reference says {count}"
        )
    actual = "sha256:" + hashlib.sha256(whole).hexdigest()
    # The response's digest equals the reference's (checked per chunk), so this one
    # comparison verifies the bytes against both.
    if actual != digest:
        raise ContentVerificationError(
            f"content {digest} of run {run_id} failed verification: its bytes hash to "
            f"{actual}; it is damaged and is not shown (run `pi-workflows state verify`)"
        )
    return whole


def _load_json(client: Caller, run_id: str, ref: Mapping[str, Any]) -> Any:
    data = load_content(client, run_id, ref)
    try:
        return json.loads(data)
    except ValueError:
        raise ContentVerificationError(f"content {ref.get('digest')}: not JSON") from None


def _load_text(client: Caller, run_id: str, ref: Mapping[str, Any]) -> str:
    return load_content(client, run_id, ref).decode("utf-8", "replace")


# --- pages -------------------------------------------------------------------------------


def _collect_once(client: Caller, view: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    run_id, revision = str(view["runId"]), view["revision"]
    trace = view["trace"]
    items: list[dict[str, Any]] = list(trace["items"])
    cursor = trace.get("cursors", {}).get("older")
    for _ in range(MAX_TRACE_PAGES):
        if cursor is None:
            break
        payload = {"list": name, "cursor": cursor, "revision": revision}
        page = client.call("view.page", payload, run_id=run_id)["receipt"]
        if page.get("cursor") != cursor or page.get("revision") != revision:
            raise _PageChangedError
        items[:0] = page["items"]
        cursor = page.get("nextCursor")
    if len(items) != trace["count"]:
        raise _PageChangedError
    return items


def collect_trace(client: Caller, view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every attempt of the view's revision, oldest first: its own window plus every
    older `view.page` window.

    Raises:
        _PageChangedError (internal): a page of another revision.
    """
    return _collect_once(client, view, "trace")


def hydrate_run_view(client: Caller, run_id: str) -> dict[str, Any]:
    """The run's complete view: one revision's whole trace, every reference loaded.

    Each referenced value `{"ref", "preview"}` becomes `{"value": …, "ref": …}`; an
    error with `errorContent` gets its complete text; a traceback without text gets
    it; `display.reasonText` becomes the complete reason; `graph.definitionSnapshot`
    holds the complete definition, and `failureReason` the complete reason.
    `trace.items` holds every attempt and `trace.omitted` is 0. The document is no
    longer bounded by the frame limit.

    Raises:
        RunChangingError: the run changed between pages `MAX_COLLECT_ATTEMPTS` times.
        ContentVerificationError: referenced content failed verification.
        RequestFailedError: the server refused a request (`runNotFound`, ...).
    """
    for _ in range(MAX_COLLECT_ATTEMPTS):
        view = dict(client.call("run.get", run_id=run_id)["receipt"])
        try:
            items = collect_trace(client, view)
        except _PageChangedError:
            continue
        return _hydrated(client, view, items)
    raise RunChangingError(
        f"run {run_id} changed between pages {MAX_COLLECT_ATTEMPTS} times; try again, or "
        "follow it with `pi-workflows run watch`"
    )


def _hydrated(
    client: Caller, view: Mapping[str, Any], items: list[dict[str, Any]]
) -> dict[str, Any]:
    run_id = str(view["runId"])
    whole = copy.deepcopy(dict(view))
    whole["trace"] = {"count": len(items), "omitted": 0, "items": copy.deepcopy(items)}
    state = whole.get("state")
    if isinstance(state, dict):
        state["input"] = _value(client, run_id, state.get("input"))
    result = whole.get("result")
    if isinstance(result, dict):
        result["output"] = _value(client, run_id, result.get("output"))
    for item in whole["trace"]["items"]:
        _hydrate_attempt(client, run_id, item)
    display = whole["display"]
    if "reasonContent" in display:
        display["reasonText"] = _load_text(client, run_id, display["reasonContent"])
        if "failureReason" in whole:  # the view holds only its head
            whole["failureReason"] = display["reasonText"]
    graph = whole.get("graph")
    definition = graph.get("definition") if isinstance(graph, dict) else None
    if isinstance(graph, dict) and isinstance(definition, dict) and "digest" in definition:
        graph["definitionSnapshot"] = _load_json(client, run_id, graph["definition"])
    whole["hydrated"] = True
    return whole


def _value(client: Caller, run_id: str, shown: Any) -> Any:
    """One view value with its referenced content loaded; inline values stay as they are
    (and are never searched for references)."""
    if isinstance(shown, dict) and "ref" in shown and "value" not in shown:
        return {"value": _load_json(client, run_id, shown["ref"]), "ref": shown["ref"]}
    return shown


def _hydrate_attempt(client: Caller, run_id: str, item: dict[str, Any]) -> None:
    if "output" in item:
        item["output"] = _value(client, run_id, item["output"])
    if "errorContent" in item:
        item["error"] = _load_text(client, run_id, item["errorContent"])
    traceback = item.get("traceback")
    if isinstance(traceback, dict) and "text" not in traceback and "ref" in traceback:
        traceback["text"] = _load_text(client, run_id, traceback["ref"])
