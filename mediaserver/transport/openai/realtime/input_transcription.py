"""``StreamSession`` events → the Realtime API's input-audio server events, and their items.

A user audio item is announced when speech starts (server VAD) or on a manual commit; its
transcript arrives as append-only ``...input_audio_transcription.delta`` events whose concatenation
is exactly the ``completed.transcript``. This module keeps that bookkeeping (which item is being
spoken, which await their transcript, the previous item id) apart from the socket, so a conversation
session can reuse it for the user's side of a turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol

from mediaserver.events import (
    FinalTranscript,
    PartialTranscript,
    SessionEvent,
    SpeechStarted,
    SpeechStopped,
    StreamError,
)
from mediaserver.transport.openai.realtime.values import new_id
from mediaserver.transport.openai.transcription_stream import word_logprobs

log = logging.getLogger(__name__)

# StreamError codes that are the client's fault rather than the server's.
CLIENT_ERROR_CODES: Final = frozenset(
    {"invalid_parameter", "model_not_found", "invalid_audio", "audio_too_large", "recording_too_long"}
)


class Host(Protocol):
    """What the session's parts (input transcription, conversation) need of its connection: a
    WebSocket or a WebRTC data channel. ``RealtimeSession`` subclasses it, for ``send_error``."""

    id: str
    beta: bool

    def send(self, kind: str, **fields: Any) -> None: ...

    def send_error(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        client_event_id: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        """Send an ``error`` event, in OpenAI's shape."""
        self.send(
            "error",
            error={"type": kind, "code": code, "message": message, "param": param, "event_id": client_event_id},
        )

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...


class UserItems(Protocol):
    """A conversation that keeps the user's audio items (``conversation.Conversation``)."""

    def user_audio(self, item_id: str) -> str | None:
        """Add a committed audio item; returns the id of the item before it."""
        ...

    def transcribed(self, item_id: str, transcript: str | None) -> None:
        """The item's transcript (None: transcription failed)."""
        ...


@dataclass
class AudioInput:
    """A user audio item: its id and the transcript text its delta events have carried so far."""

    id: str
    sent: str = ""


class InputTranscription:
    """Translates one session's speech and transcript events into input-audio server events."""

    def __init__(self, sink: Host, conversation: UserItems | None = None) -> None:
        self._sink = sink
        self.conversation = conversation  # a conversation session: committed audio becomes its items
        self.speaking: AudioInput | None = None  # server VAD: the item being spoken
        self._awaiting: dict[int, AudioInput] = {}  # server VAD: audio_start_ms → item awaiting its transcript
        self.last_item_id: str | None = None
        self.muted_errors = 0  # >0 while a commit reports its own failure on its item
        self.items_completed = 0
        self.logprobs = False  # ``include`` asks for the transcription's logprobs (set by the session)

    def on_event(self, event: SessionEvent, offset_ms: int, *, server_vad: bool) -> None:
        """Translate one event; ``offset_ms`` places the stream's clock on the session's."""
        send = self._sink.send
        if isinstance(event, SpeechStarted):
            item = AudioInput(new_id("item"))
            self.speaking = item
            self._awaiting[event.audio_start_ms + offset_ms] = item
            send("input_audio_buffer.speech_started", audio_start_ms=event.audio_start_ms + offset_ms, item_id=item.id)
        elif isinstance(event, PartialTranscript):
            speaking = self.speaking
            if speaking is not None and event.delta:
                speaking.sent += event.delta
                send(
                    "conversation.item.input_audio_transcription.delta",
                    item_id=speaking.id,
                    content_index=0,
                    delta=event.delta,
                )
        elif isinstance(event, SpeechStopped):
            stopped, self.speaking = self.speaking, None
            if stopped is None:
                return
            send("input_audio_buffer.speech_stopped", audio_end_ms=event.audio_end_ms + offset_ms, item_id=stopped.id)
            self.committed(stopped)
        elif isinstance(event, FinalTranscript):
            if not server_vad:
                return  # a manual commit's final: the session completes its item
            awaiting = self._awaiting.pop(event.audio_start_ms + offset_ms, None)
            if awaiting is not None:
                self.completed(awaiting, event)
        elif isinstance(event, StreamError) and not self.muted_errors:
            kind = "invalid_request_error" if event.code in CLIENT_ERROR_CODES else "server_error"
            self._sink.send_error(event.code, event.message, kind=kind)
            if self.conversation is not None and server_vad and event.audio_start_ms is not None:
                failed = self._awaiting.pop(event.audio_start_ms + offset_ms, None)
                if failed is not None:  # no transcript will come: a response must not wait for it
                    self.conversation.transcribed(failed.id, None)

    def committed(self, item: AudioInput) -> None:
        send = self._sink.send
        if self.conversation is not None:
            self.last_item_id = self.conversation.user_audio(item.id)
        send("input_audio_buffer.committed", previous_item_id=self.last_item_id, item_id=item.id)
        user_item = {
            "id": item.id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        if self._sink.beta:
            send("conversation.item.created", previous_item_id=self.last_item_id, item=user_item)
        else:
            send("conversation.item.added", previous_item_id=self.last_item_id, item=user_item)
            send("conversation.item.done", previous_item_id=self.last_item_id, item=user_item)
        self.last_item_id = item.id

    def completed(self, item: AudioInput, final: FinalTranscript) -> None:
        send = self._sink.send
        transcript = item.sent + final.delta
        if transcript != final.transcript.text:  # cannot happen while StreamSession keeps its promise
            log.warning("realtime item %s: final does not extend its deltas; sending the deltas' text", item.id)
        if final.delta:
            send(
                "conversation.item.input_audio_transcription.delta",
                item_id=item.id,
                content_index=0,
                delta=final.delta,
            )
        seconds = max(0, final.audio_end_ms - final.audio_start_ms) / 1000.0
        extra = {"logprobs": word_logprobs(final.transcript.segments)} if self.logprobs else {}
        send(
            "conversation.item.input_audio_transcription.completed",
            item_id=item.id,
            content_index=0,
            transcript=transcript,
            usage={"type": "duration", "seconds": round(seconds, 3)},
            **extra,
        )
        self.items_completed += 1
        if self.conversation is not None:
            self.conversation.transcribed(item.id, transcript)

    def failed(self, item: AudioInput, code: str, message: str, kind: str = "server_error") -> None:
        self.forget(item)
        if self.conversation is not None:
            self.conversation.transcribed(item.id, None)
        self._sink.send(
            "conversation.item.input_audio_transcription.failed",
            item_id=item.id,
            content_index=0,
            error={"type": kind, "code": code, "message": message, "param": None},
        )

    def drop_speaking(self) -> None:
        """Forget the item being spoken (its audio was cleared): it will get no transcript."""
        item, self.speaking = self.speaking, None
        if item is not None:
            self.forget(item)

    def forget(self, item: AudioInput) -> None:
        for start_ms, waiting in list(self._awaiting.items()):
            if waiting is item:
                del self._awaiting[start_ms]
