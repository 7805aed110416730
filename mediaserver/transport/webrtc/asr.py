"""WebRTC sessions: one peer connection's session and the WIS data-channel protocol (the SDP
signalling at POST /api/rtc/asr that creates it is webrtc/routes.py's).

One aiortc peer connection per browser. The incoming Opus track is always read (an unread aiortc
track buffers without bound), resampled to 16 kHz mono and fed to a ``StreamSession``. Between
utterances the browser pauses with ``RTCRtpSender.replaceTrack(null)``; Chrome then sends an RTCP
BYE, which aiortc would take as the end of the track. Like WIS we ignore BYE on receivers, so audio
flows again into the same session when the browser resumes with ``replaceTrack(track)``.

Data channel (willow-contract.md §7.3): messages are ``{"type", "message", "obj"}`` JSON. WIS
clients get exactly WIS's messages; the extensions (hands-free server VAD, partials, speech events,
the assistant) are only sent to a client that asked for them in ``start.obj``.

The voice loop: when the offer's audio is ``sendrecv``, the answer carries an outbound audio track
(``rtc_peer/audio.py``'s ``AssistantAudioTrack``) that sends nothing until there is an answer to speak. A client
that starts with ``"assistant": true`` gets each final transcript answered by the LLM: ``assistant``
messages with the text as it is written, the speech on that track, ``assistant_audio_started`` /
``assistant_audio_stopped``; speaking over an answer (or ``interrupt``) stops it, ``reset`` forgets
the conversation. Tool calls show as ``assistant_tool_call`` / ``assistant_tool_result``; a client
may declare its own tools in ``start.obj.tools`` (``assistant/client_tools.py``): their calls come
with ``"client": true`` and the client answers each with ``tool_output``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import av
from aiohttp import web
from aiortc import RTCDataChannel
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from mediaserver.assistant.audio_out import AudioOut
from mediaserver.assistant.client_tools import (
    ClientToolbox,
    ClientTools,
    SessionToolbox,
    parse_client_tools,
    tool_output_fields,
    unknown_call_text,
)
from mediaserver.assistant.turns import Assistant
from mediaserver.audio.echo import EchoMode, parse_echo_option
from mediaserver.audio.echo_line import EchoLine, HeldRelease
from mediaserver.audio.noise import NoiseFilter, new_filter, parse_level
from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidParameter
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
from mediaserver.state import ASR, METRICS, SESSIONS, SPEAKERS, TEXT_EOU, TOOLS
from mediaserver.stream.options import StreamOptions
from mediaserver.stream.session import StreamSession
from mediaserver.transport.common import (
    json_error,
    loads_json,
    speaker_payload,
    stream_options_from,
    turn_payload,
)
from mediaserver.transport.rtc_peer.audio import RTC_SAMPLE_RATE_HZ, AssistantAudioTrack
from mediaserver.transport.rtc_peer.peer import (
    ServerPeer,
    can_send_audio,
    read_audio_track,
)
from mediaserver.transport.voice import check_voice, new_assistant, update_assistant
from mediaserver.wake.gate import (
    WakeGate,
    WakeWaiting,
    feed_through,
    new_gate,
    observe,
    parse_wake_option,
    wake_message,
)

log = logging.getLogger(__name__)


def message(kind: str, text: str | None = None, obj: Any = None) -> str:
    return json.dumps({"type": kind, "message": text, "obj": obj})


class RtcSession:
    """A peer connection, its track reader, its data channel and the StreamSession behind them."""

    def __init__(self, app: web.Application, options: StreamOptions, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.sessions = app[SESSIONS]
        self.id = f"rtc-{uuid.uuid4().hex[:12]}"
        self.peer = ServerPeer(settings, self.id, "rtc")
        self.base_options = options
        self.stream = StreamSession(
            app[ASR], settings, self._on_event, options, session_id=self.id, text_eou=app.get(TEXT_EOU), route="rtc"
        )
        self.stream.speakers = app.get(SPEAKERS)
        self.channel: RTCDataChannel | None = None
        self.extensions = False  # the client opted in to partials / hands-free messages
        self.hands_free = False
        self.started = False
        self.closed = False
        self.last_activity = time.monotonic()
        self.opened_at = time.monotonic()
        self.remote = "unknown"  # the signalling client's address
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE_HZ)
        self.frames_received = 0
        # The voice loop: an outbound track when the offer can receive audio, an assistant on request.
        self.audio_out: AudioOut | None = None
        self.out_track: AssistantAudioTrack | None = None
        self.assistant: Assistant | None = None
        self.client_tools = ClientToolbox(settings, app[METRICS], session_id=self.id)  # the page's own tools
        self.noise: NoiseFilter | None = None
        # The server's canceller of the answers it plays on the track (audio/echo.py), for a client
        # that cancels no echo itself (``echo_cancellation``): each frame sent is the reference.
        self.echo: EchoLine | None = None
        # Audio it holds for auto's decision is heard once the track stops sending (echo_line.py).
        self._held = HeldRelease(self.settings.echo_mic_gap_ms / 1000.0, self._release_later)
        self.wake: WakeGate | None = None  # hands-free with a wake word (wake/gate.py)
        self.peer.pc.on("datachannel", self._on_datachannel)
        self.peer.pc.on("track", self._on_track)
        self.peer.pc.on("connectionstatechange", self._on_connection_state)

    # --- peer connection ------------------------------------------------------------------------

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self.peer.spawn(self._read_track(track), "rtc-track")
        else:  # never leave a track unread
            self.peer.spawn(self._drain(track), "rtc-drain")

    async def _drain(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                await track.recv()

    async def _read_track(self, track: MediaStreamTrack) -> None:
        await read_audio_track(
            track,
            self._resampler,
            self._feed,
            self._on_frame,
            self._on_gap,
            pause_s=self.settings.rtc_track_pause_ms / 1000.0,
            on_skipped=self._on_skipped,
        )
        log.debug("session %s: track ended", self.id)

    async def _on_gap(self, seconds: float) -> None:
        if self.echo is not None:
            self.echo.gap(int(seconds * SAMPLE_RATE_HZ))  # the microphone's clock goes on through it

    async def _on_skipped(self, seconds: float) -> None:
        """The sender says (its timestamps) it skipped ``seconds``: the stream's clock goes on by them."""
        samples = int(seconds * SAMPLE_RATE_HZ)
        if self.wake is not None:
            self.wake.gap(samples)
        await self.stream.gap(samples)

    def _on_answer_sent(self, pcm: bytes) -> None:
        if self.echo is not None:
            self.echo.sent(pcm, RTC_SAMPLE_RATE_HZ, louder=self.audio_out is not None and self.audio_out.rose)

    async def _feed(self, samples: AudioArray) -> None:
        if self.echo is not None:
            self.echo.arrived(samples.size)
            samples = self.echo.process(samples)
            if self.echo.canceller.holding:
                self.stream.audio_arriving()  # (waiting for echo_cancellation auto's decision: no gap)
        await self._hear(samples)
        self._held.fed(self.echo)

    def _release_later(self) -> None:
        """The track went quiet while the canceller holds audio: hear it now (the reader is idle)."""
        if self.echo is not None and not self.closed:
            self.peer.spawn(self._hear(self.echo.release()), f"echo-release-{self.id}")

    async def _hear(self, samples: AudioArray) -> None:
        """Audio out of the echo canceller (if any) into the session."""
        cleaned = self.noise.process(samples) if self.noise is not None else samples
        await feed_through(
            self.wake, cleaned, self.stream, self._send_wake, metrics=self.stream.asr.metrics, route="rtc"
        )

    def _send_wake(self, gate: WakeGate, change: Any) -> None:
        obj = wake_message(gate, change)
        kind = str(obj.pop("type"))
        phrases = " or ".join(f"'{p.lower()}'" for p in gate.phrases)
        text = f"heard '{str(obj.get('phrase', '')).lower()}'" if kind == "wake_word" else f"listening for {phrases}"
        self.send(message(kind, text, obj))

    def _on_frame(self) -> None:
        self.last_activity = time.monotonic()
        self.frames_received += 1

    def add_outbound_track(self) -> None:
        """Answer an offer that can receive audio with a track for spoken answers (silent until used)."""
        if not can_send_audio(self.peer.pc):
            return
        self.audio_out = AudioOut(RTC_SAMPLE_RATE_HZ)
        self.out_track = AssistantAudioTrack(self.audio_out)
        self.out_track.on_sent = self._on_answer_sent
        self.peer.pc.addTrack(self.out_track)

    def _on_connection_state(self) -> None:
        state = self.peer.pc.connectionState
        if state == "connected":
            log.info("session %s: connected (%s)", self.id, self.remote)
        else:
            log.log(logging.INFO if state == "failed" else logging.DEBUG, "session %s: %s", self.id, state)
        if state in ("failed", "closed"):
            self.peer.spawn(self.aclose(), "rtc-close")

    def start_watchdogs(self) -> None:
        """Close the session if its peer never connects, or goes silent (rtc_peer/peer.py)."""
        self.peer.start_watchdogs(closed=lambda: self.closed, close=self.aclose)

    # --- data channel ---------------------------------------------------------------------------

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        self.channel = channel

        @channel.on("message")
        def on_message(data: str | bytes) -> None:
            self.last_activity = time.monotonic()
            self.peer.spawn(self._handle_message(data), "rtc-message")

        @channel.on("close")
        def on_close() -> None:
            self.client_tools.close("the client's data channel closed")

    def send(self, text: str) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(text)

    async def _handle_message(self, data: str | bytes) -> None:
        try:
            parsed = loads_json(data)
        except (ValueError, TypeError) as exc:
            self.send(message("error", json_error(exc, "could not parse message")))
            return
        if not isinstance(parsed, dict) or not isinstance(parsed.get("type"), str):
            self.send(message("error", "could not parse message"))
            return
        kind = parsed["type"]
        obj = parsed.get("obj")
        obj = obj if isinstance(obj, dict) else {}
        try:
            if kind == "start":
                await self._start(obj)
            elif kind == "stop":
                await self._stop(obj)
            elif kind == "ping":
                self.send(message("pong", parsed.get("message")))
            elif kind == "interrupt":
                if self.assistant is not None:
                    await self.assistant.interrupt()
            elif kind == "reset":
                if self.assistant is not None:
                    await self.assistant.reset()
                self.send(message("log", "conversation reset"))
            elif kind == "tool_output":
                self._tool_output(obj or parsed)
            else:
                self.send(message("error", f'unknown message type "{kind}"'))
        except ApiError as exc:
            self.send(message("error", exc.message))

    def _tool_output(self, fields: Mapping[str, Any]) -> None:
        """The client's answer to a call of one of its tools (``assistant_tool_call`` with ``client``)."""
        call_id, output, is_error = tool_output_fields(fields)
        if not self.client_tools.answer(call_id, output, is_error=is_error):
            detail = {"code": "unknown_call_id", "call_id": call_id}
            self.send(message("error", unknown_call_text(call_id), detail))

    def _session_tools(self) -> SessionToolbox:
        return SessionToolbox(self.client_tools, self.app.get(TOOLS))

    def _options(self, obj: Mapping[str, Any], *, base: StreamOptions) -> StreamOptions:
        return stream_options_from(obj, self.settings, base=base)

    async def _start(self, obj: Mapping[str, Any]) -> None:
        options = self._options(obj, base=self.base_options)
        noise_level = parse_level(obj.get("noise_suppression"), self.settings)
        echo = parse_echo_option(obj.get("echo_cancellation", self.settings.rtc_echo_cancellation_default))
        wake_names = parse_wake_option(obj.get("wake"), self.settings)
        if wake_names is not None and not obj.get("hands_free", False):
            raise InvalidParameter("'wake' needs 'hands_free': true", param="wake")
        wants_assistant = obj.get("assistant", False)
        if not isinstance(wants_assistant, bool):
            raise InvalidParameter("'assistant' must be true or false", param="assistant")
        declared = parse_client_tools(obj.get("tools"), obj.get("tool_choice"))
        if declared.specs and not wants_assistant:
            raise InvalidParameter("'tools' needs 'assistant': true", param="tools")
        self._session_tools().check_clash(declared)
        if wants_assistant:
            check_voice(self.app, obj, self.assistant.options if self.assistant else None)
            if self.assistant is None:
                self.assistant = new_assistant(self.app, self.stream, self._on_event, self.audio_out, obj)
                self.assistant.toolbox = self._session_tools()
            else:
                update_assistant(self.assistant, obj)
            self.client_tools.declare(declared)
            self.extensions = True
        elif self.assistant is not None:
            self.client_tools.declare(ClientTools(()))
            await self.assistant.interrupt()  # an answer playing ends as a cut one does, told
            await self.assistant.aclose()
            self.assistant = None
            self.stream.assistant = None
        self.hands_free = bool(obj.get("hands_free", False))
        self.extensions = self.extensions or self.hands_free or bool(obj.get("partials", False))
        self.stream.configure(
            replace(
                options,
                server_vad=self.hands_free,
                partials=bool(obj.get("partials", False)),
                unstable_partials=bool(obj.get("partials", False)) and bool(obj.get("unstable", False)),
            )
        )
        if (self.noise.level if self.noise else 0) != noise_level:
            self.noise = new_filter(noise_level, self.settings)
        self._apply_echo(echo)
        if self.wake is not None:
            self.wake.close()
        self.wake = (
            new_gate(wake_names, self.settings, stream_ms=self.stream.position_ms) if wake_names is not None else None
        )
        self.started = True
        if self.hands_free:
            self.stream.clear()
            if self.wake is not None:
                self._send_wake(self.wake, WakeWaiting("started"))
            else:
                described = {**self.stream.turn_described(), "echo_cancellation": self.echo is not None}
                self.send(message("log", "ASR hands-free - listening, speak any time", described))
        else:
            self.stream.start_recording()
            self.send(message("log", "ASR Recording - start talking and press stop when done"))

    def _apply_echo(self, mode: EchoMode) -> None:
        """``on``, or ``auto`` while the answers are spoken on the track; a client that cancels echo
        itself (a browser's ``echoCancellation``, which the /rtc page reports as ``off``) says so."""
        speaks = self.assistant is not None and self.out_track is not None and self.assistant.options.speak
        if not (mode == "on" or (mode == "auto" and speaks)):
            self.echo = None
        elif self.echo is None:
            # its clock starts at the next audio; gaps: _on_gap
            self.echo = EchoLine.of(self.settings, watch_gaps=False)
        if self.echo is not None:
            self.echo.set_mode(mode, self.settings)
        self.stream.attach_echo(self.echo)

    async def _stop(self, obj: Mapping[str, Any]) -> None:
        if not self.started:
            self.send(message("error", "Recording not yet started"))
            return
        self.started = False
        if self.echo is not None:
            await self._hear(self.echo.release())  # (what waits for echo_cancellation auto's decision)
        if self.wake is not None:
            self.wake.close()
            self.wake = None
        if self.hands_free:
            self.hands_free = False
            with contextlib.suppress(ApiError):  # a failure was already sent as the utterance's error
                await self.stream.commit()  # finish an utterance in progress; its infer is sent by the event
            self.stream.configure(
                replace(self.stream.options, server_vad=False, partials=False, unstable_partials=False)
            )
            self.send(message("log", "ASR hands-free - stopped"))
            return
        options = self._options(obj, base=self.stream.options)
        self.stream.configure(
            replace(options, server_vad=False, partials=self.stream.options.partials, unstable_partials=False)
        )
        models = self.app[ASR].models
        try:  # the model that runs (WIS's "large" is an alias of base here), not the name asked for
            model = models.resolve(models.for_options(options.model, options.transcription))
        except ApiError:
            model = options.model or self.settings.asr_default_model
        beam = options.transcription.beam_size
        detect = options.transcription.language is None
        self.send(
            message("log", f"Doing ASR with model {model} beam size {beam} detect language {detect} - please wait")
        )
        try:
            final = await self.stream.stop_recording()
        except ApiError:
            return  # the StreamSession has already sent it as an error message
        audio_ms = final.transcript.duration_s * 1000.0
        infer_ms = final.latency_ms
        self.send(message("log", f"ASR Infer time: {infer_ms:.1f} ms"))
        self.send(message("log", f"ASR Audio Duration: {audio_ms:.0f} ms"))
        speedup = int(audio_ms // infer_ms) if infer_ms > 0 else 0
        self.send(message("log", f"ASR Speedup: {speedup}x faster than realtime"))

    async def _on_event(self, event: SessionEvent) -> None:
        gate = self.wake
        waiting = observe(gate, event) if gate is not None else None
        await self._on_session_event(event)
        if gate is not None and waiting is not None:
            self._send_wake(gate, waiting)

    async def _on_session_event(self, event: SessionEvent) -> None:
        if isinstance(event, AssistantText):
            text = {"text": event.delta, "full": event.text, "final": event.final}
            self.send(message("assistant", None, {**text, "interrupted": True} if event.interrupted else text))
            return
        if isinstance(event, AssistantAudioStarted):
            self.send(message("assistant_audio_started", None, {"turn": event.turn}))
            return
        if isinstance(event, AssistantAudioPaused | AssistantAudioResumed):
            kind = "assistant_audio_paused" if isinstance(event, AssistantAudioPaused) else "assistant_audio_resumed"
            self.send(message(kind, None, {"turn": event.turn}))
            return
        if isinstance(event, AssistantAudioStopped):
            stopped = {"turn": event.turn, "interrupted": event.interrupted, "heard": event.heard}
            self.send(message("assistant_audio_stopped", None, stopped))
            return
        if isinstance(event, AssistantToolCall):
            call = {"turn": event.turn, "call_id": event.call_id, "name": event.name, "arguments": event.arguments}
            self.send(message("assistant_tool_call", None, {**call, "client": event.client, "speaker": event.speaker}))
            return
        if isinstance(event, AssistantToolResult):
            result = {"turn": event.turn, "call_id": event.call_id, "name": event.name, "result": event.result}
            self.send(message("assistant_tool_result", None, {**result, "is_error": event.is_error}))
            return
        if isinstance(event, AssistantError):
            self.send(
                message(
                    "error", f"assistant {event.stage}: {event.message}", {"stage": event.stage, "code": event.code}
                )
            )
            return
        if isinstance(event, FinalTranscript):
            obj: dict[str, Any] = {"text": event.transcript.text}
            if self.extensions:
                obj.update(
                    final=True,
                    delta=event.delta,
                    language=event.transcript.language,
                    audio_start_ms=event.audio_start_ms,
                    audio_end_ms=event.audio_end_ms,
                    latency_ms=round(event.latency_ms, 1),
                    speaker=speaker_payload(event),
                )
                if event.transcript.guard is not None:
                    obj["guard"] = event.transcript.guard
                if event.echo:
                    obj["echo"] = True  # the answer's own words heard back: not answered (docs/echo.md)
            self.send(message("infer", None, obj))
        elif isinstance(event, StreamError):
            detail: dict[str, object] | None = None
            if self.extensions:
                detail = {"code": event.code}
                if event.audio_start_ms is not None and event.audio_end_ms is not None:
                    # The utterance failed: it stands in for that utterance's final.
                    detail.update(audio_start_ms=event.audio_start_ms, audio_end_ms=event.audio_end_ms)
            self.send(message("error", event.message, detail))
        elif not self.extensions:
            return
        elif isinstance(event, PartialTranscript):
            partial = {"text": event.delta, "full": event.text}
            if self.stream.options.unstable_partials:
                partial["unstable"] = event.unstable
            self.send(message("partial", None, partial))
        elif isinstance(event, SpeechStarted):
            self.send(message("speech_started", None, {"ms": event.audio_start_ms}))
        elif isinstance(event, SpeechStopped):
            self.send(message("speech_stopped", None, {"ms": event.audio_end_ms}))
        elif isinstance(event, TurnDecided):
            self.send(message("turn", None, turn_payload(event)))

    async def aclose(self) -> None:
        """Idempotent, and never raises: whatever state the peer connection was left in (a
        malformed offer can leave it half built), everything it opened is closed."""
        if self.closed:
            return
        self.closed = True
        self.sessions.discard(self.id)
        self.peer.cancel_tasks()
        self._held.close()
        if self.wake is not None:
            self.wake.close()
        self.client_tools.close()  # a call waiting for the page ends now
        try:
            if self.assistant is not None:
                await self.assistant.aclose()
            elif self.audio_out is not None:
                self.audio_out.close()
            await self.stream.aclose()
        finally:
            await self.peer.aclose()
            log.log(
                logging.INFO if self.frames_received or self.channel is not None else logging.DEBUG,
                "session %s: closed after %.1f s",
                self.id,
                time.monotonic() - self.opened_at,
            )
