"""Function calling: the tools a request offers, the calls a model makes, and their validation.

The same values serve every face: ``/v1/chat/completions`` (OpenAI's ``tools``/``tool_choice``),
the Realtime session's ``tools``, and the voice loop's MCP tools. A backend receives a
``ToolConfig`` in its ``ChatRequest`` and streams ``ToolCallDelta`` pieces back, in the shape
OpenAI's streaming ``delta.tool_calls`` has: the first piece of a call carries its ``id`` and
``name``, the following ones only more ``arguments`` text.

The model's output is not checked here: a call whose arguments do not match the schema is given to
the client as the model made it (OpenAI does the same); grammar-constrained servers (llama.cpp)
only make valid ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mediaserver.errors import InvalidParameter

ToolChoiceMode = Literal["auto", "none", "required"]
MAX_TOOLS = 128  # OpenAI's own limit on ``tools``
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call: its name, what it does, and its JSON-Schema parameters."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    def openai(self) -> dict[str, Any]:
        """As ``/v1/chat/completions`` takes it."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolConfig:
    """What a request offers: the tools, which the model must (or may) use, and parallel calls.

    ``choice`` is a mode, or the name of the one function the model must call.
    """

    tools: tuple[ToolSpec, ...]
    choice: ToolChoiceMode | str = "auto"
    forced: bool = False  # ``choice`` names a function
    parallel: bool | None = None

    def openai_choice(self) -> str | dict[str, Any]:
        """As an upstream takes it. ``required`` with one tool is sent as that tool, named: the same
        choice, and servers without ``required`` (llama-cpp-python's) do take a named one."""
        if self.forced:
            return {"type": "function", "function": {"name": self.choice}}
        if self.choice == "required" and len(self.tools) == 1:
            return {"type": "function", "function": {"name": self.tools[0].name}}
        return self.choice


@dataclass(frozen=True)
class ToolCall:
    """A whole call: ``arguments`` is the JSON text the model wrote (not parsed, not checked)."""

    id: str
    name: str
    arguments: str

    def openai(self, *, json_arguments: bool = False) -> dict[str, Any]:
        """As ``/v1/chat/completions`` takes it; ``json_arguments``: with the arguments made JSON
        (``engine_arguments``), for llama-server."""
        arguments = engine_arguments(self.arguments) if json_arguments else self.arguments
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": arguments}}


def json_object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object (blank is ``{}``, a call without arguments), or None where it is not
    one: not JSON, other JSON, or ``NaN``/``Infinity``, which Python's parser takes and JSON (and
    llama-server's parser) does not."""
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text, parse_constant=not_json)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def not_json(name: str) -> Any:
    """``json.loads``'s ``parse_constant``: ``NaN`` and ``Infinity`` are not JSON."""
    raise ValueError(f"{name} is not JSON")


def engine_arguments(arguments: str) -> str:
    """A call's arguments as a chat template can render them: llama-server parses them to render
    its template (and answers 500 to text that is not JSON), templates read them as a mapping, and
    vLLM parses them too. A call the model wrote until its token cap, sent back in a history, is
    not such text: arguments that are not a JSON object go as ``{}`` (the call's result says what
    went wrong), blank ones too."""
    return arguments if arguments.strip() and json_object(arguments) is not None else "{}"


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of call number ``index``: the first has ``id`` and ``name``, the rest ``arguments``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        """One entry of a streaming chunk's ``delta.tool_calls``."""
        piece: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            piece["id"] = self.id
            piece["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        piece["function"] = function
        return piece


class ToolCallAccumulator:
    """Joins ``ToolCallDelta`` pieces into whole calls, and cleans pieces up for a stream.

    Some servers (llama-cpp-python's) repeat a call's ``id`` and ``name`` in every piece; passed on
    as they are, OpenAI's SDK would join the names into ``set_lightset_light...``. ``clean``
    returns a piece with what was already said removed.
    """

    def __init__(self) -> None:
        self._ids: dict[int, str] = {}
        self._names: dict[int, str] = {}
        self._arguments: dict[int, list[str]] = {}

    def clean(self, delta: ToolCallDelta) -> ToolCallDelta:
        index = delta.index
        new_id = delta.id if delta.id and self._ids.get(index) != delta.id else None
        name = delta.name or None
        if name is not None and self._names.get(index) == name:
            name = None
        if new_id is not None:
            self._ids[index] = new_id
        if name is not None:
            self._names[index] = self._names.get(index, "") + name if new_id is None else name
        self._arguments.setdefault(index, []).append(delta.arguments)
        return ToolCallDelta(index, new_id, name, delta.arguments)

    def add(self, delta: ToolCallDelta) -> None:
        self.clean(delta)

    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(self._ids.get(i, f"call_{i}"), self._names.get(i, ""), "".join(self._arguments[i]))
            for i in sorted(self._arguments)
        ]

    def __bool__(self) -> bool:
        return bool(self._arguments)


