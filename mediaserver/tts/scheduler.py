"""One fair queue per loaded voice: work is a sentence, served round-robin across requests.

Each request is a ``SentenceStream``: sentences go in as the text is split (all at once, or as an
LLM or Home Assistant sends more), audio comes out in order. The voice's workers (``workers``
asyncio tasks, each handing one sentence at a time to a thread of its own) take the next sentence
from the next request in turn, so a short answer that arrives behind a long text waits for at most
one sentence per worker, never for the long text's whole length (a new request is the next in
turn, so its first sentence only waits for the ones already running).

A request runs at most ``lookahead`` sentences ahead of what its consumer has taken: a client that
reads slowly (or stopped reading) holds back only its own synthesis. Its first sentence runs
alone, so a second worker never slows the first audio down by sharing its cores. Closing a stream (the client
went away, the caller stopped iterating, barge-in) drops every sentence of it not yet started at
once; one already running in a thread finishes there, and its audio is discarded.

The queue is bounded by requests: at most ``max_streams`` may be open per voice; one more is
refused at once with ``Overloaded`` (a 503) rather than waiting behind an ever-longer backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mediaserver.errors import Overloaded
from mediaserver.tts.engine import TtsEngine
from mediaserver.tts.metrics import TtsMetrics
from mediaserver.tts.types import SynthesisParams, TtsChunk

log = logging.getLogger(__name__)


@dataclass
class _Job:
    index: int
    sentence: str


class StreamClosed(Exception):
    """The stream was closed (by its owner or because the service shut down)."""


class SentenceStream:
    """One request's sentences through the scheduler; ``next()`` returns audio in sentence order."""

    def __init__(self, scheduler: TtsScheduler, params: SynthesisParams, stream_id: int) -> None:
        self._scheduler = scheduler
        self.params = params
        self.id = stream_id
        self._pending: deque[_Job] = deque()
        self._inflight = 0
        self._results: dict[int, TtsChunk | BaseException] = {}
        self._added = 0
        self._taken = 0
        self._input_done = False
        self._closed: str | None = None
        self._changed = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def sentences_added(self) -> int:
        return self._added

    @property
    def sentences_pending(self) -> int:
        """Sentences not yet started."""
        return len(self._pending)

    def add(self, sentence: str) -> None:
        if self._closed is not None:
            raise StreamClosed(self._closed)
        if self._input_done:
            raise RuntimeError("add() after end()")
        self._pending.append(_Job(self._added, sentence))
        self._added += 1
        self._scheduler.wake()

    def end(self) -> None:
        """No more sentences will be added."""
        self._input_done = True
        self._changed.set()

    def _eligible(self, lookahead: int) -> bool:
        if not self._pending:
            return False
        if self._inflight and self._taken == 0 and not self._results:
            # The first sentence runs alone: a second one beside it would share its cores and
            # delay the first audio (measured: 2 workers doubled time to first audio).
            return False
        return self._inflight + len(self._results) < lookahead

    def _deliver(self, index: int, result: TtsChunk | BaseException) -> None:
        self._results[index] = result
        self._changed.set()

    async def next(self) -> TtsChunk | None:
        """The next sentence's audio; None once every added sentence was returned after ``end()``."""
        while True:
            if self._closed is not None:
                raise StreamClosed(self._closed)
            result = self._results.pop(self._taken, None)
            if result is not None:
                self._taken += 1
                self._scheduler.wake()  # room in the lookahead window
                if isinstance(result, BaseException):
                    raise result
                return result
            if self._input_done and self._taken >= self._added:
                self._scheduler.release(self)
                return None
            self._changed.clear()
            await self._changed.wait()

    def close(self, reason: str = "closed") -> int:
        """Drop everything not yet started; return how many sentences were dropped. Idempotent."""
        if self._closed is not None:
            return 0
        self._closed = reason
        dropped = len(self._pending)
        self._pending.clear()
        self._results.clear()
        self._changed.set()
        self._scheduler.release(self, dropped=dropped)
        return dropped


