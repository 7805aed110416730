"""Realtime function calling through the SDK's ``client.realtime.connect``: the session's
``tools``, a response that calls one (``response.output_item.added`` with a ``function_call``
item, ``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``,
``response.done``), the client's ``function_call_output`` and ``response.create``, and the answer
spoken after it. Every event is validated against the SDK's own models.

The LLM is llama-cpp-python's server on the bundled SmolLM2 (grammar-constrained calls); the
session names the function in ``tool_choice``, since that model never picks one by itself.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest
import pytest_asyncio

from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from tests.conftest import LiveServer
from tests.integration.test_realtime_conversation import audio_of, sdk, until
from tests.integration.test_voice_loop import transcribe
from tests.llama_upstream import llama_server, server_with_llm

MODEL = "smollm2-realtime-tools"
LIGHT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "enum": ["kitchen", "bedroom"]}, "on": {"type": "boolean"}},
    "required": ["name", "on"],
}
SET_LIGHT = {
    "type": "function",
    "name": "set_light",
    "description": "Turn a light on or off",
    "parameters": LIGHT_SCHEMA,
}


@pytest.fixture(scope="module")
def tools_upstream() -> Iterator[str]:
    with llama_server(MODEL, "--chat_format", "chatml-function-calling") as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session", params=["embedded", "upstream"])
async def rt_server(
    request: pytest.FixtureRequest, server_factory: Callable[..., Any], base_settings: Settings
) -> AsyncIterator[LiveServer]:
    """The server with the session's shared embedded engine, or with llama-cpp-python as its upstream."""
    settings: dict[str, Any] = {
        "assistant_temperature": 0.0,
        "assistant_max_answer_tokens": 30,
        "realtime_audio_lead_ms": 600_000,
    }
    if request.param == "embedded":
        embedded: LiveServer = await server_factory(**settings)
        yield embedded
        return
    settings["llm_upstream_url"] = request.getfixturevalue("tools_upstream")
    async with server_with_llm(server_factory, base_settings, **settings) as server:
        yield server


async def test_function_call_round_trip_then_a_spoken_answer(rt_server: LiveServer, asr_service: AsrService) -> None:
    async with sdk(rt_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={
                "type": "realtime",
                "instructions": "You control the lights.",
                "tools": [SET_LIGHT],
                "tool_choice": {"type": "function", "name": "set_light"},
                "max_output_tokens": 80,  # room for the call (the embedded engine writes indented JSON)
            }
        )
        updated = (await until(connection, "session.updated"))[-1]
        assert [t.name for t in updated.session.tools] == ["set_light"]
        await connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Turn on the kitchen light."}],
            }
        )
        await connection.response.create()
        events = await until(connection, "response.done", timeout=120)
        kinds = [e.type for e in events]
        added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call")
        call_id, item_id = added.item.call_id, added.item.id
        assert call_id and added.item.name == "set_light"
        deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert all(d.call_id == call_id and d.item_id == item_id for d in deltas) and done.call_id == call_id
        assert "".join(d.delta for d in deltas) == done.arguments
        assert len(deltas) > 1  # streamed as the model writes them
        jsonschema.validate(json.loads(done.arguments), LIGHT_SCHEMA)
        item_done = next(e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call")
        assert item_done.item.arguments == done.arguments and item_done.item.status == "completed"
        assert kinds.index("response.function_call_arguments.done") < kinds.index("response.done")
        response = events[-1].response
        assert response.status == "completed"
        assert [o.type for o in response.output if o.type == "function_call"] == ["function_call"]

        # The client runs the function and answers; the next response speaks.
        await connection.session.update(session={"type": "realtime", "tool_choice": "none", "max_output_tokens": 30})
        await until(connection, "session.updated")
        await connection.conversation.item.create(
            item={"type": "function_call_output", "call_id": call_id, "output": "The kitchen light is now on."}
        )
        created = (await until(connection, "conversation.item.done"))[-1]
        assert created.item.type == "function_call_output" and created.item.call_id == call_id
        await connection.response.create()
        answer = await until(connection, "response.done", timeout=120)
        status = answer[-1].response.status
        assert status in ("completed", "incomplete"), answer[-1]  # incomplete: the token cap cut the answer
        transcript = next(e.transcript for e in answer if e.type == "response.output_audio_transcript.done")
        heard = await transcribe(asr_service, audio_of(answer), 24000)
        print(f"call {done.arguments}; spoken answer ({status}) {transcript!r}, heard {heard!r}")
        assert transcript.strip() and np.any(audio_of(answer))


async def test_output_for_an_unknown_call_is_an_error_and_the_session_stays(rt_server: LiveServer) -> None:
    async with sdk(rt_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await connection.conversation.item.create(
            item={"type": "function_call_output", "call_id": "call_nope", "output": "{}"}
        )
        error = (await until(connection, "error"))[-1]
        assert error.error.param == "item.call_id" and "call_nope" in error.error.message
        await connection.session.update(
            session={"type": "realtime", "tools": [SET_LIGHT], "tool_choice": {"type": "function", "name": "open_door"}}
        )
        error = (await until(connection, "error"))[-1]
        assert error.error.param == "session.tool_choice"
        await connection.session.update(session={"type": "realtime", "instructions": "still here"})
        assert (await until(connection, "session.updated"))[-1].session.instructions == "still here"


async def test_a_call_the_token_cap_cut_is_incomplete_and_its_output_is_answered(
    server_factory: Callable[..., Any],
) -> None:
    """On the embedded engine, ``max_output_tokens`` 20 stops the named call inside its arguments:
    the response is ``incomplete`` and so is the call's item, with the arguments so far; the client
    answers it anyway and the next response, whose history holds the cut call, is answered (the
    engine refused such a history before: a 500, and the response failed)."""
    server: LiveServer = await server_factory(assistant_temperature=0.0, realtime_audio_lead_ms=600_000)
    async with sdk(server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "tools": [SET_LIGHT],
                "tool_choice": {"type": "function", "name": "set_light"},
                "max_output_tokens": 20,
            }
        )
        await until(connection, "session.updated")
        text = {"type": "input_text", "text": "Turn on the kitchen light."}
        await connection.conversation.item.create(item={"type": "message", "role": "user", "content": [text]})
        await connection.response.create()
        events = await until(connection, "response.done", timeout=120)
        item = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call")
        print(f"cut call {item.arguments!r}, {item.status}")
        assert events[-1].response.status == "incomplete", events[-1].response
        assert item.status == "incomplete", item
        with pytest.raises(ValueError):
            json.loads(item.arguments or "")
        await connection.session.update(session={"type": "realtime", "tool_choice": "none", "max_output_tokens": 20})
        await until(connection, "session.updated")
        output = {"type": "function_call_output", "call_id": item.call_id, "output": "Error: the call was cut off."}
        await connection.conversation.item.create(item=output)
        await connection.response.create()
        answer = (await until(connection, "response.done", timeout=120))[-1].response
        assert answer.status in ("completed", "incomplete"), answer
        assert any(part.text for o in answer.output if o.type == "message" for part in o.content or ()), answer
