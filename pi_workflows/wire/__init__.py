"""The wire layer: canonical JSON, framing, protocol schemas and the client.

Implements client-protocol.md and workflow-server.md § Live client protocol,
§ Runner protocol and § Supervised channel adapters.

The names load on first use: a client (the command line) that needs only `client` and
`protocol` does not pay for the server's socket listener.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pi_workflows.wire._listener import (
        FIRST_FRAME_ENV,
        MAX_CONNECTIONS_ENV,
        ClientListener,
        Connection,
        ConnectionLimits,
        offer_event_frames,
        raise_descriptor_limit,
    )
    from pi_workflows.wire._websocket import LOOPBACK_HOSTS, is_loopback, normalize_host
    from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads
    from pi_workflows.wire.framing import MAX_FRAME_BYTES, FrameError, encode_frame
    from pi_workflows.wire.protocol import (
        CLIENT_SCHEMA,
        OUTCOMES,
        EventMessage,
        HelloMessage,
        ProtocolViolation,
        RequestMessage,
        ResponseMessage,
        SafeError,
        client_message_from_wire,
        decode_client_message,
        encode_client_message,
        validate,
    )

_LAZY = {
    "FIRST_FRAME_ENV": "pi_workflows.wire._listener",
    "MAX_CONNECTIONS_ENV": "pi_workflows.wire._listener",
    "ClientListener": "pi_workflows.wire._listener",
    "Connection": "pi_workflows.wire._listener",
    "ConnectionLimits": "pi_workflows.wire._listener",
    "offer_event_frames": "pi_workflows.wire._listener",
    "raise_descriptor_limit": "pi_workflows.wire._listener",
    "LOOPBACK_HOSTS": "pi_workflows.wire._websocket",
    "is_loopback": "pi_workflows.wire._websocket",
    "normalize_host": "pi_workflows.wire._websocket",
    "CanonicalJSONError": "pi_workflows.wire.canonical",
    "dumps": "pi_workflows.wire.canonical",
    "loads": "pi_workflows.wire.canonical",
    "MAX_FRAME_BYTES": "pi_workflows.wire.framing",
    "FrameError": "pi_workflows.wire.framing",
    "encode_frame": "pi_workflows.wire.framing",
    "CLIENT_SCHEMA": "pi_workflows.wire.protocol",
    "OUTCOMES": "pi_workflows.wire.protocol",
    "EventMessage": "pi_workflows.wire.protocol",
    "HelloMessage": "pi_workflows.wire.protocol",
    "ProtocolViolation": "pi_workflows.wire.protocol",
    "RequestMessage": "pi_workflows.wire.protocol",
    "ResponseMessage": "pi_workflows.wire.protocol",
    "SafeError": "pi_workflows.wire.protocol",
    "client_message_from_wire": "pi_workflows.wire.protocol",
    "decode_client_message": "pi_workflows.wire.protocol",
    "encode_client_message": "pi_workflows.wire.protocol",
    "validate": "pi_workflows.wire.protocol",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pi_workflows.wire' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "CLIENT_SCHEMA",
    "FIRST_FRAME_ENV",
    "LOOPBACK_HOSTS",
    "MAX_CONNECTIONS_ENV",
    "MAX_FRAME_BYTES",
    "OUTCOMES",
    "CanonicalJSONError",
    "ClientListener",
    "Connection",
    "ConnectionLimits",
    "EventMessage",
    "FrameError",
    "HelloMessage",
    "ProtocolViolation",
    "RequestMessage",
    "ResponseMessage",
    "SafeError",
    "client_message_from_wire",
    "decode_client_message",
    "dumps",
    "encode_client_message",
    "encode_frame",
    "is_loopback",
    "loads",
    "normalize_host",
    "offer_event_frames",
    "raise_descriptor_limit",
    "validate",
]
