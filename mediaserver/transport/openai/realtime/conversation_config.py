"""Conversation session configuration: ``session.update`` of a ``realtime`` session (GA nested and
beta flat shapes) → a typed ``ConversationConfig``, and ``response.create`` → ``ResponseOptions``.

Pure functions, like ``config`` (which parses the input side both session kinds share): every shape
and error text is unit-tested directly (tests/unit/test_realtime_conversation_config.py).

What maps onto the voice loop: ``instructions`` is the system prompt, ``output_modalities``
(beta ``modalities``) chooses a spoken or a text answer, ``voice`` (OpenAI's names are aliases of the
default voice) and ``speed`` go to TTS, ``max_output_tokens`` caps the answer, beta ``temperature``
is the LLM's, ``tools`` (type ``function``, checked as JSON Schema) and ``tool_choice`` are the
functions the model may call (the client runs them); ``tools`` of type ``mcp`` are MCP servers this
server calls itself (``mcp_tools``: checked against what the operator allows). ``tracing``,
``truncation``, ``prompt`` and ``reasoning`` are accepted, echoed where OpenAI echoes them, and not
acted on; ``noise_reduction`` turns on WebRTC noise suppression (``audio/noise.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from mediaserver.asr.models import ModelRegistry
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.llm.tools import ToolConfig, parse_tools
from mediaserver.transport.openai.realtime.config import InputFormat, RealtimeConfig
from mediaserver.transport.openai.realtime.mcp_tools import (
    REDACTED,
    McpPolicy,
    McpTool,
    is_mcp,
    parse_mcp_tools,
    redacted,
)
from mediaserver.transport.openai.realtime.session_update import parse_format, parse_input
from mediaserver.transport.openai.realtime.values import (
    EventError,
    as_object,
    integer,
    known_fields,
    number,
    type_name,
)

Modality = Literal["text", "audio"]
MAX_OUTPUT_TOKENS: Final = 4096  # OpenAI's cap on max_output_tokens
MIN_SPEED: Final = 0.25
AUDIO_OUTPUT_FIELDS: Final = frozenset({"format", "voice", "speed"})  # (OpenAI's; unknown ones are refused)
MAX_SPEED: Final = 1.5
MAX_METADATA_PAIRS: Final = 16
OUTPUT_FORMAT: Final = InputFormat("audio/pcm", 24000)

# Checks a voice name against the TTS registry; raises EventError for an unknown one.
VoiceCheck = Callable[[str, str], None]
# True when the LLM registry knows the name.
LlmCheck = Callable[[str], bool]


@dataclass(frozen=True)
class AnswerDefaults:
    """What an answer runs with where the client sets nothing: the LLM's temperature (beta
    ``temperature``: ``assistant_temperature``, else the model's own default), and the token limit
    (``assistant_max_answer_tokens``; a client's ``max_output_tokens`` is capped at
    ``llm_max_completion_tokens``). The session events show these, never OpenAI's 0.8 and "inf"."""

    temperature: float
    max_tokens: int
    max_tokens_cap: int

    @classmethod
    def of(cls, settings: Settings, model_temperature: float) -> AnswerDefaults:
        temperature = settings.assistant_temperature
        return cls(
            model_temperature if temperature is None else temperature,
            settings.assistant_max_answer_tokens,
            settings.llm_max_completion_tokens,
        )

    def tokens(self, requested: int | None) -> int:
        return self.max_tokens if requested is None else min(requested, self.max_tokens_cap)

    def temperature_of(self, requested: float | None) -> float:
        return self.temperature if requested is None else requested


# The answer defaults of a conversation's LLM (None: the assistant's default model).
AnswerDefaultsOf = Callable[[str | None], AnswerDefaults]


