"""A call the request forces (``tool_choice`` ``required`` or a named function) on the llama-server engine.

llama-server parses tool calls and constrains them with a grammar, but that grammar lets the model
write text before its first call (anything up to ``<tool_call>``), and a small model writes text
instead of calling: SmolLM2-135M answers "Turn on the kitchen light." with a Python snippet until
the token cap. So a forced call is asked for as the whole answer: the tools stay in the prompt (the
chat template lists them), and the answer is constrained (``response_format``, a JSON schema) to
``{"name": <an offered function>, "arguments": <its parameters>}`` from its first token, then handed
on as a call. This is what llama-cpp-python's ``chatml-function-calling`` does in-process; llama.cpp's
own server has no "call now" mode, so this is written here (about 60 lines).

One call per answer: ``parallel_tool_calls`` does not make a forced answer call twice.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

from mediaserver.llm.tools import ToolCallDelta, ToolConfig, ToolSpec
from mediaserver.llm.types import BackendEvent, Finished, TextDelta


def forced_tools(config: ToolConfig) -> tuple[ToolSpec, ...] | None:
    """The tools one of which must be called now, or None when the model may answer in words."""
    if config.forced:
        return tuple(tool for tool in config.tools if tool.name == config.choice)
    if config.choice == "required":
        return config.tools
    return None


def call_schema(tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """JSON Schema of one call of one of ``tools``: its name, then arguments matching its parameters."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": dict(tool.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


# The constrained answer opens with its name, then the arguments object; the call's ``}`` closes it.
_HEAD = re.compile(r'\s*(?:```(?:json)?\s*)?\{\s*"name"\s*:\s*"(?P<name>[^"]+)"\s*,\s*"arguments"\s*:\s*')


async def as_call(events: AsyncIterator[BackendEvent], tools: Sequence[ToolSpec]) -> AsyncIterator[BackendEvent]:
    """The constrained answer's events as one call, streamed: a ``ToolCallDelta`` with the id and
    name as soon as the name is written, then the arguments' text in pieces as it comes (the last
    ``}`` so far and the white space before it are held back: they may close the answer's own object).

    An answer cut off before it closed (``max_tokens``) keeps its finish reason and the arguments
    written so far, as OpenAI's own cut-off calls do; one cut off before its name is passed on as text.
    """
    names = {tool.name for tool in tools}
    text = ""
    head_end = -1  # where the arguments start, once the name was seen
    sent = 0  # how far into ``text`` the arguments were sent
    async for event in events:
        if isinstance(event, TextDelta):
            text += event.text
            if head_end < 0:
                head = _HEAD.match(text)
                if head is None or head.group("name") not in names:
                    continue
                head_end = sent = head.end()
                yield ToolCallDelta(0, "call_" + secrets.token_hex(12), head.group("name"), "")
            if sent == head_end:  # the arguments start at their "{"
                while sent < len(text) and text[sent].isspace():
                    sent += 1
                head_end = sent
            release = text.rfind("}")
            while release > sent and text[release - 1].isspace():  # may be before the answer's "}"
                release -= 1
            if release > sent:
                yield ToolCallDelta(0, arguments=text[sent:release])
                sent = release
            continue
        if isinstance(event, Finished) and event.finish_reason != "cancelled":
            if head_end < 0:
                if text:
                    yield TextDelta(text)
                yield event
                return
            whole = _closed_arguments(text, head_end)
            if whole is None:  # cut off: what was written
                if len(text) > sent:
                    yield ToolCallDelta(0, arguments=text[sent:])
                yield event
                return
            if len(whole) > sent - head_end:
                yield ToolCallDelta(0, arguments=whole[sent - head_end :])
            yield Finished("tool_calls", event.usage)
            return
        yield event


def _closed_arguments(text: str, head_end: int) -> str | None:
    """The arguments' JSON text of a whole answer (up to the answer's closing ``}``), None if not whole."""
    end = text.rfind("}")
    arguments = text[head_end:end].rstrip() if end >= head_end else ""
    try:
        return arguments if isinstance(json.loads(arguments), dict) else None
    except ValueError:
        return None
