"""A large tool result does not break a Realtime session: the prompt is fitted to the model.

The session has five function tools (as many as tests/mcp_light_server.py lists); the client adds a
call and its output of ``mcp_max_result_chars`` (4,000) characters of dense JSON, the size an MCP
result is cut to. Before, ``assistant_history_tokens`` (characters / 4) kept that output whole with
the tools' schemas left out of the count, so that response and every later one failed with
``context_length_exceeded``. Now each prompt is counted with the engine's own chat template and
tokenizer and cut to ``llm_max_prompt_tokens``: the output's LLM copy is cut (the item keeps it all),
and later turns leave the old turn out. The LLM is the server's own llama-server engine (SmolLM2).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest_asyncio

from tests.conftest import LiveServer
from tests.integration.test_realtime_conversation import sdk, until

LIMIT = 1792  # llm_max_prompt_tokens, the default
LIGHT = {"type": "string", "enum": ["kitchen", "bedroom", "living room"]}


def _tool(tool: str, description: str, **properties: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "name": tool, "description": description, "parameters": schema}


TOOLS = [
    _tool("set_light", "Turn a light (kitchen, bedroom, ...) on or off.", name=LIGHT, on={"type": "boolean"}),
    _tool("get_state", "Whether a light is on or off.", name=LIGHT),
    _tool("get_log", "The lights' log of switches and temperatures.", name=LIGHT),
    _tool("echo", "Say it back.", text={"type": "string"}),
    _tool("broken", "Always fails."),
]


def big_result(chars: int = 4000) -> str:
    """A log as a tool returns it: JSON numbers and names, about two characters a token."""
    rows: list[dict[str, Any]] = []
    n = 0
    while len(json.dumps(rows)) < chars:
        rows.append({"t": f"2025-01-0{n % 9 + 1}T{n % 24:02d}:{n % 60:02d}", "light": "kitchen", "on": n % 2 == 0,
                     "temp": round(19.5 + (n * 37 % 50) / 10, 1)})  # fmt: skip
        n += 1
    return json.dumps(rows)[:chars]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fit_server(server_factory: Callable[..., Any]) -> LiveServer:
    # A prompt fitted to the limit is ~1,750 tokens: a single-threaded engine on a loaded 2-core
    # machine reads it in about 30 s, so the turn may go that long without a token.
    server: LiveServer = await server_factory(
        assistant_temperature=0.0, assistant_max_answer_tokens=20, assistant_turn_timeout_s=180.0
    )
    return server


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def _answered(connection: Any) -> list[Any]:
    """The events up to the next response's ``response.done``: it must not have failed."""
    await connection.response.create()
    events = await until(connection, "response.done", timeout=240)
    errors = [e for e in events if e.type == "error"]
    done = events[-1]
    assert not errors, errors
    assert done.response.status in ("completed", "incomplete"), done.response.status_details
    assert done.response.usage is not None and done.response.usage.input_tokens <= LIMIT, done.response.usage
    return events


async def test_a_session_keeps_answering_after_a_large_tool_result(fit_server: LiveServer) -> None:
    output = big_result()
    async with sdk(fit_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "instructions": "You control the lights. Answer in one short sentence.",
                "tools": TOOLS,
                "tool_choice": "auto",
            }
        )
        await until(connection, "session.updated")
        await connection.conversation.item.create(item=_user("What did the kitchen light do today?"))
        call = {"type": "function_call", "call_id": "call_log", "name": "get_log", "arguments": '{"name":"kitchen"}'}
        await connection.conversation.item.create(item=call)
        await connection.conversation.item.create(
            item={"type": "function_call_output", "call_id": "call_log", "output": output}
        )
        events = await _answered(connection)  # the answer to the result itself
        done_items = [e.item for e in events if e.type == "conversation.item.done"]
        outputs = [item for item in done_items if item.type == "function_call_output"]
        assert outputs and outputs[-1].output == output  # the item keeps it whole: only the LLM's copy is cut
        done = events[-1]
        print(f"after the result: {done.response.usage.input_tokens} prompt tokens")
        for question in ("Is the kitchen light on now?", "And the bedroom?", "Thank you."):
            await connection.conversation.item.create(item=_user(question))
            done = (await _answered(connection))[-1]
            print(f"{question!r}: {done.response.usage.input_tokens} prompt tokens")
