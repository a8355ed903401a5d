"""The wire layer: canonical JSON, framing, protocol schemas and the client.

Implements client-protocol.md and workflow-server.md § Live client protocol,
§ Runner protocol and § Supervised channel adapters.
"""

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
