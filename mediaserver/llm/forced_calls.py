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


class _ArgumentsScanner:
    """Follows the arguments object's JSON as it is written, to know where it ends (the answer's own
    ``}`` follows it): depth of braces and brackets, outside strings."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.done = False

    def take(self, text: str) -> str:
        """The part of ``text`` that belongs to the arguments (all of it until they close)."""
        for index, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return text[: index + 1]
        return text


async def as_call(events: AsyncIterator[BackendEvent], tools: Sequence[ToolSpec]) -> AsyncIterator[BackendEvent]:
    """The constrained answer's events as one call, streamed: a ``ToolCallDelta`` with the id and
    name as soon as the name is written, then the arguments' text in pieces as it is written.

    An answer cut off before it closed (``max_tokens``) keeps its finish reason and the arguments
    written so far, as OpenAI's own cut-off calls do. One cut off before its name (the wrapper
    around a call takes about 17 of the bundled model's tokens) is the forced tool's call with no
    arguments where only one tool was allowed (a named ``tool_choice``: OpenAI's call names it
    whatever the cap), else an empty answer.
    """
    names = {tool.name for tool in tools}
    head = ""  # the answer until its arguments start
    arguments: _ArgumentsScanner | None = None
    written: list[str] = []
    async for event in events:
        if isinstance(event, TextDelta):
            text = event.text
            if arguments is None:
                head += text
                match = _HEAD.match(head)
                if match is None or match.group("name") not in names:
                    continue
                arguments = _ArgumentsScanner()
                yield ToolCallDelta(0, "call_" + secrets.token_hex(12), match.group("name"), "")
                text = head[match.end() :]
            if not written:
                text = text.lstrip()  # the arguments start at their "{"
            piece = "" if arguments.done else arguments.take(text)
            if piece:
                written.append(piece)
                yield ToolCallDelta(0, arguments=piece)
            continue
        if isinstance(event, Finished) and event.finish_reason != "cancelled":
            if arguments is None:  # cut off before the name: no JSON fragment as text ...
                if len(names) == 1 and event.finish_reason == "length":  # ... the one tool it could be
                    yield ToolCallDelta(0, "call_" + secrets.token_hex(12), next(iter(names)), "")
                yield event
                return
            whole = arguments.done and _is_object("".join(written))
            yield Finished("tool_calls", event.usage) if whole else event
            return
        yield event


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
