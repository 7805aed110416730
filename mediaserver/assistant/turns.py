"""The turn pipeline: a final transcript answered by the LLM, spoken by TTS, played to the user.

One ``Assistant`` per session that asked for answers. For each user turn it streams the LLM's
answer (the session's history and a system prompt in, text deltas out), feeds the deltas to TTS
as they come (sentence by sentence: the first sentence is synthesized while the LLM still writes
the second), and queues the audio on the session's ``AudioOut``, which the transport drains (a
WebRTC track, binary socket frames). Text deltas and audio start/stop go out as typed events
through the session's emit callback, so every transport translates the same events.

A turn is one task, one cancellation scope. ``interrupt`` (barge-in: the user started to speak,
or the client asked) drops the queued audio at once, cancels the task (the LLM stops within a
token, pending sentences leave the TTS queue), and records in the history what the user heard:
the sentences played and the one being played cut where playback stopped.

Failures are per turn: the LLM or TTS failing or timing out ends that turn with an
``AssistantError`` naming the stage; the session and the next turn are unaffected.

Two ways to start a turn. ``answer(text)`` is the voice loop's: the assistant keeps the history.
``respond(context, options)`` answers a conversation its caller keeps (the OpenAI Realtime items),
with per-turn options (instructions, text only or spoken, voice, token cap); it returns the ``Turn``,
whose ``outcome()`` says how it ended (completed, interrupted, failed), what the user heard, the
token usage, and whose ``marks`` place each spoken sentence in the outbound audio (truncation).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any

from mediaserver.assistant.answer_text import AnswerText
from mediaserver.assistant.audio_out import AudioOut, played_text
from mediaserver.assistant.greeting import Greeted
from mediaserver.assistant.history import History
from mediaserver.assistant.notices import Notices
from mediaserver.assistant.prefill import Prefills
from mediaserver.assistant.prompt import CHARS_PER_TOKEN, build_prompt
from mediaserver.assistant.prompt_fit import fit
from mediaserver.assistant.speaker_context import current_speaker
from mediaserver.assistant.speaker_tools import gated
from mediaserver.assistant.tool_rounds import Toolbox, ToolRounds
from mediaserver.assistant.turn_types import (
    AssistantOptions,
    StageFailed,
    Turn,
    TurnOutcome,
    VoiceMetrics,
    within_progress_deadline,
)
from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.events import (
    AssistantAudioPaused,
    AssistantAudioResumed,
    AssistantAudioStarted,
    AssistantAudioStopped,
    AssistantError,
    AssistantText,
    SessionEvent,
)
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics
from mediaserver.tts.service import Speech, TtsService
from mediaserver.tts.types import SynthesisParams

log = logging.getLogger(__name__)

Emit = Callable[[SessionEvent], Awaitable[None]]


class Assistant:
    """One session's side of a spoken conversation: history, the running turn, its audio."""

    def __init__(
        self,
        llm: LlmService | None,
        tts: TtsService | None,
        settings: Settings,
        options: AssistantOptions,
        emit: Emit,
        out: AudioOut | None,
        metrics: Metrics,
        *,
        name: str = "assistant",
        unavailable: dict[str, str] | None = None,
    ) -> None:
        self.llm = llm
        self.tts = tts
        self.settings = settings
        self.options = options
        self._emit = emit
        self.out = out
        self.metrics = VoiceMetrics.of(metrics)
        self._text = AnswerText(settings, self.metrics, emit, self._turn_emit)  # the LLM's text → events, TTS
        self.name = name
        self._unavailable = unavailable or {}  # why a stage is off ("llm", "tts"), for the error
        self._history = History()
        self._turns = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._current: Turn | None = None
        self._helpers: set[asyncio.Task[None]] = set()
        self._notices = Notices(emit, name)  # the pauses and resumes, said in order (notices.py)
        self._closed = False
        self._registry = metrics
        self._speculation: tuple[str, Turn, asyncio.Task[None]] | None = None
        # Who speaks (an enrolled speaker's name, from the session's finals): the prompt names them.
        self.speaker: str | None = None
        self._speculated_for: str | None = None  # the speaker a speculative answer's prompt named
        self._prefills = Prefills(self, name)  # the LLM's work ahead of the answers (prefill.py)
        self._greeted = Greeted()  # whom the answers have greeted (greeting.py)
        self.toolbox: Toolbox | None = None  # tools for this assistant's own turns (assistant/tool_rounds.py)

    # --- state --------------------------------------------------------------------------------

    @property
    def history(self) -> list[ChatMessage]:
        """The voice loop's conversation (``answer``'s turns: what the user said and heard)."""
        return self._history.messages

    @history.setter
    def history(self, messages: list[ChatMessage]) -> None:
        self._history.messages = messages

    @property
    def active(self) -> bool:
        """A turn is being generated or its audio is still playing."""
        return self._task is not None and not self._task.done()

    def configure(self, options: AssistantOptions) -> None:
        self.options = options

    def unavailable(self, stage: str) -> str | None:
        """Why ``stage`` ("llm", "tts") cannot run here, or None when it can."""
        service = self.llm if stage == "llm" else self.tts
        return None if service is not None else self._unavailable.get(stage, "not configured")

    async def reset(self) -> None:
        """Forget the conversation (and stop an answer in progress)."""
        await self.interrupt()
        self.drop_speculation()  # its prompt holds the history being forgotten
        self._prefills.stop()
        self._history.clear()
        self._greeted.forget()

    def heard_speaker(self, name: str | None) -> None:
        """The turn about to be answered was spoken by ``name`` (None: nobody enrolled matched)."""
        self.speaker = name

    def _greeting_due(self) -> str | None:
        """The enrolled speaker the next answer greets (assistant_greeting), if it is due."""
        return self._greeted.due(self.speaker, self.settings.assistant_greeting)

    def _turn_context(self, of_the_speaker: bool = True) -> contextvars.Context:
        """The context a turn's task runs in: its tools see who speaks (``current_speaker``); a
        turn the caller keeps (``respond``: a Realtime conversation) has no speaker."""
        context = contextvars.copy_context()
        context.run(current_speaker.set, self.speaker if of_the_speaker else None)
        return context

    def messages(self, user_text: str) -> list[ChatMessage]:
        """The system prompt and as much recent history as the budget allows, then the new turn."""
        earlier, text = self._history.rejoined(user_text, self.speaker, self._max_joined_chars)
        return self.prompt([*earlier, ChatMessage("user", text)])

    @property
    def _max_joined_chars(self) -> int:
        """Words joined to the unanswered ones stay within half the history budget."""
        return self.options.history_tokens * CHARS_PER_TOKEN // 2

    def _record_user(self, user_text: str) -> None:
        self._history.record_user(user_text, self.speaker, self._max_joined_chars)

    def prompt(self, context: Sequence[ChatMessage], options: AssistantOptions | None = None) -> list[ChatMessage]:
        """The system prompt and as much of ``context`` as the history budget allows (prompt.py)."""
        return build_prompt(context, options or self.options, self.settings, self.speaker, self.toolbox)

    def prefill(self, options: AssistantOptions | None = None, *, own_tools: bool = True) -> None:
        """Have the LLM engine evaluate this conversation's system prompt (and tools) now, into the
        slot its first turn will take (prefill.py)."""
        self._prefills.system_prompt(options, own_tools=own_tools)

    def prefill_question(self, words: str) -> None:
        """The question being spoken reads ``words`` so far (a partial transcript): have the LLM
        engine evaluate its answer's prompt now (``turn_prefill_partials``, prefill.py)."""
        self._prefills.question(words)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def answering(self) -> bool:
        """An answer runs or is speculated (no question is prefilled meanwhile)."""
        return self.active or self._speculation is not None

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A helper task of this assistant's (cancelled when it closes)."""
        helper = asyncio.get_running_loop().create_task(work, name=name)
        self._helpers.add(helper)
        helper.add_done_callback(self._helpers.discard)
        return helper

    # --- turns --------------------------------------------------------------------------------

    async def answer(self, user_text: str, *, speech_ended_at: float | None = None) -> None:
        """Start answering ``user_text`` (an answer still playing is interrupted first)."""
        if self._closed or not user_text.strip():
            return
        if await self._release_speculation(user_text):
            return
        self._prefills.stop()
        await self.interrupt()
        messages = self.messages(user_text)
        self._record_user(user_text)
        self._start(messages, self.options, speech_ended_at, record=True)

    async def respond(
        self,
        context: Sequence[ChatMessage],
        options: AssistantOptions | None = None,
        *,
        speech_ended_at: float | None = None,
    ) -> Turn:
        """Start answering a conversation the caller keeps (nothing goes into ``history``).

        ``options`` hold for this turn only. An answer still playing is interrupted first.
        """
        await self.interrupt()
        options = options or self.options
        if self._closed:
            turn = Turn(next(self._turns), options, 0, record=False)
            turn.settle(TurnOutcome("interrupted", "", ""))
            return turn
        return self._start(self.prompt(context, options), options, speech_ended_at, record=False)

    def _start(
        self, messages: list[ChatMessage], options: AssistantOptions, speech_ended_at: float | None, *, record: bool
    ) -> Turn:
        start = self.out.written_samples if self.out is not None else 0
        turn = Turn(next(self._turns), options, start, record=record)
        if record:
            turn.greet = self._greeting_due()
            self._greeted.answering(self.speaker)
        turn.speech_ended_at = speech_ended_at
        task = asyncio.get_running_loop().create_task(
            self._run(turn, messages), name=f"assistant-turn-{self.name}", context=self._turn_context(record)
        )
        # However the task ends (even cancelled before it ran), the turn is settled.
        task.add_done_callback(lambda _: turn.settle(self._interrupted(turn)))
        self._task = task
        self._current = turn
        return turn

    def _spoken(self, turn: Turn) -> bool:
        return self.out is not None and turn.options.speak

    def heard(self, turn: Turn) -> str:
        """What the user has got of ``turn`` so far: the audio taken, or (text only) the text."""
        if self.out is None or not self._spoken(turn):
            return turn.text
        return played_text(turn.marks, self.out.taken_samples, since=turn.start_sample)

    def _interrupted(self, turn: Turn) -> TurnOutcome:
        return TurnOutcome("interrupted", turn.text, self.heard(turn), turn.usage, turn.finish_reason)

    # --- a barge-in being judged (stream/echo_check.py) -----------------------------------------

    @property
    def speaking(self) -> bool:
        """A turn's answer is being spoken: its audio has started and the turn has not ended."""
        turn = self._current
        return self.active and turn is not None and turn.audio_started and self._spoken(turn)

    @property
    def paused(self) -> bool:
        return self.out is not None and self.out.paused

    def pause(self) -> bool:
        """Stop sending the answer's audio, keeping what is queued (``resume`` goes on from there);
        the turn goes on being written. False when no answer is being spoken."""
        if self.out is None or not self.speaking:
            return False
        self.out.pause()
        self._tell(AssistantAudioPaused)  # (a device sees its frames stop, and would not know why)
        return True

    def resume(self) -> None:
        if self.out is not None:
            paused = self.out.paused
            self.out.resume()
            if paused and self.speaking:  # (not for a turn that ended while paused)
                self._tell(AssistantAudioResumed)

    def duck(self, db: float) -> None:
        """Play the answer on ``db`` dB quieter (0: as written), for as long as a suspect start is
        judged long enough to pause it (stream/barge_in.py); the next answer's audio starts as written
        whatever came of it, and a barge-in's cut (``AudioOut.clear``) ends it too."""
        if self.out is not None:
            self.out.duck(db)

    def _tell(self, event: type[AssistantAudioPaused | AssistantAudioResumed]) -> None:
        if self._current is not None:
            self._notices.say(event(self._current.number))

    def played_text(self) -> str:
        """The text of the latest turn's audio sent so far: while it runs, its sentences whose audio
        has started to go out (the one being played whole); once it ended, what was heard."""
        turn = self._current
        if turn is None or self.out is None:
            return ""
        if not self.active:
            return self.heard(turn)
        taken = self.out.taken_samples
        return " ".join(mark.text for mark in turn.marks if mark.start < taken)

    def spoke_within(self, seconds: float) -> bool:
        """Answer audio went out in the last ``seconds`` (the device may still be playing it)."""
        taken_at = self.out.taken_at if self.out is not None else None
        return taken_at is not None and time.monotonic() - taken_at < seconds

    async def interrupt(self) -> bool:
        """Barge-in: stop the audio now, cancel the turn, keep what was heard. True if one was running."""
        task, turn = self._task, self._current
        if task is None or task.done() or turn is None:
            self.resume()  # a pause never outlives its turn
            return False
        if turn.cutting is not None:  # another interrupt is ending it (a client's interrupt beside a barge-in)
            await turn.cutting.wait()  # until it has: its events are sent, the turn settled
            return False
        turn.cutting = asyncio.Event()
        try:
            return await self._cut(task, turn)
        finally:
            turn.cutting.set()

    async def _cut(self, task: asyncio.Task[None], turn: Turn) -> bool:
        """``interrupt``'s work, done once a turn."""
        dropped = self.out.clear() if self.out is not None else 0
        self._cancel_helpers()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        outcome = self._interrupted(turn)
        log.info("%s: turn %d interrupted (%d samples of audio dropped)", self.name, turn.number, dropped)
        self._history.spoke_on(
            recorded=turn.record,
            heard=outcome.heard,
            speaker=self.speaker,
            window_s=self.settings.assistant_rejoin_ms / 1000.0,
        )
        if turn.record:
            self._history.remember(outcome.heard)
        await self._notices.said()  # (a pause said before the stop)
        if turn.audio_started or not self._spoken(turn):
            await self._emit(AssistantAudioStopped(turn.number, True, outcome.heard))
        elif turn.told and not turn.text_ended:  # a spoken turn cut before its audio, its text (or a call) sent
            await self._emit(AssistantText(turn.number, "", turn.text, final=True, interrupted=True))
        turn.settle(outcome)
        return True

    def _cancel_helpers(self) -> None:
        for helper in list(self._helpers):
            helper.cancel()

    async def _run(self, turn: Turn, messages: list[ChatMessage]) -> None:
        try:
            await within_progress_deadline(
                turn, self._generate(turn, messages), self.settings.assistant_turn_timeout_s, self.name
            )
        except StageFailed as exc:
            await self._fail(turn, exc.stage, exc.code, exc.message)
            return
        except TimeoutError:
            stage = "tts" if turn.text and self._spoken(turn) else "llm"
            await self._fail(
                turn,
                stage,
                "timeout",
                f"no progress for {self.settings.assistant_turn_timeout_s:g} s (assistant_turn_timeout_s)",
            )
            return
        except Exception:
            # A defect of the server's, not an engine's or the client's: the turn fails, said as such
            # (ended by the done callback it would read as interrupted: a Realtime response "cancelled"
            # with "client_cancelled" that nobody cancelled), and the session goes on.
            log.exception("%s: turn %d failed on an unexpected error", self.name, turn.number)
            stage = "tts" if turn.text and self._spoken(turn) else "llm"
            await self._fail(turn, stage, "internal_error", "the answer failed on an unexpected server error")
            return
        await turn.released()
        turn.text_ended = True
        await self._emit(AssistantText(turn.number, "", turn.text, final=True))
        if self.out is not None and self._spoken(turn) and turn.audio_started:
            self.out.end_of_answer()
            await self.out.drained()
            await self._emit(AssistantAudioStopped(turn.number, False, turn.text))
        if turn.record:
            self._history.remember(turn.text)
        turn.settle(
            TurnOutcome("completed", turn.text, turn.text, turn.usage, turn.finish_reason, tool_calls=turn.tool_calls)
        )

    async def _fail(self, turn: Turn, stage: str, code: str, message: str) -> None:
        await turn.released()  # a speculative answer fails only if it is used
        log.warning("%s: turn %d failed at %s: %s", self.name, turn.number, stage, message)
        if self.out is not None:
            self.out.clear()
        if turn.record:
            self._history.remember(turn.text if stage == "tts" else "")
        error = AssistantError(turn.number, stage, code, message)
        await self._emit(error)
        if turn.audio_started:
            await self._emit(AssistantAudioStopped(turn.number, True, turn.text))
        turn.settle(TurnOutcome("failed", turn.text, self.heard(turn), turn.usage, turn.finish_reason, error))

    async def _generate(self, turn: Turn, messages: list[ChatMessage]) -> None:
        options = turn.options
        if self.llm is None:
            why = self._unavailable.get("llm", "not configured")
            raise StageFailed("llm", "feature_disabled", f"the LLM is disabled on this server: {why}")
        params = GenerationParams(
            max_tokens=options.max_answer_tokens, temperature=options.temperature, tools=options.tools
        )
        rounds = self._tool_rounds(turn, messages, params)
        if rounds is not None:
            params = rounds.params
        messages = await fit(self.llm, messages, params.tools, options.model)
        try:
            stream = self.llm.stream(messages, params, model=options.model)
        except ApiError as exc:
            raise StageFailed("llm", exc.code, exc.message) from None
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(stream)
            if not self._spoken(turn) or self.out is None:
                await self._text.read(turn, stream, None, rounds)
                return
            if self.tts is None:
                why = self._unavailable.get("tts", "not configured")
                raise StageFailed("tts", "feature_disabled", f"TTS is disabled on this server: {why}")
            try:
                voice = await self.tts.voice(options.voice)
                speech = await stack.enter_async_context(
                    self.tts.open(
                        voice,
                        SynthesisParams(speed=options.speed),
                        sample_rate_hz=self.out.sample_rate_hz,
                        first_clause_words=self.settings.assistant_first_clause_words,
                        first_phrase_words=self.settings.assistant_first_phrase_words,
                    )
                )
            except ApiError as exc:
                raise StageFailed("tts", exc.code, exc.message) from None
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._text.read(turn, stream, speech, rounds))
                    group.create_task(self._play(turn, speech))
            except* StageFailed as failures:
                raise failures.exceptions[0] from None

    def _tool_rounds(self, turn: Turn, messages: list[ChatMessage], params: GenerationParams) -> ToolRounds | None:
        """Tool calls for the voice loop's own turns when MCP servers (or the client) offer tools (not
        ``respond``: a Realtime conversation brings its own tools)."""
        toolbox = gated(self.toolbox, self.settings.speaker_tools, self.speaker)
        if not turn.record or toolbox is None or self.llm is None:
            return None
        choice, forced = toolbox.tool_choice or (self.settings.mcp_tool_choice, False)
        config = ToolRounds.config(toolbox, choice, forced=forced)
        if config is None:
            return None

        def progress() -> None:
            turn.progress_at = time.monotonic()

        rounds = ToolRounds(
            self.llm, toolbox, messages, replace(params, tools=config), turn.options.model,
            functools.partial(self._turn_emit, turn),
            turn.number, self.settings.mcp_max_calls_per_turn, progress, turn.released,
        )  # fmt: skip
        return rounds

    async def _play(self, turn: Turn, speech: Speech) -> None:
        assert self.out is not None
        try:
            async for chunk in speech:
                if not chunk.pcm:
                    continue
                await turn.released()  # a speculative answer's first clause waits here, ready
                mark = self.out.write(chunk.pcm, chunk.sentence)
                turn.progress_at = time.monotonic()
                turn.marks.append(mark)
                if not turn.audio_started:
                    turn.audio_started = True
                    self.out.duck(0.0)  # a new answer plays as written (a duck never outlives its answer)
                    since = turn.since_speech()
                    if since is not None:
                        self.metrics.observe("tts_first_audio", since)
                    await self._emit(AssistantAudioStarted(turn.number))
                    if turn.speech_ended_at is not None:
                        self.spawn(
                            self._first_sent(mark.start, turn.speech_ended_at), f"assistant-first-sent-{self.name}"
                        )
        except ApiError as exc:
            raise StageFailed("tts", exc.code, exc.message) from None

    async def _first_sent(self, sample_index: int, speech_ended_at: float) -> None:
        assert self.out is not None
        sent_at = await self.out.taken(sample_index)
        self.metrics.observe("first_audio_sent", sent_at - speech_ended_at)

    # --- speculative answers ------------------------------------------------------------------

    def speculate(self, user_text: str, *, speech_ended_at: float | None = None) -> bool:
        """Start answering ``user_text`` before the user's turn has ended (the final was decoded
        during the pause): the LLM writes and TTS synthesizes the first clause, but nothing is sent,
        emitted or remembered. ``answer`` with the same text releases it at once; other text, or
        ``drop_speculation`` (the user spoke again), discards it unseen. Only when no answer is
        running (a playing answer is not cut for a turn that may not be over). True if started."""
        if self._closed or not user_text.strip() or self.active:
            return False
        self.drop_speculation()
        self._prefills.stop()
        start = self.out.written_samples if self.out is not None else 0
        turn = Turn(next(self._turns), self.options, start, record=True)
        turn._release = asyncio.Event()
        turn.greet = self._greeting_due()
        turn.speech_ended_at = speech_ended_at if speech_ended_at is not None else time.monotonic()
        messages = self.messages(user_text)
        task = asyncio.get_running_loop().create_task(
            self._run(turn, messages), name=f"assistant-speculative-{self.name}", context=self._turn_context()
        )
        task.add_done_callback(lambda _: turn.settle(self._interrupted(turn)))
        self._speculation = (user_text, turn, task)
        self._speculated_for = self.speaker
        return True

    def drop_speculation(self) -> None:
        """Discard a speculative answer: nothing of it was sent, nothing goes into the history."""
        speculation, self._speculation = self._speculation, None
        if speculation is not None:
            speculation[2].cancel()
            self._registry.speculative_answers.labels("miss").inc()

    async def _release_speculation(self, user_text: str) -> bool:
        """The turn ended as speculated: the prepared answer becomes the running turn and goes out now."""
        speculation = self._speculation
        if speculation is None:
            return False
        text, turn, task = speculation
        if text.strip() != user_text.strip() or task.done() or self.active or self._speculated_for != self.speaker:
            self.drop_speculation()  # (another speaker: the prompt named the one before)
            return False
        self._speculation = None
        self._registry.speculative_answers.labels("hit").inc()
        self._greeted.answering(self.speaker)
        self._record_user(user_text)
        turn.start_sample = self.out.written_samples if self.out is not None else 0
        self._task, self._current = task, turn
        while turn.deferred:  # the text written so far, in order, before anything new
            turn.told = True
            await self._emit(turn.deferred.pop(0))
        since = turn.since_speech()
        if turn.first_token_pending and since is not None:  # its first token is seen now
            self.metrics.observe("llm_first_token", since)
        assert turn._release is not None
        turn._release.set()
        return True

    async def _turn_emit(self, turn: Turn, event: SessionEvent) -> None:
        if turn.held:
            turn.deferred.append(event)
        else:
            turn.told = True
            await self._emit(event)

    def observe_transcript(self, seconds: float) -> None:
        self.metrics.observe("transcript", seconds)

    async def aclose(self) -> None:
        """Stop everything; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._cancel_helpers()
        self._notices.cancel()
        speculation, self._speculation = self._speculation, None
        if speculation is not None:
            speculation[2].cancel()
        task = self._task
        if task is not None and not task.done():
            if self.out is not None:
                self.out.clear()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.out is not None:
            self.out.close()
