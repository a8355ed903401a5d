"""The wire layer: canonical JSON, framing, protocol schemas and the client.

Implements client-protocol.md and workflow-server.md § Live client protocol,
§ Runner protocol and § Supervised channel adapters.
"""

__all__: list[str] = []
