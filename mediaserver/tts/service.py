"""The app-wide TTS service: voices loaded once, one fair queue each, a response cache, metrics.

Created once per app (aiohttp cleanup_ctx) and shared by every transport: however many clients
speak at once there is one copy of each voice in memory. Transports never call an engine.

Two entry points, both async context managers so that leaving them (normally, by an exception,
or by cancellation: the client went away, the user barged in) drops all of the request's pending
work at once:

- ``speak(text_or_deltas, voice, params)`` yields an async iterator of ``TtsChunk`` (one per
  sentence, in order). ``text_or_deltas`` is a whole text or an async iterable of text deltas
  (LLM tokens, Wyoming ``synthesize-chunk``) that are split into sentences as they arrive.
- ``open(voice, params)`` gives the ``Speech`` itself, for callers that push deltas by hand
  (``feed``/``end``) while iterating the audio elsewhere.

``synthesize`` collects a whole text into one ``SpeechResult``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

import numpy as np

from mediaserver.audio.decode import StreamResampler
from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidParameter, ModelUnavailable
from mediaserver.keep_alive import ModelKeeper, SharedLoads, return_freed_memory
from mediaserver.metrics import Metrics
from mediaserver.tts.cache import TtsCache
from mediaserver.tts.engine import TtsEngine, load_engine
from mediaserver.tts.metrics import TtsMetrics
from mediaserver.tts.scheduler import SentenceStream, StreamClosed, TtsScheduler
from mediaserver.tts.text import SentenceSplitter, readable, split_sentences, ssml_to_text
from mediaserver.tts.types import SpeechResult, SynthesisParams, TtsChunk, VoiceInfo
from mediaserver.tts.voices import VoiceRegistry, check_speaker

log = logging.getLogger(__name__)

# Texts longer than this are split in a thread (pysbd takes ~10 ms per 1000 characters).
_SPLIT_IN_THREAD_CHARS = 500


class TextTooLong(ApiError):
    status = 413
    code = "text_too_long"


@dataclass
class LoadedVoice:
    voice: VoiceInfo
    engine: TtsEngine
    scheduler: TtsScheduler


class Speech:
    """One request: text in (``feed``/``end``), audio out (``async for chunk in speech``)."""

    def __init__(
        self,
        service: TtsService,
        stream: SentenceStream,
        voice: VoiceInfo,
        *,
        sample_rate_hz: int | None,
        first_clause_words: int = 0,
        first_phrase_words: int = 0,
    ) -> None:
        self._service = service
        self._stream = stream
        self.voice = voice
        self.sample_rate_hz = sample_rate_hz or voice.sample_rate_hz
        self._splitter = SentenceSplitter(
            max_sentence_chars=service.settings.tts_max_sentence_chars,
            first_clause_words=first_clause_words,
            first_phrase_words=first_phrase_words,
        )
        self._metrics = service.metrics
        self._started = time.perf_counter()
        self.first_audio_s: float | None = None
        self.characters = 0
        self.audio_s = 0.0
        self.sentences: list[str] = []
        self._finished = False

    def _add(self, sentences: list[str]) -> None:
        for sentence in sentences:
            self.sentences.append(sentence)
            self.characters += len(sentence)
            self._stream.add(sentence)

    def feed(self, delta: str) -> None:
        """More text; complete sentences are queued at once."""
        self._add(self._splitter.push(delta))

    def add_sentences(self, sentences: list[str]) -> None:
        """Sentences already split (``split_sentences``)."""
        self._add(sentences)

    def end(self) -> None:
        """The text is complete: queue the rest."""
        self._add(self._splitter.flush())
        self._stream.end()

    def __aiter__(self) -> AsyncIterator[TtsChunk]:
        return self

    async def __anext__(self) -> TtsChunk:
        chunk = await self._stream.next()
        if chunk is None:
            self._finished = True
            raise StopAsyncIteration
        if chunk.sample_rate_hz != self.sample_rate_hz and chunk.pcm:
            chunk = _resampled(chunk, self.sample_rate_hz)
        if self.first_audio_s is None:
            self.first_audio_s = time.perf_counter() - self._started
            self._metrics.first_audio_seconds.labels(self.voice.name).observe(self.first_audio_s)
        self.audio_s += chunk.duration_s
        return chunk

    @property
    def closed(self) -> bool:
        return self._stream.closed

    def close(self) -> None:
        """Drop what is not yet synthesized and record the request. Idempotent."""
        if self._stream.closed:
            return
        self._stream.close("the request ended")
        outcome = "ok" if self._finished else "cancelled"
        name = self.voice.name
        self._metrics.requests.labels(name, outcome).inc()
        self._metrics.characters.labels(name).inc(self.characters)
        self._metrics.audio_seconds.labels(name).inc(self.audio_s)


def _resampled(chunk: TtsChunk, rate_hz: int) -> TtsChunk:
    """One sentence to another rate with libswresample (each sentence starts and ends in silence,
    so resampling them one by one leaves no seam)."""
    resampler = StreamResampler(chunk.sample_rate_hz, rate_hz)
    samples = chunk.as_array().astype(np.float32) / 32768.0
    out = np.concatenate([resampler.push(samples), resampler.flush()])
    pcm = (np.clip(out, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    return TtsChunk(pcm, rate_hz, chunk.sentence, chunk.sentence_index, chunk.voice, chunk.synth_time_s)


class TtsService:
    def __init__(self, settings: Settings, metrics: Metrics, registry: VoiceRegistry | None = None) -> None:
        self.settings = settings
        self.voices = registry or VoiceRegistry(settings)
        self.app_metrics = metrics
        self.metrics = TtsMetrics.of(metrics)
        self.cache = TtsCache(
            max_bytes=settings.tts_cache_max_bytes,
            max_entry_bytes=settings.tts_cache_max_entry_bytes,
            metrics=self.metrics,
        )
        self._loaded: OrderedDict[str, LoadedVoice] = OrderedDict()
        self._load_locks: dict[str, asyncio.Lock] = {}
        self._loading: SharedLoads[LoadedVoice] = SharedLoads("tts")  # one load per cold start
        self._closed = False
        # Idle unload of voices (tts_keep_alive_s): a voice unused that long leaves memory.
        self.keeper = ModelKeeper("tts", settings.tts_keep_alive_s, metrics, self._unload_idle)

    @property
    def loaded_voices(self) -> list[str]:
        return list(self._loaded)

    async def start(self) -> None:
        """Load the default voice now, so the first request does not wait for it."""
        if self.settings.tts_preload_default_voice:
            await self.load(await self.voice(None))

    # --- validation (shared by every transport) ---------------------------------------------

    async def voice(self, name: str | None, *, language: str | None = None) -> VoiceInfo:
        """The voice a request names (an alias, a voice, a downloadable Piper name) or the default."""
        return await self.voices.resolve_or_download(name, language=language)

    def check_text(self, text: str, *, param: str = "text") -> str:
        """Refuse empty text and text with nothing to read (no letter or digit: 400), and text past
        ``tts_max_input_chars`` (413)."""
        if not text or not text.strip():
            raise InvalidParameter(f"{param!r} is empty: there is nothing to say", param=param)
        if not readable(text):  # (no sentence of it would be read: an empty file)
            raise InvalidParameter(f"{param!r} has no words or numbers to say, only marks: {text[:40]!r}", param=param)
        limit = self.settings.tts_max_input_chars
        if len(text) > limit:
            raise TextTooLong(
                f"{param!r} has {len(text)} characters; the limit is {limit} (tts_max_input_chars)", param=param
            )
        return text

    def check_speed(self, speed: float, *, param: str = "speed") -> float:
        low, high = self.settings.tts_min_speed, self.settings.tts_max_speed
        if not low <= speed <= high:
            raise InvalidParameter(f"{param!r} must be between {low} and {high}, got {speed}", param=param)
        return speed

    async def split(self, text: str) -> list[str]:
        """A whole text's sentences (SSML read as its words), off the event loop when the text is long."""
        text = ssml_to_text(text)
        limit = self.settings.tts_max_sentence_chars
        if len(text) > _SPLIT_IN_THREAD_CHARS:
            return await asyncio.to_thread(split_sentences, text, max_sentence_chars=limit)
        return split_sentences(text, max_sentence_chars=limit)

    # --- voices -------------------------------------------------------------------------------

    async def load(self, voice: VoiceInfo) -> LoadedVoice:
        """The loaded voice (one copy, shared by every request), loading it on first use."""
        if self._closed:
            raise ModelUnavailable("the TTS service is shutting down")
        loaded = self._loaded.get(voice.name)
        if loaded is not None:
            self._loaded.move_to_end(voice.name)
            return loaded
        return await self._loading.load(voice.name, lambda: self._load_once(voice))

    async def _load_once(self, voice: VoiceInfo) -> LoadedVoice:
        async with self._load_locks.setdefault(voice.name, asyncio.Lock()):
            loaded = self._loaded.get(voice.name)
            if loaded is not None:
                return loaded
            if self._closed:
                raise ModelUnavailable("the TTS service is shutting down")
            started = time.perf_counter()
            try:
                engine = await asyncio.to_thread(load_engine, voice, self.settings)
            except Exception as exc:
                log.exception("loading TTS voice %s failed", voice.name)
                error = ModelUnavailable(f"voice {voice.name!r} could not be loaded: {exc}")
                self.keeper.load_failed(voice.name, error.message)
                raise error from exc
            scheduler = TtsScheduler(
                engine,
                workers=self.settings.tts_workers_per_voice,
                max_streams=self.settings.tts_max_queue,
                lookahead=self.settings.tts_lookahead_sentences,
                metrics=self.metrics,
            )
            scheduler.start()
            loaded = LoadedVoice(voice, engine, scheduler)
            if self._closed:  # it shut down meanwhile
                await self._unload(loaded)
                raise ModelUnavailable("the TTS service is shutting down")
            self._loaded[voice.name] = loaded
            self.keeper.loaded(voice.name, time.perf_counter() - started)
            await self._evict_over_limit(keep=voice.name)
            return loaded

    async def _unload_idle(self, name: str) -> bool:
        """The keeper's idle unload: under the voice's load lock, never with a request open on it."""
        async with self._load_locks.setdefault(name, asyncio.Lock()):
            loaded = self._loaded.get(name)
            if loaded is None or self._closed or self.keeper.in_use(name) or loaded.scheduler.open_streams:
                return False
            del self._loaded[name]
            await self._unload(loaded)
            self.keeper.unloaded(name, "idle")
            return True

    async def _evict_over_limit(self, *, keep: str) -> None:
        while len(self._loaded) > self.settings.tts_max_loaded_voices:
            idle = (n for n, v in self._loaded.items() if v.scheduler.open_streams == 0 and n != keep)
            victim = next(idle, None)
            if victim is None:
                return
            log.info("unloading TTS voice %s (tts_max_loaded_voices=%d)", victim, self.settings.tts_max_loaded_voices)
            await self._unload(self._loaded.pop(victim))
            self.keeper.unloaded(victim, "limit")

    @staticmethod
    async def _unload(loaded: LoadedVoice) -> None:
        await loaded.scheduler.aclose()

        def free() -> None:
            loaded.engine.close()
            return_freed_memory()

        await asyncio.to_thread(free)

    # --- speaking -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def open(
        self,
        voice: VoiceInfo,
        params: SynthesisParams,
        *,
        sample_rate_hz: int | None = None,
        first_clause_words: int = 0,
        first_phrase_words: int = 0,
    ) -> AsyncIterator[Speech]:
        """A request with its own place in the voice's queue (``Overloaded`` → 503 when full).

        On leaving, whatever was not synthesized yet is dropped. ``first_clause_words``,
        ``first_phrase_words``: see ``SentenceSplitter`` (a conversation's answer starts sooner at
        its first clause or phrase). A speaker the voice does not have is a 400
        (``UnknownSpeaker``), not its default speaker.
        """
        check_speaker(voice, params.speaker)
        with self.keeper.use(voice.name):  # the voice stays loaded until the request is done
            loaded = await self.load(voice)
            stream = loaded.scheduler.open(params)
            speech = Speech(
                self,
                stream,
                voice,
                sample_rate_hz=sample_rate_hz,
                first_clause_words=first_clause_words,
                first_phrase_words=first_phrase_words,
            )
            try:
                yield speech
            finally:
                speech.close()

    @contextlib.asynccontextmanager
    async def speak(
        self,
        text: str | AsyncIterable[str],
        voice: VoiceInfo,
        params: SynthesisParams | None = None,
        *,
        sample_rate_hz: int | None = None,
    ) -> AsyncIterator[Speech]:
        """Text (whole, or deltas as they arrive) in, ``TtsChunk``s out, first sentence first."""
        params = params or SynthesisParams()
        async with self.open(voice, params, sample_rate_hz=sample_rate_hz) as speech:
            if isinstance(text, str):
                speech.add_sentences(await self.split(text))
                speech.end()
                yield speech
                return
            feeder = asyncio.get_running_loop().create_task(_feed(speech, text), name="tts-text-feeder")
            try:
                yield speech
            finally:
                feeder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feeder

    async def synthesize(
        self,
        text: str,
        voice: VoiceInfo,
        params: SynthesisParams | None = None,
        *,
        sample_rate_hz: int | None = None,
    ) -> SpeechResult:
        """A whole text → one ``SpeechResult`` (all sentences joined)."""
        parts: list[bytes] = []
        async with self.speak(text, voice, params, sample_rate_hz=sample_rate_hz) as speech:
            async for chunk in speech:
                parts.append(chunk.pcm)
            return SpeechResult(
                b"".join(parts),
                speech.sample_rate_hz,
                voice.name,
                tuple(speech.sentences),
                speech.first_audio_s or 0.0,
            )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.keeper.aclose()
        await self._loading.settle()
        for loaded in list(self._loaded.values()):
            await self._unload(loaded)
        self._loaded.clear()
        self.cache.clear()


async def _feed(speech: Speech, deltas: AsyncIterable[str]) -> None:
    """Pass deltas to ``speech`` as they arrive; end it when they stop.

    A failing source ends the text where it broke: what was said so far is still spoken.
    """
    try:
        async for delta in deltas:
            speech.feed(delta)
    except StreamClosed:
        return
    except Exception:
        log.exception("the text source of a TTS request failed")
    if not speech.closed:
        speech.end()
