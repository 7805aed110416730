"""Wake word gating of a stream: nothing reaches ASR (or the assistant) until a wake word is heard.

A ``WakeGate`` sits where a transport feeds its ``StreamSession`` (the device WebSocket and the
hands-free WebRTC data channel, when a client starts with ``wake``). It is either

- **waiting**: audio goes to the wake word detector only; or
- **listening**: after a wake word, audio also goes to the session (VAD, ASR, the assistant).

It goes back to waiting when no speech starts within ``listen_timeout_s`` of the wake word, or
after the utterance's final transcript: at once with ``conversation_timeout_s`` 0 (one utterance per
wake word), else when no further speech starts within that long after the last final (a
conversation). Timeouts count audio received, not wall-clock time, so they mean the same on a
loaded server. The detector keeps hearing the audio while listening (its timeline stays whole), and
detections then are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidParameter
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray, FinalTranscript, SpeechStarted, SpeechStopped, StreamError
from mediaserver.metrics import Metrics
from mediaserver.wake.detector import WakeDetection, WakeDetector
from mediaserver.wake.models import load_wake_models

WaitReason = Literal["started", "no_speech", "utterance_done", "conversation_timeout"]


@dataclass(frozen=True)
class WakeWaiting:
    """The gate closed again: waiting for a wake word."""

    reason: WaitReason


class WakeGate:
    def __init__(self, detector: WakeDetector, *, listen_timeout_s: float, conversation_timeout_s: float) -> None:
        self.detector = detector
        self.listen_timeout_samples = int(listen_timeout_s * SAMPLE_RATE_HZ)
        self.conversation_timeout_samples = int(conversation_timeout_s * SAMPLE_RATE_HZ)
        self.listening = False
        self._in_speech = False
        self._finals = 0  # utterances finished since the wake word
        self._quiet_samples = 0  # audio since the wake word or the last final with no speech started

    @property
    def names(self) -> list[str]:
        return self.detector.names

    @property
    def phrases(self) -> list[str]:
        return self.detector.phrases

    def feed(self, samples: AudioArray) -> tuple[AudioArray | None, WakeDetection | WakeWaiting | None]:
        """One piece of 16 kHz audio → (what the session gets, or None) and what changed, if anything."""
        detections = self.detector.process_float(samples)
        if not self.listening:
            if not detections:
                return None, None
            self.listening = True
            self._in_speech = False
            self._finals = 0
            self._quiet_samples = 0
            return None, detections[0]
        if self._in_speech:
            return samples, None
        self._quiet_samples += samples.size
        limit = self.listen_timeout_samples if self._finals == 0 else self.conversation_timeout_samples
        if self._quiet_samples > limit:
            self.listening = False
            return None, WakeWaiting("no_speech" if self._finals == 0 else "conversation_timeout")
        return samples, None

    def on_speech_started(self) -> None:
        if self.listening:
            self._in_speech = True

    def on_speech_discarded(self) -> None:
        """The VAD's speech was too short to be an utterance: still waiting for the command."""
        self._in_speech = False

    def on_final(self) -> WakeWaiting | None:
        """An utterance ended; with no conversation the gate closes now."""
        self._in_speech = False
        if not self.listening:
            return None
        self._finals += 1
        self._quiet_samples = 0
        if self.conversation_timeout_samples <= 0:
            self.listening = False
            return WakeWaiting("utterance_done")
        return None

    def gap(self, samples: int) -> None:
        """The sender sent nothing for ``samples`` (Opus DTX in silence): the detector's clock goes on
        with the stream's, and a command awaited after the wake word has been silent that much longer
        (told at the next audio: ``listen_timeout_s`` / ``conversation_timeout_s``, a review)."""
        self.detector.samples += samples
        if self.listening and not self._in_speech:
            self._quiet_samples += samples

    def close(self) -> None:
        self.detector.close()


