"""Wyoming server (TCP): what Home Assistant's ``wyoming`` integration talks to, for speech to text
and, through ``wyoming/tts.py``, text to speech.

Framing, exactly as the Wyoming spec: each event is one UTF-8 JSON header line ending in ``\\n``
(``{"type", "data"?, "data_length"?, "payload_length"?, "version"?}``), then ``data_length`` bytes
of JSON merged over ``data``, then ``payload_length`` bytes of binary payload (PCM here). Events are
the ``wyoming`` package's own types (``Event`` and its ``Eventable`` classes), written with its
``async_write_event``; each connection is a ``wyoming.server.AsyncEventHandler``. Only reading is
ours (``wyoming/framing.py``'s ``read_event``): the package's reader has no size limit and turns a malformed
event into a silent end of stream; ours checks every length first and answers with a clear ``error``.

Conversation, per connection (Home Assistant opens one per utterance; several cycles on one
connection work too): ``describe`` → ``info``; ``transcribe{name?, language?,
transcript_names?, transcript_terms?}`` (the words a prompt gives Whisper: ``transcribe_prompt``, wyoming/stt.py) →
``audio-start`` → ``audio-chunk``* → ``audio-stop`` → ``transcript-start``, ``transcript-chunk``*,
``transcript``, ``transcript-stop`` (an ``audio-chunk`` that is not a whole number of frames, or an
``audio-stop`` with no ``audio-start`` before it, is an ``invalid_audio`` error); ``ping`` →
``pong``; wake word detection (``detect`` → audio → ``detection`` / ``not-detected``) is
``wyoming.wake``'s. Unknown event types are ignored, as the spec asks of every peer.

Every error ends the connection: the server sends ``error{text, code}``, shuts down its sending side
and discards what the client still sends for a moment before closing (closing a socket with unread
input makes the kernel send a reset, which can destroy the error before the client reads it). Home
Assistant reads until ``transcript`` without a timeout, so an error that left the connection open
would leave it waiting; a closed connection ends its request at once.

Access and memory. Wyoming has no authentication (Home Assistant connects with a host and a port
only), so when the HTTP API requires credentials the server listens on loopback unless
``wyoming_host`` says otherwise, and ``wyoming_allowed_networks`` restricts clients by address
(others get ``error{code: "forbidden"}``). At most ``wyoming_max_connections`` connections are open
(``too_many_connections``), and the audio all connections hold for transcription is bounded by
``wyoming_max_buffered_audio_bytes`` (``audio_buffer_full``), besides each utterance's own limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import ipaddress
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any, Final

from aiohttp import web
from wyoming.asr import Transcribe, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.asr import Transcript as WyomingTranscript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler

from mediaserver.asr.service import AsrService
from mediaserver.audio.decode import PcmFormat
from mediaserver.capabilities import Capabilities
from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidAudio, InvalidParameter
from mediaserver.events import SAMPLE_RATE_HZ, Priority, Transcript, TranscriptionOptions
from mediaserver.languages import normalize_language
from mediaserver.state import ASR, CAPABILITIES, SETTINGS, TTS
from mediaserver.transport.wyoming.framing import MAX_HEADER_LINE_BYTES, WyomingProtocolError, read_event
from mediaserver.transport.wyoming.info import build_info
from mediaserver.transport.wyoming.stt import AudioBudget, Utterance, audio_format, transcribe_prompt, transcript_chunks
from mediaserver.transport.wyoming.tts import WyomingTts
from mediaserver.transport.wyoming.wake import WyomingWake
from mediaserver.tts.service import TtsService
from mediaserver.wake.models import load_wake_models

log = logging.getLogger(__name__)

# How long an error's sender waits for the client to stop sending before closing outright.
LINGER_S: Final = 2.0
LINGER_MAX_BYTES: Final = 16 * 1024 * 1024
ZEROCONF_SERVICE_TYPE: Final = "_wyoming._tcp.local."

# --- one connection ----------------------------------------------------------------------------


class WyomingConnection(AsyncEventHandler):
    """One client: reads events, answers them, and owns its socket until it is closed.

    ``run`` replaces the package's loop with one that bounds each event and the idle time and turns
    failures into ``error`` events; ``handle_event`` is the package's hook, one event at a time.
    """

    def __init__(self, server: WyomingServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self._server = server
        self._settings = server.settings
        self._asr = server.asr
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        self._utterance: Utterance | None = None
        # (model, language, prompt) of a transcribe
        self._pending: tuple[str | None, str | None, str | None] | None = None
        self._held_bytes = 0  # this connection's share of the server's AudioBudget
        self._tts = WyomingTts(
            server.tts,
            server.capabilities,
            self.send,
            self.peer,
            max_streamed_chars=self._settings.tts_max_streamed_chars,
            on_error=lambda code: self._asr.metrics.wyoming_errors.labels(code).inc(),
        )
        self._wake = WyomingWake(
            server.wake, server.settings, self.send, self.peer, audio_format, metrics=server.asr.metrics
        )

    async def refuse(self, text: str, code: str) -> None:
        """Turn the connection away with an error (it is closed afterwards)."""
        log.info("wyoming %s: refused: %s", self.peer, text)
        await self._fail(text, code)

    def _release_audio(self) -> None:
        self._server.budget.release(self._held_bytes)
        self._held_bytes = 0

    async def run(self) -> None:
        try:
            await self._serve()
        except WyomingProtocolError as exc:
            log.info("wyoming %s: protocol error: %s", self.peer, exc.message)
            await self._fail(exc.message, exc.code)
        except ApiError as exc:
            log.info("wyoming %s: %s (%s)", self.peer, exc.message, exc.code)
            await self._fail(exc.message, exc.code)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            log.debug("wyoming %s: connection lost: %r", self.peer, exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("wyoming %s: unexpected error", self.peer)
            await self._fail("internal server error", "internal_error")
        finally:
            self._release_audio()
            self._wake.close()
            await self._tts.aclose()
            await self.disconnect()

    async def _serve(self) -> None:
        idle_s = self._settings.wyoming_idle_timeout_s
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    event = await read_event(self.reader, max_event_bytes=self._settings.wyoming_max_event_bytes)
            except TimeoutError:
                log.info("wyoming %s: idle for %.0f s, closing", self.peer, idle_s)
                return
            if event is None:
                return
            if not await self.handle_event(event):
                return

    async def handle_event(self, event: Event) -> bool:
        kind = event.type
        if Describe.is_type(kind):
            await self.send(build_info(self._asr, self._server.tts_if_enabled, self._server.wake).event())
        elif Ping.is_type(kind):
            await self.send(Pong(text=event.data.get("text")).event())
        elif self._wake.wants(kind):
            await self._wake.handle(event)
        elif Transcribe.is_type(kind):
            self._wake.close()
            self._pending = self._parse_transcribe(event.data)
            self._utterance = None
            self._release_audio()
        elif AudioStart.is_type(kind):
            self._start_utterance(audio_format(event.data, None))
        elif AudioChunk.is_type(kind):
            self._add_chunk(event)
        elif AudioStop.is_type(kind):
            await self._finish_utterance()
        elif WyomingTts.handles(kind):
            await self._tts.handle(event)
        else:
            log.debug("wyoming %s: ignoring event %r", self.peer, kind)
        return True

    def _parse_transcribe(self, data: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
        name = data.get("name")
        if name is not None and not isinstance(name, str):
            raise InvalidParameter(f"transcribe name must be a string, got {name!r}", param="name")
        if name:
            self._asr.models.resolve(name)  # UnknownModel for names we do not know
        # (As named: an OpenAI name such as whisper-1 names no model of ours, and another language
        # then takes translation_model, as with none.)
        model = name or None
        prompt = transcribe_prompt(data, self._settings)
        raw_language = data.get("language")
        if raw_language is None or raw_language == "":
            return model, self._settings.default_language, prompt
        if not isinstance(raw_language, str):
            raise InvalidParameter(f"transcribe language must be a string, got {raw_language!r}", param="language")
        try:
            return model, normalize_language(raw_language), prompt  # None ("auto") means detect
        except ValueError:
            raise InvalidParameter(f"unsupported language {raw_language!r}", param="language") from None

    def _start_utterance(self, fmt: PcmFormat | None) -> Utterance:
        pending = self._pending if self._pending is not None else (None, self._settings.default_language, None)
        model, language, prompt = pending
        self._pending = None
        self._utterance = Utterance(model, language, fmt, prompt)
        self._release_audio()
        return self._utterance

    def _add_chunk(self, event: Event) -> None:
        utterance = self._utterance
        if utterance is None:  # no audio-start: the chunk has to say its format itself
            utterance = self._start_utterance(None)
        fmt = audio_format(event.data, utterance.fmt)
        if fmt is None:
            raise InvalidAudio("Invalid audio: audio-chunk without rate/width/channels and no audio-start before it")
        if event.payload and len(event.payload) % fmt.frame_bytes:
            raise InvalidAudio(
                f"Invalid audio: an audio-chunk of {len(event.payload)} bytes is not a whole number of frames "
                f"({fmt.frame_bytes} bytes each at width {fmt.bits // 8} and {fmt.channels} channel(s))"
            )
        if event.payload:
            self._server.budget.reserve(len(event.payload))
            self._held_bytes += len(event.payload)
            # Counted as received, as the streams count theirs (a trial: audio abandoned without an
            # audio-stop was never counted).
            seconds = len(event.payload) / fmt.frame_bytes / fmt.sample_rate_hz
            self._asr.metrics.audio_seconds.labels("wyoming").inc(seconds)
            utterance.add(
                fmt,
                event.payload,
                max_bytes=self._settings.max_upload_bytes,
                max_duration_s=self._settings.max_audio_duration_s,
            )

    async def _finish_utterance(self) -> None:
        utterance = self._utterance
        if utterance is None:  # no audio-start (nor an audio-chunk that said its format) in this cycle
            raise InvalidAudio("Invalid audio: audio-stop without audio-start: there is no audio to transcribe")
        self._utterance = None
        started = time.perf_counter()
        try:  # the audio is held (and counted) until its transcript is made
            audio = await asyncio.to_thread(utterance.to_float, self._settings.max_audio_duration_s)
            del utterance.runs[:]
            if audio.size == 0:
                language = utterance.language or self._settings.default_language
                transcript = Transcript(text="", language=language, language_probability=None, duration_s=0.0)
            else:
                options = TranscriptionOptions(
                    language=utterance.language,
                    beam_size=self._settings.default_beam_size,
                    initial_prompt=utterance.prompt,
                )
                transcript = await self._asr.transcribe(audio, options, model=utterance.model, priority=Priority.FINAL)
        finally:
            self._release_audio()
        log.info(
            "wyoming %s: %.2f s of audio transcribed in %.0f ms",
            self.peer,
            audio.size / SAMPLE_RATE_HZ,
            (time.perf_counter() - started) * 1000,
        )
        language = transcript.language
        events = [TranscriptStart(language=language).event()]
        events += [TranscriptChunk(text=text).event() for text in transcript_chunks(transcript)]
        events += [WyomingTranscript(text=transcript.text, language=language).event(), TranscriptStop().event()]
        await self.send(*events)

    async def send(self, *events: Event) -> None:
        """Write events; a client that stops reading is dropped after the idle timeout."""
        async with asyncio.timeout(self._settings.wyoming_idle_timeout_s):
            for event in events:
                await async_write_event(event, self.writer)

    async def _fail(self, text: str, code: str) -> None:
        """Send an error, then close gracefully (see the module docstring)."""
        await self._tts.aclose()  # a stream's writer stops first: nothing is sent after the error
        self._asr.metrics.wyoming_errors.labels(code).inc()
        try:
            await self.send(Error(text=text, code=code).event())
            if self.writer.can_write_eof():
                self.writer.write_eof()
            async with asyncio.timeout(LINGER_S):
                discarded = 0
                while discarded < LINGER_MAX_BYTES:
                    block = await self.reader.read(65536)
                    if not block:
                        break
                    discarded += len(block)
        except (TimeoutError, ConnectionError, OSError):
            pass

    async def aclose(self) -> None:
        if self.writer.is_closing():
            return
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


# --- the server --------------------------------------------------------------------------------


class WyomingServer:
    """The TCP listener; owns every open connection and the optional mDNS announcement."""

    def __init__(
        self,
        settings: Settings,
        asr: AsrService,
        *,
        tts: TtsService | None = None,
        capabilities: Capabilities | None = None,
    ) -> None:
        self.settings = settings
        self.asr = asr
        self.tts = tts
        self.capabilities = capabilities
        self._server: asyncio.Server | None = None
        self._tasks: dict[asyncio.Task[None], WyomingConnection] = {}
        self._zeroconf: Any = None
        self._service_info: Any = None
        self._closed = False
        self._allowed = [ipaddress.ip_network(n, strict=False) for n in settings.wyoming_allowed_networks]
        self.budget = AudioBudget(settings.wyoming_max_buffered_audio_bytes)
        self.wake = load_wake_models(settings.wake_models_dir) if settings.wake_enabled else None
        self.port: int | None = None
        self.served = 0  # connections being served (not the ones refused, still lingering)

    @property
    def tts_if_enabled(self) -> TtsService | None:
        """The TTS service when TTS is on (``describe`` lists it only then)."""
        if self.tts is None or (self.capabilities is not None and not self.capabilities.enabled("tts")):
            return None
        return self.tts

    @property
    def connections(self) -> frozenset[WyomingConnection]:
        """The connections open right now."""
        return frozenset(self._tasks.values())

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 = any free port); return the bound port."""
        self._server = await asyncio.start_server(self._on_connect, host, port, limit=MAX_HEADER_LINE_BYTES)
        sockets = self._server.sockets
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        log.info("wyoming server listening on %s:%d (TTS %s)", host, self.port, "on" if self.tts_if_enabled else "off")
        if self.settings.wyoming_zeroconf:
            await self._announce(host, self.port)
        return self.port

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self._closed or task is None:
            writer.close()
            return
        connection = WyomingConnection(self, reader, writer)
        self._tasks[task] = connection
        served = False
        log.debug("wyoming %s: connected", connection.peer)
        try:
            if not self.allows(writer.get_extra_info("peername")):
                await connection.refuse(
                    f"{connection.peer} is not in this server's wyoming_allowed_networks", "forbidden"
                )
            elif len(self._tasks) > self.settings.wyoming_max_connections:
                await connection.refuse(
                    f"too many open connections (wyoming_max_connections = {self.settings.wyoming_max_connections})",
                    "too_many_connections",
                )
            else:
                served = True  # (counted while served: not a refused one during its linger)
                self.served += 1
                self.asr.metrics.wyoming_connections.inc()
                await connection.run()
        except asyncio.CancelledError:
            if not self._closed:
                raise
            # aclose cancelled it: the server is shutting down. End normally, as a client's EOF does
            # (Python 3.11's start_server logs a cancelled connection task at ERROR with a traceback).
            task.uncancel()
            log.debug("wyoming %s: closed by the server's shutdown", connection.peer)
        finally:
            self._tasks.pop(task, None)
            if served:
                self.served -= 1
                self.asr.metrics.wyoming_connections.dec()
            await connection.aclose()
            log.debug("wyoming %s: closed", connection.peer)

    def allows(self, peername: Any) -> bool:
        """Whether a client address is in ``wyoming_allowed_networks`` (always, when that is empty)."""
        if not self._allowed:
            return True
        try:
            address = ipaddress.ip_address(str(peername[0]).split("%", 1)[0])
        except (TypeError, IndexError, ValueError):
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._allowed)

    async def _announce(self, host: str, port: int) -> None:
        try:
            zc_asyncio = importlib.import_module("zeroconf.asyncio")
        except ImportError:
            log.warning("wyoming_zeroconf is set but the 'zeroconf' package is not installed; not announcing")
            return
        address = host if host not in ("", "0.0.0.0", "::") else _outbound_ipv4()
        name = self.settings.wyoming_zeroconf_name
        try:
            info = zc_asyncio.AsyncServiceInfo(
                ZEROCONF_SERVICE_TYPE,
                f"{name}.{ZEROCONF_SERVICE_TYPE}",
                addresses=[socket.inet_aton(address)],
                port=port,
            )
            zc = zc_asyncio.AsyncZeroconf()
            await zc.async_register_service(info)
        except Exception as exc:
            log.warning("zeroconf announcement of %s on %s:%d failed: %s", name, address, port, exc)
            return
        self._zeroconf, self._service_info = zc, info
        log.info("announced %r as %s on %s:%d", name, ZEROCONF_SERVICE_TYPE, address, port)

    async def aclose(self) -> None:
        """Stop listening, close every connection (cancelling running requests), withdraw mDNS."""
        if self._closed:
            return
        self._closed = True
        if self._zeroconf is not None:
            with contextlib.suppress(Exception):
                await self._zeroconf.async_unregister_service(self._service_info)
            with contextlib.suppress(Exception):
                await self._zeroconf.async_close()
            self._zeroconf = None
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


