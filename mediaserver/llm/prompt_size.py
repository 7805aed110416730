"""How long a chat prompt is as the model reads it: the messages, the calls' arguments, the tools'
schemas and what the chat template wraps around them.

``prompt_bytes`` is the bound the llama-server engine itself checks before it counts exactly
(``engine.LlamaServerEngine.stream``): a byte-level tokenizer never makes more tokens than bytes,
and a template adds at most ``TEMPLATE_BYTES_PER_MESSAGE`` around a message and
``TOOLS_PREAMBLE_BYTES`` around the tools. ``LlmService.prompt_tokens`` counts a prompt that may be
too long with the engine's own template and tokenizer, and estimates an upstream's with
``estimate_tokens``, the same estimate an upstream request is refused by
(``upstream.UpstreamChat.stream``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from mediaserver.errors import ApiError
from mediaserver.llm.tools import ToolConfig
from mediaserver.llm.types import ChatMessage

# Per message, what a chat template adds around the content, at most (role markers, separators).
TEMPLATE_BYTES_PER_MESSAGE = 16
# What a tool-rendering template adds around the tools, at most (smollm2-tools.jinja: ~400 bytes).
TOOLS_PREAMBLE_BYTES = 1024


class PromptTooLong(ApiError):
    """A prompt past ``llm_max_prompt_tokens`` (or the engine's context window): a 400."""

    status = 400
    code = "context_length_exceeded"


@dataclass(frozen=True)
class PromptTokens:
    """A prompt's length in tokens and the most the model takes; ``exact`` when the engine counted."""

    tokens: int
    limit: int
    exact: bool = False

    @property
    def excess(self) -> int:
        return max(0, self.tokens - self.limit)


def message_bytes(message: ChatMessage) -> int:
    """One message as sent: its text, its calls (name and arguments, as JSON) and the template's markers."""
    size = len(message.content.encode()) + TEMPLATE_BYTES_PER_MESSAGE
    return size + sum(len(json.dumps(call.openai())) for call in message.tool_calls)


def tools_bytes(tools: ToolConfig | None) -> int:
    if tools is None or not tools.tools:
        return 0
    return TOOLS_PREAMBLE_BYTES + sum(len(json.dumps(tool.openai())) for tool in tools.tools)


def prompt_bytes(messages: Sequence[ChatMessage], tools: ToolConfig | None) -> int:
    """The whole prompt's bytes: never fewer than its tokens with a byte-level tokenizer."""
    return sum(message_bytes(m) for m in messages) + tools_bytes(tools)


def text_bytes(messages: Sequence[ChatMessage], tools: ToolConfig | None) -> int:
    """``prompt_bytes`` without the template's share, which is a bound, not text: with an exact
    count, this over the tokens is the prompt's real bytes a token (about)."""
    overhead = len(messages) * TEMPLATE_BYTES_PER_MESSAGE + (TOOLS_PREAMBLE_BYTES if tools and tools.tools else 0)
    return max(1, prompt_bytes(messages, tools) - overhead)


def estimate_tokens(messages: Sequence[ChatMessage], tools: ToolConfig | None, bytes_per_token: float) -> int:
    return math.ceil(prompt_bytes(messages, tools) / bytes_per_token)
