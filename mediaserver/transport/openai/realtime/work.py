"""The client events of a Realtime session, as the work its worker applies in order.

``RealtimeSession`` (session.py) reads each client event on the socket's reader, checks it, and
queues what it asks for as one of these; the worker applies them in the order they came, between
the audio it feeds. Which events a session takes depends on whether it holds a conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from mediaserver.transport.openai.realtime.config import RealtimeConfig
from mediaserver.transport.openai.realtime.conversation_config import ConversationConfig, ResponseOptions
from mediaserver.transport.openai.realtime.items import NewItem

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
