"""Who is speaking: enrolment and verification on the speaker encoder (encoder.py).

One worker thread runs every embedding, so the event loop never waits on it; voices of several
requests that arrive while it works are embedded together in the next batch (up to
``speaker_batch_max``), as the turn model batches pauses. A voice is compared with every enrolled
speaker by cosine similarity; those at ``speaker_threshold`` or more are its matches, best first.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mediaserver.batches import ThreadBatches
from mediaserver.config import Settings
from mediaserver.errors import InvalidAudio, ModelUnavailable
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray
from mediaserver.keep_alive import WorkerModel
from mediaserver.metrics import Metrics
from mediaserver.speakers.encoder import MIN_SAMPLES, SpeakerEncoder, voiced_seconds
from mediaserver.speakers.fetch import default_path
from mediaserver.speakers.onnx_encoder import OnnxSpeakerEncoder
from mediaserver.speakers.store import Embedding, Speaker, SpeakerStore, check_name
from mediaserver.speakers.voicing import voiced_share

log = logging.getLogger(__name__)

# GE2E (the default, numpy) or an operator's ONNX model (``speaker_model_path`` ending in .onnx).
VoiceEncoder = SpeakerEncoder | OnnxSpeakerEncoder


def model_path(settings: Settings) -> Path:
    return settings.speaker_model_path or default_path()


def store_dir(settings: Settings) -> Path:
    return settings.speakers_dir or Path.home() / ".cache" / "mediaserver" / "speakers"


@dataclass(frozen=True)
class Match:
    name: str
    score: float  # cosine similarity


class SpeakerService:
    """The encoder on its worker thread and the store of enrolled speakers."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.store = SpeakerStore(store_dir(settings), settings.speakers_max)
        # The encoder on the worker thread: loaded at start, unloaded once unused for
        # speaker_keep_alive_s and loaded again by the next voice (None: speakers are off).
        self.weights: WorkerModel[VoiceEncoder] | None = None
        self.model_id: str | None = None
        self.problem: str | None = "not started"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speakers")
        self._batches: ThreadBatches[AudioArray, tuple[Embedding, float]] = ThreadBatches(
            self._executor, settings.speaker_batch_max, self._embed_batch
        )

    async def start(self) -> None:
        """Load the encoder and the store off the event loop; a missing model turns speakers off."""
        path = model_path(self.settings)
        keep_alive_s = self.settings.speaker_keep_alive_s
        name = path.stem if path.suffix.lower() == ".onnx" else "ge2e"
        open_encoder = functools.partial(_load_encoder, path, shared=keep_alive_s < 0)
        weights: WorkerModel[VoiceEncoder] = WorkerModel(
            "speaker", name, open_encoder, keep_alive_s, self.metrics, self._executor
        )

        def load() -> None:
            if not path.is_file():
                self.problem = (
                    f"the speaker model {path} is missing (fetch it with `make setup` or "
                    "`python -m mediaserver.speakers.fetch`)"
                )
            else:
                try:
                    started = time.perf_counter()
                    encoder = weights.get()
                    weights.loaded_at_start(encoder, time.perf_counter() - started)
                    self.model_id = encoder.model_id
                    self.problem = None
                except Exception as exc:
                    self.problem = f"the speaker model {path} could not be loaded: {exc}"
            # Speakers another model enrolled are left out (named in /health) while this one runs.
            self.store.load(self.model_id)

        await asyncio.get_running_loop().run_in_executor(self._executor, load)
        if self.problem is not None:
            log.warning("speakers are off: %s", self.problem)
        else:
            self.weights = weights
            weights.announce()  # its idle timer (speaker_keep_alive_s) starts now
            log.info("speaker model loaded from %s", path)

    async def aclose(self) -> None:
        if self.weights is not None:
            await self.weights.aclose()
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)

    def status(self) -> dict[str, Any]:
        """What ``/health`` says of speakers (never who is enrolled: only how many)."""
        return {
            "available": self.problem is None,
            "reason": self.problem,
            "model": self.model_id,
            "in_memory": self.weights is not None and self.weights.loaded,
            "enrolled": len(self.store),
            "threshold": self.settings.speaker_threshold,
            "store_problems": list(self.store.problems),
        }

    # --- embeddings ------------------------------------------------------------------------

    async def embed(self, audio: AudioArray) -> tuple[Embedding, float]:
        """The voice's embedding and its seconds of speech, on the worker thread (batched with
        other requests' voices). Raises InvalidAudio when there is no speech to embed."""
        with self._weights().use():  # no idle unload while it waits
            return await self._batches.submit(audio)

    def _weights(self) -> WorkerModel[VoiceEncoder]:
        if self.weights is None:
            raise ModelUnavailable(f"speaker recognition is off: {self.problem}")
        return self.weights

    async def embed_windows(self, clips: list[AudioArray]) -> list[Embedding | None]:
        """Each clip's embedding, None for one with too little speech (diarization's windows), on the
        worker thread in batches of ``speaker_batch_max`` clips between other requests' voices."""
        weights = self._weights()
        loop = asyncio.get_running_loop()
        results: list[Embedding | None] = []
        size = max(self.settings.speaker_batch_max, 1)
        with weights.use():
            for first in range(0, len(clips), size):
                chunk = clips[first : first + size]
                results += await loop.run_in_executor(self._executor, self._embed_usable, chunk)
        return results

    def _encoder(self) -> VoiceEncoder:
        """The encoder, loaded again if it idled out (on the worker thread); a failed load is a 503."""
        assert self.weights is not None
        try:
            return self.weights.get()
        except Exception as exc:
            raise ModelUnavailable(f"the speaker model could not be loaded again: {exc}") from exc

    def _embed_usable(self, clips: list[AudioArray]) -> list[Embedding | None]:
        return _embed_usable(self._encoder(), clips)

    def _embed_batch(self, voices: list[AudioArray]) -> list[tuple[Embedding, float] | BaseException]:
        """Each voice's embedding and seconds of speech, on the worker thread (``ThreadBatches``); a
        sound that is no voice (``speaker_min_voiced_share``) is that one's InvalidAudio."""
        encoder = self._encoder()  # a failed load is every voice's 503
        seconds = [voiced_seconds(audio) for audio in voices]  # (the encoder's VAD over each clip, once)
        problems = [self._no_voice(audio, s) for audio, s in zip(voices, seconds, strict=True)]
        kept = [i for i, problem in enumerate(problems) if problem is None]
        clips = [voices[i] for i in kept]
        try:
            vectors: list[Embedding | BaseException] = list(encoder.embed_batch(clips)) if clips else []
        except ValueError:  # a voice too short to embed: each alone, so only that one fails
            vectors = [_embed_one(encoder, audio) for audio in clips]
        embedded = dict(zip(kept, vectors, strict=True))
        return [
            problem if problem is not None else _with_seconds(embedded[i], seconds[i])
            for i, problem in enumerate(problems)
        ]

    def _no_voice(self, audio: AudioArray, speech_s: float) -> InvalidAudio | None:
        """Why ``audio`` (``speech_s`` of speech once silences are cut) is no voice to embed (steady
        noise the VAD calls speech), or None."""
        needed = self.settings.speaker_min_voiced_share
        if needed <= 0 or speech_s * SAMPLE_RATE_HZ < MIN_SAMPLES:
            return None  # (too little speech to embed: the encoder says so, "too short" not "no voice")
        share = voiced_share(audio)
        if share is None or share >= needed:
            return None  # (no speech at all: the encoder says so itself)
        return InvalidAudio(
            f"no voice in the audio: {share:.0%} of what sounds like speech has a voice's pitch, at least "
            f"{needed:.0%} needed (speaker_min_voiced_share); steady noise is not a voice"
        )

    # --- enrolment and verification ----------------------------------------------------------

    async def enrol(self, name: str, clips: list[AudioArray], *, replace: bool) -> tuple[Speaker, bool]:
        """Enrol ``name`` from ``clips`` (16 kHz): their embeddings' mean. Too little speech is a 400."""
        name = check_name(name)
        if not clips:
            raise InvalidAudio("no audio: send one or more files of the speaker talking")
        results = await asyncio.gather(*(self.embed(clip) for clip in clips), return_exceptions=True)
        usable = [r for r in results if not isinstance(r, BaseException)]
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, InvalidAudio):
                raise result
        speech_s = sum(seconds for _, seconds in usable)
        needed = self.settings.speaker_enrol_min_speech_s
        if speech_s < needed:
            # Each clip left out says why (too short to know the voice, no voice, no speech).
            left_out = "".join(
                f"; clip {i + 1} left out: {r.message}" for i, r in enumerate(results) if isinstance(r, InvalidAudio)
            )
            raise InvalidAudio(
                f"too little speech to enrol {name!r}: {speech_s:.1f} s usable from {len(usable)} of {len(clips)} "
                "clip(s), "
                f"at least {needed:g} s needed (speaker_enrol_min_speech_s); three spoken sentences are enough"
                + left_out
            )
        mean = np.mean([vector * seconds for vector, seconds in usable], axis=0)  # longer clips weigh more
        model = self.model_id or "ge2e"
        speaker = Speaker(
            name, (mean / np.linalg.norm(mean)).astype(np.float32), len(usable), speech_s, time.time(), model
        )
        replaced = await asyncio.to_thread(self.store.put, speaker, replace=replace)
        verb = "re-enrolled" if replaced else "enrolled"
        log.info("speakers: %s a speaker (%d clip(s), %.1f s of speech)", verb, len(usable), speech_s)
        return speaker, replaced

    async def identify(self, audio: AudioArray) -> list[Match]:
        """Every enrolled speaker's similarity to the voice in ``audio`` (its first
        ``speaker_verify_max_s``), best first; empty when nobody is enrolled."""
        speakers = self.store.snapshot()
        if not speakers:
            return []
        limit = int(self.settings.speaker_verify_max_s * SAMPLE_RATE_HZ)
        vector, _ = await self.embed(audio[:limit])
        scores = [Match(s.name, float(np.dot(vector, s.embedding))) for s in speakers]
        return sorted(scores, key=lambda m: m.score, reverse=True)

    def accepted(self, matches: list[Match]) -> list[Match]:
        threshold = self.settings.speaker_threshold
        return [m for m in matches if m.score >= threshold]


