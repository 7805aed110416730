"""A question prefilled while it is spoken (``turn_prefill_partials``), with real parts: Piper's
question streamed in real time into a StreamSession that runs partial decodes, with semantic turns
(the real turn model), the real ASR service, and the bundled LLM and Piper answering through an
Assistant.

Each partial decode (whether or not its words are promised yet and sent) has the LLM engine evaluate
the prompt the answer will send (the history and the words so far) into the slot the answer takes:
the answer's request then evaluates only what the final adds to the last partial (its last word or
two, the closing mark and the template's assistant header)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.events import (
    AssistantAudioStarted,
    FinalTranscript,
    PartialTranscript,
    SessionEvent,
    TranscriptionOptions,
)
from mediaserver.llm.service import LlmService
from mediaserver.stream.options import StreamOptions
from mediaserver.stream.session import StreamSession
from mediaserver.tts.service import TtsService
from mediaserver.turns.model import TurnModel
from tests.conftest import Clip
from tests.integration.test_speculative import VOICE, converse, turn_model  # noqa: F401 (a fixture)
from tests.integration.test_turns import silence
from tests.llm_engine import wait_idle
from tests.unit.test_stream_session import until

QUESTION = "How many legs does a spider have?"  # ends in "?": the text end-of-turn score skips it


async def _ignore(event: SessionEvent) -> None:
    pass


async def another_stream(
    asr: AsrService, settings: Settings, speech: Callable[[str], Clip], *, speaking: bool
) -> StreamSession:
    """Another device's stream (server VAD); ``speaking``: its user is heard in mid-sentence, and no
    silence comes to end it (gap filling off: the device sends nothing more)."""
    other = StreamSession(
        asr, settings.model_copy(update={"stream_gap_fill_ms": 0}), _ignore, StreamOptions(server_vad=True)
    )
    if speaking:
        await other.feed(speech("I am still talking about something else entirely").audio16k)
        assert other.speaking
    return other


def counter(metric: object, model: str) -> float:
    return float(metric.labels(model)._value.get())  # type: ignore[attr-defined]


CASES = {  # partials asked for, settings, another stream in speech, prefilled
    "default": (True, {}, False, True),
    # turn_prefill_decodes auto (the default), no other stream in speech: decoded for the prefill
    "no partials asked": (False, {}, False, True),
    "no partials asked, another stream speaking": (False, {}, True, False),  # auto: its decodes come first
    "no partials asked, decodes on, another stream speaking": (False, {"turn_prefill_decodes": True}, True, True),
    "no partials asked, decodes off": (False, {"turn_prefill_decodes": False}, False, False),
    "off": (True, {"turn_prefill_partials": False}, False, False),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_question_is_in_the_llms_cache_before_its_final(
    asr_service: AsrService,
    llm_service: LlmService,
    tts_service: TtsService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    turn_model: TurnModel,  # noqa: F811
    case: str,
) -> None:
    """Prefilled, the answer's request finds all but the last few prompt tokens in the cache (a
    system prompt new to the engine, so nothing else could have put them there): a client that
    asked for partials, or one that asked for none with ``turn_prefill_decodes`` auto (the default)
    while no other stream is in speech, or true; with ``turn_prefill_partials`` off, a client that
    asked for no partials with ``turn_prefill_decodes`` off, or auto while another stream is in
    speech, nothing is prefilled and the request evaluates the system prompt and the question itself."""
    partials, update, other_speaking, prefill = CASES[case]
    await wait_idle(llm_service)
    name = ("Quillon", "Marrow", "Osric", "Pellam", "Tansy", "Bramwell")[list(CASES).index(case)]
    system = f"{name} is your name. {VOICE['assistant_system_prompt']}"  # one the engine has not seen
    settings = base_settings.model_copy(update={**VOICE, "assistant_system_prompt": system, **update})
    model = llm_service.sources.resolve(None).name
    metrics = llm_service.metrics
    before = {
        what: counter(getattr(metrics, what), model) for what in ("prefills", "prompt_tokens", "cached_prompt_tokens")
    }
    audio = np.concatenate([silence(0.5), speech(QUESTION).audio16k, silence(3.0)]).astype(np.float32)
    other = await another_stream(asr_service, settings, speech, speaking=other_speaking)
    try:
        events, _, _, _ = await converse(
            asr_service, llm_service, tts_service, settings, turn_model, audio, eagerness="high", partials=partials
        )
        assert other.speaking == other_speaking
    finally:
        await other.aclose()
    after = {what: counter(getattr(metrics, what), model) for what in before}
    kinds = [type(e) for _, e in events]
    assert FinalTranscript in kinds and AssistantAudioStarted in kinds, kinds
    if not partials:
        assert PartialTranscript not in kinds, kinds  # decoded for the prefill alone: nothing sent
    final = next(e for _, e in events if isinstance(e, FinalTranscript))
    assert "spider" in final.transcript.text.lower(), final
    prompt = after["prompt_tokens"] - before["prompt_tokens"]  # the one answer's
    evaluated = prompt - (after["cached_prompt_tokens"] - before["cached_prompt_tokens"])
    assert prompt >= 30, prompt  # the system prompt and the question
    if prefill:
        assert after["prefills"] > before["prefills"]
        assert evaluated <= 12, (evaluated, prompt)  # the words after the last partial, the header
    else:
        assert after["prefills"] == before["prefills"]
        assert evaluated >= 25, (evaluated, prompt)


@pytest.mark.parametrize("mode", ["auto", True, False])
async def test_a_decode_for_the_prefill_alone_waits_for_spare_cores(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], mode: bool | str
) -> None:
    """``turn_prefill_decodes`` auto: a prefill-only decode runs while the ASR has no other job and
    no other stream hears someone speaking (a push-to-talk stream recording does not say so); true:
    always; false: never."""
    settings = base_settings.model_copy(update={"turn_prefill_decodes": mode})
    session = StreamSession(asr_service, settings, _ignore, StreamOptions(server_vad=True))
    push_to_talk = StreamSession(asr_service, settings, _ignore, StreamOptions(server_vad=False))
    other = await another_stream(asr_service, settings, speech, speaking=False)
    try:
        await until(lambda: asr_service.open_jobs() == 0)
        push_to_talk.start_recording()  # records all the time (a Realtime session without turn detection)
        spare = session.decode_for_prefill()
        await other.aclose()
        other = await another_stream(asr_service, settings, speech, speaking=True)
        speaking = session.decode_for_prefill()
        await other.aclose()  # ... and hangs up
        clip = speech("A long upload that keeps the recogniser busy for a while, sentence after sentence.")
        upload = asyncio.create_task(
            asr_service.transcribe(np.tile(clip.audio16k, 4), TranscriptionOptions(language="en"))
        )
        await until(lambda: asr_service.open_jobs() > 0 or upload.done())
        busy = session.decode_for_prefill() if not upload.done() else None
        await upload
        assert (spare, speaking, busy) == {"auto": (True, False, False), True: (True,) * 3, False: (False,) * 3}[mode]
    finally:
        await other.aclose()
        await push_to_talk.aclose()
        await session.aclose()
