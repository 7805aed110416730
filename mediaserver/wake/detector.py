"""A wake word detector for one audio stream: 16 kHz mono int16 in, detections out.

One ``WakeDetector`` per stream holds microWakeWord's audio front end (one feature extractor,
shared by every model of the stream: all microWakeWord models take the same 40 log-mel features
per 10 ms) and one small TFLite interpreter per model (the streaming models keep their own state,
so interpreters cannot be shared between streams). Its memory is bounded: the front end keeps less
than one 10 ms frame of audio, each model three feature frames and its last few probabilities.

``process`` is synchronous: about 2.6 ms of CPU per second of audio with one model, 6.5 ms with
all four built-ins (0.26 % / 0.65 % of a core per real-time stream, ``tools/bench_wake.py``);
callers hand large pieces to a thread. After a detection the model stays
quiet for ``refractory_s`` (its averaged probability stays above the cutoff for a few frames).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from mediaserver.events import SAMPLE_RATE_HZ, AudioArray
from mediaserver.wake.models import WakeModel, WakeModels

FRAME_SAMPLES: Final = SAMPLE_RATE_HZ // 100  # 10 ms
BYTES_PER_SAMPLE: Final = 2


@dataclass(frozen=True)
class WakeDetection:
    name: str  # the model's name
    phrase: str
    timestamp_ms: int  # position in the stream (since the detector started) where it was heard
    probability: float


class _Model:
    def __init__(self, model: WakeModel, library: Any) -> None:
        from pymicro_wakeword import MicroWakeWord

        self.info = model
        self.net = MicroWakeWord(
            model.name,
            wake_word=model.phrase,
            tflite_model=model.tflite_path,
            probability_cutoff=model.probability_cutoff,
            sliding_window_size=model.sliding_window_size,
            trained_languages=list(model.languages),
            libtensorflowlite_c_path=library,
        )
        self.quiet_until_ms = -1

    def close(self) -> None:
        self.net.close()


class WakeDetector:
    """Feeds audio to a stream's wake word models; returns what they heard."""

    def __init__(
        self, models: WakeModels, names: list[str] | None = None, *, refractory_s: float = 2.0, start_ms: int = 0
    ) -> None:
        from pymicro_wakeword import MicroWakeWordFeatures

        chosen = models.resolve(names)  # UnknownWakeModel / WakeUnavailable
        self._models = [_Model(m, models.library) for m in chosen]
        self._features = MicroWakeWordFeatures()
        self._refractory_ms = int(refractory_s * 1000)
        self._carry = b""
        self._busy = threading.Lock()  # close() while a thread runs process() defers to its end
        self._close_pending = False
        # Audio processed so far, counted from ``start_ms`` of the stream it listens to (a gate made by a
        # later start: its detections' times compare with the stream's events).
        self.samples = start_ms * SAMPLE_RATE_HZ // 1000
        self.max_probability: dict[str, float] = {m.info.name: 0.0 for m in self._models}

    @property
    def names(self) -> list[str]:
        return [m.info.name for m in self._models]

    @property
    def phrases(self) -> list[str]:
        return [m.info.phrase for m in self._models]

    @property
    def position_ms(self) -> int:
        return self.samples * 1000 // SAMPLE_RATE_HZ

    def process(self, pcm16: bytes) -> list[WakeDetection]:
        """16 kHz mono little-endian int16 bytes (any length) → detections heard in them."""
        with self._busy:
            try:
                return self._process(pcm16)
            finally:
                if self._close_pending:
                    self._close_models()

    def _process(self, pcm16: bytes) -> list[WakeDetection]:
        data = self._carry + pcm16
        usable = len(data) - len(data) % (FRAME_SAMPLES * BYTES_PER_SAMPLE)
        self._carry = data[usable:]
        found: list[WakeDetection] = []
        frame_bytes = FRAME_SAMPLES * BYTES_PER_SAMPLE
        for start in range(0, usable, frame_bytes):
            self.samples += FRAME_SAMPLES
            for features in self._features.process_streaming(data[start : start + frame_bytes]):
                found += self._infer(features)
        return found

    def process_float(self, samples: AudioArray) -> list[WakeDetection]:
        """16 kHz mono float32 (the session pipeline's form) → detections."""
        pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")
        return self.process(pcm.tobytes())

    def _infer(self, features: Any) -> list[WakeDetection]:
        found: list[WakeDetection] = []
        now_ms = self.position_ms
        for model in self._models:
            probability = model.net.process_streaming_prob(features)
            if probability is None:
                continue
            name = model.info.name
            if probability > self.max_probability[name]:
                self.max_probability[name] = probability
            if probability > model.info.probability_cutoff and now_ms >= model.quiet_until_ms:
                model.quiet_until_ms = now_ms + self._refractory_ms
                found.append(WakeDetection(name, model.info.phrase, now_ms, float(probability)))
        return found

    def close(self) -> None:
        """Free the interpreters; when a thread is inside ``process``, as soon as it returns."""
        if not self._busy.acquire(blocking=False):
            self._close_pending = True
            return
        try:
            self._close_models()
        finally:
            self._busy.release()

    def _close_models(self) -> None:
        for model in self._models:
            model.close()
        self._models = []

    def __enter__(self) -> WakeDetector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