@dataclass(frozen=True)
class ConversationConfig:
    """A conversation session's effective configuration (what ``session.updated`` describes)."""

    input: RealtimeConfig
    model: str  # the realtime model name clients see
    llm_model: str | None  # the LLM registry's name, None = the assistant's default
    instructions: str
    voice: str  # as the client named it
    answer: AnswerDefaults  # of llm_model: what runs where the client set nothing
    modality: Modality = "audio"
    speed: float = 1.0
    max_output_tokens: int | None = None  # None = "inf" (answer.max_tokens)
    temperature: float | None = None  # beta only; None = the server's
    output_format: InputFormat = OUTPUT_FORMAT
    tools: tuple[Any, ...] = ()
    tool_choice: Any = "auto"
    mcp: tuple[McpTool, ...] = ()  # the ``type: "mcp"`` tools, parsed (mcp_tools.py)
    # The instructions came sealed in the client secret that opened the session: the browser holding
    # the secret must not read them, so ``session.created`` / ``.updated`` show ``<redacted>``.
    instructions_sealed: bool = False

    @property
    def echoed_instructions(self) -> str:
        """``instructions`` as the session events show them to the client."""
        return REDACTED if self.instructions_sealed else self.instructions

    def tool_config(self, where: str = "session") -> ToolConfig | None:
        """The session's functions for the LLM (None: none, or ``tool_choice`` ``none``); an error
        names ``where`` they came from (``response``: a ``response.create``'s own).

        Only the ``function`` tools: the MCP servers' tools join at response time, once listed
        (``Conversation``); a ``tool_choice`` naming one (``{"type": "mcp", ...}``) is checked here
        against the declared servers."""
        functions = [tool for tool in self.tools if not is_mcp(tool)]
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "mcp":
            label = choice.get("server_label")
            if not any(m.label == label for m in self.mcp):
                raise EventError(
                    "invalid_value",
                    f"Invalid '{where}.tool_choice': no MCP tool with server_label {label!r} is in tools.",
                    f"{where}.tool_choice",
                )
            choice = "auto"
        if not functions and self.mcp and choice == "required":
            return None  # a call of an MCP tool is required
        try:
            return parse_tools(functions, choice, None, flat=True)
        except InvalidParameter as exc:
            param = f"{where}.tool_choice" if exc.param == "tool_choice" else f"{where}.tools"
            raise EventError("invalid_value", exc.message, param) from None

    @property
    def turn_detection_on(self) -> bool:
        return self.input.turn_detection is not None

    def describe_ga(self, session_id: str, settings: Settings) -> dict[str, Any]:
        turn = self.input.turn_detection
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": [self.modality],
            "instructions": self.echoed_instructions,
            "audio": {
                "input": {
                    "format": self.input.input_format.ga(),
                    "transcription": {
                        "model": self.input.model,
                        "language": self.input.language,
                        "prompt": self.input.prompt or "",
                    },
                    "noise_reduction": self.input.noise_reduction_object(),
                    "echo_cancellation": self.input.echo_cancellation,
                    "turn_detection": turn.describe(settings, conversation=True) if turn is not None else None,
                },
                "output": {"format": self.output_format.ga(), "voice": self.voice, "speed": self.speed},
            },
            "tools": [redacted(tool) for tool in self.tools],
            "tool_choice": self.tool_choice,
            "max_output_tokens": self.answer.tokens(self.max_output_tokens),
            "tracing": None,
            "truncation": "auto",
            "prompt": None,
            "include": list(self.input.include) if self.input.include is not None else None,
        }

    def describe_beta(self, session_id: str, settings: Settings) -> dict[str, Any]:
        turn = self.input.turn_detection
        return {
            "id": session_id,
            "object": "realtime.session",
            "model": self.model,
            "modalities": ["text"] if self.modality == "text" else ["audio", "text"],
            "instructions": self.echoed_instructions,
            "voice": self.voice,
            "input_audio_format": self.input.input_format.beta(),
            "output_audio_format": self.output_format.beta(),
            "input_audio_transcription": {
                "model": self.input.model,
                "language": self.input.language,
                "prompt": self.input.prompt or "",
            },
            "turn_detection": turn.describe(settings, conversation=True) if turn is not None else None,
            "input_audio_noise_reduction": self.input.noise_reduction_object(),
            "input_audio_echo_cancellation": self.input.echo_cancellation,
            "tools": [redacted(tool) for tool in self.tools],
            "tool_choice": self.tool_choice,
            "temperature": self.answer.temperature_of(self.temperature),
            "max_response_output_tokens": self.answer.tokens(self.max_output_tokens),
            "speed": self.speed,
            "tracing": None,
        }


