"""Runs every file of the language-neutral wire fixture corpus through the decoders.

Implements house rule 12 and the shared conformance corpus of client-protocol.md: each
valid fixture is canonical, decodes, validates and re-encodes to the same bytes, through
both `decode_*` and the frame decoder; each invalid fixture fails with the error class
named in tests/fixtures/wire/manifest.json, and nothing else. Runner frames decode into
the msgspec records of `wire/runner.py` (what both ends read), and every one is also
checked against `runner.v1.schema.json`, so the records and the schema agree.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.wire import protocol
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads
from pi_workflows.wire.framing import (
    MAX_FRAME_BYTES,
    FrameDecoder,
    FrameTooLargeError,
    MalformedFrameError,
)
from pi_workflows.wire.protocol import ProtocolViolation
from pi_workflows.wire.runner import RunnerMessage, decode_server_frame

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
VALID = sorted((CORPUS / "valid").glob("*.json"))
INVALID = sorted((CORPUS / "invalid").glob("*.json"))
MANIFEST: dict[str, Any] = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))

ERROR_CLASSES: dict[str, type[Exception]] = {
    "framing": FrameTooLargeError,
    "canonical": CanonicalJSONError,
    "schema": ProtocolViolation,
}


class Codec:
    """The decoder, checker and encoder for one fixture prefix."""

    def __init__(
        self,
        schema: str,
        decode: Callable[[bytes], Any],
        from_wire: Callable[[object], Any],
        encode: Callable[[Any], bytes],
        *,
        encoder_checks: bool = True,
    ) -> None:
        self.schema = schema
        self.decode = decode
        self.from_wire = from_wire
        self.encode = encode
        self.encoder_checks = encoder_checks
        """The encoder takes a raw message and checks it (a record encoder takes only
        records: a record is checked where its frame is read, once)."""


def runner_record(value: object) -> Any:
    """A runner frame as the record its reader decodes it into (server frames are
    `command` and `reply`; every other kind comes from a runner)."""
    if isinstance(value, dict) and value.get("kind") in ("command", "reply"):
        return decode_server_frame(value)
    return RunnerMessage.from_wire(value)


def decode_runner(data: bytes) -> Any:
    if len(data) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"message exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return runner_record(loads(data))


def encode_runner(record: Any) -> bytes:
    return dumps(record.to_wire())


CODECS = {
    "client-": Codec(
        "client.v1",
        protocol.decode_client_message,
        protocol.client_message_from_wire,
        protocol.encode_client_message,
    ),
    "runner-": Codec(
        "runner.v1", decode_runner, runner_record, encode_runner, encoder_checks=False
    ),
    "channel-": Codec(
        "channel.v1",
        protocol.decode_channel_message,
        protocol.channel_message_from_wire,
        protocol.encode_channel_message,
    ),
    "launch-": Codec(
        "worker-launch.v1",
        protocol.decode_launch_envelope,
        protocol.launch_envelope_from_wire,
        protocol.encode_launch_envelope,
    ),
    "run-list-page-": Codec(
        "run-list-page.v1",
        protocol.decode_run_list_page,
        protocol.run_list_page_from_wire,
        protocol.encode_run_list_page,
    ),
}


def codec_for(path: Path) -> Codec:
    for prefix, codec in CODECS.items():
        if path.name.startswith(prefix):
            return codec
    raise AssertionError(f"{path.name} has no known prefix")


def test_corpus_size_and_manifest_cover_every_file() -> None:
    assert len(VALID) + len(INVALID) >= 150
    assert len(VALID) >= 90
    assert len(INVALID) >= 90
    assert set(MANIFEST["invalid"]) == {path.name for path in INVALID}
    assert set(MANIFEST["invalid"].values()) <= set(ERROR_CLASSES)
    assert {path.name for path in VALID}.isdisjoint(MANIFEST["invalid"])
    assert MANIFEST["frameLimitBytes"] == MAX_FRAME_BYTES
    assert set(MANIFEST["prefixes"]) == set(CODECS)
    for path in VALID + INVALID:
        codec_for(path)
    for prefix in CODECS:
        assert any(p.name.startswith(prefix) for p in VALID), prefix
        assert any(p.name.startswith(prefix) for p in INVALID), prefix
    # Few large files keep the repository small.
    assert sum(p.stat().st_size > 65536 for p in VALID + INVALID) <= 2


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_fixture(path: Path) -> None:
    data = path.read_bytes()
    codec = codec_for(path)
    assert b"\n" not in data, "a frame body never contains a newline"
    assert dumps(loads(data)) == data, "valid fixtures are canonical"

    message = codec.decode(data)
    protocol.validate(codec.schema, loads(data))
    assert codec.encode(message) == data

    frames = FrameDecoder().feed(data + b"\n")
    assert frames == [loads(data)]
    assert codec.from_wire(frames[0]) == message


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_fixture(path: Path) -> None:
    data = path.read_bytes()
    codec = codec_for(path)
    expected = MANIFEST["invalid"][path.name]

    with pytest.raises(ERROR_CLASSES[expected]) as caught:
        codec.decode(data)
    assert len(str(caught.value)) <= 200, "errors are short and bounded"

    decoder = FrameDecoder()
    if expected == "framing":
        with pytest.raises(FrameTooLargeError):
            decoder.feed(data + b"\n")
    elif expected == "canonical":
        with pytest.raises(MalformedFrameError):
            decoder.feed(data + b"\n")
    else:
        value = loads(data)
        if not isinstance(value, dict):
            with pytest.raises(MalformedFrameError):
                decoder.feed(data + b"\n")
        else:
            (frame,) = decoder.feed(data + b"\n")
            with pytest.raises(ProtocolViolation):
                codec.from_wire(frame)
            if codec.encoder_checks:
                with pytest.raises(ProtocolViolation):
                    codec.encode(frame)
            with pytest.raises(ProtocolViolation):
                protocol.validate(codec.schema, frame)


def test_generator_reproduces_the_checked_in_corpus(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("wire_fixture_generator", CORPUS / "generate.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    generator.write_corpus(tmp_path)
    for folder, expected in (("valid", VALID), ("invalid", INVALID)):
        produced = sorted((tmp_path / folder).glob("*.json"))
        assert [p.name for p in produced] == [p.name for p in expected]
        for new, old in zip(produced, expected, strict=True):
            assert new.read_bytes() == old.read_bytes(), f"{folder}/{old.name} is stale"
    assert (tmp_path / "manifest.json").read_bytes() == (CORPUS / "manifest.json").read_bytes()
