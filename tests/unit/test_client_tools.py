"""The page's tools (mediaserver/assistant/client_tools.py) without a page: parsing what ``start``
declares, and a call's wait for an answer, a timeout, a hang-up, a barge-in."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mediaserver.assistant.client_tools import (
    ClientToolbox,
    SessionToolbox,
    parse_client_tools,
    tool_output_fields,
)
from mediaserver.assistant.mcp import McpToolbox
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.llm.tools import ToolCall
from mediaserver.metrics import Metrics

FLAT = {
    "type": "function",
    "name": "get_local_time",
    "description": "The time on the user's device.",
    "parameters": {"type": "object", "properties": {}},
}
NESTED = {"type": "function", "function": {k: v for k, v in FLAT.items() if k != "type"}}


def toolbox(timeout_s: float = 5.0, **settings: Any) -> ClientToolbox:
    box = ClientToolbox(Settings(assistant_client_tool_timeout_s=timeout_s, **settings), Metrics(), session_id="t")
    box.declare(parse_client_tools([FLAT], None))
    return box


async def answered_soon(box: ClientToolbox, call_id: str, output: str, **kw: Any) -> bool:
    while call_id not in box.waiting:
        await asyncio.sleep(0.01)
    return box.answer(call_id, output, **kw)


def test_both_shapes_and_the_choices_parse() -> None:
    flat, nested = parse_client_tools([FLAT], None), parse_client_tools([NESTED], None)
    assert flat == nested and [s.name for s in flat.specs] == ["get_local_time"]
    assert flat.choice is None  # the operator's mcp_tool_choice
    assert parse_client_tools([FLAT], "required").choice == ("required", False)
    named = {"type": "function", "function": {"name": "get_local_time"}}
    assert parse_client_tools([NESTED], named).choice == ("get_local_time", True)
    assert parse_client_tools([FLAT], {"type": "function", "name": "get_local_time"}).choice == ("get_local_time", True)
    none = parse_client_tools([FLAT], "none")
    assert none.specs == () and none.choice == ("none", False)
    assert parse_client_tools(None, None).specs == ()


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        ({"a": 1}, None, "'tools' must be a list"),
        ([{**FLAT, "parameters": {"type": 5}}], None, "not a valid JSON Schema"),
        ([{**FLAT, "parameters": {"type": 5}}], "none", "not a valid JSON Schema"),
        ([FLAT], "sometimes", "tool_choice must be"),
        ([FLAT], {"type": "function", "name": "other"}, "not in tools"),
        ([], "required", "the request has no tools"),
        ([{"type": "function", "parameters": {}}], None, r"tools\[0\]\.name is required"),
        ([FLAT, {**FLAT, "name": "a b"}], None, r"tools\[1\]\.name must be 1-64 letters"),
    ],
)
def test_bad_declarations_are_invalid_parameters(tools: Any, choice: Any, message: str) -> None:
    with pytest.raises(InvalidParameter, match=message):
        parse_client_tools(tools, choice)


def test_tool_output_fields() -> None:
    assert tool_output_fields({"call_id": "c1", "output": "12:30"}) == ("c1", "12:30", False)
    assert tool_output_fields({"call_id": "c1", "output": {"time": "12:30"}, "is_error": True}) == (
        "c1",
        '{"time": "12:30"}',
        True,
    )
    cases: list[tuple[dict[str, Any], str]] = [
        ({"output": "x"}, "needs 'call_id'"),
        ({"call_id": 3, "output": "x"}, "needs 'call_id'"),
        ({"call_id": "c1"}, "needs 'output'"),
        ({"call_id": "c1", "output": "x", "is_error": 1}, "'is_error' must be"),
    ]
    for fields, message in cases:
        with pytest.raises(InvalidParameter, match=message):
            tool_output_fields(fields)


async def test_a_call_waits_for_the_page_answer() -> None:
    box = toolbox()
    call = asyncio.ensure_future(box.call("get_local_time", "{}", call_id="c1"))
    assert await answered_soon(box, "c1", "It is 12:30.")
    result = await call
    assert (result.text, result.is_error) == ("It is 12:30.", False)
    assert not box.answer("c1", "again")  # answered already: unknown now
    assert not box.waiting


async def test_an_error_answer_is_an_error_result() -> None:
    box = toolbox()
    call = asyncio.ensure_future(box.call("get_local_time", "{}", call_id="c1"))
    assert await answered_soon(box, "c1", "no clock here", is_error=True)
    result = await call
    assert result.is_error and result.text == "Error: no clock here"


async def test_no_answer_is_a_timeout_result() -> None:
    box = toolbox(timeout_s=0.2)
    result = await box.call("get_local_time", "{}", call_id="c1")
    assert result.is_error and "did not answer within 0.2 seconds" in result.text
    assert not box.answer("c1", "late")


async def test_closing_ends_the_wait_at_once_and_later_calls_do_not_wait() -> None:
    box = toolbox(timeout_s=60)
    call = asyncio.ensure_future(box.call("get_local_time", "{}", call_id="c1"))
    while not box.waiting:
        await asyncio.sleep(0.01)
    box.close()
    result = await asyncio.wait_for(call, 1)
    assert result.is_error and "the page disconnected" in result.text
    later = await asyncio.wait_for(box.call("get_local_time", "{}", call_id="c2"), 1)
    assert later.is_error and "cannot run" in later.text


async def test_a_cancelled_turn_leaves_nothing_waiting() -> None:
    box = toolbox(timeout_s=60)
    call = asyncio.ensure_future(box.call("get_local_time", "{}", call_id="c1"))
    while not box.waiting:
        await asyncio.sleep(0.01)
    call.cancel()  # barge-in: the turn is cancelled, not answered
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not box.waiting and not box.answer("c1", "late")


async def test_calls_the_page_cannot_run_are_refused_without_waiting() -> None:
    box = toolbox(timeout_s=60)
    for name, arguments, text in [
        ("get_weather", "{}", "no tool named 'get_weather'"),
        ("get_local_time", "{not json", "not valid JSON"),
        ("get_local_time", "[1]", "must be a JSON object"),
    ]:
        result = await asyncio.wait_for(box.call(name, arguments, call_id="c1"), 1)
        assert result.is_error and text in result.text, result


async def test_long_answers_are_cut_for_the_model() -> None:
    box = toolbox(mcp_max_result_chars=100)
    call = asyncio.ensure_future(box.call("get_local_time", "", call_id="c1"))
    assert await answered_soon(box, "c1", "x" * 500)
    result = await call
    assert result.text == "x" * 100 + "\n[truncated: the result had 500 characters, 100 shown]"


async def test_the_session_toolbox_offers_both_and_the_operators_win() -> None:
    settings = Settings()
    operator = McpToolbox(settings, Metrics())  # no servers configured: no tools
    client = ClientToolbox(settings, Metrics())
    tools = SessionToolbox(client, operator)
    assert tools.tools() == [] and tools.tool_choice is None
    client.declare(parse_client_tools([FLAT], "required"))
    assert [t.name for t in tools.tools()] == ["get_local_time"]
    assert tools.client_side("get_local_time") and not tools.client_side("set_light")
    assert tools.tool_choice == ("required", False)
    tools.check_clash(client.declared)  # no operator tool of that name
    client.declare(parse_client_tools([FLAT], "none"))
    assert tools.tools() == []  # tool_choice none: no calls at all
    client.declare(parse_client_tools([FLAT], None))
    call = asyncio.ensure_future(tools.run(ToolCall("c1", "get_local_time", "{}")))
    assert await answered_soon(client, "c1", "noon")
    assert (await call).text == "noon"
    result = await tools.run(ToolCall("c2", "set_light", "{}"))  # the operator's: it has none
    assert result.is_error and "no tool named" in result.text


UNLOCK = {
    "type": "function",
    "name": "unlock_door",
    "description": "Unlock the front door.",
    "parameters": {"type": "object", "properties": {}},
}


@pytest.mark.parametrize(("speaker", "offered"), [("alice", True), ("bob", False), (None, False)])
async def test_a_tool_some_speakers_may_use_is_theirs_alone(speaker: str | None, offered: bool) -> None:
    """speaker_tools: unlock_door is offered (and runs) on alice's turns only, never on an unknown
    voice's; the tools nobody restricted stay everyone's."""
    from mediaserver.assistant.speaker_tools import gated

    settings = Settings(assistant_client_tool_timeout_s=5.0, speaker_tools={"unlock_door": ["alice"]})
    box = ClientToolbox(settings, Metrics(), session_id="t")
    box.declare(parse_client_tools([FLAT, UNLOCK], None))
    gate = gated(box, settings.speaker_tools, speaker)
    assert gate is not None
    names = [spec.name for spec in gate.tools()]
    assert ("unlock_door" in names) is offered and "get_local_time" in names
    if offered:
        answer = asyncio.ensure_future(answered_soon(box, "c1", "unlocked"))
        result = await gate.run(ToolCall("c1", "unlock_door", "{}"))
        assert await answer and result.text == "unlocked" and not result.is_error
    else:  # called anyway (a model may call what it was not offered): refused, the page never asked
        result = await gate.run(ToolCall("c1", "unlock_door", "{}"))
        assert result.is_error and "may not be used" in result.text and "speaker_tools" in result.text
        assert box.waiting == []
    assert gated(box, {}, speaker) is box  # nothing restricted: the toolbox itself
