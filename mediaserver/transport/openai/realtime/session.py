"""One Realtime WebSocket connection: client events in, server events out (see the package docstring)."""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from aiohttp import web

from mediaserver.assistant.audio_out import AudioOut
from mediaserver.audio.echo_line import EchoLine, HeldRelease
from mediaserver.audio.noise import new_filter, realtime_level
from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray, FinalTranscript, SessionEvent, SpeechStarted
from mediaserver.state import ASR, METRICS, TEXT_EOU
from mediaserver.stream.session import Emit, StreamSession
from mediaserver.transport.common import LoneSurrogate, json_error, loads_json, unicode_text
from mediaserver.transport.openai.realtime.config import RealtimeConfig
from mediaserver.transport.openai.realtime.conversation import AudioMode, Conversation, VoiceTurns
from mediaserver.transport.openai.realtime.conversation_config import (
    ConversationConfig,
    parse_conversation_session,
)
from mediaserver.transport.openai.realtime.idle import IdleTimer
from mediaserver.transport.openai.realtime.input_transcription import AudioInput, Host, InputTranscription
from mediaserver.transport.openai.realtime.lookups import answer_defaults, check_voice, is_llm_model
from mediaserver.transport.openai.realtime.mcp_tools import McpPolicy
from mediaserver.transport.openai.realtime.session_update import SessionKind, parse_session
from mediaserver.transport.openai.realtime.values import EventError, as_object, new_id, type_name
from mediaserver.transport.openai.realtime.work import (
    CONVERSATION_EVENTS,
    MAX_AUDIO_BYTES_PER_EVENT,
    SUPPORTED_EVENTS,
    UNSUPPORTED_EVENTS,
    CancelResponse,
    Clear,
    Commit,
    Configure,
    CreateItem,
    CreateResponse,
    ItemOp,
    Refusal,
    Work,
    conversation_work,
)
from mediaserver.transport.socket_session import Limits, MessageSocket, SocketSession
from mediaserver.transport.voice import make_assistant

log = logging.getLogger(__name__)

# base64 of the largest append plus room for the JSON around it; larger frames close the socket (1009).
MAX_FRAME_BYTES: Final = (MAX_AUDIO_BYTES_PER_EVENT + 2) // 3 * 4 + 1024 * 1024
MIN_COMMIT_MS: Final = 100  # OpenAI's minimum for input_audio_buffer.commit
MAX_BUFFER_S: Final = 10 * 60  # audio in one append, and uncommitted audio in manual mode
MAX_BACKLOG_S: Final = 15 * 60  # audio decoded by the reader but not yet fed by the worker
MAX_QUEUED_WORK: Final = 8192
MAX_QUEUED_EVENTS: Final = 10000  # server events a client has not read yet; beyond: closed
MAX_RETIRED_STREAMS: Final = 4


def max_message_bytes(settings: Settings) -> int:
    """The largest client event taken: ``ws_max_message_bytes``, and never less than one full append."""
    return max(settings.ws_max_message_bytes, MAX_FRAME_BYTES)


