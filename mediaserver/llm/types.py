"""Typed values the LLM stage exchanges: chat messages in, text deltas and a final usage out.

Frozen dataclasses, so a request handed to a worker thread cannot change under it, and so neither
the transports nor the voice loop need to know how a backend represents a generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mediaserver.llm.tools import ToolCall, ToolCallDelta, ToolConfig

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "cancelled", "tool_calls"]
BackendKind = Literal["llama.cpp", "upstream"]


@dataclass(frozen=True)
class ImageInput:
    """An image a message shows the model: an https URL or a ``data:image/...;base64,`` URI, and
    where the client put it (``messages[1].content[1]``), for errors that name it."""

    url: str
    detail: str | None = None
    where: str = ""

    def openai(self) -> dict[str, Any]:
        image: dict[str, Any] = {"url": self.url}
        if self.detail is not None:
            image["detail"] = self.detail
        return {"type": "image_url", "image_url": image}


@dataclass(frozen=True)
class ChatMessage:
    """``tool_calls`` are an assistant's calls; ``tool_call_id`` names the call a ``tool`` message
    answers; ``images`` are shown to the model after the text (only a vision model takes them)."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    images: tuple[ImageInput, ...] = ()

    def openai(self, *, json_arguments: bool = False) -> dict[str, Any]:
        """As ``/v1/chat/completions`` takes it; ``json_arguments``: the calls' arguments made JSON
        for llama-server (``tools.engine_arguments``)."""
        content: str | list[dict[str, Any]] = self.content
        if self.images:
            content = [{"type": "text", "text": self.content}] if self.content else []
            content += [image.openai() for image in self.images]
        body: dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            # content stays a string ("" with only calls): llama-cpp-python's server refuses null there.
            body["tool_calls"] = [call.openai(json_arguments=json_arguments) for call in self.tool_calls]
        if self.tool_call_id is not None:
            body["tool_call_id"] = self.tool_call_id
        return body


@dataclass(frozen=True)
class GenerationParams:
    """Sampling and limits of one generation.

    ``max_tokens=None`` means the server's default (``llm_default_max_tokens``, never past the
    context window); ``None`` elsewhere means the model's default (``mediaserver.llm.defaults``).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    repeat_penalty: float | None = None
    tools: ToolConfig | None = None
    # OpenAI's penalties (-2 to 2), passed on as asked; None: not sent (the backend's own, 0).
    frequency_penalty: float | None = None
    presence_penalty: float | None = None


@dataclass(frozen=True)
class ChatRequest:
    """What a backend generates from: the messages and the resolved parameters."""

    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...] = ()
    seed: int | None = None
    repeat_penalty: float | None = None
    dry_multiplier: float | None = None
    tools: ToolConfig | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None  # prompt tokens served from the engine's prompt cache, when it says

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TextDelta:
    """A piece of the answer, in order; the pieces concatenate to the full text."""

    text: str


@dataclass(frozen=True)
class Finished:
    """The last event of a generation. ``usage`` is None when a backend could not count."""

    finish_reason: FinishReason
    usage: Usage | None


@dataclass(frozen=True)
class Progress:
    """The tokens a generation has taken so far (llama-server's per-token timings): what a
    generation cancelled before ``Finished`` reports as its usage (a Realtime ``response.done``)."""

    usage: Usage


BackendEvent = TextDelta | ToolCallDelta | Finished | Progress


@dataclass(frozen=True)
class ModelInfo:
    """A model as ``/v1/models`` and ``/health`` show it."""

    name: str
    kind: Literal["llm", "embedding"]
    backend: BackendKind
    source: str
    aliases: tuple[str, ...] = field(default_factory=tuple)
