"""Remote ASR engines: the shared part of the Triton and OpenAI-compatible backends.

A remote engine stands where a local ``WhisperEngine`` stands, behind the same scheduler (queue,
priorities, deadlines, metrics), but the decoding happens in another server. What stays here:

- the cheap VAD gate, so silence never leaves the machine (an empty transcript at once);
- one upstream request at a time per slot of ``max_concurrency``, each under ``timeout_s``, retried
  ``retries`` times with backoff after a connection error (``Unreachable``): the connection could not
  be made, or it broke before an answer came (reset, a pooled keep-alive connection the server had
  closed, Triton's ``UNAVAILABLE``), so the audio may have been sent. That is safe because a
  transcription changes nothing upstream: a repeat costs at most a second decode. A timeout or an
  error answer is never retried;
- faults in the protocol's own shape: unreachable, an error answer or garbage is a 502
  ``BackendUnavailable`` naming the backend, a slow answer a 504 ``BackendTimeout``; one bad job of a
  batch fails alone;
- the backend's state for ``/health`` and ``mediaserver_asr_backend_up``: refreshed by a periodic
  probe in the background and by every real request, so ``/health`` only reads a cached value.

The batch call is async and awaited on the event loop (``AsrScheduler``'s ``async_batch_fn``): the
work is elsewhere, so no thread is needed, several batches can be in flight, and a batch whose
callers all went away is cancelled together with its upstream requests.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from mediaserver.asr.engine import AsrJob
from mediaserver.asr.guards import GUARD_REASONS, GuardConfig, GuardReason, check_text
from mediaserver.audio.vad import VadConfig, has_speech, speech_ms
from mediaserver.config import RemoteModel
from mediaserver.errors import ApiError, BackendTimeout, BackendUnavailable
from mediaserver.events import SAMPLE_RATE_HZ, Segment, Transcript
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")


# The temperature of a guarded answer's second request: Whisper's greedy decode repeats its loop on
# the same audio, and sampling at a temperature Whisper's own fallback reaches breaks it.
SAFE_TEMPERATURE: tuple[float, ...] = (0.4,)


@dataclass(frozen=True)
class BackendState:
    """What ``/health`` shows of one backend: ``up`` is None until the first probe or request."""

    up: bool | None
    reason: str
    checked_at: float  # time.monotonic() of the observation


def redact_url(url: str) -> str:
    """The URL without credentials, for messages and ``/health``."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class Unreachable(Exception):
    """Raised by a backend's request when the connection could not be made: safe to retry."""


_WORD = re.compile(r"[^\w']+")


def _norm(word: str) -> str:
    return _WORD.sub("", word.lower())


def force_prefix(prefix: str | None, text: str) -> str:
    """Make ``text`` start with ``prefix``, as the local engine's forced decoder prefix does.

    A streaming session promises its partials' text as the start of the final. The OpenAI API has
    no forced prefix (and an upstream may not honour Triton's TEXT_PREFIX text), so the words of the
    new transcript are aligned to the promised ones and the rest appended: the promised words win
    where the two disagree, and the final still extends every partial sent.
    """
    if not prefix or text.startswith(prefix):
        return text
    promised = prefix.split()
    heard = text.split()
    count = len(promised)
    if [_norm(w) for w in heard[:count]] == [_norm(w) for w in promised]:
        rest = heard[count:]
    else:
        # The hypothesis may have split or merged a word: resume after the promised last word
        # where it is found near the expected place, else after as many words as were promised.
        last = _norm(promised[-1])
        found = next(
            (
                j
                for j in (count, count - 1, count + 1, count - 2, count + 2)
                if 0 < j <= len(heard) and _norm(heard[j - 1]) == last
            ),
            count,
        )
        rest = heard[found:]
    return " ".join([prefix.strip(), *rest]).strip()