class RealtimeSession(SocketSession, Host):
    """One Realtime connection: the OpenAI event format over a ``SocketSession``.

    It owns a ``StreamSession`` per turn-detection setting (a segmenter is fixed for a stream's
    life; the retired ones still deliver their queued finals) and the input items' bookkeeping; a
    conversation session also owns a ``Conversation`` (items, responses, the assistant).
    """

    kind = "realtime"

    def __init__(
        self,
        app: web.Application,
        ws: MessageSocket,
        settings: Settings,
        config: RealtimeConfig,
        *,
        beta: bool,
        conversation: ConversationConfig | None = None,
        audio: AudioMode = "deltas",
        audio_out: AudioOut | None = None,
        session_id: str | None = None,
    ) -> None:
        limits = Limits(
            MAX_QUEUED_WORK, MAX_BACKLOG_S, MAX_QUEUED_EVENTS, settings.ws_idle_timeout_s, max_message_bytes(settings)
        )
        super().__init__(app, ws, settings, session_id or new_id("sess"), limits)
        if conversation is None or audio != "deltas":  # the server speaks nothing over this socket
            config = replace(config, echo_cancellation="off")
            conversation = replace(conversation, input=config) if conversation is not None else None
        self.asr = app[ASR]
        self.models = self.asr.models
        self.beta = beta  # send beta event names (conversation.item.created)
        # The reader's view: what the latest valid session.update said.
        self.config = config
        self.conversation_config = conversation
        self._decoder = config.input_format.decoder()
        self._buffered_ms = 0.0  # manual mode: uncommitted audio
        # The worker's view.
        self._applied = config
        self._segmenter = config.segmenter(settings)
        self._fed_samples = 0
        self.noise = new_filter(realtime_level(config.noise_reduction, settings), settings)
        self.conversation: Conversation | None = None
        if conversation is not None:
            assistant = make_assistant(app, self.id, self._on_assistant_event, audio_out, {})
            metrics = app.get(METRICS)
            self.conversation = Conversation(self, settings, self.asr, assistant, conversation, audio, metrics)
        self.items = InputTranscription(self, self.conversation)
        self.items.logprobs = config.logprobs
        self.idle = IdleTimer(self.conversation, self.items) if self.conversation is not None else None
        self.echo: EchoLine | None = None  # the canceller of the answers spoken over the socket (audio/echo.py)
        # Audio it holds for auto's decision is heard once the client stops appending (echo_line.py).
        self._held = HeldRelease(self.settings.echo_mic_gap_ms / 1000.0, self.release_later)
        self.stream = self._new_stream(config)
        self._retired: list[StreamSession] = []
        self._apply_echo(config, conversation)

    @property
    def session_kind(self) -> SessionKind:
        return "transcription" if self.conversation is None else "conversation"

    async def _on_assistant_event(self, event: SessionEvent) -> None:
        if self.conversation is not None:
            await self.conversation.on_assistant_event(event)

    def _new_stream(self, config: RealtimeConfig) -> StreamSession:
        """A StreamSession for one turn-detection setting (its segmenter and mode are fixed for its life)."""
        offset_ms = self._fed_samples * 1000 // SAMPLE_RATE_HZ
        emit = self._emitter(offset_ms, server_vad=config.server_vad)
        stream = StreamSession(
            self.asr,
            self.settings,
            emit,
            session_id=self.id,
            segmenter=config.segmenter(self.settings),
            text_eou=self.app.get(TEXT_EOU),
            route="realtime",
        )
        stream.configure(config.stream_options(self.settings))
        if not config.server_vad:
            stream.start_recording()
        stream.attach_echo(self.echo)
        if self.conversation is not None:
            # Finals create responses through the session core; barge-in is handled in the emitter,
            # after input_audio_buffer.speech_started has been sent.
            stream.assistant = VoiceTurns(self.conversation)
            stream.barge_in = False
        return stream

    def _emitter(self, offset_ms: int, *, server_vad: bool) -> Emit:
        async def emit(event: SessionEvent) -> None:
            self.items.on_event(event, offset_ms, server_vad=server_vad)
            if self.conversation is not None and isinstance(event, SpeechStarted):
                await self.conversation.on_speech_started()

        return emit

    async def close_streams(self) -> None:
        self._held.close()
        if self.conversation is not None:
            await self.conversation.aclose()
        for stream in (self.stream, *self._retired):
            await stream.aclose()

    def summary(self) -> str:
        audio = f"{self._fed_samples / SAMPLE_RATE_HZ:.1f} s audio"
        if self.conversation is None:
            return f"{self.items.items_completed} items transcribed, {audio}"
        conversation = self.conversation
        return f"{len(conversation.items)} items held, {conversation.responses} responses, {audio}"

    # --- sending ------------------------------------------------------------------------------------

    def send(self, kind: str, **fields: Any) -> None:
        """Queue a server event (never awaits, so a cancelled caller cannot lose half of an item)."""
        self.send_json({"type": kind, "event_id": new_id("event"), **fields})

    def send_session(self, kind: str, config: RealtimeConfig, conversation: ConversationConfig | None = None) -> None:
        if conversation is not None:
            describe = conversation.describe_beta if self.beta else conversation.describe_ga
            self.send(kind, session=describe(self.id, self.settings))
        elif kind.startswith("transcription_session."):
            self.send(kind, session=config.describe_beta(self.id, self.settings))
        else:
            self.send(kind, session=config.describe_ga(self.id, self.settings))

    def send_created(self) -> None:
        """``session.created`` (and the beta transcription twin), then the MCP servers the session's
        configuration declares (a client secret's or a call's) are connected and listed."""
        self.send_session("session.created", self.config, self.conversation_config)
        if self.beta and self.conversation is None:
            self.send_session("transcription_session.created", self.config)
        if self.conversation is not None and self.conversation_config is not None:
            self.conversation.set_mcp(self.conversation_config.mcp)
            self.conversation.prefill()

    def on_idle(self, idle_s: float) -> None:
        self.send_error("idle_timeout", f"No client event for {idle_s:g} s; closing the session.")

    def on_worker_failed(self) -> None:
        self.send_error("internal_error", "Internal server error; closing the session.", kind="server_error")

    # --- reading ------------------------------------------------------------------------------------

    async def on_binary(self, data: bytes) -> None:
        self._refuse("invalid_type", "Binary messages are not supported; send JSON events as text.")

    async def on_text(self, data: str) -> None:
        try:
            event = loads_json(data)
        except ValueError as exc:
            parsed = exc.value if isinstance(exc, LoneSurrogate) else None
            raw_id = parsed.get("event_id") if isinstance(parsed, dict) else None
            told_id = isinstance(raw_id, str) and raw_id.isprintable() and unicode_text(raw_id)
            self._refuse(
                "invalid_json",
                json_error(exc, "The client event is not valid JSON; expected a JSON object."),
                client_event_id=raw_id if told_id else None,
            )
            return
        if not isinstance(event, dict):
            self._refuse("invalid_json", "The client event must be a JSON object with a string 'type'.")
            return
        raw_id = event.get("event_id")
        client_event_id = raw_id if isinstance(raw_id, str) else None
        try:
            self._dispatch(event)
        except EventError as exc:
            self._refuse(exc.code, exc.message, param=exc.param, client_event_id=client_event_id, kind=exc.kind)

    def _refuse(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        client_event_id: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        """An error about a client event, in its turn: after the replies to the events before it
        (``Refusal``); at once when the queue is full, or when the error is that it is."""
        if code == "overloaded" or not self.enqueue(Refusal(code, message, param, client_event_id, kind)):
            self.send_error(code, message, param=param, client_event_id=client_event_id, kind=kind)

    def _dispatch(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind is None:
            raise EventError("missing_required_parameter", "Missing required parameter: 'type'.", "type")
        if not isinstance(kind, str):
            raise EventError(
                "invalid_type", f"Invalid type for 'type': expected a string, but got {type_name(kind)}.", "type"
            )
        raw_id = event.get("event_id")
        client_event_id = raw_id if isinstance(raw_id, str) else None
        if kind == "input_audio_buffer.append":
            self._append(event)
        elif kind == "session.update" or (kind == "transcription_session.update" and self.conversation is None):
            self._update(event, kind)
        elif kind == "input_audio_buffer.commit":
            self._commit(event)
        elif kind == "input_audio_buffer.clear":
            self._decoder.reset()
            self._buffered_ms = 0.0
            self._enqueue(Clear())
        elif self.conversation is not None and kind in CONVERSATION_EVENTS:
            assert self.conversation_config is not None
            track = self.conversation.audio == "track"
            self._enqueue(
                conversation_work(kind, event, client_event_id, self.conversation_config, self._check_voice, track)
            )
        elif kind in UNSUPPORTED_EVENTS:
            raise EventError("unsupported_event", f"'{kind}' is not supported in a transcription session.", "type")
        else:
            names = CONVERSATION_EVENTS if self.conversation is not None else SUPPORTED_EVENTS
            supported = ", ".join(f"'{k}'" for k in names)
            raise EventError("invalid_value", f"Invalid value: {kind!r}. Supported values are: {supported}.", "type")

    def _check_voice(self, name: str, param: str) -> None:
        check_voice(self.app, name, param)

    def _is_llm(self, name: str) -> bool:
        return is_llm_model(self.app, name)

    def _enqueue(self, work: Work) -> None:
        if not self.enqueue(work):
            raise EventError("overloaded", "Too many queued client events; slow down.", kind="server_error")

    def _enqueue_audio(self, samples: AudioArray) -> None:
        if not self.enqueue_audio(samples):
            raise EventError(
                "overloaded", "The server is behind by too much audio; the audio was dropped.", kind="server_error"
            )

    def _update(self, event: Mapping[str, Any], kind: str) -> None:
        if "session" not in event:
            raise EventError("missing_required_parameter", "Missing required parameter: 'session'.", "session")
        session = as_object(event["session"], "session")
        conversation: ConversationConfig | None = None
        if self.conversation_config is not None:
            conversation = parse_conversation_session(
                session,
                self.conversation_config,
                self.models,
                check_voice=self._check_voice,
                is_llm=self._is_llm,
                answer_of=lambda name: answer_defaults(self.app, self.settings, name),
                mcp_policy=McpPolicy.of(self.settings),
            )
            if conversation.mcp and self.beta:
                raise EventError(
                    "invalid_value",
                    "Invalid 'session.tools': tools of type 'mcp' are part of the GA Realtime interface; connect "
                    "without the 'OpenAI-Beta: realtime=v1' header to use them.",
                    "session.tools",
                )
            config = conversation.input
        else:
            config = parse_session(session, self.config, self.models)
        if config.echo_cancellation != "off" and not self._speaks_deltas:
            if config.echo_cancellation == "on":
                raise EventError(
                    "invalid_value",
                    "Invalid 'echo_cancellation': 'on' cancels the echo of answers this server speaks over the "
                    "WebSocket; "
                    + (
                        "a WebRTC call's browser cancels the echo of the track it plays (echoCancellation)."
                        if self.conversation is not None
                        else "a transcription session speaks none."
                    ),
                    "session.input_audio_echo_cancellation"
                    if "input_audio_echo_cancellation" in session
                    else "session.audio.input.echo_cancellation",
                )
            config = replace(config, echo_cancellation="off")
            conversation = replace(conversation, input=config) if conversation is not None else None
        if kind == "transcription_session.update":
            self.beta = True
        if config.input_format != self.config.input_format or config.server_vad != self.config.server_vad:
            self._decoder = config.input_format.decoder()
            self._buffered_ms = 0.0
        self.config = config
        self.conversation_config = conversation
        self._enqueue(Configure(config, kind.replace(".update", ".updated"), conversation))

    def _append(self, event: Mapping[str, Any]) -> None:
        audio = event.get("audio")
        if audio is None:
            raise EventError("missing_required_parameter", "Missing required parameter: 'audio'.", "audio")
        if not isinstance(audio, str):
            raise EventError(
                "invalid_type",
                f"Invalid type for 'audio': expected a base64 string, but got {type_name(audio)}.",
                "audio",
            )
        if len(audio) * 3 // 4 > MAX_AUDIO_BYTES_PER_EVENT + 2:
            raise EventError(
                "audio_too_large",
                f"Invalid 'audio': an append carries at most {MAX_AUDIO_BYTES_PER_EVENT} bytes of audio.",
                "audio",
            )
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise EventError(
                "invalid_value", "Invalid 'audio': not valid base64-encoded audio bytes.", "audio"
            ) from None
        if len(data) > MAX_AUDIO_BYTES_PER_EVENT:
            raise EventError(
                "audio_too_large",
                f"Invalid 'audio': an append carries at most {MAX_AUDIO_BYTES_PER_EVENT} bytes of audio.",
                "audio",
            )
        if not data:
            return
        fmt = self.config.input_format
        duration_ms = len(data) / fmt.bytes_per_sample / fmt.rate_hz * 1000.0
        if duration_ms > MAX_BUFFER_S * 1000 or (
            not self.config.server_vad and self._buffered_ms + duration_ms > MAX_BUFFER_S * 1000
        ):
            raise EventError(
                "audio_too_large",
                f"The input audio buffer holds at most {MAX_BUFFER_S} s of audio; commit or clear it. "
                "The audio was dropped.",
                "audio",
            )
        if self.backlog_s_after(duration_ms / 1000.0) > MAX_BACKLOG_S:
            raise EventError(
                "overloaded", "The server is behind by too much audio; the audio was dropped.", kind="server_error"
            )
        samples = self._decoder.decode(data)
        if samples.size == 0:
            return
        self._enqueue_audio(samples)
        if not self.config.server_vad:
            self._buffered_ms += duration_ms

    def _commit(self, event: Mapping[str, Any]) -> None:
        raw_id = event.get("event_id")
        client_event_id = raw_id if isinstance(raw_id, str) else None
        if not self.config.server_vad:
            if self._buffered_ms < MIN_COMMIT_MS:
                raise EventError(
                    "input_audio_buffer_commit_empty",
                    f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms "
                    f"of audio, but buffer only has {self._buffered_ms:.2f}ms of audio.",
                )
            self._buffered_ms = 0.0
            tail = self._decoder.flush()
            if tail.size:
                self._enqueue_audio(tail)
        self._enqueue(Commit(client_event_id))

    # --- the worker ---------------------------------------------------------------------------------

    def on_audio_queued(self) -> None:
        self.stream.audio_arriving()

    def enqueue_audio(self, samples: AudioArray) -> bool:
        queued = super().enqueue_audio(samples)
        if queued and self.echo is not None:
            self.echo.arrived(samples.size)
        return queued

    async def feed(self, samples: AudioArray) -> None:
        self._fed_samples += samples.size
        await self._hear(self.echo.process(samples) if self.echo is not None else samples)
        self._held.fed(self.echo)

    async def release_held_audio(self) -> None:
        if self.echo is not None:
            await self._hear(self.echo.release())

    async def gap(self, samples: int) -> None:
        """A WebRTC call's sender sent nothing for ``samples`` (Opus DTX in silence): input audio time
        all the same, for the events' times and ``idle_timeout_ms`` (a browser trial's never fired)."""
        self._fed_samples += samples
        await self.stream.gap(samples, net=True)
        if self.idle is not None and self._applied.server_vad:
            await self.idle.check(self._applied.turn_detection, self._fed_samples, self.stream.in_speech)

    async def _hear(self, samples: AudioArray) -> None:
        """Audio out of the echo canceller (if any) into the session."""
        await self.stream.feed(self.noise.process(samples) if self.noise is not None else samples)
        if self.idle is not None and self._applied.server_vad:
            await self.idle.check(self._applied.turn_detection, self._fed_samples, self.stream.in_speech)

    async def apply(self, work: Work) -> None:
        if isinstance(work, Configure):
            await self.release_held_audio()  # (audio held for auto's decision, heard as the session was)
            await self._apply(work.config)
            if self.conversation is not None and work.conversation is not None:
                self.conversation.config = work.conversation
            self._apply_echo(work.config, work.conversation)
            self.send_session(work.reply, work.config, work.conversation)
            if self.conversation is not None and work.conversation is not None:
                self.conversation.set_mcp(work.conversation.mcp)
                self.conversation.prefill()
        elif isinstance(work, Commit):
            await self._commit_buffer(work.client_event_id)
        elif isinstance(work, Refusal):
            self.send_error(
                work.code, work.message, param=work.param, client_event_id=work.client_event_id, kind=work.kind
            )
        elif isinstance(work, Clear):
            dropped = self.echo.release().size if self.echo is not None else 0  # (cleared with the rest)
            self.stream.clear()
            self.stream.skip(dropped)  # (its time went by all the same: the stream's clock counts it)
            self.items.drop_speaking()
            self.send("input_audio_buffer.cleared")
        else:
            try:
                await self._apply_conversation(work)
            except EventError as exc:
                self.send_error(exc.code, exc.message, param=exc.param, client_event_id=work.client_event_id)

    async def _apply_conversation(self, work: CreateItem | ItemOp | CreateResponse | CancelResponse) -> None:
        conversation = self.conversation
        assert conversation is not None
        if isinstance(work, CreateItem):
            await conversation.create_item(work.item, work.previous_item_id, work.client_event_id)
        elif isinstance(work, ItemOp):
            if work.op == "delete":
                await conversation.delete_item(work.item_id, work.client_event_id)
            elif work.op == "retrieve":
                conversation.retrieve_item(work.item_id)
            else:
                await conversation.truncate_item(work.item_id, work.content_index, work.audio_end_ms)
        elif isinstance(work, CreateResponse):
            await conversation.create_response(work.options, work.client_event_id)
        else:
            await conversation.cancel_response(
                "client_cancelled", from_client=work.from_client, response_id=work.response_id
            )

    async def _apply(self, config: RealtimeConfig) -> None:
        old = self._applied
        self._applied = config
        self.items.logprobs = config.logprobs
        if config.noise_reduction != old.noise_reduction:
            self.noise = new_filter(realtime_level(config.noise_reduction, self.settings), self.settings)
        segmenter = config.segmenter(self.settings)
        if segmenter == self._segmenter and config.server_vad == old.server_vad:
            self.stream.configure(config.stream_options(self.settings))
            return
        # Turn detection changed. A StreamSession's segmenter and mode are fixed: finish the utterance
        # being spoken, drop uncommitted manual audio, and start a new one. The old one still delivers
        # its queued finals (their items complete) and is closed with the session.
        if self.stream.options.server_vad and self.stream.in_speech:
            await self._commit_buffer(None)
        self.stream.clear()
        self.items.drop_speaking()
        self._retired.append(self.stream)
        if len(self._retired) > MAX_RETIRED_STREAMS:
            self.spawn(self._retired.pop(0).aclose(), "realtime-retire")
        self._segmenter = segmenter
        self.stream = self._new_stream(config)

    @property
    def _speaks_deltas(self) -> bool:
        """Answers go out as delta events on this socket (a WebRTC call's go out on its track)."""
        return self.conversation is not None and self.conversation.audio == "deltas"

    def _echo_wanted(self, config: RealtimeConfig, conversation: ConversationConfig | None) -> bool:
        """``on``, or ``auto`` while the session's answers are audio. (Sessions that speak nothing over
        the socket hold ``off``: a transcription session, and a WebRTC call, whose browser cancels
        the echo of the track it plays.)"""
        speaks = conversation is not None and conversation.modality == "audio"
        return config.echo_cancellation == "on" or (config.echo_cancellation == "auto" and speaks)

    def _apply_echo(self, config: RealtimeConfig, conversation: ConversationConfig | None) -> None:
        if not self._echo_wanted(config, conversation):
            self.echo = None
        elif self.echo is None:
            self.echo = EchoLine.of(self.settings, self.backlog_samples)  # its clock starts at the audio fed next
        if self.echo is not None:
            self.echo.set_mode(config.echo_cancellation, self.settings)
        if self.conversation is not None:
            self.conversation.echo = self.echo
        self.stream.attach_echo(self.echo)

    async def _commit_buffer(self, client_event_id: str | None) -> None:
        await self.release_held_audio()  # (what waits for echo_cancellation auto's decision)
        if self.stream.options.server_vad:
            item = self.items.speaking
            if item is None or not self.stream.in_speech:
                self.send_error(
                    "input_audio_buffer_commit_empty",
                    "Error committing input audio buffer: no speech in the buffer (server VAD commits by itself).",
                    client_event_id=client_event_id,
                )
                return
            await self._transcribe(item, self.stream.commit)
            return
        item = AudioInput(new_id("item"))
        self.items.committed(item)
        final = await self._transcribe(item, self.stream.stop_recording)
        self.stream.start_recording()
        if final is not None:
            self.items.completed(item, final)

    async def _transcribe(
        self, item: AudioInput, finish: Callable[[], Awaitable[FinalTranscript | None]]
    ) -> FinalTranscript | None:
        """Run a commit (``StreamSession.commit`` / ``stop_recording``); a failure fails the item."""
        self.items.muted_errors += 1  # the failure is reported on the item, not as a loose error event
        try:
            return await finish()
        except ApiError as exc:
            self.items.failed(
                item, exc.code, exc.message, "invalid_request_error" if exc.status < 500 else "server_error"
            )
        finally:
            self.items.muted_errors -= 1
        return None
