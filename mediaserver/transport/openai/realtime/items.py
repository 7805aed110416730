"""The conversation of a Realtime session: its items in order, as the client sees them and as the
LLM reads them.

An item is a message: a user's text or audio (its transcript once the ASR has it), a system
message, or an assistant's answer (text, or audio with its transcript); or a tool's: a
``function_call`` and its ``function_call_output``, an ``mcp_call`` (run by the server, with its
output or error) or an ``mcp_list_tools`` listing. ``Items`` keeps their
order (``previous_item_id`` inserts mid-conversation, ``"root"`` at the start), deletes, and
truncates an assistant's audio answer at the millisecond the client says playback stopped (its
transcript then keeps only the words that were heard). ``context()`` is the conversation as chat
messages for the turn pipeline. Past ``max_items`` the oldest items are forgotten.

``parse_item`` validates the ``item`` of ``conversation.item.create`` (GA and beta content types);
these are pure functions, unit-tested in tests/unit/test_realtime_items.py.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from mediaserver.assistant.audio_out import Mark, played_text
from mediaserver.llm.tools import ToolCall
from mediaserver.llm.types import ChatMessage
from mediaserver.transport.openai.realtime.values import EventError, as_object, type_name

Role = Literal["user", "assistant", "system"]
ContentKind = Literal["input_text", "input_audio", "output_text", "output_audio"]
ItemStatus = Literal["completed", "incomplete", "in_progress"]
ItemType = Literal["message", "function_call", "function_call_output", "mcp_call", "mcp_list_tools"]
ROOT: Final = "root"
MAX_ITEM_ID_CHARS: Final = 64

_TEXT_TYPES: Final = {"user": ("input_text",), "system": ("input_text",), "assistant": ("output_text", "text")}


@dataclass
class Item:
    """One message of the conversation. ``text`` is its text or its audio's transcript (None while
    an input audio item waits for the ASR)."""

    id: str
    role: Role
    kind: ContentKind
    text: str | None
    status: ItemStatus = "completed"
    # output_audio: the audio the item holds (samples at rate_hz) and its sentences' marks, relative
    # to the item's first sample; truncation cuts both.
    audio_samples: int = 0
    rate_hz: int = 24000
    marks: tuple[Mark, ...] = ()
    transcribed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # function calling: a call's ``name`` and ``call_id`` (its arguments are ``text``), or the
    # ``call_id`` an output answers (the output is ``text``)
    type: ItemType = "message"
    call_id: str | None = None
    name: str | None = None
    # MCP (the server runs the call): the server's label; a call's ``output`` or ``error`` (its
    # ``call_id`` is the model's, for the chat context; ``name`` the server's own tool name);
    # a listing's ``tools`` (described already)
    server_label: str | None = None
    output: str | None = None
    error: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.text is not None:
            self.transcribed.set()

    @property
    def audio_ms(self) -> int:
        return self.audio_samples * 1000 // max(1, self.rate_hz)

    def set_text(self, text: str) -> None:
        self.text = text
        self.transcribed.set()

    def content(self, *, beta: bool) -> list[dict[str, Any]]:
        if self.kind == "input_text":
            return [{"type": "input_text", "text": self.text or ""}]
        if self.kind == "input_audio":
            return [{"type": "input_audio", "transcript": self.text}]
        if self.kind == "output_text":
            return [{"type": "text" if beta else "output_text", "text": self.text or ""}]
        return [{"type": "audio" if beta else "output_audio", "transcript": self.text or ""}]

    def describe(self, *, beta: bool) -> dict[str, Any]:
        if self.type == "mcp_call":
            return {
                "id": self.id,
                "object": "realtime.item",
                "type": "mcp_call",
                "status": self.status,
                "server_label": self.server_label,
                "name": self.name,
                "arguments": self.text or "",
                "output": self.output,
                "error": self.error,
                "approval_request_id": None,
            }
        if self.type == "mcp_list_tools":
            return {
                "id": self.id,
                "object": "realtime.item",
                "type": "mcp_list_tools",
                "server_label": self.server_label,
                "tools": list(self.tools or []),
            }
        if self.type == "function_call":
            return {
                "id": self.id,
                "object": "realtime.item",
                "type": "function_call",
                "status": self.status,
                "call_id": self.call_id,
                "name": self.name,
                "arguments": self.text or "",
            }
        if self.type == "function_call_output":
            return {
                "id": self.id,
                "object": "realtime.item",
                "type": "function_call_output",
                "status": self.status,
                "call_id": self.call_id,
                "output": self.text or "",
            }
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": self.status,
            "role": self.role,
            "content": self.content(beta=beta),
        }

    def truncate(self, audio_end_ms: int) -> None:
        """Keep the first ``audio_end_ms`` of the audio and the words spoken in it."""
        end = audio_end_ms * self.rate_hz // 1000
        self.text = played_text(self.marks, end)
        self.audio_samples = min(self.audio_samples, end)
        self.status = "incomplete"


class Items:
    """The items of one conversation, in order."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._order: list[str] = []
        self._items: dict[str, Item] = {}

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    def get(self, item_id: str) -> Item | None:
        return self._items.get(item_id)

    @property
    def last_id(self) -> str | None:
        return self._order[-1] if self._order else None

    def ids(self) -> list[str]:
        return list(self._order)

    def previous_id(self, item_id: str) -> str | None:
        index = self._order.index(item_id)
        return self._order[index - 1] if index > 0 else None

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert ``item`` after ``previous_item_id`` (None: at the end, ``"root"``: at the start);
        returns the id before it. The caller has checked both ids (``check_insert``)."""
        if previous_item_id is None:
            index = len(self._order)
        elif previous_item_id == ROOT:
            index = 0
        else:
            index = self._order.index(previous_item_id) + 1
        previous = self._order[index - 1] if index > 0 else None
        self._order.insert(index, item.id)
        self._items[item.id] = item
        while len(self._order) > self.max_items:
            forgotten = self._order.pop(0)
            del self._items[forgotten]
        return previous if previous in self._items else None

    def check_insert(self, item_id: str | None, previous_item_id: str | None) -> None:
        if item_id is not None and item_id in self._items:
            raise EventError(
                "invalid_value", f"Invalid 'item.id': an item with id {item_id!r} already exists.", "item.id"
            )
        if previous_item_id not in (None, ROOT) and previous_item_id not in self._items:
            raise EventError(
                "invalid_value",
                f"Invalid 'previous_item_id': the item with id {previous_item_id!r} does not exist.",
                "previous_item_id",
            )

    def delete(self, item_id: str) -> Item | None:
        item = self._items.pop(item_id, None)
        if item is not None:
            self._order.remove(item_id)
        return item

    def pending(self) -> list[Item]:
        """Input audio items still waiting for their transcript."""
        return [item for item in self._items.values() if not item.transcribed.is_set()]

    def context(self, ids: Sequence[str] | None = None) -> list[ChatMessage]:
        """The conversation as chat messages (items without text left out)."""
        messages: list[ChatMessage] = []
        for item_id in self._order if ids is None else ids:
            item = self._items.get(item_id)
            if item is None:
                continue
            if item.type == "function_call":
                call = ToolCall(item.call_id or item.id, item.name or "", item.text or "")
                messages.append(ChatMessage("assistant", "", (call,)))
            elif item.type == "mcp_call":
                call = ToolCall(item.call_id or item.id, item.name or "", item.text or "")
                messages.append(ChatMessage("assistant", "", (call,)))
                result = item.output if item.error is None else f"Error: {item.error.get('message', '')}"
                messages.append(ChatMessage("tool", result or "", tool_call_id=call.id))
            elif item.type == "mcp_list_tools":
                continue
            elif item.type == "function_call_output":
                messages.append(ChatMessage("tool", item.text or "", tool_call_id=item.call_id))
            elif item.text and item.text.strip():
                messages.append(ChatMessage(item.role, item.text.strip()))
        return messages

    def has_call(self, call_id: str) -> bool:
        return any(i.type == "function_call" and i.call_id == call_id for i in self._items.values())


# --- conversation.item.create -----------------------------------------------------------------------


@dataclass(frozen=True)
class NewItem:
    """A validated ``conversation.item.create`` item: text, or input audio to transcribe."""

    id: str | None
    role: Role
    kind: ContentKind
    text: str | None
    audio: bytes | None = None
    type: ItemType = "message"
    call_id: str | None = None
    name: str | None = None


def _call_string(spec: Mapping[str, Any], key: str, param: str) -> str:
    value = spec.get(key)
    if value is None:
        raise EventError(
            "missing_required_parameter", f"Missing required parameter: '{param}.{key}'.", f"{param}.{key}"
        )
    if not isinstance(value, str):
        raise EventError(
            "invalid_type",
            f"Invalid type for '{param}.{key}': expected a string, but got {type_name(value)}.",
            f"{param}.{key}",
        )
    return value


def _function_item(spec: Mapping[str, Any], item_type: str, item_id: str | None, param: str) -> NewItem:
    """A ``function_call`` (a call the model made, added by the client) or its ``function_call_output``."""
    call_id = _call_string(spec, "call_id", param)
    if item_type == "function_call_output":
        return NewItem(item_id, "user", "input_text", _call_string(spec, "output", param), None,
                       "function_call_output", call_id)  # fmt: skip
    name = _call_string(spec, "name", param)
    arguments = spec.get("arguments", "{}")
    if not isinstance(arguments, str):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}.arguments': expected a string.", f"{param}.arguments"
        )
    return NewItem(item_id, "assistant", "output_text", arguments, None, "function_call", call_id, name)


def _decode_audio(value: object, param: str, max_bytes: int) -> bytes:
    if not isinstance(value, str):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected a base64 string, but got {type_name(value)}.", param
        )
    if len(value) * 3 // 4 > max_bytes + 2:
        raise EventError("audio_too_large", f"Invalid '{param}': at most {max_bytes} bytes of audio.", param)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise EventError("invalid_value", f"Invalid '{param}': not valid base64-encoded audio bytes.", param) from None


def parse_item(value: object, *, max_audio_bytes: int, param: str = "item") -> NewItem:
    """The ``item`` of ``conversation.item.create``: a message from the user (text or audio), the
    system, or the assistant (text only: OpenAI does not take assistant audio either)."""
    spec = as_object(value, param)
    item_type = spec.get("type", "message")
    if item_type not in ("message", "function_call", "function_call_output"):
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.type': {item_type!r}. Supported values are: 'message', 'function_call' and "
            "'function_call_output'.",
            f"{param}.type",
        )
    item_id = spec.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= MAX_ITEM_ID_CHARS):
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.id': expected a string of 1 to {MAX_ITEM_ID_CHARS} characters.",
            f"{param}.id",
        )
    if item_type != "message":
        return _function_item(spec, str(item_type), item_id, param)
    role = spec.get("role")
    if role not in ("user", "assistant", "system"):
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.role': {role!r}. Supported values are: 'user', 'assistant' and 'system'.",
            f"{param}.role",
        )
    content = spec.get("content")
    if not isinstance(content, list) or not content:
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.content': expected a non-empty array of content parts.",
            f"{param}.content",
        )
    texts: list[str] = []
    audio: bytes | None = None
    for index, raw_part in enumerate(content):
        part_param = f"{param}.content[{index}]"
        part: Mapping[str, Any] = as_object(raw_part, part_param)
        kind = part.get("type")
        if kind in _TEXT_TYPES[role]:
            text = part.get("text")
            if not isinstance(text, str):
                raise EventError(
                    "invalid_type",
                    f"Invalid type for '{part_param}.text': expected a string, but got {type_name(text)}.",
                    f"{part_param}.text",
                )
            texts.append(text)
        elif kind == "input_audio" and role == "user":
            if audio is not None:
                raise EventError("invalid_value", f"Invalid '{part_param}': one input_audio part per item.", part_param)
            audio = _decode_audio(part.get("audio"), f"{part_param}.audio", max_audio_bytes)
        else:
            allowed = ", ".join(f"'{t}'" for t in _TEXT_TYPES[role]) + (", 'input_audio'" if role == "user" else "")
            raise EventError(
                "invalid_value",
                f"Invalid '{part_param}.type': {kind!r}. A {role} message takes {allowed} content here.",
                f"{part_param}.type",
            )
    text = " ".join(t for t in texts if t) if texts else None
    if audio is not None:
        return NewItem(item_id, "user", "input_audio", text, audio)
    kind_of: ContentKind = "output_text" if role == "assistant" else "input_text"
    return NewItem(item_id, role, kind_of, text or "")


def required_id(event: Mapping[str, Any], key: str) -> str:
    value = event.get(key)
    if value is None:
        raise EventError("missing_required_parameter", f"Missing required parameter: '{key}'.", key)
    if not isinstance(value, str):
        raise EventError("invalid_type", f"Invalid type for '{key}': expected a string.", key)
    return value
