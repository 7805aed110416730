"""Device stream WebSocket at ``GET /api/ws/asr``: raw PCM frames in, speech events and transcripts out.

The wire protocol is specified in ``docs/ws-protocol.md``. In short: the client sends a JSON
``start`` (format, mode, decoding options) and gets ``ready``; then binary frames of little-endian
PCM; ``stop`` / ``clear`` / ``ping`` / another ``start`` as JSON text. The server sends
``speech_started``, ``speech_stopped``, ``partial``, ``final``, ``pong`` and ``error{code, message}``.
With the assistant on, its answers come as text and binary audio, and a device that declared its own
``tools`` answers their calls with ``tool_output`` (assistant/client_tools.py).
A query string with start keys (``?sample_rate=16000&mode=server_vad``) is an implicit ``start``. The
``start`` keys and their validation are in ``start.py``.

Each connection is a ``SocketSession`` (transport/socket_session.py): the reader validates every
message at once, decodes PCM (with a resampler that keeps its state across frames) and queues the
result; a worker applies the queue in order to the ``StreamSession``, so a ``stop`` that waits for
its final transcript never stops the socket from being read; a writer sends. The backlog is bounded
(``MAX_BACKLOG_S`` of audio); beyond it frames are dropped with an ``overloaded`` error. However the
connection ends, ``WsSession.aclose`` leaves nothing running.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import WSCloseCode, web

from mediaserver.assistant.audio_out import AudioOut
from mediaserver.assistant.client_tools import ClientToolbox, SessionToolbox, tool_output_fields, unknown_call_text
from mediaserver.assistant.pacing import send_paced
from mediaserver.assistant.turns import Assistant
from mediaserver.audio.echo_line import EchoLine, HeldRelease
from mediaserver.audio.noise import NoiseFilter, new_filter
from mediaserver.audio.stream_decode import PcmStreamDecoder
from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidAudio, Overloaded
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    AssistantAudioPaused,
    AssistantAudioResumed,
    AssistantAudioStarted,
    AssistantAudioStopped,
    AssistantError,
    AssistantText,
    AssistantToolCall,
    AssistantToolResult,
    AudioArray,
    FinalTranscript,
    PartialTranscript,
    SessionEvent,
    SpeechStarted,
    SpeechStopped,
    StreamError,
    TurnDecided,
)
from mediaserver.session_registry import SessionLimitReached, ShuttingDown
from mediaserver.state import ASR, METRICS, SESSIONS, SETTINGS, SPEAKERS, TEXT_EOU, TOOLS
from mediaserver.stream.session import StreamSession
from mediaserver.transport.common import json_error, loads_json, speaker_payload, turn_payload
from mediaserver.transport.socket_session import LimitedWebSocket, Limits, SocketSession, close_reason
from mediaserver.transport.voice import check_voice, new_assistant, update_assistant
from mediaserver.transport.ws.start import START_KEYS, StreamConfig, parse_start
from mediaserver.wake.gate import WakeGate, feed_through, new_gate, observe, wake_message

log = logging.getLogger(__name__)

PATH: Final = "/api/ws/asr"

# Audio the worker may lag behind the socket (a final in progress, a slow client reader).
MAX_BACKLOG_S: Final = 30.0
# Queued messages of any kind; only a client flooding control messages reaches it.
MAX_QUEUED_MESSAGES: Final = 4096
# Messages to the client not sent yet; a client that stops reading is closed beyond it.
MAX_OUTBOX: Final = 10000


@dataclass(frozen=True)
class _Start:
    config: StreamConfig


@dataclass(frozen=True)
class _Stop:
    pass


@dataclass(frozen=True)
class _Clear:
    pass


@dataclass(frozen=True)
class _Ping:
    pass


@dataclass(frozen=True)
class _Refusal:
    """An error about a message, sent in its turn (after what the messages before it caused)."""

    code: str
    message: str


_Work = _Start | _Stop | _Clear | _Ping | _Refusal


class WsSession(SocketSession):
    """One device stream connection: the wire format over a ``SocketSession`` and a ``StreamSession``."""

    kind = "ws"

    def __init__(self, app: web.Application, ws: web.WebSocketResponse, settings: Settings) -> None:
        limits = Limits(
            MAX_QUEUED_MESSAGES, MAX_BACKLOG_S, MAX_OUTBOX, settings.ws_idle_timeout_s, settings.ws_max_message_bytes
        )
        super().__init__(app, ws, settings, f"ws-{uuid.uuid4().hex[:12]}", limits)
        self.models = app[ASR].models
        self.stream = StreamSession(
            app[ASR], settings, self._on_event, session_id=self.id, text_eou=app.get(TEXT_EOU), route="ws"
        )
        self.stream.speakers = app.get(SPEAKERS)
        self.config: StreamConfig | None = None  # the reader's view: set by the latest valid start
        self._decoder: PcmStreamDecoder | None = None
        self._recording = False  # push-to-talk: between start and stop (reader's view)
        self._told_not_started = False
        self._dropping = False
        self._cutting: set[asyncio.Task[Any]] = set()  # interrupts and resets under way (a ping waits for them)
        self.audio_out: AudioOut | None = None
        self.assistant: Assistant | None = None
        self.client_tools = ClientToolbox(settings, app[METRICS], session_id=self.id)  # the client's own tools
        self.noise: NoiseFilter | None = None
        self.wake: WakeGate | None = None
        # Echo cancellation (audio/echo.py): the answers sent are the reference, placed on the clock of
        # the microphone samples that had arrived when each was sent.
        self.echo: EchoLine | None = None
        # Audio it holds for auto's decision is heard once the device stops sending (echo_line.py).
        self._held = HeldRelease(self.settings.echo_mic_gap_ms / 1000.0, self.release_later)

    # --- sending ----------------------------------------------------------------------------------

    def send_error(self, code: str, message: str, param: str | None = None) -> None:
        payload: dict[str, Any] = {"type": "error", "code": code, "message": message}
        if param is not None:
            payload["param"] = param
        self.send_json(payload)

    def send_api_error(self, exc: ApiError) -> None:
        self.send_error(exc.code, exc.message, exc.param)

    async def _on_event(self, event: SessionEvent) -> None:
        gate = self.wake
        waiting = observe(gate, event) if gate is not None else None
        if isinstance(event, AssistantText):
            text = {"type": "assistant", "delta": event.delta, "text": event.text, "final": event.final}
            self.send_json({**text, "interrupted": True} if event.interrupted else text)
        elif isinstance(event, AssistantAudioStarted):
            rate = self.audio_out.sample_rate_hz if self.audio_out is not None else SAMPLE_RATE_HZ
            self.send_json({"type": "assistant_audio_started", "sample_rate": rate, "encoding": "pcm16"})
        elif isinstance(event, AssistantAudioPaused | AssistantAudioResumed):
            kind = "assistant_audio_paused" if isinstance(event, AssistantAudioPaused) else "assistant_audio_resumed"
            self.send_json({"type": kind})
        elif isinstance(event, AssistantAudioStopped):
            self.send_json({"type": "assistant_audio_stopped", "interrupted": event.interrupted, "heard": event.heard})
        elif isinstance(event, AssistantError):
            self.send_json({"type": "error", "code": event.code, "message": event.message, "stage": event.stage})
        elif isinstance(event, AssistantToolCall):
            call = {"type": "assistant_tool_call", "call_id": event.call_id, "name": event.name}
            self.send_json({**call, "arguments": event.arguments, "client": event.client, "speaker": event.speaker})
        elif isinstance(event, AssistantToolResult):
            result = {"type": "assistant_tool_result", "call_id": event.call_id, "name": event.name}
            self.send_json({**result, "result": event.result, "is_error": event.is_error})
        elif isinstance(event, FinalTranscript):
            self.send_json(self._final_message(event))
        elif isinstance(event, PartialTranscript):
            partial = {"type": "partial", "delta": event.delta, "text": event.text}
            if self.stream.options.unstable_partials:
                partial["unstable"] = event.unstable
            self.send_json(partial)
        elif isinstance(event, SpeechStarted):
            self.send_json({"type": "speech_started", "audio_start_ms": event.audio_start_ms})
        elif isinstance(event, SpeechStopped):
            self.send_json({"type": "speech_stopped", "audio_end_ms": event.audio_end_ms, "discarded": event.discarded})
        elif isinstance(event, TurnDecided):
            self.send_json({"type": "turn", **turn_payload(event)})
        elif isinstance(event, StreamError):
            error: dict[str, Any] = {"type": "error", "code": event.code, "message": event.message}
            if event.audio_start_ms is not None and event.audio_end_ms is not None:
                # The utterance failed: it stands in for that utterance's final.
                error.update(audio_start_ms=event.audio_start_ms, audio_end_ms=event.audio_end_ms)
            self.send_json(error)
        if gate is not None and waiting is not None:
            self.send_json(wake_message(gate, waiting))

    def _final_message(self, event: FinalTranscript) -> dict[str, Any]:
        transcript = event.transcript
        message: dict[str, Any] = {
            "type": "final",
            "text": transcript.text,
            "delta": event.delta,
            "language": transcript.language,
            "audio_start_ms": event.audio_start_ms,
            "audio_end_ms": event.audio_end_ms,
            "latency_ms": round(event.latency_ms, 1),
            "speaker": speaker_payload(event),
        }
        if transcript.guard is not None:
            message["guard"] = transcript.guard  # the first decode looped: this is the safe redecode
        if event.echo:
            message["echo"] = True  # the answer's own words heard back: not answered (docs/echo.md)
        if self.stream.options.transcription.with_segment_timestamps:
            message["segments"] = [
                {
                    "start_ms": event.audio_start_ms + round(seg.start_s * 1000),
                    "end_ms": event.audio_start_ms + round(seg.end_s * 1000),
                    "text": seg.text,
                }
                for seg in transcript.segments
            ]
        return message

    # --- reading ----------------------------------------------------------------------------------

    async def run_with_query(self, query: Mapping[str, str]) -> None:
        """A query string with start keys is an implicit start; then read until the socket closes."""
        if START_KEYS.intersection(query):
            try:
                self._accept_start(parse_start(query, self.settings, self.models))
            except ApiError as exc:
                self.send_api_error(exc)
                await self.aclose(WSCloseCode.POLICY_VIOLATION, exc.message)
                return
        await self.run()

    def on_idle(self, idle_s: float) -> None:
        self.send_error("idle_timeout", f"no message for {idle_s:g} s; closing")

    def on_worker_failed(self) -> None:
        self.send_error("internal_error", "internal server error; closing")

    def _accept_start(self, config: StreamConfig) -> None:
        if config.assistant:  # before anything changes: a refused start leaves the session as it was
            check_voice(self.app, dict(config.assistant_values), self.assistant.options if self.assistant else None)
            self._session_tools().check_clash(config.client_tools)
        self._enqueue_control(_Start(config))
        self.config = config
        self._decoder = PcmStreamDecoder(config.pcm_format)
        self._recording = not config.server_vad
        self._told_not_started = False

    async def on_binary(self, data: bytes) -> None:
        if self.config is None or self._decoder is None:
            if not self._told_not_started:  # once, not once per frame of a device that streams at once
                self._told_not_started = True
                self.send_error("not_started", 'send {"type": "start", ...} before audio; audio dropped')
            return
        if not data or (not self.config.server_vad and not self._recording):
            return  # push-to-talk audio outside a recording is ignored
        try:
            samples = self._decoder.decode(data)
        except InvalidAudio as exc:
            # In its turn, after what the messages before it caused (a trial saw a start's audio
            # refused before that start's "ready").
            if not self.enqueue(_Refusal(exc.code, exc.message)):
                self.send_api_error(exc)
            return
        if samples.size == 0:
            return
        if not self.enqueue_audio(samples):
            if not self._dropping:
                self._dropping = True
                self.send_error("overloaded", "the server is behind by too much audio; audio dropped")
            return
        self._dropping = False

    async def on_text(self, data: str) -> None:
        try:
            parsed = loads_json(data)
        except ValueError as exc:
            self.send_error(
                "invalid_message", json_error(exc, "text messages must be JSON objects with a string 'type'")
            )
            return
        if not isinstance(parsed, dict) or not isinstance(parsed.get("type"), str):
            self.send_error("invalid_message", "text messages must be JSON objects with a string 'type'")
            return
        kind: str = parsed["type"]
        try:
            if kind == "start":
                self._accept_start(parse_start(parsed, self.settings, self.models, self.config))
            elif kind == "ping":
                self._enqueue_control(_Ping())
            elif kind == "tool_output":
                # Not queued either: the turn waiting for it runs beside the worker.
                self._tool_output(parsed)
            elif kind in ("interrupt", "reset"):
                # Not queued behind audio: barge-in must not wait for the worker.
                if self.config is None:
                    self.send_error("not_started", f'"{kind}" before "start"')
                elif self.assistant is not None:
                    task = self.spawn(
                        self.assistant.interrupt() if kind == "interrupt" else self.assistant.reset(), "ws-" + kind
                    )
                    self._cutting.add(task)
                    task.add_done_callback(self._cutting.discard)
            elif kind not in ("stop", "clear"):
                self.send_error(
                    "unknown_type",
                    f"unknown message type {kind!r}; expected start, stop, clear, ping, interrupt, reset"
                    " or tool_output",
                )
            elif self.config is None or self._decoder is None:
                self.send_error("not_started", f'"{kind}" before "start"')
            elif kind == "clear":
                self._enqueue_control(_Clear())
            elif self.config.server_vad:
                self._enqueue_control(_Stop())
            elif not self._recording:
                # In its turn: a stop right after a stop gets this after the first one's final.
                refusal = _Refusal("not_recording", 'no push-to-talk recording to stop; send "start" first')
                self._enqueue_control(refusal)
            else:
                self._recording = False
                tail = self._decoder.flush()
                if tail.size:
                    self.enqueue_audio(tail)
                self._enqueue_control(_Stop())
        except ApiError as exc:
            self.send_api_error(exc)

    def _tool_output(self, fields: Mapping[str, Any]) -> None:
        """The client's answer to a call of one of its tools (``assistant_tool_call`` with ``client``)."""
        call_id, output, is_error = tool_output_fields(fields)
        if not self.client_tools.answer(call_id, output, is_error=is_error):
            self.send_json(
                {"type": "error", "code": "unknown_call_id", "message": unknown_call_text(call_id), "call_id": call_id}
            )

    def _session_tools(self) -> SessionToolbox:
        return SessionToolbox(self.client_tools, self.app.get(TOOLS))

    def _enqueue_control(self, item: _Work) -> None:
        if not self.enqueue(item):
            raise Overloaded("too many queued messages; slow down")

    # --- the worker -------------------------------------------------------------------------------

    def on_audio_queued(self) -> None:
        self.stream.audio_arriving()

    def enqueue_audio(self, samples: AudioArray) -> bool:
        queued = super().enqueue_audio(samples)
        if queued and self.echo is not None:
            self.echo.arrived(samples.size)
        return queued

    async def feed(self, samples: AudioArray) -> None:
        await self._hear(self.echo.process(samples) if self.echo is not None else samples)
        self._held.fed(self.echo)

    async def release_held_audio(self) -> None:
        if self.echo is not None:
            await self._hear(self.echo.release())

    async def _hear(self, samples: AudioArray) -> None:
        """Audio out of the echo canceller (if any) into the session."""
        cleaned = self.noise.process(samples) if self.noise is not None else samples
        await feed_through(
            self.wake,
            cleaned,
            self.stream,
            lambda gate, change: self.send_json(wake_message(gate, change)),
            metrics=self.stream.asr.metrics,
            route="ws",
        )

    async def apply(self, work: _Work) -> None:
        if isinstance(work, _Start):
            await self.release_held_audio()  # (audio held for auto's decision, heard as the session was)
            await self._apply_start(work.config)
        elif isinstance(work, _Stop):
            await self._finish_utterance()
        elif isinstance(work, _Clear):
            dropped = self.echo.release().size if self.echo is not None else 0  # (cleared with the rest)
            self.stream.clear()
            self.stream.skip(dropped)  # (its time went by all the same: the stream's clock counts it)
        elif isinstance(work, _Refusal):
            self.send_error(work.code, work.message)
        else:
            await self.stream.decided()  # a pause being judged on the audio before: its end comes first
            if self._cutting:  # an interrupt or reset before the ping: its events come first (a trial)
                await asyncio.wait(set(self._cutting))
            self.send_json({"type": "pong"})

    async def _apply_start(self, config: StreamConfig) -> None:
        """Every start begins from a clean slate: an unfinished utterance is dropped."""
        self.stream.clear()
        self.stream.configure(config.stream_options())
        if (self.noise.level if self.noise else 0) != config.noise_level:
            self.noise = new_filter(config.noise_level, self.settings)
        if not config.echo_cancelling:
            self.echo = None
        elif self.echo is None:
            self.echo = EchoLine.of(self.settings, self.backlog_samples)  # its clock starts at the audio fed next
        if self.echo is not None:
            self.echo.set_mode(config.echo_cancellation, self.settings)
        self.stream.attach_echo(self.echo)
        if self.wake is not None:
            self.wake.close()
        self.wake = (
            new_gate(list(config.wake), self.settings, stream_ms=self.stream.position_ms)
            if config.wake is not None
            else None
        )
        if not config.server_vad:
            self.stream.start_recording()
        log.info(
            "session %s: start %s, %s %d Hz x%d, model %s",
            self.id,
            config.mode,
            config.encoding,
            config.sample_rate_hz,
            config.channels,
            config.options.model,
        )
        await self._apply_assistant(config)
        self.send_json({"type": "ready", "session_id": self.id, **config.describe(), **self.stream.turn_described()})

    async def _apply_assistant(self, config: StreamConfig) -> None:
        values = dict(config.assistant_values)
        out = self.audio_out
        kept = config.assistant and out is not None and out.sample_rate_hz == config.audio_sample_rate_hz
        if self.assistant is not None and not kept:
            # The start ends it (off, or a new answer sample rate: a new one): an answer playing ends
            # as a cut one does, told before the start's ready.
            await self.assistant.interrupt()
            self.spawn(self.assistant.aclose(), "ws-assistant-close")
            self.assistant = None
            self.stream.assistant = None
        self.client_tools.declare(config.client_tools)  # calls already waiting go on
        if not config.assistant:
            return
        if self.assistant is not None:
            update_assistant(self.assistant, values)
            return
        self.audio_out = AudioOut(config.audio_sample_rate_hz)
        self.assistant = new_assistant(self.app, self.stream, self._on_event, self.audio_out, values)
        self.assistant.toolbox = self._session_tools()
        self.spawn(self._send_answers(self.audio_out), "ws-answer-audio")

    async def _send_answers(self, out: AudioOut) -> None:
        """Answer audio as binary frames (one frame each), paced at real time with a little lead, so
        a barge-in drops what the device has not received yet rather than what it has already buffered."""

        def send(frame: bytes) -> None:
            if self.echo is not None:  # what the device will play: after what it was sent before, not earlier than now
                self.echo.sent(frame, out.sample_rate_hz, louder=out.rose)
            self.send_raw(frame)

        async def align() -> None:
            if self.echo is not None:
                await self.echo.align_start()

        await send_paced(out, send, lead_s=self.settings.ws_answer_lead_ms / 1000.0, align=align)

    async def _finish_utterance(self) -> None:
        started = time.perf_counter()
        await self.release_held_audio()  # (what waits for echo_cancellation auto's decision)
        try:
            if self.stream.options.server_vad:
                final = await self.stream.commit()
            else:
                final = await self.stream.stop_recording()
        except ApiError:
            return  # the StreamSession has already sent it as an error event for the utterance
        if final is not None:
            log.info(
                "session %s: final of %d ms audio in %.0f ms",
                self.id,
                final.audio_end_ms - final.audio_start_ms,
                (time.perf_counter() - started) * 1000,
            )

    # --- closing ----------------------------------------------------------------------------------

    async def close_streams(self) -> None:
        self._held.close()
        self.client_tools.close()  # a call waiting for the client ends now
        if self.wake is not None:
            self.wake.close()
        if self.assistant is not None:
            await self.assistant.aclose()
        await self.stream.aclose()

    def summary(self) -> str:
        return f"{self.stream.utterances} utterances, {self.stream.samples_received / SAMPLE_RATE_HZ:.1f} s audio"


async def stream_handler(request: web.Request) -> web.WebSocketResponse:
    """GET /api/ws/asr: upgrade, register the session, read until it closes, clean up."""
    settings = request.app[SETTINGS]
    ws = LimitedWebSocket(heartbeat=settings.ws_heartbeat_s, max_message_bytes=settings.ws_max_message_bytes)
    await ws.prepare(request)
    session = WsSession(request.app, ws, settings)
    try:
        request.app[SESSIONS].add(session.id, session)
    except SessionLimitReached as exc:
        log.warning("refusing WebSocket stream: %s", exc.message)
        await ws.send_str(json.dumps({"type": "error", "code": exc.code, "message": exc.message}))
        if isinstance(exc, ShuttingDown):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=close_reason("server shutting down"))
        else:
            await ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=close_reason("too many sessions"))
        return ws
    try:
        session.start()
        log.info("session %s: opened from %s", session.id, request.remote)
        await session.run_with_query(request.query)
    finally:
        await session.aclose()
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get(PATH, stream_handler)
