"""The final transcripts of a stream: started at once, sent in order, a bounded number waiting.

A final's transcription enters the shared ASR queue as soon as its utterance ends (or earlier: an
``EarlyFinal`` is decoded during the trailing silence, and is the utterance's final if the
utterance ends on that silence), so the service's ``asr_max_queue`` bounds every session's waiting
finals together and a session's backlog fills batches; only the results wait for the earlier
utterances'. A session with ``stream_max_pending_finals`` finals waiting drops the next utterance
with an ``overloaded`` error. A final is decoded as an upload of its audio would be, with no forced
prefix; a transcription that was refused or failed is tried again once. ``StreamSession``
(session.py) joins each transcript to what its partials promised and sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from mediaserver.asr.scheduler import DeadlineExceeded
from mediaserver.audio.segmenter import Utterance
from mediaserver.errors import ApiError, Overloaded
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray, Priority, SessionEvent, StreamError, Transcript
from mediaserver.stream.options import StreamParent

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass
class EarlyFinal:
    """A final decoded during the trailing silence, before the segmenter ends the utterance.

    It is the utterance's final if the utterance ends on this silence: then its audio is
    ``samples`` long plus exactly the rest of the hangover (any voiced frame would have restarted
    the silence and made the utterance longer).
    """

    task: asyncio.Task[Transcript]
    samples: int
    silence_ms: int
    pause_from_ms: int  # the stream time its pause began (another pause: speech resumed meanwhile)
    speech_ended_at: float  # monotonic: when the speech before this silence ended (the voice latency's zero)
    held: bool = False  # the stream's audio waited for it once (semantic turns: its words are evidence)

    def fits(self, utterance: Utterance) -> bool:
        """Whether this is ``utterance``'s final (it ended on the silence the final started in)."""
        rest = (utterance.silence_ms - self.silence_ms) * SAMPLE_RATE_HZ // 1000
        return utterance.reason in ("silence", "turn") and rest >= 0 and utterance.audio.size == self.samples + rest


class TaskStarter(Protocol):
    """Starts a task of the session (``aclose`` cancels it)."""

    def __call__(self, coro: Coroutine[object, object, _T], name: str) -> asyncio.Task[_T]: ...


class Finals:
    """The final transcriptions of one stream and the chain that sends their results in order."""

    def __init__(self, stream: StreamParent, emit: Callable[[SessionEvent], Awaitable[None]], start_task: TaskStarter):
        self.stream = stream
        self._emit = emit
        self._start_task = start_task
        self._chain: asyncio.Future[None] | None = None
        self._pending = 0  # utterances submitted whose final was not yet sent

    def start(self, audio: AudioArray, name: str) -> asyncio.Task[Transcript]:
        """Put a final's transcription in the ASR queue now.

        A final is decoded as an upload of its audio would be, with no forced prefix: forcing the
        promised text made the decoder continue past it on the trailing silence ("... forever.
        Ferever.") and made short real commands loop. ``continuation`` joins it to the promise.
        """
        stream = self.stream
        options = replace(stream.options.transcription, prefix=None)
        # (a VAD's utterance starts at its preroll: no lead silence; a push-to-talk one at the press)
        vad = stream.options.server_vad
        decode = stream.asr.transcribe(audio, options, model=stream.options.model, priority=Priority.FINAL, stream=vad)
        task = self._start_task(decode, name)
        task.add_done_callback(_retrieve_exception)  # whoever awaits it handles a failure
        return task

    async def submit(
        self,
        audio: AudioArray,
        start_ms: int,
        end_ms: int,
        early: EarlyFinal | None,
        send: Callable[[asyncio.Task[Transcript]], Awaitable[object]],
    ) -> None:
        """Start an utterance's final without blocking the audio path: ``send`` gets its
        transcription (``early``'s, or one started now) once the earlier finals were sent.

        With ``stream_max_pending_finals`` finals already waiting, the utterance is dropped with an
        ``overloaded`` error."""
        stream = self.stream
        previous = self._chain
        limit = stream.settings.stream_max_pending_finals
        if self._pending >= limit:
            if early is not None:
                early.task.cancel()
            stream.asr.metrics.stream_dropped.inc()
            log.info("session %s: utterance %d-%d ms dropped, %d finals waiting", stream.id, start_ms, end_ms, limit)
            await self._emit(
                StreamError(
                    f"server overloaded: {limit} earlier utterances of this session are still waiting for their "
                    "transcripts (stream_max_pending_finals); this one was dropped",
                    Overloaded.code,
                    start_ms,
                    end_ms,
                )
            )
            return
        transcription = early.task if early is not None else self.start(audio, f"transcribe-{stream.id}")
        self._pending += 1

        async def run() -> None:
            try:
                if previous is not None:
                    with contextlib.suppress(Exception):
                        await previous
                await send(transcription)
            except ApiError:
                pass  # transcribe already reported it as a StreamError
            except Exception:
                log.exception("session %s: final transcription failed", stream.id)
                await self._emit(StreamError("transcription failed", "internal_error", start_ms, end_ms))
            finally:
                self._pending -= 1
                transcription.cancel()  # only if this final was cancelled before it was done

        self._chain = self._start_task(run(), f"final-{stream.id}")

    @property
    def pending(self) -> int:
        """Utterances submitted whose final was not sent yet (the one being sent included)."""
        return self._pending

    async def wait(self) -> None:
        """Until the finals submitted so far were sent (or failed)."""
        previous = self._chain
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous

    async def transcribe(
        self, audio: AudioArray, start_ms: int, end_ms: int, early: asyncio.Task[Transcript] | None = None
    ) -> Transcript:
        """The transcript of an utterance; a failure is sent as a ``StreamError`` and raised.

        ``early`` is its transcription already under way (started in the trailing silence, or when
        the utterance ended); if that was refused or failed, the utterance is transcribed again
        here, once: not after it already waited ``asr_request_timeout_s``.
        """
        stream = self.stream
        options = replace(stream.options.transcription, prefix=None)
        transcript: Transcript | None = None
        if early is not None:
            try:
                transcript = await early
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            except DeadlineExceeded as exc:
                await self._emit(StreamError(exc.message, exc.code, start_ms, end_ms))
                raise
            except Exception:
                log.debug("session %s: the started final failed; transcribing again", stream.id)
        try:
            if transcript is None:
                vad = stream.options.server_vad
                transcript = await stream.asr.transcribe(
                    audio, options, model=stream.options.model, priority=Priority.FINAL, stream=vad
                )
        except ApiError as exc:
            await self._emit(StreamError(exc.message, exc.code, start_ms, end_ms))
            raise
        return transcript


def _retrieve_exception(task: asyncio.Task[Transcript]) -> None:
    """An early final that is dropped or fails is not an error of its own (the final retries)."""
    if not task.cancelled():
        task.exception()


def speech_ended_at(silence_ms: int) -> float:
    """When (monotonic) the speech of a stream now ``silence_ms`` into silence ended: the voice
    latency (``mediaserver_voice_latency_seconds``) counts from there, not from the moment the
    pause was judged the end of the turn. Audio fed faster than real time makes it an estimate."""
    return time.monotonic() - silence_ms / 1000.0
