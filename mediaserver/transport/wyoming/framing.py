"""Wyoming framing, read defensively.

Each event is one UTF-8 JSON header line ending in ``\\n`` (``{"type", "data"?, "data_length"?,
"payload_length"?, "version"?}``), then ``data_length`` bytes of JSON merged over ``data``, then
``payload_length`` bytes of binary payload. The ``wyoming`` package's ``async_read_event`` has no
size limit (a header claiming a 4 GB payload is read into memory) and turns a malformed event into
a silent end of stream, so ``read_event`` checks every length before anything is allocated and
raises ``WyomingProtocolError`` with a reason the server sends back as an ``error`` event.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from wyoming.event import Event

from mediaserver.transport.common import json_error, loads_json

# Longest accepted header line; real headers are ~150 bytes (data goes in the data_length block).
MAX_HEADER_LINE_BYTES: Final = 64 * 1024


class WyomingProtocolError(Exception):
    """A malformed event; the connection it came from cannot be trusted any further."""

    def __init__(self, message: str, code: str = "invalid_event") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = loads_json(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise WyomingProtocolError(json_error(exc, f"{what} is not valid UTF-8 JSON")) from None
    if not isinstance(value, dict):
        raise WyomingProtocolError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _length(header: dict[str, Any], key: str) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise WyomingProtocolError(f"{key} must be an integer, got {value!r}")
    if value < 0:
        raise WyomingProtocolError(f"{key} must not be negative, got {value}")
    return value


async def read_event(reader: asyncio.StreamReader, *, max_event_bytes: int) -> Event | None:
    """Read one event; None on a clean end of stream between events.

    Raises WyomingProtocolError for anything malformed or larger than ``max_event_bytes`` (header,
    data and payload together), and asyncio.IncompleteReadError when the peer leaves mid-event.
    The reader's own limit must be at least MAX_HEADER_LINE_BYTES.
    """
    max_line = min(MAX_HEADER_LINE_BYTES, max_event_bytes)
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    except asyncio.LimitOverrunError:
        raise WyomingProtocolError(f"header line is longer than {max_line} bytes", "event_too_large") from None
    if len(line) > max_line:
        raise WyomingProtocolError(f"header line is longer than {max_line} bytes", "event_too_large")
    header = _json_object(line, "header line")
    event_type = header.get("type")
    if not isinstance(event_type, str) or not event_type:
        raise WyomingProtocolError("header has no 'type' string")
    data = header.get("data")
    if data is None:
        data = {}
    elif not isinstance(data, dict):
        raise WyomingProtocolError(f"'data' must be a JSON object, got {type(data).__name__}")
    data_length = _length(header, "data_length")
    payload_length = _length(header, "payload_length")
    total = len(line) + data_length + payload_length
    if total > max_event_bytes:
        raise WyomingProtocolError(
            f"event of {total} bytes (data_length={data_length}, payload_length={payload_length}) "
            f"exceeds the limit of {max_event_bytes} bytes",
            "event_too_large",
        )
    if data_length:
        data = {**data, **_json_object(await reader.readexactly(data_length), "data block")}
    payload = await reader.readexactly(payload_length) if payload_length else None
    return Event(event_type, data, payload)