@dataclass(frozen=True)
class ResponseOptions:
    """One response's parameters: the session's, with what ``response.create`` overrides."""

    instructions: str
    voice: str
    answer: AnswerDefaults
    modality: Modality = "audio"
    speed: float = 1.0
    max_output_tokens: int | None = None  # None: answer.max_tokens
    temperature: float | None = None  # None: answer.temperature
    output_format: InputFormat = OUTPUT_FORMAT
    metadata: Mapping[str, str] | None = None
    in_conversation: bool = True  # conversation "auto"; "none" keeps the output out of it
    input: tuple[Mapping[str, Any], ...] | None = None  # its own context instead of the conversation
    conversation_id: str | None = field(default=None, compare=False)
    tools: ToolConfig | None = None  # the session's functions (the client runs the calls)
    tool_choice: Any = "auto"  # as the session said it (with MCP tools the choice is made per response)

    @classmethod
    def of(cls, config: ConversationConfig) -> ResponseOptions:
        return cls(
            instructions=config.instructions,
            voice=config.voice,
            answer=config.answer,
            modality=config.modality,
            speed=config.speed,
            max_output_tokens=config.max_output_tokens,
            temperature=config.temperature,
            output_format=config.output_format,
            tools=config.tool_config(),
            tool_choice=config.tool_choice,
        )

    @property
    def max_tokens(self) -> int:
        """The most tokens this response's answer may have (what runs, and what events show)."""
        return self.answer.tokens(self.max_output_tokens)

    @property
    def llm_temperature(self) -> float:
        return self.answer.temperature_of(self.temperature)

    def describe(self, *, beta: bool) -> dict[str, Any]:
        """The response object's settings (``response.created`` / ``response.done`` add the rest)."""
        limit = self.max_tokens
        if beta:
            return {
                "modalities": ["text"] if self.modality == "text" else ["audio", "text"],
                "voice": self.voice,
                "output_audio_format": self.output_format.beta(),
                "temperature": self.answer.temperature_of(self.temperature),
                "max_output_tokens": limit,
            }
        return {
            "output_modalities": [self.modality],
            "audio": {"output": {"format": self.output_format.ga(), "voice": self.voice}},
            "max_output_tokens": limit,
        }


# --- parsing ------------------------------------------------------------------------------------------


def _string(value: object, param: str) -> str:
    if not isinstance(value, str):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected a string, but got {type_name(value)}.", param
        )
    return value


def _modality(value: object, param: str) -> Modality:
    if not isinstance(value, list) or not value or not all(v in ("text", "audio") for v in value):
        raise EventError(
            "invalid_value",
            f"Invalid '{param}': {value!r}. Supported values are: ['audio'] (audio and its transcript; "
            "['audio', 'text'], the beta's, is the same) and ['text'].",
            param,
        )
    return "audio" if "audio" in value else "text"


def _voice(value: object, param: str, check: VoiceCheck) -> str:
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        value = value["id"]  # a custom voice object {"id": ...} names a voice too
    name = _string(value, param).strip()
    if not name:
        raise EventError("invalid_value", f"Invalid '{param}': the voice name is empty.", param)
    check(name, param)
    return name


def _max_tokens(value: object, param: str) -> int | None:
    if value == "inf" or value is None:
        return None
    return integer(value, param, 1, MAX_OUTPUT_TOKENS)


def _metadata(value: object, param: str) -> Mapping[str, str] | None:
    if value is None:
        return None
    spec = as_object(value, param)
    if len(spec) > MAX_METADATA_PAIRS or not all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in spec.items()
    ):
        raise EventError(
            "invalid_value",
            f"Invalid '{param}': at most {MAX_METADATA_PAIRS} pairs of strings (keys up to 64 characters, "
            "values up to 512).",
            param,
        )
    return dict(spec)


