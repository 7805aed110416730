"""A question prefilled while it is spoken (``turn_prefill_partials``), with real parts: Piper's
question streamed in real time into a StreamSession that runs partial decodes, with semantic turns
(the real turn model), the real ASR service, and the bundled LLM and Piper answering through an
Assistant.

Each partial decode (whether or not its words are promised yet and sent) has the LLM engine evaluate
the prompt the answer will send (the history and the words so far) into the slot the answer takes:
the answer's request then evaluates only what the final adds to the last partial (its last word or
two, the closing mark and the template's assistant header)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.events import AssistantAudioStarted, FinalTranscript, PartialTranscript
from mediaserver.llm.service import LlmService
from mediaserver.tts.service import TtsService
from mediaserver.turns.model import TurnModel
from tests.conftest import Clip
from tests.integration.test_speculative import VOICE, converse, turn_model  # noqa: F401 (a fixture)
from tests.integration.test_turns import silence
from tests.llm_engine import wait_idle

QUESTION = "How many legs does a spider have?"  # ends in "?": the text end-of-turn score skips it


def counter(metric: object, model: str) -> float:
    return float(metric.labels(model)._value.get())  # type: ignore[attr-defined]


CASES = {  # partials asked for, settings, prefilled
    "default": (True, {}, True),
    "no partials asked": (False, {}, False),  # turn_prefill_decodes off (the default): no decodes, no prefill
    "no partials asked, decodes on": (False, {"turn_prefill_decodes": True}, True),  # decoded for the prefill
    "off": (True, {"turn_prefill_partials": False}, False),
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
    asked for partials, or one that asked for none with ``turn_prefill_decodes`` on; with
    ``turn_prefill_partials`` off, or a client that asked for no partials on the default, nothing is
    prefilled and the request evaluates the system prompt and the question itself."""
    partials, update, prefill = CASES[case]
    await wait_idle(llm_service)
    name = {"default": "Quillon", "no partials asked": "Marrow", "off": "Bramwell"}.get(case, "Tansy")
    system = f"{name} is your name. {VOICE['assistant_system_prompt']}"  # one the engine has not seen
    settings = base_settings.model_copy(update={**VOICE, "assistant_system_prompt": system, **update})
    model = llm_service.sources.resolve(None).name
    metrics = llm_service.metrics
    before = {
        what: counter(getattr(metrics, what), model) for what in ("prefills", "prompt_tokens", "cached_prompt_tokens")
    }
    audio = np.concatenate([silence(0.5), speech(QUESTION).audio16k, silence(3.0)]).astype(np.float32)
    events, _, _, _ = await converse(
        asr_service, llm_service, tts_service, settings, turn_model, audio, eagerness="high", partials=partials
    )
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