def _with_seconds(vector: Embedding | BaseException, seconds: float) -> tuple[Embedding, float] | BaseException:
    return vector if isinstance(vector, BaseException) else (vector, seconds)


def _embed_one(encoder: VoiceEncoder, audio: AudioArray) -> Embedding | BaseException:
    try:
        return encoder.embed(audio)
    except ValueError as exc:  # no speech, or too little of it for one window
        return InvalidAudio(f"not enough speech in the audio to know the voice: {exc}")
    except Exception as exc:
        return exc


def _embed_usable(encoder: VoiceEncoder, clips: list[AudioArray]) -> list[Embedding | None]:
    usable = [i for i, clip in enumerate(clips) if voiced_seconds(clip) * SAMPLE_RATE_HZ >= MIN_SAMPLES]
    vectors = encoder.embed_batch([clips[i] for i in usable])
    found: list[Embedding | None] = [None] * len(clips)
    for i, vector in zip(usable, vectors, strict=True):
        found[i] = vector
    return found


_encoders: dict[Path, VoiceEncoder] = {}
_encoders_lock = threading.Lock()


def _load_encoder(path: Path, *, shared: bool = True) -> VoiceEncoder:
    """An ONNX model for a ``.onnx`` file, GE2E's weights otherwise. ``shared``: one encoder per
    weights file in the process (apps built side by side share it: read-only weights); an encoder
    that idles out (speaker_keep_alive_s) is its service's own, so unloading it frees it."""
    if not shared:
        return _new_encoder(path)
    with _encoders_lock:
        if path not in _encoders:
            _encoders[path] = _new_encoder(path)
        return _encoders[path]


def _new_encoder(path: Path) -> VoiceEncoder:
    return OnnxSpeakerEncoder(path) if path.suffix.lower() == ".onnx" else SpeakerEncoder(path)
