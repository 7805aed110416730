"""The partial transcripts of a stream: what it has promised its client, and the decodes that extend it.

While someone speaks, ``Partials`` decodes the utterance so far on a fixed cadence
(``stream_partial_interval_ms``, the first once it holds ``stream_partial_min_audio_ms``). Partials
are append-only: a word once sent (promised) is never taken back, and the final transcript
extends the promised text. Every decode is unforced (no prefix), so what a decode says after the
promised words is found by lining them up with its start: ``continuation``, an edit distance on
normalised words, so "pairs" / "Paris" or "forever." / "forever," still line up with their twins.
A word is promised once ``stream_partial_agreement`` consecutive hypotheses agree on it (short of
each one's last word, which the next audio may still change), the earliest of them decoded on
``stream_partial_commit_lag_ms`` less audio than the latest. ``PartialPromises`` holds that state
for the utterance in progress. ``StreamSession`` (session.py) owns a ``Partials`` and tells
it when an utterance starts and ends; the final transcript extends the promises by ``continuation``.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from mediaserver.asr.scheduler import DeadlineExceeded, Superseded
from mediaserver.config import Settings
from mediaserver.errors import ApiError, BackendTimeout, BackendUnavailable, Overloaded
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray, PartialTranscript, Priority, SessionEvent, StreamError
from mediaserver.stream.options import StreamParent


def continuation(promised: str, decoded: str) -> str:
    """The text of ``decoded`` (a final decoded without a forced prefix, as an upload is) that comes
    after the words already ``promised`` in partials, so that ``promised + continuation`` is the
    final and never repeats or splits a word at the seam.

    The promised words are aligned to the start of the decode by edit distance on normalised words
    (case and punctuation ignored), so a promised word the final decode spells or punctuates
    differently ("pairs" / "Paris", "forever." / "forever,") still lines up with its twin.
    """
    tokens = decoded.split()
    if not promised.strip():
        return " ".join(tokens)
    said = [word_key(word) for word in promised.split()]
    heard = [word_key(word) for word in tokens]
    # distance[j]: edit distance between all promised words and the decode's first j words.
    previous = list(range(len(heard) + 1))
    for i, word in enumerate(said, start=1):
        current = [i] + [0] * len(heard)
        for j, other in enumerate(heard, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other))
        previous = current
    # Ties: the seam where the decode's word is the last promised one (a promise that missed the
    # decode's first word, "Mr." for "And Mr. John", must not read "Mr." as "And", or the final
    # says "Mr. Mr. John"); then the length nearest the promise's, then the longer.
    last = said[-1]
    best = min(
        range(len(heard) + 1),
        key=lambda j: (previous[j], j == 0 or heard[j - 1] != last, abs(j - len(said)), -j),
    )
    rest = " ".join(tokens[best:])
    return (" " + rest) if rest else ""


def word_key(word: str) -> str:
    """A word as the alignment compares it: lower case, letters, digits and apostrophes only."""
    return "".join(ch for ch in word.lower() if ch.isalnum() or ch == "'")


class PartialPromises:
    """The partial transcript state of one utterance: the text promised so far (``committed``), the
    unstable words shown after it, and the latest hypotheses the agreement rule compares."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.committed = ""  # partial text already sent for the current utterance
        self.unstable = ""  # the words after it in the last partial (unstable_partials)
        # The latest partial hypotheses and the audio (samples) each was decoded on.
        self._hypotheses: collections.deque[tuple[str, int]] = collections.deque(maxlen=32)

    def advance(
        self, hypothesis: str, audio_samples: int | None = None, *, unstable_partials: bool = False
    ) -> PartialTranscript | None:
        """The partial to send for a new hypothesis, or None when nothing the client sees changed.

        It promises the words ``stream_partial_agreement`` consecutive hypotheses agree on, beyond
        what was already promised; with ``unstable_partials`` it also carries the latest
        hypothesis' words after them whenever they change (``unstable``: shown at once, replaced by
        the next partial).

        Each hypothesis is a decode of the utterance so far; what it says after the promised words
        is found by lining them up with its start (``continuation``), so a hypothesis that spells
        or punctuates a promised word differently still counts. ``audio_samples`` is the length of
        the audio it was decoded on (None: as long as needed, for tests of the agreement alone)."""
        samples = audio_samples if audio_samples is not None else (len(self._hypotheses) + 1) * 10**9
        earlier = self._agreeing_window(samples)
        self._hypotheses.append((hypothesis, samples))
        tail = continuation(self.committed, hypothesis).split()
        agreed = self._agreed_words(tail, earlier)
        delta = ""
        if agreed:
            delta = (" " if self.committed else "") + " ".join(agreed)
            self.committed += delta
        unstable = " ".join(tail[len(agreed) :]) if unstable_partials else self.unstable
        if not delta and unstable == self.unstable:
            return None
        self.unstable = unstable
        return PartialTranscript(delta, self.committed, unstable)

    def joined(self, decoded: str) -> str:
        """The promised text and what ``decoded`` (a final's unforced decode) says after it."""
        return self.committed + continuation(self.committed, decoded)

    def forget(self) -> None:
        """The next utterance starts with nothing promised or shown."""
        self.committed = ""
        self.unstable = ""
        self._hypotheses.clear()

    def _agreeing_window(self, samples: int) -> list[str]:
        """The earlier hypotheses a new one (decoded on ``samples``) must agree with: the last
        ``stream_partial_agreement - 1``, and back to one decoded on ``stream_partial_commit_lag_ms``
        less audio, so a promised word has survived that much more context. Empty until enough
        hypotheses have come."""
        needed = max(1, self.settings.stream_partial_agreement - 1)
        lag = self.settings.stream_partial_commit_lag_ms * SAMPLE_RATE_HZ // 1000
        window: list[str] = []
        for hypothesis, size in reversed(self._hypotheses):
            window.append(hypothesis)
            if len(window) >= needed and samples - size >= lag:
                return window
        return []

    def _agreed_words(self, tail: list[str], earlier: list[str]) -> list[str]:
        """The words at the start of ``tail`` (the latest hypothesis after the promised text) that
        every earlier hypothesis has there too, short of each one's last word: the word at the edge
        of the audio heard so far may still change, its punctuation above all ("Americans." becomes
        "Americans, ask" once the next words are heard)."""
        if not earlier:
            return []
        agreed = [word_key(word) for word in tail[:-1]]
        for other in earlier:
            settled = [word_key(word) for word in continuation(self.committed, other).split()[:-1]]
            common = 0
            for mine, theirs in zip(agreed, settled, strict=False):
                if mine != theirs or not mine:
                    break
                common += 1
            agreed = agreed[:common]
        return tail[: len(agreed)]


