"""Speculative answers in the voice loop, with real parts: Piper speech streamed in real time into a
StreamSession with semantic turns (the real turn model), the real ASR service, the bundled LLM and
Piper answering through an Assistant into an AudioOut (what the transport would drain).

The answer starts on the final decoded during a pause, before the turn has ended: if the speech
resumes it is dropped unseen (no text event, no audio queued, nothing in the history); if the turn
ends, what was prepared goes out at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from mediaserver.asr.service import AsrService
from mediaserver.assistant.audio_out import AudioOut
from mediaserver.assistant.turn_types import AssistantOptions
from mediaserver.assistant.turns import Assistant
from mediaserver.config import Settings
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    AssistantAudioStarted,
    AssistantAudioStopped,
    AssistantText,
    FinalTranscript,
    SessionEvent,
    SpeechStopped,
    TranscriptionOptions,
    TurnDecided,
)
from mediaserver.llm.service import LlmService
from mediaserver.metrics import Metrics
from mediaserver.stream.options import StreamOptions
from mediaserver.stream.session import StreamSession
from mediaserver.tts.service import TtsService
from mediaserver.turns.fetch import default_dir, fetch
from mediaserver.turns.model import TurnModel
from tests.conftest import Clip
from tests.integration.test_turns import silence, stream_real_time

VOICE: dict[str, Any] = {
    "assistant_temperature": 0.0,
    "assistant_max_answer_tokens": 40,
    "assistant_system_prompt": "You are a helpful voice assistant. Answer in one short sentence.",
}


@pytest.fixture(scope="module")
def turn_model() -> TurnModel:
    return TurnModel(fetch(default_dir()))


def count(metrics: Metrics, result: str) -> float:
    return float(metrics.speculative_answers.labels(result)._value.get())


async def drain(out: AudioOut) -> None:
    """The transport: takes the answer's frames at real time."""
    while True:
        await asyncio.sleep(out.frame_samples / SAMPLE_RATE_HZ)
        out.take()


async def converse(
    asr: AsrService,
    llm: LlmService,
    tts: TtsService,
    settings: Settings,
    model: TurnModel,
    audio: np.ndarray,
    *,
    eagerness: str,
    resume_at_s: float | None = None,
    partials: bool = False,
    metrics: Metrics | None = None,
) -> tuple[list[tuple[float, SessionEvent]], Assistant, AudioOut, int]:
    """Stream ``audio`` in real time into a semantic-turn session answered by an Assistant; the
    events (with times), the assistant, its AudioOut, and the samples queued on it at ``resume_at_s``
    of the stream (the moment speech resumes after a pause), once the answer has played.
    ``metrics``: the assistant's own (its speculative answers and voice latency counted apart from
    every other test's in the worker, which share the ASR service's); by default the ASR service's."""
    events: list[tuple[float, SessionEvent]] = []

    async def emit(event: SessionEvent) -> None:
        events.append((time.monotonic(), event))

    out = AudioOut(SAMPLE_RATE_HZ)
    options = StreamOptions(
        transcription=TranscriptionOptions(language="en", with_segment_timestamps=False),
        server_vad=True,
        turn_detection="semantic",
        eagerness=eagerness,  # type: ignore[arg-type]
        partials=partials,
    )
    session = StreamSession(asr, settings, emit, options, turn_model=model)
    answering = AssistantOptions.from_settings(settings)
    assistant = Assistant(llm, tts, settings, answering, emit, out, metrics or asr.metrics)
    session.assistant = assistant
    queued_at_resume = -1

    drainer = asyncio.create_task(drain(out))
    try:
        if resume_at_s is None:
            await stream_real_time(session, audio)
        else:
            cut = int(resume_at_s * SAMPLE_RATE_HZ)
            await stream_real_time(session, audio[:cut])
            queued_at_resume = out.written_samples
            await stream_real_time(session, audio[cut:])
        async with asyncio.timeout(90):
            while not any(isinstance(e, AssistantAudioStopped) for _, e in events):
                await asyncio.sleep(0.05)
    finally:
        drainer.cancel()
        await assistant.aclose()
        await session.aclose()
    return events, assistant, out, queued_at_resume


def first_token_samples(metrics: Metrics) -> float:
    """The voice latency's ``llm_first_token`` samples so far (answers the user got)."""
    count = metrics.registry.get_sample_value("mediaserver_voice_latency_seconds_count", {"stage": "llm_first_token"})
    return count or 0.0


