"""Who is speaking: enrolment and verification on the speaker encoder (encoder.py).

One worker thread runs every embedding, so the event loop never waits on it; voices of several
requests that arrive while it works are embedded together in the next batch (up to
``speaker_batch_max``), as the turn model batches pauses. A voice is compared with every enrolled
speaker by cosine similarity; those at ``speaker_threshold`` or more are its matches, best first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mediaserver.config import Settings
from mediaserver.errors import InvalidAudio, ModelUnavailable
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray
from mediaserver.speakers.encoder import MIN_SAMPLES, SpeakerEncoder, voiced_seconds
from mediaserver.speakers.fetch import default_path
from mediaserver.speakers.onnx_encoder import OnnxSpeakerEncoder
from mediaserver.speakers.store import Embedding, Speaker, SpeakerStore, check_name

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


@dataclass
class _Request:
    audio: AudioArray
    future: asyncio.Future[tuple[Embedding, float]]
    loop: asyncio.AbstractEventLoop


class SpeakerService:
    """The encoder on its worker thread and the store of enrolled speakers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = SpeakerStore(store_dir(settings), settings.speakers_max)
        self.encoder: VoiceEncoder | None = None
        self.problem: str | None = "not started"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speakers")
        self._lock = threading.Lock()
        self._queue: list[_Request] = []
        self._draining = False

    async def start(self) -> None:
        """Load the encoder and the store off the event loop; a missing model turns speakers off."""
        path = model_path(self.settings)

        def load() -> None:
            if not path.is_file():
                self.problem = (
                    f"the speaker model {path} is missing (fetch it with `make setup` or "
                    "`python -m mediaserver.speakers.fetch`)"
                )
            else:
                try:
                    self.encoder = _load_encoder(path)
                    self.problem = None
                except Exception as exc:
                    self.problem = f"the speaker model {path} could not be loaded: {exc}"
            # Speakers another model enrolled are left out (named in /health) while this one runs.
            self.store.load(self.encoder.model_id if self.encoder is not None else None)

        await asyncio.get_running_loop().run_in_executor(self._executor, load)
        if self.problem is not None:
            log.warning("speakers are off: %s", self.problem)
        else:
            log.info("speaker model loaded from %s", path)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)

    def status(self) -> dict[str, Any]:
        """What ``/health`` says of speakers (never who is enrolled: only how many)."""
        return {
            "available": self.problem is None,
            "reason": self.problem,
            "model": self.encoder.model_id if self.encoder is not None else None,
            "enrolled": len(self.store),
            "threshold": self.settings.speaker_threshold,
            "store_problems": list(self.store.problems),
        }

    # --- embeddings ------------------------------------------------------------------------

    async def embed(self, audio: AudioArray) -> tuple[Embedding, float]:
        """The voice's embedding and its seconds of speech, on the worker thread (batched with
        other requests' voices). Raises InvalidAudio when there is no speech to embed."""
        if self.encoder is None:
            raise ModelUnavailable(f"speaker recognition is off: {self.problem}")
        loop = asyncio.get_running_loop()
        request = _Request(audio, loop.create_future(), loop)
        with self._lock:
            self._queue.append(request)
            start = not self._draining
            self._draining = True
        if start:
            self._executor.submit(self._drain)
        return await request.future

    async def embed_windows(self, clips: list[AudioArray]) -> list[Embedding | None]:
        """Each clip's embedding, None for one with too little speech (diarization's windows), on the
        worker thread in batches of ``speaker_batch_max`` clips between other requests' voices."""
        encoder = self.encoder
        if encoder is None:
            raise ModelUnavailable(f"speaker recognition is off: {self.problem}")
        loop = asyncio.get_running_loop()
        results: list[Embedding | None] = []
        size = max(self.settings.speaker_batch_max, 1)
        for first in range(0, len(clips), size):
            chunk = clips[first : first + size]
            results += await loop.run_in_executor(self._executor, _embed_usable, encoder, chunk)
        return results

    def _drain(self) -> None:
        encoder = self.encoder
        assert encoder is not None
        batch_max = self.settings.speaker_batch_max
        while True:
            with self._lock:
                batch = [r for r in self._queue[:batch_max] if not r.future.done()]
                del self._queue[:batch_max]
                if not batch and not self._queue:
                    self._draining = False
                    return
            try:
                vectors: list[Embedding | BaseException] = list(encoder.embed_batch([r.audio for r in batch]))
            except ValueError:  # a voice too short to embed: each alone, so only that one fails
                vectors = [_embed_one(encoder, r.audio) for r in batch]
            except Exception as exc:
                vectors = [exc] * len(batch)
            for request, vector in zip(batch, vectors, strict=True):
                if isinstance(vector, BaseException):
                    request.loop.call_soon_threadsafe(_fail, request.future, vector)
                else:
                    seconds = voiced_seconds(request.audio)
                    request.loop.call_soon_threadsafe(_resolve, request.future, (vector, seconds))

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
            raise InvalidAudio(
                f"too little speech to enrol {name!r}: {speech_s:.1f} s heard in {len(clips)} clip(s), "
                f"at least {needed:g} s needed (speaker_enrol_min_speech_s); three spoken sentences are enough"
            )
        mean = np.mean([vector * seconds for vector, seconds in usable], axis=0)  # longer clips weigh more
        model = self.encoder.model_id if self.encoder is not None else "ge2e"
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


def _load_encoder(path: Path) -> VoiceEncoder:
    """One encoder per weights file in the process (apps built side by side share it: read-only
    weights): an ONNX model for a ``.onnx`` file, GE2E's weights otherwise."""
    with _encoders_lock:
        if path not in _encoders:
            _encoders[path] = OnnxSpeakerEncoder(path) if path.suffix.lower() == ".onnx" else SpeakerEncoder(path)
        return _encoders[path]


def _resolve(future: asyncio.Future[tuple[Embedding, float]], result: tuple[Embedding, float]) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[tuple[Embedding, float]], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