class TtsScheduler:
    def __init__(
        self,
        engine: TtsEngine,
        *,
        workers: int,
        max_streams: int,
        lookahead: int,
        metrics: TtsMetrics,
    ) -> None:
        self.engine = engine
        self.voice = engine.voice.name
        self._workers_wanted = max(1, workers)
        self._max_streams = max_streams
        self._lookahead = max(1, lookahead)
        self._metrics = metrics
        self._streams: list[SentenceStream] = []
        self._turn = 0
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=self._workers_wanted, thread_name_prefix=f"tts-{self.voice}")
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.sentences_done = 0
        self.busy_s = 0.0

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def drain_estimate_s(self) -> float | None:
        """How long the sentences queued now take at the measured time per sentence (None before
        any was measured); what a refused request is told to wait (``Retry-After``)."""
        if not self.sentences_done:
            return None
        queued = sum(len(stream._pending) + stream._inflight for stream in self._streams)
        return max(1, queued) * (self.busy_s / self.sentences_done) / self._workers_wanted

    def start(self) -> None:
        if not self._tasks and not self._closed:
            loop = asyncio.get_running_loop()
            self._tasks = [
                loop.create_task(self._work(), name=f"tts-worker-{self.voice}-{i}") for i in range(self._workers_wanted)
            ]

    def open(self, params: SynthesisParams) -> SentenceStream:
        """A new request's stream; ``Overloaded`` when ``max_streams`` are already open."""
        if self._closed:
            raise Overloaded("the TTS service is shutting down")
        if len(self._streams) >= self._max_streams:
            self._metrics.rejected.labels(self.voice).inc()
            raise Overloaded(
                f"server overloaded: {len(self._streams)} speech requests are already queued for voice "
                f"{self.voice!r}; retry later",
                retry_after_s=self.drain_estimate_s(),
            )
        self.start()
        stream = SentenceStream(self, params, next(self._ids))
        # A new request goes next in the rotation: its first sentence waits for at most the ones
        # already running, which keeps time to first audio short under load.
        self._streams.insert(self._turn, stream)
        self._metrics.queue_depth.labels(self.voice).set(len(self._streams))
        return stream

    def wake(self) -> None:
        self._wake.set()

    def release(self, stream: SentenceStream, *, dropped: int = 0) -> None:
        if stream in self._streams:
            position = self._streams.index(stream)
            self._streams.remove(stream)
            if position < self._turn:
                self._turn -= 1
            self._metrics.queue_depth.labels(self.voice).set(len(self._streams))
        if dropped:
            self._metrics.dropped_sentences.labels(self.voice).inc(dropped)

    def _pick(self) -> tuple[SentenceStream, _Job] | None:
        """Round-robin: the next stream after the last one served that may run a sentence."""
        count = len(self._streams)
        for step in range(count):
            position = (self._turn + step) % count
            stream = self._streams[position]
            if stream._eligible(self._lookahead):
                self._turn = (position + 1) % count
                stream._inflight += 1
                return stream, stream._pending.popleft()
        return None

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            picked = self._pick()
            if picked is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            stream, job = picked
            started = time.perf_counter()
            result: TtsChunk | BaseException
            try:
                pcm = await loop.run_in_executor(self._executor, self.engine.synthesize, job.sentence, stream.params)
                elapsed = time.perf_counter() - started
                result = TtsChunk(
                    pcm.astype("<i2", copy=False).tobytes(),
                    self.engine.voice.sample_rate_hz,
                    job.sentence,
                    job.index,
                    self.voice,
                    elapsed,
                )
                self._observe(result, elapsed)
            except asyncio.CancelledError:
                stream._inflight -= 1
                raise
            except Exception as exc:
                log.exception("TTS synthesis failed on voice %s", self.voice)
                result = exc
            stream._inflight -= 1
            if not stream.closed:
                stream._deliver(job.index, result)
            self.wake()

    def _observe(self, chunk: TtsChunk, elapsed: float) -> None:
        self.sentences_done += 1
        self.busy_s += elapsed
        self._metrics.sentences.labels(self.voice).inc()
        self._metrics.synthesis_seconds.labels(self.voice).observe(elapsed)
        if chunk.duration_s > 0:
            self._metrics.real_time_factor.labels(self.voice).observe(elapsed / chunk.duration_s)

    async def aclose(self) -> None:
        """Close every stream, stop the workers and release the threads (the engine stays: its
        owner closes it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for stream in list(self._streams):
            stream.close("the TTS service is shutting down")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
