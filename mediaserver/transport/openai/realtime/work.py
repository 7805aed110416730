"""The client events of a Realtime session, as the work its worker applies in order.

``RealtimeSession`` (session.py) reads each client event on the socket's reader, checks it, and
queues what it asks for as one of these; the worker applies them in the order they came, between
the audio it feeds. Which events a session takes depends on whether it holds a conversation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from mediaserver.transport.openai.realtime.config import RealtimeConfig
from mediaserver.transport.openai.realtime.conversation_config import (
    ConversationConfig,
    ResponseOptions,
    parse_response_options,
)
from mediaserver.transport.openai.realtime.items import NewItem, parse_item, required_id
from mediaserver.transport.openai.realtime.values import EventError, integer

MAX_AUDIO_BYTES_PER_EVENT: Final = 15 * 1024 * 1024  # an append's, or an item's, audio

AUDIO_BUFFER_EVENTS: Final = ("input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear")
# Client events of the full Realtime API that only a conversation has a use for.
CONVERSATION_ONLY_EVENTS: Final = (
    "conversation.item.create",
    "conversation.item.retrieve",
    "conversation.item.truncate",
    "conversation.item.delete",
    "response.create",
    "response.cancel",
    "output_audio_buffer.clear",
)
UNSUPPORTED_EVENTS: Final = frozenset(CONVERSATION_ONLY_EVENTS)  # in a transcription session
SUPPORTED_EVENTS: Final = ("session.update", "transcription_session.update", *AUDIO_BUFFER_EVENTS)
CONVERSATION_EVENTS: Final = ("session.update", *AUDIO_BUFFER_EVENTS, *CONVERSATION_ONLY_EVENTS)


@dataclass(frozen=True)
class Configure:
    config: RealtimeConfig
    reply: str  # "session.updated" or "transcription_session.updated"
    conversation: ConversationConfig | None = None


@dataclass(frozen=True)
class Commit:
    client_event_id: str | None


@dataclass(frozen=True)
class Clear:
    pass


@dataclass(frozen=True)
class CreateItem:
    item: NewItem
    previous_item_id: str | None
    client_event_id: str | None


@dataclass(frozen=True)
class ItemOp:
    op: str  # "delete", "retrieve", "truncate"
    item_id: str
    client_event_id: str | None
    content_index: int = 0
    audio_end_ms: int = 0


@dataclass(frozen=True)
class CreateResponse:
    options: ResponseOptions
    client_event_id: str | None


@dataclass(frozen=True)
class CancelResponse:
    response_id: str | None
    client_event_id: str | None
    from_client: bool = True  # response.cancel (an error when nothing runs), not output_audio_buffer.clear


@dataclass(frozen=True)
class Refusal:
    """An error about a client event, sent in its turn: after what the events before it caused (a
    trial's empty commit was refused before the session.updated of the update sent just before it)."""

    code: str
    message: str
    param: str | None
    client_event_id: str | None
    kind: str


Work = Configure | Commit | Clear | CreateItem | ItemOp | CreateResponse | CancelResponse | Refusal


def conversation_work(
    kind: str,
    event: Mapping[str, Any],
    client_event_id: str | None,
    config: ConversationConfig,
    check_voice: Callable[[str, str], None],
    track_audio: bool,
) -> Work:
    """A conversation event, checked at once (on the reader), as the work the worker applies in
    order; ``track_audio``: the answers play on a WebRTC track (``output_audio_buffer.clear``)."""
    if kind == "conversation.item.create":
        if "item" not in event:
            raise EventError("missing_required_parameter", "Missing required parameter: 'item'.", "item")
        previous = event.get("previous_item_id")
        if previous is not None and not isinstance(previous, str):
            raise EventError(
                "invalid_type", "Invalid type for 'previous_item_id': expected a string.", "previous_item_id"
            )
        return CreateItem(
            parse_item(event["item"], max_audio_bytes=MAX_AUDIO_BYTES_PER_EVENT), previous, client_event_id
        )
    if kind in ("conversation.item.delete", "conversation.item.retrieve"):
        return ItemOp(kind.rsplit(".", 1)[1], required_id(event, "item_id"), client_event_id)
    if kind == "conversation.item.truncate":
        item_id = required_id(event, "item_id")
        for key in ("content_index", "audio_end_ms"):
            if key not in event:
                raise EventError("missing_required_parameter", f"Missing required parameter: '{key}'.", key)
        content_index = integer(event["content_index"], "content_index", 0, 1_000_000)
        audio_end_ms = integer(event["audio_end_ms"], "audio_end_ms", 0, 2**31)
        return ItemOp("truncate", item_id, client_event_id, content_index, audio_end_ms)
    if kind == "response.create":
        return CreateResponse(
            parse_response_options(event.get("response"), config, check_voice=check_voice), client_event_id
        )
    if kind == "output_audio_buffer.clear" and not track_audio:
        raise EventError(
            "unsupported_event",
            "'output_audio_buffer.clear' is for WebRTC calls; over WebSocket send "
            "'response.cancel' and 'conversation.item.truncate'.",
            "type",
        )
    response_id = event.get("response_id")  # response.cancel, output_audio_buffer.clear
    if response_id is not None and not isinstance(response_id, str):
        raise EventError("invalid_type", "Invalid type for 'response_id': expected a string.", "response_id")
    return CancelResponse(response_id, client_event_id, kind == "response.cancel")
