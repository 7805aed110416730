"""A turn's prompt fitted to the model's limit (mediaserver/assistant/prompt_fit.py), against an
upstream's estimate (``llm_upstream_bytes_per_token``: no engine and no network are needed; the
engine's exact count is tested with the real llama-server in
tests/integration/test_realtime_prompt_fit.py and test_ws_client_tools.py)."""

from __future__ import annotations

from typing import Any

from mediaserver.assistant.prompt_fit import fit
from mediaserver.config import Settings
from mediaserver.llm.prompt_size import prompt_bytes
from mediaserver.llm.service import LlmService
from mediaserver.llm.tools import ToolCall, ToolConfig, ToolSpec
from mediaserver.llm.types import ChatMessage
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
