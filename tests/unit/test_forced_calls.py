"""A forced call's constrained answer becomes one streamed call (mediaserver.llm.forced_calls)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import jsonschema
import pytest

from mediaserver.llm.forced_calls import as_call, call_schema, forced_tools
from mediaserver.llm.tools import ToolCall, ToolCallAccumulator, ToolCallDelta, ToolConfig, ToolSpec
from mediaserver.llm.types import BackendEvent, Finished, TextDelta, Usage

LIGHT = ToolSpec(
    "set_light",
    "Turn a light on or off",
    {"type": "object", "properties": {"name": {"type": "string"}, "on": {"type": "boolean"}}, "required": ["name"]},
)
WEATHER = ToolSpec("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})
ANSWER = '{\n  "name": "set_light",\n  "arguments": {\n    "name": "kitchen {main}",\n    "on": true\n  }\n}'


def run(pieces: list[str], finish: str = "stop", tools: tuple[ToolSpec, ...] = (LIGHT, WEATHER)) -> list[BackendEvent]:
    async def events() -> AsyncIterator[BackendEvent]:
        for piece in pieces:
            yield TextDelta(piece)
        yield Finished(finish, Usage(10, 20))  # type: ignore[arg-type]

    async def collect() -> list[BackendEvent]:
        return [event async for event in as_call(events(), tools)]

    return asyncio.run(collect())


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(ANSWER)])
def test_the_answer_becomes_one_call_streamed_in_pieces(size: int) -> None:
    events = run([ANSWER[i : i + size] for i in range(0, len(ANSWER), size)])
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas[0].id and deltas[0].id.startswith("call_") and deltas[0].name == "set_light"
    assert all(d.id is None and d.name is None for d in deltas[1:])
    calls = ToolCallAccumulator()
    for delta in deltas:
        calls.add(delta)
    (call,) = calls.calls()
    assert json.loads(call.arguments) == {"name": "kitchen {main}", "on": True}
    assert call.arguments == call.arguments.strip()
    assert not any(isinstance(e, TextDelta) for e in events)
    assert events[-1] == Finished("tool_calls", Usage(10, 20))
    if size < 10:
        assert len(deltas) > 2  # the arguments come as they are written


def test_a_fenced_answer_is_a_call_too() -> None:
    events = run(["```json\n", ANSWER, "\n```"])
    assert events[-1].finish_reason == "tool_calls"  # type: ignore[union-attr]


def test_cut_off_arguments_keep_the_finish_reason() -> None:
    events = run([ANSWER[:60]], finish="length")
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas[0].name == "set_light"
    assert "".join(d.arguments for d in deltas).startswith('{\n    "name": "kitch')
    assert events[-1].finish_reason == "length"  # type: ignore[union-attr]


def test_cut_off_before_the_name_is_an_empty_answer() -> None:
    events = run(['{"na'], finish="length")
    assert events == [Finished("length", Usage(10, 20))]


def test_a_named_choice_cut_off_before_the_name_is_its_call_with_no_arguments() -> None:
    """A named tool_choice allows one tool: its call, as OpenAI's names it whatever the cap (a user
    trial's max_tokens 12 got an empty answer, the wrapper taking ~17 tokens)."""
    events = run(['{"na'], finish="length", tools=(LIGHT,))
    assert len(events) == 2 and events[1] == Finished("length", Usage(10, 20))
    (delta,) = events[:1]
    assert isinstance(delta, ToolCallDelta) and (delta.name, delta.arguments) == ("set_light", "")
    assert delta.id and delta.id.startswith("call_")
    assert run([ANSWER[:10]], finish="stop", tools=(LIGHT,)) == [Finished("stop", Usage(10, 20))]  # not cut: no call


def test_which_choices_force_a_call() -> None:
    assert forced_tools(ToolConfig((LIGHT, WEATHER), "auto")) is None
    assert forced_tools(ToolConfig((LIGHT, WEATHER), "required")) == (LIGHT, WEATHER)
    assert forced_tools(ToolConfig((LIGHT, WEATHER), "get_weather", forced=True)) == (WEATHER,)


def test_the_schema_takes_exactly_a_call_of_an_offered_tool() -> None:
    schema = call_schema((LIGHT, WEATHER))
    jsonschema.validate(json.loads(ANSWER), schema)
    for wrong in (
        {"name": "open_door", "arguments": {}},
        {"name": "set_light", "arguments": {"on": True}},  # "name" is required
        {"name": "set_light"},
        {"name": "get_weather", "arguments": {}, "extra": 1},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        ('{"name": "kitchen", "on": true}', '{"name": "kitchen", "on": true}'),  # JSON: as written
        ("", "{}"),  # blank: a call without arguments
        ("  ", "{}"),
        ('{\n    "name', "{}"),  # cut off at the token cap
        ("[1, 2]", "{}"),  # JSON, but templates read arguments as a mapping
        ('{"on": NaN}', "{}"),  # Python's parser takes NaN; JSON and llama-server's do not
    ],
)
def test_the_engine_gets_arguments_that_parse(written: str, sent: str) -> None:
    """llama-server parses a history's arguments to render its template (a 500 when they do not),
    and templates read them as a mapping: anything but a JSON object goes as ``{}``."""
    call = ToolCall("call_1", "set_light", written)
    assert call.openai(json_arguments=True)["function"]["arguments"] == sent
    assert call.openai()["function"]["arguments"] == written  # an upstream gets them as written
    assert isinstance(json.loads(sent), dict)
