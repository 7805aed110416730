"""The response resource of a Realtime conversation: its state while it runs, and its JSON.

Pure functions: how a turn's outcome becomes a response ``status`` (``completed``, ``incomplete``
when the token cap cut the answer, ``cancelled`` with ``turn_detected`` / ``client_cancelled``,
``failed`` with the error), the ``usage`` object (the LLM's prompt and completion tokens; audio is
not counted in tokens here) and the ``realtime.response`` object in GA and beta shapes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from mediaserver.assistant.turn_types import Turn, TurnOutcome
from mediaserver.llm.types import ChatMessage, Usage
from mediaserver.transport.openai.realtime.conversation_config import ResponseOptions
from mediaserver.transport.openai.realtime.items import Item


@dataclass
class Response:
    id: str
    options: ResponseOptions
    context: list[ChatMessage] | None  # its own input (response.input), else the conversation's
    task: asyncio.Task[None] | None = None
    item: Item | None = None
    turn: Turn | None = None
    reason: str | None = None  # why it was cancelled
    audio_started: bool = False
    # Every output item in order: a round's message, then the calls its turn made (function_call,
    # mcp_call); after MCP calls the next round's message and calls follow (``ResponseRounds.run``).
    output: list[Item] = field(default_factory=list)
    open_calls: dict[int, Item] = field(default_factory=dict)  # this round's calls by the model's index
    mcp_calls: int = 0  # MCP calls run in this response (at most mcp_max_calls_per_turn)
    running_tools: bool = False  # between two rounds (its MCP calls running): a cancel cancels the task

    @property
    def item_index(self) -> int:
        """The output index of the current round's message item."""
        return self.output.index(self.item) if self.item is not None and self.item in self.output else 0

    def index_of(self, item: Item) -> int:
        return self.output.index(item) if item in self.output else len(self.output)


def usage_of(usage: Usage | None) -> dict[str, Any]:
    prompt = usage.prompt_tokens if usage is not None else 0
    completion = usage.completion_tokens if usage is not None else 0
    cached = (usage.cached_tokens or 0) if usage is not None else 0  # from the engine's prompt cache
    return {
        "total_tokens": prompt + completion,
        "input_tokens": prompt,
        "output_tokens": completion,
        "input_token_details": {
            "text_tokens": prompt,
            "audio_tokens": 0,
            "image_tokens": 0,
            "cached_tokens": cached,
            "cached_tokens_details": {"text_tokens": cached, "audio_tokens": 0, "image_tokens": 0},
        },
        "output_token_details": {"text_tokens": completion, "audio_tokens": 0},
    }


def status_of(response: Response, outcome: TurnOutcome | None) -> tuple[str, dict[str, Any] | None]:
    if outcome is None or outcome.status == "interrupted":
        reason = response.reason or "client_cancelled"
        return "cancelled", {"type": "cancelled", "reason": reason}
    if outcome.status == "failed":
        error = outcome.error
        details = {
            "type": "server_error",
            "code": error.code if error else "internal_error",
            "message": f"{error.stage}: {error.message}" if error else "the answer failed",
        }
        return "failed", {"type": "failed", "error": details}
    if outcome.finish_reason == "length":
        return "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
    return "completed", None


def describe_response(
    response: Response,
    status: str,
    details: dict[str, Any] | None = None,
    usage: Usage | None = None,
    *,
    beta: bool,
) -> dict[str, Any]:
    output = [item.describe(beta=beta) for item in response.output]
    return {
        "id": response.id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": output,
        "conversation_id": response.options.conversation_id,
        **response.options.describe(beta=beta),
        "usage": usage_of(usage) if status != "in_progress" else None,
        "metadata": dict(response.options.metadata) if response.options.metadata is not None else None,
    }