# --- validation of what clients send -----------------------------------------------------------
def check_schema(schema: Any, param: str) -> None:
    """400 unless ``schema`` is a JSON Schema (checked against its own metaschema)."""
    import jsonschema

    if not isinstance(schema, dict):
        raise InvalidParameter(f"{param} must be a JSON Schema object", param=param)
    try:
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise InvalidParameter(
            f"{param} is not a valid JSON Schema: {exc.message}" + (f" (at {where})" if where else ""), param=param
        ) from None


def check_name(name: Any, param: str, where: str | None = None) -> str:
    """A function name, or a 400 naming ``where`` it is (default ``param``)."""
    where = where or param
    if name is None:
        raise InvalidParameter(f"{where} is required (a function's name)", param=param)
    if not isinstance(name, str) or not name or len(name) > 64 or not set(name) <= NAME_CHARS:
        raise InvalidParameter(
            f"{where} must be 1-64 letters, digits, underscores or dashes, got {name!r}", param=param
        )
    return name


def parse_tools(
    tools: Sequence[Any] | None, tool_choice: Any, parallel: bool | None, *, flat: bool = False
) -> ToolConfig | None:
    """The tools of a request, checked; None when there are none or ``tool_choice`` is ``none``.

    ``flat`` is the Realtime shape (``{"type": "function", "name": ..., "parameters": ...}``);
    otherwise Chat Completions' (``{"type": "function", "function": {...}}``).
    """
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidParameter(
                f"tool_choice {tool_choice!r} names a tool, but the request has no tools", param="tool_choice"
            )
        return None
    if len(tools) > MAX_TOOLS:
        raise InvalidParameter(f"tools takes at most {MAX_TOOLS} functions, got {len(tools)}", param="tools")
    specs: list[ToolSpec] = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise InvalidParameter(f"{where}: only tools of type 'function' are supported, got {kind!r}", param="tools")
        function = tool if flat else tool.get("function")
        if not isinstance(function, dict):
            raise InvalidParameter(f"{where}.function must be an object", param="tools")
        name = check_name(function.get("name"), "tools", f"{where}.name" if flat else f"{where}.function.name")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        check_schema(parameters, "tools")
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise InvalidParameter(f"{where}.description must be a string", param="tools")
        strict = function.get("strict")
        specs.append(ToolSpec(name, description, parameters, strict if isinstance(strict, bool) else None))
    names = [s.name for s in specs]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise InvalidParameter(f"tools names {duplicate!r} twice", param="tools")
    choice, forced = _parse_choice(tool_choice, names, flat=flat)
    if choice == "none":
        return None
    return ToolConfig(tuple(specs), choice, forced, parallel)


def _parse_choice(tool_choice: Any, names: list[str], *, flat: bool) -> tuple[str, bool]:
    if tool_choice is None:
        return "auto", False
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise InvalidParameter(
                f"tool_choice must be 'auto', 'none', 'required' or a function, got {tool_choice!r}",
                param="tool_choice",
            )
        return tool_choice, False
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice if flat else tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if name not in names:
            raise InvalidParameter(
                f"tool_choice names the function {name!r}, which is not in tools ({', '.join(names)})",
                param="tool_choice",
            )
        return str(name), True
    raise InvalidParameter(f"tool_choice is not a valid choice: {json.dumps(tool_choice)[:200]}", param="tool_choice")
