"""A turn's prompt fitted to the model's limit (mediaserver/assistant/prompt_fit.py), against an
upstream's estimate (``llm_upstream_bytes_per_token``: no engine and no network are needed; the
engine's exact count is tested with the real llama-server in
tests/integration/test_realtime_prompt_fit.py and test_ws_client_tools.py), and the same estimate
holding an upstream request to ``llm_max_prompt_tokens`` (a real upstream's answer to it:
tests/integration/test_llm_upstream.py)."""

from __future__ import annotations

from typing import Any

from mediaserver.assistant.prompt_fit import fit
from mediaserver.config import Settings
from mediaserver.llm.prompt_size import PromptTooLong, prompt_bytes
from mediaserver.llm.service import LlmService
from mediaserver.llm.tools import ToolCall, ToolConfig, ToolSpec
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.llm.upstream import UpstreamError
from mediaserver.metrics import Metrics

MODEL = "upstream-model"


def service(**settings: Any) -> LlmService:
    values: dict[str, Any] = {"llm_upstream_url": "http://127.0.0.1:9/v1", "llm_upstream_models": [MODEL]}
    return LlmService(Settings(_env_file=None, **values, **settings), Metrics())


def conversation(result_chars: int) -> list[ChatMessage]:
    return [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "old question " * 20),
        ChatMessage("assistant", "old answer " * 20),
        ChatMessage("user", "What does the log say?"),
        ChatMessage("assistant", "", (ToolCall("call_1", "get_log", '{"name": "kitchen"}'),)),
        ChatMessage("tool", "x" * result_chars, tool_call_id="call_1"),
    ]


TOOLS = ToolConfig((ToolSpec("get_log", "The log.", {"type": "object", "properties": {}}),))


async def test_a_prompt_that_fits_is_sent_as_it_is() -> None:
    llm = service()
    messages = conversation(200)
    assert await fit(llm, messages, TOOLS, MODEL) == messages


async def test_old_turns_go_first_then_the_tool_result_is_cut() -> None:
    llm = service(llm_max_prompt_tokens=1000, llm_upstream_bytes_per_token=2.0)  # 2,000 bytes
    messages = conversation(400)  # the old turn must go; the result fits then
    fitted = await fit(llm, messages, TOOLS, MODEL)
    assert fitted == [messages[0], *messages[3:]]
    messages = conversation(4000)
    fitted = await fit(llm, messages, TOOLS, MODEL)
    assert [m.role for m in fitted] == ["system", "user", "assistant", "tool"]
    result = fitted[-1].content
    assert result.startswith("x" * 100) and "of 4000 characters left out" in result, result[-120:]
    assert prompt_bytes(fitted, TOOLS) <= 2000
    assert prompt_bytes(fitted, TOOLS) > 2000 - 400  # cut to fit, not to nothing
    assert messages[-1].content == "x" * 4000  # the caller's copy is untouched


async def test_the_estimate_follows_the_setting() -> None:
    """A lower ``llm_upstream_bytes_per_token`` counts more tokens: more is cut."""
    messages = conversation(4000)
    kept = {}
    for per_token in (3.0, 1.5):
        llm = service(llm_max_prompt_tokens=1000, llm_upstream_bytes_per_token=per_token)
        fitted = await fit(llm, messages, TOOLS, MODEL)
        kept[per_token] = prompt_bytes(fitted, TOOLS)
        assert kept[per_token] <= 1000 * per_token
    assert kept[1.5] < kept[3.0]


async def test_what_cannot_be_cut_is_left_for_the_engine_to_refuse() -> None:
    llm = service(llm_max_prompt_tokens=100, llm_upstream_bytes_per_token=1.0)
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "a long question " * 50)]
    assert await fit(llm, messages, None, MODEL) == messages
    assert await fit(llm, messages, None, "no-such-model") == messages  # the generation names the error


async def sent_or_refused(llm: LlmService, messages: list[ChatMessage], tools: ToolConfig | None = None) -> str:
    """What the upstream generation does with ``messages``: 'refused' (our 400, nothing sent) or
    'sent' (the upstream, a closed port here, cannot be reached: a 502)."""
    params = GenerationParams(tools=tools)
    try:
        async with llm.stream(messages, params, model=MODEL) as answer:
            await answer.text()
    except PromptTooLong as exc:
        assert exc.status == 400 and exc.code == "context_length_exceeded" and exc.param == "messages"
        assert "an estimate" in exc.message and "llm_upstream_bytes_per_token" in exc.message
        assert f"at most {llm.settings.llm_max_prompt_tokens} (llm_max_prompt_tokens)" in exc.message
        return "refused"
    except UpstreamError as exc:
        assert "cannot be reached" in exc.message
        return "sent"
    raise AssertionError("a closed port answered")


async def test_an_upstream_prompt_over_the_cap_is_a_400_before_it_is_sent() -> None:
    """``llm_max_prompt_tokens`` holds for an upstream model: its prompt is estimated at
    ``llm_upstream_bytes_per_token`` and one over the cap is refused without being sent."""
    question = [ChatMessage("user", "Name three colors.")]  # 18 + 16 bytes: 12 tokens at 3 bytes, 34 at 1
    for per_token, expected in ((3.0, "sent"), (1.0, "refused")):
        llm = service(llm_max_prompt_tokens=20, llm_upstream_bytes_per_token=per_token, llm_upstream_retries=0)
        await llm.start()  # the models are listed: nothing is asked of the upstream
        try:
            assert await sent_or_refused(llm, question) == expected, per_token
        finally:
            await llm.aclose()


async def test_a_fitted_prompt_passes_the_upstream_cap() -> None:
    """What prompt_fit cuts to fit the estimate is what the upstream check lets through."""
    llm = service(llm_max_prompt_tokens=1000, llm_upstream_bytes_per_token=2.0, llm_upstream_retries=0)
    await llm.start()
    try:
        messages = conversation(4000)
        assert await sent_or_refused(llm, messages, TOOLS) == "refused"
        assert await sent_or_refused(llm, await fit(llm, messages, TOOLS, MODEL), TOOLS) == "sent"
    finally:
        await llm.aclose()
