"""Function calling on /v1/chat/completions, through the ``openai`` SDK, on both engines.

- ``embedded``: the server's own llama-server on the bundled SmolLM2 (its tool template,
  mediaserver/llm/chat_templates/; a forced call constrained by mediaserver.llm.forced_calls).
- ``upstream``: a real OpenAI-compatible upstream, llama-cpp-python's server on the same GGUF with
  ``chatml-function-calling`` (grammar-constrained calls), the fields passed through.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import jsonschema
import openai
import pytest
import pytest_asyncio
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from mediaserver.config import Settings
from mediaserver.llm.registry import bundled_gguf
from tests.llama_upstream import llama_server, server_with_llm
from tests.ports import bound_port

UPSTREAM_ALIAS = "smollm2-tools"
MODEL = "gpt-4o-mini"  # an alias of the default model on either engine
LIGHT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "on": {"type": "boolean"}},
    "required": ["name", "on"],
}
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {"name": "set_light", "description": "Turn a light on or off", "parameters": LIGHT_SCHEMA},
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
]
KITCHEN: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Turn on the kitchen light."}]
WEATHER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
SET_LIGHT: Any = {"type": "function", "function": {"name": "set_light"}}


@pytest.fixture(scope="module")
def tools_upstream() -> Iterator[str]:
    with llama_server(UPSTREAM_ALIAS, "--chat_format", "chatml-function-calling") as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session", params=["embedded", "upstream"])
async def sdk(
    request: pytest.FixtureRequest, server_factory: Any, base_settings: Settings
) -> AsyncIterator[openai.AsyncOpenAI]:
    if request.param == "embedded":
        live = await server_factory()
        async with openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as client:
            yield client
        return
    upstream = request.getfixturevalue("tools_upstream")
    async with (
        server_with_llm(server_factory, base_settings, llm_upstream_url=upstream) as live,
        openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as client,
    ):
        yield client


async def test_named_tool_choice_returns_a_schema_valid_call(sdk: openai.AsyncOpenAI) -> None:
    answer = await sdk.chat.completions.create(
        model=MODEL, messages=KITCHEN, tools=TOOLS, tool_choice=SET_LIGHT, temperature=0
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id
    assert call.function.name == "set_light"
    jsonschema.validate(json.loads(call.function.arguments), LIGHT_SCHEMA)
    assert not choice.message.content


async def test_named_tool_choice_streams_as_the_sdk_accumulates(sdk: openai.AsyncOpenAI) -> None:
    argument_deltas = []
    async with sdk.chat.completions.stream(
        model=MODEL, messages=KITCHEN, tools=TOOLS, tool_choice=SET_LIGHT, temperature=0
    ) as stream:
        async for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                argument_deltas.append(event.arguments_delta)
        final = await stream.get_final_completion()
    assert len(argument_deltas) > 1  # streamed in pieces, not in one chunk at the end
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "set_light"  # the name once, not once per chunk
    assert calls[0].function.arguments == "".join(argument_deltas)
    jsonschema.validate(json.loads(calls[0].function.arguments), LIGHT_SCHEMA)


async def test_raw_stream_chunks_name_a_call_once(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model=MODEL, messages=KITCHEN, tools=TOOLS, tool_choice=SET_LIGHT, temperature=0, stream=True
    )
    pieces = [tc async for chunk in stream for c in chunk.choices for tc in c.delta.tool_calls or ()]
    assert pieces[0].id and pieces[0].type == "function" and pieces[0].function is not None
    assert pieces[0].function.name == "set_light"
    assert all(p.id is None and p.function is not None and p.function.name is None for p in pieces[1:])
    assert {p.index for p in pieces} == {0}


async def test_auto_tool_choice(sdk: openai.AsyncOpenAI) -> None:
    """``auto``: the model decides. Only the shape is asserted; how often the 135M model calls is printed."""
    called = 0
    runs = 4
    for seed in range(runs):
        answer = await sdk.chat.completions.create(
            model=MODEL, messages=KITCHEN, tools=TOOLS, tool_choice="auto", temperature=0.7, seed=seed, max_tokens=60
        )
        choice = answer.choices[0]
        if choice.message.tool_calls:
            called += 1
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                assert call.type == "function"
                assert call.function.name in {"set_light", "get_weather"}
        else:
            assert choice.finish_reason in ("stop", "length")
            assert isinstance(choice.message.content, str)
    print(f"auto: the model called a tool in {called} of {runs} answers")


async def test_required_calls_one_of_the_offered_tools(sdk: openai.AsyncOpenAI, request: pytest.FixtureRequest) -> None:
    """``required`` with two tools: a call of one of them, its arguments valid for that one."""
    if request.node.callspec.params["sdk"] == "upstream":
        pytest.skip("llama-cpp-python's server has no tool_choice 'required' with more than one tool")
    schemas = {tool["function"]["name"]: tool["function"].get("parameters", {}) for tool in TOOLS}
    for messages in (KITCHEN, WEATHER):
        answer = await sdk.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", temperature=0
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert calls, choice.message
        made = []
        for call in calls:
            assert call.type == "function" and call.function.name in schemas
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
            made.append((call.function.name, call.function.arguments))
        print(f"required: {messages[0]['content']!r} -> {made}")


async def test_tool_results_in_the_history_are_answered(sdk: openai.AsyncOpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [
        *KITCHEN,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "set_light", "arguments": '{"name": "kitchen", "on": true}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"kitchen": "on"}'},
    ]
    answer = await sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=40
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content
    assert not answer.choices[0].message.tool_calls


# --- bad input: answered before any model runs (the shared embedded-engine server) -------------
@pytest_asyncio.fixture(loop_scope="session")
async def local_sdk(server_factory: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    live = await server_factory()
    async with openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


async def _bad_request(client: openai.AsyncOpenAI, model: str = MODEL, **kwargs: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=model, messages=KITCHEN, max_tokens=5, **kwargs)
    return caught.value


async def test_tool_choice_naming_an_unknown_function_is_a_400(local_sdk: openai.AsyncOpenAI) -> None:
    error = await _bad_request(
        local_sdk, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "open_door"}}
    )
    assert isinstance(error.body, dict) and error.body.get("param") == "tool_choice"
    assert "open_door" in error.message


async def test_a_schema_that_is_not_json_schema_is_a_400(local_sdk: openai.AsyncOpenAI) -> None:
    bad: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]
    error = await _bad_request(local_sdk, tools=bad)
    assert isinstance(error.body, dict) and error.body.get("param") == "tools"
    assert "JSON Schema" in error.message
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"minLength": -1}}}}}]
    error = await _bad_request(local_sdk, tools=bad)
    assert "JSON Schema" in error.message


async def test_other_bad_tools_are_400s(local_sdk: openai.AsyncOpenAI) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"type": "code_interpreter"}]}, "tools"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
    ]
    for kwargs, param in cases:
        error = await _bad_request(local_sdk, **kwargs)
        assert isinstance(error.body, dict) and error.body.get("param") == param, (kwargs, error.body)


async def test_a_model_whose_template_renders_no_tools_says_which_settings_help(
    server_factory: Any, base_settings: Settings
) -> None:
    """The same GGUF under another name keeps its own template (SmolLM2's renders no tools): a 400."""
    gguf = bundled_gguf()
    assert gguf is not None
    settings = {"llm_extra_models": {"plain-smollm2": str(gguf)}, "llm_preload": False, "llm_slots": 1}
    async with (
        server_with_llm(server_factory, base_settings, **settings) as live,
        openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as client,
    ):
        error = await _bad_request(client, model="plain-smollm2", tools=TOOLS, tool_choice=SET_LIGHT)
        assert isinstance(error.body, dict) and error.body.get("param") == "tools"
        assert "llm_chat_templates" in error.message and "llm_upstream_url" in error.message
        plain = await client.chat.completions.create(model="plain-smollm2", messages=KITCHEN, max_tokens=5)
        assert plain.choices[0].message.content  # the model itself works


# --- a model that writes invalid arguments (a fault the grammar-constrained engines cannot make) --
BROKEN_ARGUMENTS = '{"name": "kitchen", "on": tru'


@pytest_asyncio.fixture(loop_scope="session")
async def careless_upstream() -> AsyncIterator[str]:
    """An OpenAI-compatible server whose model calls ``set_light`` with arguments that are not JSON."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "careless"}
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        call = {"index": 0, "id": "call_x", "type": "function", "function": {"name": "set_light", "arguments": ""}}
        await response.write(chunk({"role": "assistant", "tool_calls": [call]}))
        for piece in (BROKEN_ARGUMENTS[:12], BROKEN_ARGUMENTS[12:]):
            await response.write(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
        await response.write(chunk({}, "tool_calls"))
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "careless", "object": "model", "owned_by": "x"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}/v1"
    finally:
        await runner.cleanup()


async def test_invalid_arguments_from_an_upstream_reach_the_client_as_sent(
    server_factory: Any, base_settings: Settings, careless_upstream: str
) -> None:
    async with (
        server_with_llm(server_factory, base_settings, llm_upstream_url=careless_upstream) as live,
        openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as client,
    ):
        answer = await client.chat.completions.create(model="careless", messages=KITCHEN, tools=TOOLS)
        calls = answer.choices[0].message.tool_calls
        assert answer.choices[0].finish_reason == "tool_calls" and calls
        call = calls[0]
        assert call.type == "function" and call.function.name == "set_light"
        assert call.function.arguments == BROKEN_ARGUMENTS
        stream = await client.chat.completions.create(model="careless", messages=KITCHEN, tools=TOOLS, stream=True)
        pieces = [tc async for c in stream for choice in c.choices for tc in choice.delta.tool_calls or ()]
        assert "".join(p.function.arguments or "" for p in pieces if p.function) == BROKEN_ARGUMENTS


async def test_a_call_stopped_by_max_tokens_finishes_length_and_its_history_is_answered(
    sdk: openai.AsyncOpenAI, request: pytest.FixtureRequest
) -> None:
    """A forced call cut by ``max_tokens`` while its arguments were written is ``length`` on the
    embedded engine (as OpenAI's are), with the arguments so far; an upstream's own reason is passed
    on (llama-cpp-python's server says ``tool_calls``). Sent back as it came, the history is answered:
    llama-server answered 500 to arguments that do not parse, and the client got a 502.
    The caps are where each engine's call of ``set_light`` is cut inside its arguments."""
    embedded = request.node.callspec.params["sdk"] == "embedded"
    cut = await sdk.chat.completions.create(
        model=MODEL,
        messages=KITCHEN,
        tools=TOOLS,
        tool_choice=SET_LIGHT,
        temperature=0,
        max_tokens=20 if embedded else 14,
    )
    choice = cut.choices[0]
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1, choice
    call = calls[0]
    assert call.type == "function" and call.function.name == "set_light", call
    print(f"cut: {choice.finish_reason} {call.function.arguments!r}")
    assert choice.finish_reason == ("length" if embedded else "tool_calls"), choice
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)
    history: list[ChatCompletionMessageParam] = [
        *KITCHEN,
        choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
        {"role": "tool", "tool_call_id": call.id, "content": "Error: the call was cut off."},
    ]
    answer = await sdk.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=20
    )
    assert answer.choices[0].message.content, answer
    if embedded:  # cut before the call's name was written: still the named tool's call, no arguments
        early = await sdk.chat.completions.create(
            model=MODEL, messages=KITCHEN, tools=TOOLS, tool_choice=SET_LIGHT, temperature=0, max_tokens=8
        )
        choice = early.choices[0]
        assert choice.finish_reason == "length" and choice.message.tool_calls is not None, choice
        (early_call,) = choice.message.tool_calls
        assert early_call.type == "function", early_call
        assert (early_call.function.name, early_call.function.arguments) == ("set_light", ""), early_call