async def test_speech_resuming_drops_the_speculative_answer_unheard(
    asr_service: AsrService,
    llm_service: LlmService,
    tts_service: TtsService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    turn_model: TurnModel,
) -> None:
    """ "I want to go to the" reads unfinished (its last word): during the 1.5 s pause after it the
    final is decoded and an answer to it started; the speech resumes, the answer is dropped: nothing
    of it was queued or emitted, and the history holds the whole sentence and the one answer to it.
    ("Remind me to buy", used before, is written "Remind me to buy." by tiny.en: the rule now ends
    that turn at 600 ms of pause, turns/decision.py.)"""
    # Scored once per pause (turn_rescore_ms 0): with more silence the model scores this fragment
    # higher (0.84 after 500 ms) and a rescore may end the turn; what is tested here is the drop.
    settings = base_settings.model_copy(update={**VOICE, "turn_rescore_ms": 0})
    # What comes after the 1.5 s pause can be dropped from the final by tiny.en, depending on the CPU's
    # kernels ("I want to go to the..."): "train station." on an Intel Xeon with AVX-512 and no AMX,
    # "train station, please." on an AMD EPYC with AVX-512 (stop 37). A longer ending is heard on both.
    first = speech("I want to go to the").audio16k
    rest = speech("train station near the old harbour, please.").audio16k
    lead = silence(0.5)
    audio = np.concatenate([lead, first, silence(1.5), rest, silence(3.0)]).astype(np.float32)
    resume_at_s = (lead.size + first.size) / SAMPLE_RATE_HZ + 1.5
    metrics = Metrics()
    events, assistant, out, queued_at_resume = await converse(
        asr_service, llm_service, tts_service, settings, turn_model, audio, eagerness="medium",
        resume_at_s=resume_at_s, metrics=metrics,
    )  # fmt: skip
    decided = [e for _, e in events if isinstance(e, TurnDecided)]
    assert decided and not decided[0].complete, decided  # the pause: unfinished
    outcomes = {result: count(metrics, result) for result in ("hit", "miss")}
    assert outcomes["miss"] >= 1, outcomes  # an answer was started in the pause, and dropped
    assert queued_at_resume == 0  # nothing of it was queued for the user
    # The voice latency counts the one answer sent. (Counted on the worker's shared metrics before
    # stop 68, it read 2 once in CI, not seen standalone or under load here: another test's answer?)
    texts = [e for _, e in events if isinstance(e, AssistantText)]
    assert first_token_samples(metrics) == 1, (outcomes, [d.complete for d in decided], {e.turn for e in texts})
    finals = [e for _, e in events if isinstance(e, FinalTranscript)]
    assert len(finals) == 1, finals
    assert {e.turn for e in texts} == {texts[-1].turn}, texts  # one answer's text, nothing of another
    assert [m.role for m in assistant.history] == ["user", "assistant"], assistant.history
    assert assistant.history[0].content == finals[0].transcript.text
    assert "station" in assistant.history[0].content.lower(), assistant.history[0].content
    assert out.written_samples > 0


async def test_a_turn_that_ends_sends_the_prepared_answer(
    asr_service: AsrService,
    llm_service: LlmService,
    tts_service: TtsService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    turn_model: TurnModel,
) -> None:
    """ "Play the song by" and silence: unfinished for the model, so the turn waits for the high
    eagerness cap (2 s: scored once, turn_rescore_ms 0); the answer prepared meanwhile is the one sent
    when the cap ends the turn."""
    settings = base_settings.model_copy(update={**VOICE, "turn_rescore_ms": 0})
    audio = np.concatenate([silence(0.5), speech("Play the song by").audio16k, silence(4.0)]).astype(np.float32)
    metrics = Metrics()
    events, assistant, out, _ = await converse(
        asr_service, llm_service, tts_service, settings, turn_model, audio, eagerness="high", metrics=metrics
    )
    assert count(metrics, "hit") == 1
    kinds = [type(e).__name__ for _, e in events]
    stopped = kinds.index(SpeechStopped.__name__)
    assert AssistantText.__name__ not in kinds[:stopped], kinds  # nothing was shown before the turn ended
    assert AssistantAudioStarted.__name__ in kinds[stopped:], kinds
    assert [m.role for m in assistant.history] == ["user", "assistant"], assistant.history
    assert out.written_samples > 0


