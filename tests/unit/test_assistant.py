"""The voice loop's pieces that need no model: the outbound audio queue and the history budget."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mediaserver.assistant.audio_out import AudioOut
from mediaserver.assistant.prompt import kept_turns
from mediaserver.assistant.turn_types import AssistantOptions, StageFailed, assistant_options_from
from mediaserver.assistant.turns import Assistant
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.events import AssistantError, SessionEvent
from mediaserver.llm.prompt_size import TEMPLATE_BYTES_PER_MESSAGE
from mediaserver.llm.service import LlmService
from mediaserver.llm.tools import ToolCall, ToolConfig, ToolSpec
from mediaserver.llm.types import ChatMessage
from mediaserver.metrics import Metrics
from mediaserver.tts.service import TtsService
from mediaserver.tts.text import SentenceSplitter

RATE = 16000
FRAME = RATE // 50  # 20 ms


def pcm(samples: int) -> bytes:
    return b"\x01\x00" * samples


async def test_audio_out_frames_idles_and_clears() -> None:
    out = AudioOut(RATE)
    assert not out.busy and out.take() is None
    waiting = asyncio.ensure_future(out.next_frame())
    for _ in range(5):  # the waiter runs and parks (each pass lets the loop run everything ready)
        await asyncio.sleep(0)
    assert not waiting.done()  # idle: nothing is produced, not even silence
    out.write(pcm(FRAME * 2 + 100), "Hello there.")
    # The frame the waiter gets is the answer's first, not a silence made while it was idle.
    assert await waiting == pcm(FRAME)
    assert out.take() is not None
    assert out.queued_samples == 100  # a partial frame waits for more audio or the end of the answer
    out.end_of_answer()
    last = out.take()
    assert last is not None and last[200:] == bytes(len(last) - 200)  # padded with silence
    assert out.take() == bytes(FRAME * 2)  # and one frame of silence to flush an encoder
    assert out.take() is None and not out.busy
    out.write(pcm(FRAME * 10))
    assert out.clear() == FRAME * 10
    assert out.take() is None
    await asyncio.wait_for(out.drained(), 1)


async def test_audio_out_knows_what_was_heard() -> None:
    out = AudioOut(RATE)
    out.write(pcm(FRAME * 10), "The first sentence.")
    out.write(pcm(FRAME * 10), "A second one with six words.")
    for _ in range(15):  # all of the first, half of the second
        out.take()
    assert out.heard() == "The first sentence. A second one"
    sent = asyncio.ensure_future(out.taken(FRAME * 18))
    await asyncio.sleep(0)
    assert not sent.done()
    for _ in range(5):
        out.take()
    assert isinstance(await asyncio.wait_for(sent, 1), float)
    assert out.heard(since=FRAME * 10) == "A second one with six words."


async def test_what_was_heard_after_a_barge_in_cleared_the_rest_of_an_answer() -> None:
    """A barge-in drops audio that was written, never taken: the stream's positions go on from where
    playback stopped, so the next answer's marks line up with what is taken of it (the cleared audio
    once pushed them 'ahead' of playback and the next answer's heard text came out empty)."""
    out = AudioOut(RATE)
    out.write(pcm(FRAME * 10), "One two three four five six.")
    out.write(pcm(FRAME * 10), "Never played at all.")
    for _ in range(5):  # half of the first sentence
        out.take()
    assert out.clear() == FRAME * 15
    assert out.written_samples == out.taken_samples == FRAME * 5
    assert out.heard() == "One two three"  # the cut sentence keeps the words played of it
    start = out.written_samples
    out.write(pcm(FRAME * 10), "The next answer.")
    for _ in range(10):
        out.take()
    assert out.heard(since=start) == "The next answer."
    assert out.heard() == "One two three The next answer."


def assistant(settings: Settings | None = None, **options: object) -> Assistant:
    settings = settings or Settings(_env_file=None)
    base = AssistantOptions.from_settings(settings)

    async def emit(event: SessionEvent) -> None:
        pass

    return Assistant(None, None, settings, assistant_options_from(dict(options), base), emit, None, Metrics())


