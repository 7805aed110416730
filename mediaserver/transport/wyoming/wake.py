"""Wyoming wake word detection: the wake half of a Wyoming connection (``transport/wyoming.py`` owns
the socket), what Home Assistant and ESPHome devices set to "wake word processed in Home Assistant"
stream to.

- ``describe`` → ``info`` lists a ``wake`` program with every model (built-ins and custom ones).
- ``detect{names?}`` → ``audio-start``, ``audio-chunk``… → ``detection{name, timestamp}`` as soon
  as a wake word is heard (``timestamp``: milliseconds of audio since ``audio-start``; the same
  word again only after ``wake_refractory_s``) → ``audio-stop`` → ``not-detected`` if nothing was
  heard. ``names`` are model names (``okay_nabu``) or phrases (``Okay Nabu``); none = every model;
  an unknown one is an ``error`` (``model_not_found``) that lists the models.
- Audio in any PCM format the connection accepts (rate, width, channels) is converted to 16 kHz
  mono int16 with PyAV, as the models need. Nothing is buffered beyond one 10 ms frame: a stream
  can run for hours (a device waiting for its wake word), bounded only by the connection's idle
  timeout. A ``transcribe`` or a new ``detect`` ends a detection in progress.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event
from wyoming.info import Attribution, WakeModel, WakeProgram
from wyoming.wake import Detect, Detection, NotDetected

from mediaserver import __version__
from mediaserver.audio.decode import PcmFormat, float_to_pcm16
from mediaserver.audio.stream_decode import PcmStreamDecoder
from mediaserver.config import Settings
from mediaserver.errors import InvalidAudio, InvalidParameter
from mediaserver.events import SAMPLE_RATE_HZ
from mediaserver.metrics import Metrics
from mediaserver.wake.detector import WakeDetection, WakeDetector
from mediaserver.wake.models import WakeModels

log = logging.getLogger(__name__)

Send = Callable[..., Awaitable[None]]
# The connection's parser of an audio event's rate/width/channels (missing fields from the fallback).
ParseFormat = Callable[[dict[str, Any], PcmFormat | None], PcmFormat | None]
NATIVE: Final = PcmFormat(SAMPLE_RATE_HZ, 16, 1)
# Pieces longer than this are run in a thread so the event loop keeps serving other connections.
INLINE_MAX_BYTES: Final = SAMPLE_RATE_HZ * 2 // 4  # 250 ms of native audio
_ATTRIBUTION: Final = Attribution(name="microWakeWord", url="https://github.com/kahrendt/microWakeWord")


def wake_program(models: WakeModels) -> WakeProgram:
    """The wake program of ``info``: one entry per model."""
    return WakeProgram(
        name="mediaserver-wake",
        description="mediaserver wake word detection (microWakeWord)",
        attribution=_ATTRIBUTION,
        installed=True,
        version=__version__,
        models=[
            WakeModel(
                name=model.name,
                description=model.phrase,
                phrase=model.phrase,
                attribution=_ATTRIBUTION,
                installed=True,
                version=None,
                languages=list(model.languages),
            )
            for model in models.models()
        ],
    )


def _names(data: dict[str, Any]) -> list[str] | None:
    names = data.get("names")
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidParameter(f"detect names must be a list of strings, got {names!r}", param="names")
    return [n for n in names if n]


class WyomingWake:
    """The wake detection state of one connection: idle, or one detector fed by audio events."""

    def __init__(
        self,
        models: WakeModels | None,
        settings: Settings,
        send: Send,
        peer: str,
        parse_format: ParseFormat,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self._models = models
        self._metrics = metrics
        self._parse_format = parse_format
        self._settings = settings
        self._send = send
        self.peer = peer
        self._detector: WakeDetector | None = None
        self._decoder: PcmStreamDecoder | None = None
        self._format: PcmFormat | None = None
        self._detected = False
        self._context: dict[str, Any] | None = None

    @property
    def active(self) -> bool:
        """Between ``detect`` and ``audio-stop``: audio events are ours."""
        return self._detector is not None

    def wants(self, kind: str) -> bool:
        """Whether an event of this type goes to the wake handler."""
        if Detect.is_type(kind):
            return True
        return self.active and (AudioStart.is_type(kind) or AudioChunk.is_type(kind) or AudioStop.is_type(kind))

    async def handle(self, event: Event) -> None:
        kind = event.type
        if Detect.is_type(kind):
            self._start(event.data)
        elif AudioStart.is_type(kind):
            self._set_format(event.data)
        elif AudioChunk.is_type(kind):
            await self._chunk(event)
        elif AudioStop.is_type(kind):
            await self._stop()

    def _start(self, data: dict[str, Any]) -> None:
        self.close()
        if self._models is None:
            raise InvalidParameter("wake word detection is off on this server (wake_enabled = false)", param="names")
        self._detector = WakeDetector(
            self._models, _names(data), refractory_s=self._settings.wake_refractory_s
        )  # UnknownWakeModel lists the models
        context = data.get("context")
        self._context = context if isinstance(context, dict) else None
        self._detected = False
        log.info("wyoming %s: detecting %s", self.peer, ", ".join(self._detector.names))

    def _set_format(self, data: dict[str, Any]) -> None:
        fmt = self._parse_format(data, self._format)
        if fmt is None:
            return
        if fmt != self._format:
            self._format = fmt
            self._decoder = None if fmt == NATIVE else PcmStreamDecoder(fmt)

    async def _chunk(self, event: Event) -> None:
        self._set_format(event.data)
        detector = self._detector
        if detector is None:
            return
        if self._format is None:
            raise InvalidAudio("Invalid audio: audio-chunk without rate/width/channels and no audio-start before it")
        payload = event.payload or b""
        if len(payload) % self._format.frame_bytes:
            raise InvalidAudio(
                f"audio-chunk of {len(payload)} bytes is not a whole number of samples "
                f"({self._format.frame_bytes} bytes per sample frame)"
            )
        decoder = self._decoder
        if decoder is None and len(payload) <= INLINE_MAX_BYTES:
            found = detector.process(payload)
        else:
            found = await asyncio.to_thread(_convert_and_detect, detector, decoder, payload)
        if found and self._detector is detector:
            await self._report(found)

    async def _report(self, found: list[WakeDetection]) -> None:
        self._detected = True
        for detection in found:
            log.info("wyoming %s: heard %r at %d ms", self.peer, detection.name, detection.timestamp_ms)
            if self._metrics is not None:
                self._metrics.wake_detections.labels("wyoming", detection.name).inc()
        await self._send(
            *(Detection(name=d.name, timestamp=d.timestamp_ms, context=self._context).event() for d in found)
        )

    async def _stop(self) -> None:
        detected, context = self._detected, self._context
        self.close()
        if not detected:
            await self._send(NotDetected(context=context).event())

    def close(self) -> None:
        """Drop the detector (a new ``detect``, a ``transcribe``, the end of the connection)."""
        if self._detector is not None:
            self._detector.close()
        self._detector = None
        self._decoder = None
        self._format = None
        self._detected = False


def _convert_and_detect(
    detector: WakeDetector, decoder: PcmStreamDecoder | None, payload: bytes
) -> list[WakeDetection]:
    if decoder is None:
        return detector.process(payload)
    return detector.process(float_to_pcm16(decoder.decode(payload)))