async def test_turn_speculative_answers_off_answers_only_once_the_turn_has_ended(
    asr_service: AsrService,
    llm_service: LlmService,
    tts_service: TtsService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    turn_model: TurnModel,
) -> None:
    """The same turn as above with turn_speculative_answers off: no answer is started in the pause
    (neither a hit nor a miss is counted); the answer is written after the turn ends, and sent."""
    settings = base_settings.model_copy(update={**VOICE, "turn_rescore_ms": 0, "turn_speculative_answers": False})
    audio = np.concatenate([silence(0.5), speech("Play the song by").audio16k, silence(4.0)]).astype(np.float32)
    metrics = Metrics()
    events, assistant, out, _ = await converse(
        asr_service, llm_service, tts_service, settings, turn_model, audio, eagerness="high", metrics=metrics
    )
    assert {result: count(metrics, result) for result in ("hit", "miss")} == {"hit": 0, "miss": 0}
    kinds = [type(e).__name__ for _, e in events]
    assert AssistantAudioStarted.__name__ in kinds[kinds.index(SpeechStopped.__name__) :], kinds
    assert [m.role for m in assistant.history] == ["user", "assistant"], assistant.history
    assert out.written_samples > 0


async def test_a_spoken_answer_cut_before_its_audio_ends_its_text_once_it_was_sent(
    asr_service: AsrService, llm_service: LlmService, tts_service: TtsService, base_settings: Settings
) -> None:
    """A spoken answer whose first words had gone to the client (``assistant`` deltas), cut before any
    audio (the user went on, another turn came): the client is told its text ends (an ``assistant``
    final, ``interrupted``), once, even when two interrupts cut it at once (a client's interrupt
    beside a barge-in); no audio start or stop is sent for it. A user trial saw its text hang without
    an end; a review found two interrupts at once each ending a turn."""
    settings = base_settings.model_copy(update=VOICE)
    events: list[SessionEvent] = []
    first_text = asyncio.Event()

    async def emit(event: SessionEvent) -> None:
        events.append(event)
        if isinstance(event, AssistantText) and event.delta:
            first_text.set()

    out = AudioOut(SAMPLE_RATE_HZ)  # nobody takes its frames: nothing is heard
    options = AssistantOptions.from_settings(settings)
    assistant = Assistant(llm_service, tts_service, settings, options, emit, out, asr_service.metrics)
    try:
        await assistant.answer("Tell me a long story about a dragon and a knight.")
        async with asyncio.timeout(60):
            await first_text.wait()
        # (The first clause's audio needs four words or more: one token in, it cannot have started.)
        assert not any(isinstance(e, AssistantAudioStarted) for e in events), events
        cut = await asyncio.gather(assistant.interrupt(), assistant.interrupt())
        assert sorted(cut) == [False, True]
        finals = [e for e in events if isinstance(e, AssistantText) and e.final]
        assert len(finals) == 1 and finals[0].interrupted, events
        assert finals[0].text and finals[0].text == "".join(e.delta for e in events if isinstance(e, AssistantText))
        assert not any(isinstance(e, AssistantAudioStarted | AssistantAudioStopped) for e in events), events
        assert [m.role for m in assistant.history] == ["user"], assistant.history  # nothing of it was heard
    finally:
        await assistant.aclose()


async def test_a_paused_answer_says_so_and_says_when_it_resumes(
    asr_service: AsrService, llm_service: LlmService, tts_service: TtsService, base_settings: Settings
) -> None:
    """Speech over the answer pauses it while its words decide: the client is told (a satellite trial
    saw the frames stop for 3.7 s with no event), and told again when it resumes; a pause the turn
    ends in (cut) is followed by the stop alone."""
    settings = base_settings.model_copy(update=VOICE)
    events: list[SessionEvent] = []
    started = asyncio.Event()

    async def emit(event: SessionEvent) -> None:
        events.append(event)
        if isinstance(event, AssistantAudioStarted):
            started.set()

    out = AudioOut(SAMPLE_RATE_HZ)
    options = AssistantOptions.from_settings(settings)
    assistant = Assistant(llm_service, tts_service, settings, options, emit, out, asr_service.metrics)

    drainer = asyncio.create_task(drain(out))
    try:
        await assistant.answer("Tell me a long story about a dragon and a knight.")
        async with asyncio.timeout(60):
            await started.wait()
        assert assistant.pause() and assistant.paused
        assistant.resume()
        assert assistant.pause()
        assert await assistant.interrupt()
        async with asyncio.timeout(10):
            while not any(isinstance(e, AssistantAudioStopped) for e in events):
                await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # (anything still on its way)
        kinds = [type(e).__name__ for e in events if not isinstance(e, AssistantText)]
        assert kinds == [
            "AssistantAudioStarted",
            "AssistantAudioPaused",
            "AssistantAudioResumed",
            "AssistantAudioPaused",
            "AssistantAudioStopped",
        ], kinds
    finally:
        drainer.cancel()
        await assistant.aclose()
