"""What a voice-loop turn is made of: the session's options, a turn in flight and how it ended, a
stage's failure, and the per-stage latency metrics. ``mediaserver.assistant.turns`` runs turns."""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any, Literal

from prometheus_client import Histogram

from mediaserver.assistant.audio_out import Mark
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.events import AssistantError, SessionEvent
from mediaserver.llm.tools import ToolCall, ToolConfig
from mediaserver.llm.types import FinishReason, Usage
from mediaserver.metrics import Metrics


@dataclass(frozen=True)
class AssistantOptions:
    """What a session asked of its assistant (defaults from the ``assistant_*`` settings)."""

    system_prompt: str
    speak: bool = True
    voice: str | None = None
    model: str | None = None
    max_answer_tokens: int = 200
    temperature: float | None = None
    history_turns: int = 8
    history_tokens: int = 1500
    history_drop_turns: int = 1  # past history_turns, the oldest turns go this many at a time
    speed: float = 1.0  # TTS speed of the answer
    tools: ToolConfig | None = None  # functions the caller runs (Realtime): calls end the turn, in its outcome

    @classmethod
    def from_settings(cls, settings: Settings) -> AssistantOptions:
        return cls(
            system_prompt=settings.assistant_system_prompt,
            speak=settings.assistant_speak,
            voice=settings.assistant_voice,
            model=settings.assistant_llm_model,
            max_answer_tokens=settings.assistant_max_answer_tokens,
            temperature=settings.assistant_temperature,
            history_turns=settings.assistant_history_turns,
            history_tokens=settings.assistant_history_tokens,
            history_drop_turns=settings.assistant_history_drop_turns,
        )


class StageFailed(Exception):
    def __init__(self, stage: str, code: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.code = code
        self.message = message


_VOICE_METRICS: weakref.WeakKeyDictionary[Metrics, VoiceMetrics] = weakref.WeakKeyDictionary()


class VoiceMetrics:
    """Per-stage latency from the end of the user's speech, one histogram with a ``stage`` label."""

    def __init__(self, metrics: Metrics) -> None:
        self.stage_seconds = Histogram(
            "mediaserver_voice_latency_seconds",
            "From the end of the user's speech to: the final transcript (transcript), the LLM's first "
            "token (llm_first_token), the first TTS audio (tts_first_audio), the first audio frame sent "
            "to the client (first_audio_sent)",
            ["stage"],
            buckets=(0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30),
            registry=metrics.registry,
        )

    @classmethod
    def of(cls, metrics: Metrics) -> VoiceMetrics:
        found = _VOICE_METRICS.get(metrics)
        if found is None:
            found = _VOICE_METRICS[metrics] = cls(metrics)
        return found

    def observe(self, stage: str, seconds: float) -> None:
        self.stage_seconds.labels(stage).observe(max(0.0, seconds))


TurnStatus = Literal["completed", "interrupted", "failed"]


@dataclass(frozen=True)
class TurnOutcome:
    """How a turn ended. ``text`` is all the LLM wrote; ``heard`` what reached the user (for a
    spoken answer the audio a transport took, for a text answer the text)."""

    status: TurnStatus
    text: str
    heard: str
    usage: Usage | None = None
    finish_reason: FinishReason | None = None
    error: AssistantError | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # the calls of a turn with ``options.tools``, for its caller to run


class Turn:
    """One answer: its number (the events carry it), its options, where its audio starts in the
    ``AudioOut`` stream, the marks of its spoken sentences, and (once settled) its outcome."""

    def __init__(self, number: int, options: AssistantOptions, start_sample: int, *, record: bool) -> None:
        self.number = number
        self.options = options
        self.start_sample = start_sample
        self.record = record  # the assistant keeps this turn in its own history (``answer``)
        self.marks: list[Mark] = []
        self.text = ""
        self.audio_started = False
        self.progress_at = time.monotonic()  # the last token or audio (the progress deadline)
        self.usage: Usage | None = None
        self.finish_reason: FinishReason | None = None
        self.tool_calls: tuple[ToolCall, ...] = ()
        self._outcome: asyncio.Future[TurnOutcome] = asyncio.get_running_loop().create_future()
        # A speculative turn (``Assistant.speculate``) is held: its text events wait in ``deferred``
        # and its audio before the first write, until it is released (or dropped unseen).
        self._release: asyncio.Event | None = None
        self.deferred: list[SessionEvent] = []
        self.told = False  # some of it (text, a tool call) reached the client: its end is told too
        self.cutting: asyncio.Event | None = None  # an interrupt is ending it (set once it has)
        self.text_ended = False  # its final text event went out
        self.greet: str | None = None  # the enrolled speaker this answer greets (assistant/greeting.py)
        # When the speech it answers ended (monotonic): its stages go into the voice latency
        # histogram, which counts from there; None: a typed request (Realtime) has no such moment.
        self.speech_ended_at: float | None = None
        self.first_token_pending = False  # held, its first token came: counted when it is released

    def since_speech(self) -> float | None:
        """Seconds since the speech it answers ended; None for a turn that answers no speech."""
        return None if self.speech_ended_at is None else time.monotonic() - self.speech_ended_at

    @property
    def held(self) -> bool:
        return self._release is not None and not self._release.is_set()

    async def released(self) -> None:
        """Return at once for a turn that is not held; else when it is released."""
        if self._release is not None:
            await self._release.wait()

    @property
    def settled(self) -> bool:
        return self._outcome.done()

    def settle(self, outcome: TurnOutcome) -> None:
        if not self._outcome.done():
            self._outcome.set_result(outcome)

    async def outcome(self) -> TurnOutcome:
        """Wait for the end of the turn (cancelling the wait does not cancel the turn)."""
        return await asyncio.shield(self._outcome)


async def within_progress_deadline(turn: Turn, work: Coroutine[Any, Any, None], limit_s: float, name: str) -> None:
    """Run ``work`` (a turn's generation) while it makes progress: a turn whose LLM and TTS produce
    nothing (no token, no audio: ``Turn.progress_at``) for ``limit_s`` (``assistant_turn_timeout_s``)
    raises TimeoutError. A long answer that keeps coming is never cut, however busy the server is; an
    upstream that hangs is."""
    turn.progress_at = time.monotonic()
    task = asyncio.get_running_loop().create_task(work, name=f"assistant-generate-{name}")
    try:
        while True:
            idle_s = time.monotonic() - turn.progress_at
            if idle_s >= limit_s:
                raise TimeoutError
            done, _ = await asyncio.wait({task}, timeout=limit_s - idle_s)
            if task in done:
                task.result()
                return
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def assistant_options_from(values: dict[str, object], base: AssistantOptions) -> AssistantOptions:
    """Apply a client's ``system_prompt`` / ``voice`` / ``speak`` to ``base``; wrong types are a 400."""
    changes: dict[str, object] = {}
    for key in ("system_prompt", "voice"):
        if key in values and values[key] is not None:
            if not isinstance(values[key], str):
                raise InvalidParameter(f"{key!r} must be a string", param=key)
            changes[key] = values[key]
    if "speak" in values and values["speak"] is not None:
        if not isinstance(values["speak"], bool):
            raise InvalidParameter("'speak' must be true or false", param="speak")
        changes["speak"] = values["speak"]
    return replace(base, **changes)  # type: ignore[arg-type]