def test_history_is_kept_within_its_budget_and_whole_turns() -> None:
    helper = assistant(system_prompt="Be brief.")
    helper.options = AssistantOptions(system_prompt="Be brief.", history_turns=2, history_tokens=1000)
    for n in range(5):
        helper.history += [ChatMessage("user", f"question {n}"), ChatMessage("assistant", f"answer {n}")]
    messages = helper.messages("question 5")
    assert messages[0] == ChatMessage("system", "Be brief.")
    assert [m.content for m in messages[1:]] == ["question 3", "answer 3", "question 4", "answer 4", "question 5"]
    # No system prompt of the client's: the server's (a voice turn never goes without one), and the
    # history budget counts it and each message's template markers: 50 to 53 bytes are left after
    # the system prompt and the question, one whole turn (26 + 24 bytes).
    default = helper.settings.assistant_system_prompt
    sent = len(default.encode()) + len("q") + 2 * TEMPLATE_BYTES_PER_MESSAGE
    helper.options = AssistantOptions(system_prompt="", history_turns=8, history_tokens=(sent + 53) // 4)
    messages = helper.messages("q")
    assert messages[0] == ChatMessage("system", default)
    assert [m.content for m in messages[1:]] == ["question 4", "answer 4", "q"]


def test_history_budget_counts_tools_and_calls() -> None:
    """The tools' schemas and the calls' arguments are sent too: the budget counts them, so a turn
    whose call carries long arguments, or a session with many tools, keeps less history."""
    helper = assistant(system_prompt="Be brief.")
    history = [
        ChatMessage("user", "old question"),
        ChatMessage("assistant", "old answer"),
        ChatMessage("user", "look it up"),
        ChatMessage("assistant", "", (ToolCall("call_1", "lookup", '{"query": "' + "x" * 600 + '"}'),)),
        ChatMessage("tool", "found", tool_call_id="call_1"),
        ChatMessage("assistant", "It is found."),
        ChatMessage("user", "thanks"),
    ]
    options = AssistantOptions(system_prompt="Be brief.", history_turns=8, history_tokens=150)
    assert [m.content for m in helper.prompt(history, options)[1:]] == ["thanks"]  # the call's 600 bytes count
    roomy = replace(options, history_tokens=250)
    assert len(helper.prompt(history, roomy)) == len(history) + 1
    schema = {"type": "object", "properties": {"text": {"type": "string", "description": "y" * 600}}}
    tools = ToolConfig(tuple(ToolSpec(f"tool_{n}", "z" * 100, schema) for n in range(3)))
    assert [m.content for m in helper.prompt(history, replace(roomy, tools=tools))[1:]] == ["thanks"]


def test_client_options_are_checked() -> None:
    assert assistant(voice="en_US-joe-medium", speak=False).options.speak is False
    for bad in ({"voice": 3}, {"speak": "yes"}, {"system_prompt": ["a"]}):
        with pytest.raises(InvalidParameter):
            assistant(**bad)


async def test_respond_settles_its_turn_and_keeps_no_history() -> None:
    events: list[SessionEvent] = []

    async def emit(event: SessionEvent) -> None:
        events.append(event)

    settings = Settings(_env_file=None)
    options = AssistantOptions.from_settings(settings)
    helper = Assistant(None, None, settings, options, emit, None, Metrics(), unavailable={"llm": "llm_enabled is off"})
    assert helper.unavailable("llm") == "llm_enabled is off" and helper.unavailable("tts") == "not configured"
    context = [ChatMessage("user", "What color is the sky?")]
    assert helper.prompt(context, options)[-1] == context[0]
    turn = await helper.respond(context, AssistantOptions(system_prompt="Say hi.", speak=False))
    outcome = await asyncio.wait_for(turn.outcome(), 5)
    assert outcome.status == "failed" and outcome.error is not None
    assert (outcome.error.stage, outcome.error.code, outcome.error.turn) == ("llm", "feature_disabled", turn.number)
    assert "llm_enabled is off" in outcome.error.message and events == [outcome.error]
    assert helper.history == []  # the caller keeps this conversation
    assert not await helper.interrupt()  # nothing is running any more


# --- the assistant_* settings at non-default values ----------------------------------------------


def test_history_turns_from_the_settings_bound_the_history_sent() -> None:
    def sent(settings: Settings) -> list[str]:
        helper = Assistant(
            None, None, settings, AssistantOptions.from_settings(settings), emit_nothing, None, Metrics()
        )
        for n in range(3):
            helper.history += [ChatMessage("user", f"question {n}"), ChatMessage("assistant", f"answer {n}")]
        return [m.content for m in helper.messages("question 3")[1:]]

    assert sent(Settings(_env_file=None, assistant_history_turns=1)) == ["question 2", "answer 2", "question 3"]
    assert len(sent(Settings(_env_file=None))) == 7  # the default 8 keeps all three earlier turns
    assert sent(Settings(_env_file=None, assistant_history_turns=0)) == ["question 3"]


def test_past_its_limit_the_history_drops_its_oldest_turns_a_few_at_a_time() -> None:
    """``assistant_history_drop_turns``: past ``assistant_history_turns`` the oldest turns go that
    many at a time, so the turns after a drop send the same start (the engine's cache holds it); at 1
    every turn past the limit drops one."""
    assert [kept_turns(n, 8, 4) for n in range(7, 19)] == [7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    assert [kept_turns(n, 8, 1) for n in range(7, 12)] == [7, 8, 8, 8, 8]
    assert [kept_turns(n, 2, 4) for n in range(1, 6)] == [1, 2, 1, 2, 1]  # at most the limit at a time
    assert kept_turns(5, 0, 4) == 0

    def firsts(settings: Settings) -> list[str]:
        """The first history message each of turns 9 to 14 sends."""
        helper = Assistant(
            None, None, settings, AssistantOptions.from_settings(settings), emit_nothing, None, Metrics()
        )
        sent = []
        for n in range(14):
            if n >= 8:
                sent.append(helper.messages(f"question {n}")[1].content)
            helper.history += [ChatMessage("user", f"question {n}"), ChatMessage("assistant", f"answer {n}")]
        return sent

    assert firsts(Settings(_env_file=None)) == ["question 0"] + ["question 4"] * 4 + ["question 8"]
    assert firsts(Settings(_env_file=None, assistant_history_drop_turns=1)) == [f"question {n}" for n in range(0, 6)]
    assert firsts(Settings(_env_file=None, assistant_history_drop_turns=2)) == [
        "question 0", "question 2", "question 2", "question 4", "question 4", "question 6"
    ]  # fmt: skip


async def emit_nothing(event: SessionEvent) -> None:
    pass


async def first_error(tts_class: type[TtsService] = TtsService, **settings: object) -> AssistantError:
    """The error of one answered turn of an assistant built from ``settings`` with the real LLM and
    TTS services, unstarted: no engine can start (``llm_engine_binary`` names nothing), so a turn
    that reaches its generation fails at the LLM stage."""
    config = Settings(_env_file=None, llm_engine_binary=Path("/nonexistent/llama-server"), **settings)  # type: ignore[arg-type]
    llm = LlmService(config, Metrics())
    tts = tts_class(config, Metrics())
    errors: list[AssistantError] = []
    got = asyncio.Event()

    async def emit(event: SessionEvent) -> None:
        if isinstance(event, AssistantError):
            errors.append(event)
            got.set()

    helper = Assistant(llm, tts, config, AssistantOptions.from_settings(config), emit, AudioOut(RATE), Metrics())
    try:
        await helper.answer("What do cows eat?")
        await asyncio.wait_for(got.wait(), 30)
    finally:
        await helper.interrupt()
        await llm.aclose()
        await tts.aclose()
    return errors[0]


async def test_answers_use_the_configured_llm_model() -> None:
    error = await first_error(assistant_llm_model="no-such-model")
    assert (error.stage, error.code) == ("llm", "model_not_found")
    assert "unknown model 'no-such-model'" in error.message


async def test_answers_are_spoken_in_the_configured_voice() -> None:
    error = await first_error(assistant_voice="nobody")
    assert (error.stage, error.code) == ("tts", "voice_not_found") and "'nobody'" in error.message


async def test_unspoken_answers_never_look_up_a_voice() -> None:
    """assistant_speak=false: the turn goes straight to its generation (which fails here, as no
    engine can start), never to the voice it would have failed on."""
    error = await first_error(assistant_speak=False, assistant_voice="nobody")
    assert (error.stage, error.code) == ("llm", "model_unavailable") and "nobody" not in error.message


async def test_assistant_first_clause_words_is_how_soon_an_answer_speaks_its_first_clause() -> None:
    """The answer's speech is opened with the setting (the turn then fails at the LLM, which cannot
    start here), and that is what cuts the first clause: at 2 words "Well sure," is spoken on its
    own at once; at the default 4 the splitter waits for the sentence."""
    opened: list[tuple[int, int]] = []

    class Recording(TtsService):
        def open(self, *args: Any, **kwargs: Any) -> Any:
            opened.append((kwargs["first_clause_words"], kwargs["first_phrase_words"]))
            return super().open(*args, **kwargs)

    error = await first_error(Recording, assistant_first_clause_words=2, assistant_first_phrase_words=9)
    assert error.stage == "llm" and opened == [(2, 9)]
    assert SentenceSplitter(first_clause_words=2).push("Well sure, I can do") == ["Well sure,"]
    assert SentenceSplitter(first_clause_words=4).push("Well sure, I can do") == []


def test_the_prompt_names_the_speaker_the_session_heard() -> None:
    helper = assistant(system_prompt="Be brief.")
    assert helper.messages("hello")[0] == ChatMessage("system", "Be brief.")
    helper.heard_speaker("Alice")
    assert helper.messages("hello")[0] == ChatMessage("system", "Be brief.\nThe person speaking to you is Alice.")
    helper.heard_speaker(None)  # a voice no enrolled speaker matched: nobody is named
    assert helper.messages("hello")[0] == ChatMessage("system", "Be brief.")


def test_a_turns_tools_run_knowing_its_speaker() -> None:
    """Each voice-loop turn's task runs with its speaker in context (MCP calls send it in _meta, the
    client's tool-call events carry it); a turn the caller keeps (respond: Realtime) has none."""
    from mediaserver.assistant.speaker_context import current_speaker

    helper = assistant()
    helper.heard_speaker("alice")
    assert helper._turn_context().run(current_speaker.get) == "alice"
    assert helper._turn_context(False).run(current_speaker.get) is None
    assert current_speaker.get() is None  # the caller's own context is untouched


async def test_words_whose_answer_was_never_heard_join_the_next_turn() -> None:
    """A turn that ended at a pause mid-sentence ("... along the rocky shore."), whose answer the same
    speaker's next words interrupted before any of it played: the two are one turn, one message in
    the prompt and in the history. Once an answer was heard, the next words are a turn of their own."""
    helper = assistant(system_prompt="Be brief.")  # no LLM: an answer left to run fails, unheard
    await helper.answer("When the keeper walked along the rocky shore.")
    await helper.interrupt()  # the rest of the sentence began: the answer had not played
    first = "When the keeper walked along the rocky shore. which birds followed him home?"
    assert [m.content for m in helper.messages("which birds followed him home?")[1:]] == [first]
    await helper.answer("which birds followed him home?")
    await helper.interrupt()
    assert helper.history == [ChatMessage("user", first)]
    helper.history.append(ChatMessage("assistant", "Seagulls."))
    await helper.answer("Thanks.")
    await helper.interrupt()
    assert [(m.role, m.content) for m in helper.history] == [
        ("user", first),
        ("assistant", "Seagulls."),
        ("user", "Thanks."),
    ]


async def test_words_are_not_joined_after_a_failed_answer_another_speaker_or_with_rejoin_off() -> None:
    """Only the same speaker speaking on within assistant_rejoin_ms of an unheard answer joins: not
    words after an answer that failed (the user was told), not another speaker's, and never with
    assistant_rejoin_ms 0."""
    failed = assistant(system_prompt="Be brief.")
    await failed.answer("What is the weather?")
    task = failed._task
    assert task is not None
    await asyncio.wait({task})  # the answer failed (no LLM): the error went out
    await failed.interrupt()
    await failed.answer("Set a timer.")
    await failed.interrupt()
    assert [m.content for m in failed.history] == ["What is the weather?", "Set a timer."]

    other = assistant(system_prompt="Be brief.")
    other.heard_speaker("Ann")
    await other.answer("Turn on the light.")
    await other.interrupt()
    other.heard_speaker("Bob")
    await other.answer("in the kitchen.")
    assert [m.content for m in other.history] == ["Turn on the light.", "in the kitchen."]
    await other.interrupt()

    off = assistant(Settings(_env_file=None, assistant_rejoin_ms=0), system_prompt="Be brief.")
    await off.answer("When the keeper walked along the rocky shore.")
    await off.interrupt()
    await off.answer("which birds followed him home?")
    await off.interrupt()
    assert len(off.history) == 2


async def test_a_turn_that_fails_unexpectedly_is_failed_not_interrupted_and_the_next_one_runs() -> None:
    """A defect in a turn (a trial's lone surrogate reached the LLM's prompt encoding) ended it as
    interrupted: a Realtime response "cancelled" with "client_cancelled" that nobody cancelled. It
    fails now, with an ``internal_error``, and the next turn runs. (A fault no real engine gives: the
    LLM service raises a RuntimeError of its own for the first turn.)"""
    config = Settings(_env_file=None)
    calls = 0

    class Faulty(LlmService):
        def stream(self, *args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a defect")
            raise StageFailed("llm", "feature_disabled", "no engine here")

    llm = Faulty(config, Metrics())
    options = replace(AssistantOptions.from_settings(config), speak=False)
    helper = Assistant(llm, None, config, options, emit_nothing, None, Metrics())
    try:
        first = await asyncio.wait_for((await helper.respond([ChatMessage("user", "Hi")])).outcome(), 10)
        second = await asyncio.wait_for((await helper.respond([ChatMessage("user", "Hi")])).outcome(), 10)
    finally:
        await helper.aclose()
        await llm.aclose()
    assert first.status == "failed" and first.error is not None
    assert (first.error.stage, first.error.code) == ("llm", "internal_error")
    assert second.status == "failed" and second.error is not None and second.error.code == "feature_disabled"