def _outbound_ipv4() -> str:
    """The address other hosts reach us on (no packet is sent: UDP connect only picks a route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("224.0.0.251", 5353))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


WYOMING_SERVER = web.AppKey("wyoming_server", WyomingServer)
WYOMING_PORT = web.AppKey("wyoming_port", int)


async def wyoming_ctx(app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup_ctx: run the Wyoming server for the app's lifetime if it is enabled."""
    settings = app[SETTINGS]
    if not settings.wyoming_enabled:
        yield
        return
    server = WyomingServer(settings, app[ASR], tts=app.get(TTS), capabilities=app.get(CAPABILITIES))
    host = settings.wyoming_bind_host()
    if settings.auth_enabled and settings.wyoming_host is None:
        log.info(
            "wyoming: the HTTP API requires credentials and Wyoming clients cannot send any, so Wyoming listens "
            "on %s only; set wyoming_host (and wyoming_allowed_networks) to expose it",
            host,
        )
    elif host not in ("127.0.0.1", "::1", "localhost") and not settings.wyoming_allowed_networks:
        level = logging.WARNING if settings.auth_enabled else logging.INFO
        log.log(
            level,
            "wyoming: listening on %s without authentication (the protocol has none): any client that reaches "
            "this port can transcribe and synthesize; wyoming_allowed_networks restricts it",
            host,
        )
    try:
        app[WYOMING_PORT] = await server.start(host, settings.wyoming_port)
        app[WYOMING_SERVER] = server
        yield
    finally:
        await server.aclose()