class _Stream(Protocol):
    """What a gated stream takes (``StreamSession``)."""

    async def feed(self, samples: AudioArray) -> None: ...

    def skip(self, samples: int) -> None: ...


async def feed_through(
    gate: WakeGate | None,
    samples: AudioArray,
    stream: _Stream,
    on_change: Callable[[WakeGate, WakeDetection | WakeWaiting], None],
    *,
    metrics: Metrics | None = None,
    route: str = "",
) -> None:
    """A stream's audio through its wake-word gate, if it has one: what the gate lets through is
    fed; what it holds back still counts on the stream's clock; ``on_change`` hears a wake word or
    the return to waiting (the faces send it their own way); a wake word heard counts in
    ``metrics`` under ``route``."""
    if gate is None:
        await stream.feed(samples)
        return
    heard, change = gate.feed(samples)
    if change is not None:
        if isinstance(change, WakeDetection) and metrics is not None:
            metrics.wake_detections.labels(route, change.name).inc()
        on_change(gate, change)
    if heard is not None:
        await stream.feed(heard)
    else:
        stream.skip(samples.size)  # waiting for the wake word: the stream clock goes on


def parse_wake_option(value: object, settings: Settings) -> list[str] | None:
    """The ``wake`` start option → the models to wait for (None = no wake word gating).

    ``true`` (or "true"/"on") = ``wake_default_models``; a name or phrase, a comma-separated string or
    a list of them = those models. Unknown names raise ``UnknownWakeModel`` listing the models.
    """
    if value is None or value is False:
        return None
    if value is True:
        names: list[str] = list(settings.wake_default_models)
    elif isinstance(value, str):
        text = value.strip()
        if text.lower() in ("", "false", "off", "no", "0"):
            return None
        names = list(settings.wake_default_models) if text.lower() in ("true", "on", "yes", "1") else text.split(",")
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        names = [str(v) for v in value]
    else:
        raise InvalidParameter(
            f"wake must be true, false, a wake word name or a list of names; got {value!r}", param="wake"
        )
    if not settings.wake_enabled:
        raise InvalidParameter("wake words are off on this server (wake_enabled = false)", param="wake")
    models = load_wake_models(settings.wake_models_dir)
    try:
        return [m.name for m in models.resolve([n.strip() for n in names if n.strip()])]
    except ApiError as exc:  # (Wyoming's detect names its models ``names``; a start option is ``wake``)
        exc.param = "wake"
        raise


def new_gate(names: list[str], settings: Settings, *, stream_ms: int = 0) -> WakeGate:
    """A gate for ``names``, listening from ``stream_ms`` of its stream (``StreamSession.position_ms``)."""
    detector = WakeDetector(
        load_wake_models(settings.wake_models_dir), names, refractory_s=settings.wake_refractory_s, start_ms=stream_ms
    )
    return WakeGate(
        detector,
        listen_timeout_s=settings.wake_listen_timeout_s,
        conversation_timeout_s=settings.wake_conversation_timeout_s,
    )


def observe(gate: WakeGate, event: object) -> WakeWaiting | None:
    """Follow the session's events (speech started, discarded, final) to know when to close."""
    if isinstance(event, SpeechStarted):
        gate.on_speech_started()
    elif isinstance(event, SpeechStopped) and event.discarded:
        gate.on_speech_discarded()
    elif isinstance(event, FinalTranscript) or (isinstance(event, StreamError) and event.audio_start_ms is not None):
        return gate.on_final()  # a failed utterance's error stands in for its final
    return None


def wake_message(gate: WakeGate, change: WakeDetection | WakeWaiting) -> dict[str, object]:
    """The device WebSocket's message for a change (docs/ws-protocol.md)."""
    if isinstance(change, WakeDetection):
        return {"type": "wake_word", "name": change.name, "phrase": change.phrase, "audio_ms": change.timestamp_ms}
    return {"type": "wake_waiting", "reason": change.reason, "names": gate.names, "phrases": gate.phrases}