def parse_conversation_session(
    session: Mapping[str, Any],
    base: ConversationConfig,
    models: ModelRegistry,
    *,
    check_voice: VoiceCheck,
    is_llm: LlmCheck,
    answer_of: AnswerDefaultsOf | None = None,
    mcp_policy: McpPolicy | None = None,
) -> ConversationConfig:
    """Apply a ``session`` object (GA nested or beta flat shape) to ``base``; all or nothing.

    ``answer_of``: the answer defaults of a newly named LLM (None: the base's stay);
    ``mcp_policy``: what MCP servers a ``type: "mcp"`` tool may reach (None: none)."""
    session_type = session.get("type")
    if session_type is not None and session_type != "realtime":
        raise EventError(
            "invalid_value",
            f"Invalid 'session.type': {session_type!r}. This connection runs a conversation (session.type = "
            "'realtime'); a transcription session is a connection with ?intent=transcription.",
            "session.type",
        )
    changes: dict[str, Any] = {"input": parse_input(session, base.input, models)}
    if "model" in session:
        model = _string(session["model"], "session.model").strip()
        if model and is_llm(model):
            changes.update(model=model, llm_model=model)
        elif model.lower().startswith("gpt-"):
            changes.update(model=model, llm_model=None)
        elif model:
            raise EventError("model_not_found", f"Invalid 'session.model': unknown model {model!r}.", "session.model")
    if "instructions" in session:
        instructions = _string(session["instructions"], "session.instructions")
        # A client that sends back the session it was shown keeps the sealed instructions; any other
        # text is the client's own (then echoed: it knows them).
        if not (base.instructions_sealed and instructions == REDACTED):
            changes.update(instructions=instructions, instructions_sealed=False)
    # GA
    if "output_modalities" in session:
        changes["modality"] = _modality(session["output_modalities"], "session.output_modalities")
    if "audio" in session:
        audio = as_object(session["audio"], "session.audio")
        if "output" in audio:
            output = known_fields(audio["output"], AUDIO_OUTPUT_FIELDS, "session.audio.output")
            if "format" in output:
                changes["output_format"] = parse_format(output["format"], "session.audio.output.format")
            if "voice" in output:
                changes["voice"] = _voice(output["voice"], "session.audio.output.voice", check_voice)
            if "speed" in output:
                changes["speed"] = number(output["speed"], "session.audio.output.speed", MIN_SPEED, MAX_SPEED)
    if "max_output_tokens" in session:
        changes["max_output_tokens"] = _max_tokens(session["max_output_tokens"], "session.max_output_tokens")
    # beta
    if "modalities" in session:
        changes["modality"] = _modality(session["modalities"], "session.modalities")
    if "voice" in session:
        changes["voice"] = _voice(session["voice"], "session.voice", check_voice)
    if "output_audio_format" in session:
        changes["output_format"] = parse_format(session["output_audio_format"], "session.output_audio_format")
    if "speed" in session:
        changes["speed"] = number(session["speed"], "session.speed", MIN_SPEED, MAX_SPEED)
    if "max_response_output_tokens" in session:
        changes["max_output_tokens"] = _max_tokens(
            session["max_response_output_tokens"], "session.max_response_output_tokens"
        )
    if "temperature" in session:
        changes["temperature"] = number(session["temperature"], "session.temperature", 0.0, 2.0)
    if "tools" in session:
        tools = session["tools"]
        if tools is not None and not isinstance(tools, list):
            raise EventError(
                "invalid_type",
                f"Invalid type for 'session.tools': expected an array, but got {type_name(tools)}.",
                "session.tools",
            )
        changes["tools"] = tuple(tools or ())
        changes["mcp"] = parse_mcp_tools(changes["tools"], mcp_policy)
    if "tool_choice" in session:
        changes["tool_choice"] = session["tool_choice"]
    if answer_of is not None and changes.get("llm_model", base.llm_model) != base.llm_model:
        changes["answer"] = answer_of(changes["llm_model"])
    updated = replace(base, **changes)
    if "tools" in session or "tool_choice" in session:
        updated.tool_config()  # the pair is valid, or this update is an error (and changes nothing)
    return updated