class _Stream(StreamParent, Protocol):
    """What the partial decodes read of their session (``StreamSession``): what every part reads,
    and whether it is in speech or closed, and the audio of the utterance so far."""

    @property
    def in_speech(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    def current_audio(self) -> AudioArray: ...

    def current_samples(self) -> int: ...

    def heard_so_far(self, words: str) -> None: ...

    def decode_for_prefill(self) -> bool: ...


class Partials:
    """The partial transcripts of one stream: the decode loop of the utterance in progress (one task,
    named ``partials-<session id>``) and what it promised (``promises``)."""

    def __init__(self, stream: _Stream, emit: Callable[[SessionEvent], Awaitable[None]]) -> None:
        self.stream = stream
        self._emit = emit
        self.promises = PartialPromises(stream.settings)
        self._task: asyncio.Task[None] | None = None
        self._failed = False  # a decode of this utterance failed and was said (once an utterance)

    def new_utterance(self) -> None:
        self._failed = False

    def start(self) -> None:
        """Decode the utterance in progress until it ends (or ``cancel``), unless that already runs."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"partials-{self.stream.id}")

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def advance(self, hypothesis: str, audio_samples: int | None = None) -> None:
        """Send the partial a new hypothesis makes (``PartialPromises.advance``), if it changed anything."""
        unstable = self.stream.options.unstable_partials
        partial = self.promises.advance(hypothesis, audio_samples, unstable_partials=unstable)
        if partial is not None:
            await self._emit(partial)

    async def _loop(self) -> None:
        """Partial decodes on a fixed cadence: one starts ``stream_partial_interval_ms`` after the
        last one started (or as soon as it returns, if it took longer), the first once the
        utterance holds ``stream_partial_min_audio_ms`` of audio."""
        stream = self.stream
        interval_s = stream.settings.stream_partial_interval_ms / 1000.0
        min_samples = stream.settings.stream_partial_min_audio_ms * SAMPLE_RATE_HZ // 1000
        last_size = 0
        next_at = 0.0
        try:
            while stream.in_speech and not stream.closed:
                size = stream.current_samples()  # (the audio is joined only for a decode)
                now = time.monotonic()
                wait_s = max(next_at - now, (min_samples - size) / SAMPLE_RATE_HZ)
                if size <= last_size:
                    wait_s = max(wait_s, 0.02)
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                    continue
                audio = stream.current_audio()
                last_size = audio.size
                # From the decode's start, as the docstring says (joining the audio takes a few ms on a
                # busy machine: counted from before it, two starts came 298 ms apart at 300).
                next_at = time.monotonic() + interval_s
                if not stream.options.partials and not stream.decode_for_prefill():
                    continue  # for the prefill alone, and the cores are wanted elsewhere: the next one, maybe
                # Unforced, as the final is: a decode forced to continue the promised text carries
                # one early mishearing into every later partial and into the final.
                # (Word timings are a final's only: they make the decode run unbatched.)
                options = replace(stream.options.transcription, prefix=None, word_timestamps=False)
                try:
                    result = await stream.asr.transcribe(
                        audio,
                        options,
                        model=stream.options.model,
                        priority=Priority.PARTIAL,
                        supersede_key=stream.id,
                        stream=stream.options.server_vad,  # (as its final: stream/finals.py)
                    )
                except (Superseded, Overloaded, DeadlineExceeded, BackendTimeout, BackendUnavailable):
                    continue  # a partial that cannot run now is simply skipped
                except ApiError as exc:
                    # (The model unavailable, say.) Said once an utterance, and tried again at the
                    # cadence: ending the loop here let the next audio start it again at once, an
                    # error per frame (a review: 78 errors in 2 s of speech).
                    if not self._failed:
                        self._failed = True
                        await self._emit(StreamError(exc.message, exc.code))
                    continue
                if not stream.in_speech:
                    return
                if result.guard is not None:
                    continue  # a loop or text on no speech: the next decode comes soon
                if stream.options.partials:  # (else decoded for the question's prefill alone: nothing promised)
                    await self.advance(result.text, audio.size)
                stream.heard_so_far(self.promises.joined(result.text))
        except asyncio.CancelledError:
            pass
        finally:
            if self._task is asyncio.current_task():
                self._task = None