class RemoteEngine(abc.ABC):
    """One model served by a remote backend: limits, retries, errors, state; subclasses speak the protocol."""

    kind: str = "remote"
    samples: bool = True  # a single temperature in the options is honoured (guarded answers are asked again)

    def __init__(
        self,
        name: str,
        config: RemoteModel,
        *,
        vad: VadConfig | None = None,
        metrics: Metrics | None = None,
        default_language: str = "en",
        guards: GuardConfig | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.multilingual = config.multilingual
        self.url = redact_url(config.url)
        self.guards = guards or GuardConfig()
        self.counters: dict[str, int] = {
            "jobs_alone": 0,
            **{f"guard_{action}_{reason}": 0 for action in ("redecode", "keep") for reason in GUARD_REASONS},
        }
        self._vad = vad or VadConfig()
        self._metrics = metrics
        self._default_language = default_language
        self._limit = asyncio.Semaphore(config.max_concurrency)
        self._state = BackendState(None, "not checked yet", time.monotonic())
        self._probe_task: asyncio.Task[None] | None = None

    @property
    def label(self) -> str:
        """How errors name the backend: ``the triton backend at grpc://host:8001 (model 'large')``."""
        return f"the {self.kind} backend at {self.url} (model {self.name!r})"

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background probe (never blocks: an unreachable backend only shows as down)."""
        if self._probe_task is None:
            self._probe_task = asyncio.get_running_loop().create_task(self._probe_loop(), name=f"probe-{self.name}")

    async def aclose(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        await self._close()

    async def _probe_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(min(self.config.timeout_s, self.config.probe_interval_s)):
                    await self._probe()
                self._observe(True, "answered its health check")
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                self._observe(False, "health check timed out")
            except Exception as exc:
                self._observe(False, f"health check failed: {_describe(exc)}")
            await asyncio.sleep(self.config.probe_interval_s)

    def _observe(self, up: bool, reason: str) -> None:
        if self._state.up is not up:
            log.log(logging.INFO if up else logging.WARNING, "%s is %s: %s", self.label, "up" if up else "down", reason)
        self._state = BackendState(up, reason, time.monotonic())
        if self._metrics is not None:
            self._metrics.backend_up.labels(self.name, self.kind).set(1 if up else 0)

    def status(self) -> dict[str, Any]:
        """The cached state for ``/health``."""
        state = self._state
        return {
            "backend": self.kind,
            "url": self.url,
            "state": "unknown" if state.up is None else "up" if state.up else "down",
            "reason": state.reason,
            "checked_s_ago": round(time.monotonic() - state.checked_at, 1),
        }

    @property
    def is_down(self) -> bool:
        return self._state.up is False

    # --- the batch call ---------------------------------------------------------------------

    async def transcribe_batch_async(
        self, jobs: Sequence[AsrJob], backlog: int = 0
    ) -> list[Transcript | BaseException]:
        """One result per job; silence is answered here, the rest goes upstream (``backlog`` is unused:
        packing needs the local decoder's timestamps, so remote jobs are never packed)."""
        started = time.perf_counter()
        results: list[Transcript | BaseException | None] = [None] * len(jobs)
        speech: list[int] = []
        for index, job in enumerate(jobs):
            if has_speech(job.audio, self._vad):
                speech.append(index)
            else:
                results[index] = self.empty(job, time.perf_counter() - started)
        if speech:
            self.counters["jobs_alone"] += len(speech)
            answers = await self._transcribe([jobs[i] for i in speech])
            guarded = await self._guarded([jobs[i] for i in speech], answers)
            for index, answer in zip(speech, guarded, strict=True):
                results[index] = answer
        return [r if r is not None else RuntimeError("job produced no result") for r in results]

    # --- guards (asr/guards.py), as the local engine applies them -------------------------------

    async def _guarded(
        self, jobs: Sequence[AsrJob], answers: list[Transcript | BaseException]
    ) -> list[Transcript | BaseException]:
        """The answers, a decode that trips a loop or hallucination guard marked (partials) or asked
        for once more the safe way (finals, uploads): no prompt or forced prefix, and a sampling
        temperature instead of the greedy decode that looped (the backend's window is its own).
        A second answer that still trips a guard and is longer gives way to the first. A backend
        that decodes greedily whatever it is asked (``samples`` False: Triton) is not asked again:
        its first answer is kept, marked. The voiced time is measured off the event loop."""
        results = list(answers)
        texts = [i for i, a in enumerate(answers) if isinstance(a, Transcript) and a.text.strip()]
        if not texts:
            return results
        voiced = dict(
            zip(
                texts,
                await asyncio.to_thread(lambda: [speech_ms(jobs[i].audio, self._vad) / 1000.0 for i in texts]),
                strict=True,
            )
        )
        again: list[tuple[int, GuardReason]] = []
        for index in texts:
            job, answer = jobs[index], answers[index]
            assert isinstance(answer, Transcript)
            reason = check_text(answer.text, voiced[index], self.guards)
            if reason is None:
                continue
            self.counters[f"guard_{job.on_guard}_{reason}"] += 1
            if job.on_guard == "keep":
                results[index] = replace(answer, guard=reason)
            elif reason == "no_speech":
                results[index] = replace(self.empty(job, answer.infer_time_s), guard=reason)
            elif not self.samples:
                results[index] = replace(answer, guard=reason)
            else:
                log.info(
                    "%s: an answer of %d words tripped the %s guard; asking again",
                    self.label,
                    len(answer.text.split()),
                    reason,
                )
                again.append((index, reason))
        if again:
            safe = [
                replace(
                    jobs[i],
                    options=replace(jobs[i].options, prefix=None, initial_prompt=None, temperature=SAFE_TEMPERATURE),
                )
                for i, _ in again
            ]
            for (index, reason), retry in zip(again, await self._transcribe(safe), strict=True):
                first = answers[index]
                assert isinstance(first, Transcript)
                if not isinstance(retry, Transcript) or (
                    check_text(retry.text, voiced[index], self.guards) is not None and len(retry.text) > len(first.text)
                ):
                    retry = first
                results[index] = replace(retry, guard=reason, infer_time_s=first.infer_time_s + retry.infer_time_s)
        return results

    @abc.abstractmethod
    async def _transcribe(self, jobs: Sequence[AsrJob]) -> list[Transcript | BaseException]:
        """Transcribe jobs that hold speech; a failed job is its (ApiError) exception."""

    @abc.abstractmethod
    async def _probe(self) -> None:
        """Raise unless the backend answers and serves the model."""

    async def _close(self) -> None:  # noqa: B027 - optional hook
        """Release the client's connections."""

    # --- one upstream request -----------------------------------------------------------------

    async def call(self, request: Callable[[], Awaitable[T]]) -> T:
        """Run one upstream request under the concurrency limit, the timeout and the connect retries.

        ``request`` raises ``Unreachable`` when no connection could be made (retried), an
        ``ApiError`` for a bad answer, anything else for a failure of the backend (both 502s).
        """
        config = self.config
        async with self._limit:
            for attempt in range(config.retries + 1):
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(config.timeout_s):
                        result = await request()
                except TimeoutError:
                    self._count("timeout", started)
                    raise BackendTimeout(
                        f"{self.label} did not answer within {config.timeout_s:g} s; retry later"
                    ) from None
                except Unreachable as exc:
                    self._count("unreachable", started)
                    if attempt < config.retries:
                        await asyncio.sleep(config.retry_backoff_ms / 1000.0 * 2**attempt)
                        continue
                    self._observe(False, f"unreachable: {exc}")
                    raise BackendUnavailable(f"{self.label} is unreachable: {exc}") from None
                except ApiError:
                    self._count("error", started)
                    raise
                except Exception as exc:
                    self._count("error", started)
                    log.warning("%s failed: %s", self.label, _describe(exc))
                    raise BackendUnavailable(f"{self.label} failed: {_describe(exc)}") from exc
                self._count("ok", started)
                self._observe(True, "answered a request")
                return result
        raise AssertionError("unreachable")  # the loop returns or raises

    def _count(self, outcome: str, started: float) -> None:
        if self._metrics is not None:
            self._metrics.backend_requests.labels(self.name, self.kind, outcome).inc()
            self._metrics.backend_seconds.labels(self.name, self.kind).observe(time.perf_counter() - started)

    def bad_answer(self, what: str) -> BackendUnavailable:
        return BackendUnavailable(f"{self.label} returned an invalid answer: {what}")

    # --- results ------------------------------------------------------------------------------

    def language_of(self, job: AsrJob) -> str:
        return (job.options.language if self.multilingual else "en") or self._default_language

    def empty(self, job: AsrJob, elapsed_s: float) -> Transcript:
        return Transcript(
            text="",
            language=self.language_of(job),
            language_probability=None,
            duration_s=job.audio.size / SAMPLE_RATE_HZ,
            infer_time_s=elapsed_s,
            model=self.name,
            task=job.options.task,
            speech_detected=False,
        )

    def transcript(
        self,
        job: AsrJob,
        text: str,
        *,
        language: str | None,
        elapsed_s: float,
        segments: Sequence[Segment] = (),
    ) -> Transcript:
        """A transcript of an upstream answer; without segments the whole text is one segment. What
        no upstream API reports (the language's probability) and what this one did not (a segment's
        decode scores) is None, left out of the answers, not made up."""
        text = force_prefix(job.options.prefix, text.strip())
        duration_s = job.audio.size / SAMPLE_RATE_HZ
        if not segments and text:
            segments = (Segment(0, 0, 0.0, duration_s, " " + text, (), None, None, None, None),)
        return Transcript(
            text=text,
            language=language or self.language_of(job),
            language_probability=None,
            duration_s=duration_s,
            segments=tuple(segments),
            infer_time_s=elapsed_s,
            model=self.name,
            task=job.options.task,
            speech_detected=bool(text),
        )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"