def parse_response_options(
    response: object, session: ConversationConfig, *, check_voice: VoiceCheck
) -> ResponseOptions:
    """``response.create``'s ``response`` object (GA or beta) over the session's settings."""
    options = ResponseOptions.of(session)
    if response is None:
        return options
    spec = as_object(response, "response")
    changes: dict[str, Any] = {}
    if "instructions" in spec:
        changes["instructions"] = _string(spec["instructions"], "response.instructions")
    if "output_modalities" in spec:
        changes["modality"] = _modality(spec["output_modalities"], "response.output_modalities")
    if "modalities" in spec:
        changes["modality"] = _modality(spec["modalities"], "response.modalities")
    if "audio" in spec:
        audio = as_object(spec["audio"], "response.audio")
        if "output" in audio:
            output = known_fields(audio["output"], AUDIO_OUTPUT_FIELDS, "response.audio.output")
            if "format" in output:
                changes["output_format"] = parse_format(output["format"], "response.audio.output.format")
            if "voice" in output:
                changes["voice"] = _voice(output["voice"], "response.audio.output.voice", check_voice)
    if "voice" in spec:
        changes["voice"] = _voice(spec["voice"], "response.voice", check_voice)
    if "output_audio_format" in spec:
        changes["output_format"] = parse_format(spec["output_audio_format"], "response.output_audio_format")
    for key in ("max_output_tokens", "max_response_output_tokens"):
        if key in spec:
            changes["max_output_tokens"] = _max_tokens(spec[key], f"response.{key}")
    if "temperature" in spec:
        changes["temperature"] = number(spec["temperature"], "response.temperature", 0.0, 2.0)
    if "metadata" in spec:
        changes["metadata"] = _metadata(spec["metadata"], "response.metadata")
    if "conversation" in spec:
        conversation = spec["conversation"]
        if conversation not in ("auto", "none", None):
            raise EventError(
                "invalid_value",
                f"Invalid 'response.conversation': {conversation!r}. Supported values are: 'auto' and 'none'.",
                "response.conversation",
            )
        changes["in_conversation"] = conversation != "none"
    if "tools" in spec or "tool_choice" in spec:
        changes.update(_response_tools(spec, session))
    if "input" in spec and spec["input"] is not None:
        items = spec["input"]
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise EventError(
                "invalid_type", "Invalid type for 'response.input': expected an array of items.", "response.input"
            )
        changes["input"] = tuple(items)
    return replace(options, **changes)


def _response_tools(spec: Mapping[str, Any], session: ConversationConfig) -> dict[str, Any]:
    """A ``response.create``'s own ``tools`` (functions; the session's MCP servers stay) and
    ``tool_choice``, over the session's, checked as a session's are."""
    tools = session.tools
    if "tools" in spec:
        given = spec["tools"]
        if given is not None and not isinstance(given, list):
            raise EventError(
                "invalid_type", f"Invalid type for 'response.tools': expected an array, but got {type_name(given)}.",
                "response.tools",
            )  # fmt: skip
        if any(is_mcp(tool) for tool in given or ()):
            raise EventError(
                "invalid_value",
                "'response.tools' takes functions here; MCP servers are declared for the session (session.update)",
                "response.tools",
            )
        tools = (*(given or ()), *(tool for tool in session.tools if is_mcp(tool)))
    choice = spec.get("tool_choice", session.tool_choice)
    own = replace(session, tools=tools, tool_choice=choice)
    return {"tools": own.tool_config("response"), "tool_choice": choice}


def default_conversation(
    settings: Settings, config: RealtimeConfig, llm_model: str | None, model: str | None, answer_of: AnswerDefaultsOf
) -> ConversationConfig:
    """A new conversation session: the voice loop's settings, in OpenAI's terms."""
    return ConversationConfig(
        input=config,
        model=model or "gpt-realtime",
        llm_model=llm_model,
        instructions=settings.assistant_system_prompt,
        voice=settings.assistant_voice or settings.tts_default_voice,
        answer=answer_of(llm_model),
        modality="audio" if settings.assistant_speak else "text",
    )
