"""OpenAI chat and embeddings: POST /v1/chat/completions, POST /v1/embeddings.

Shapes follow OpenAI's API so the official SDKs work with only ``base_url`` changed: streaming is
SSE ``chat.completion.chunk`` events ending with ``data: [DONE]`` (and a usage chunk with
``stream_options.include_usage``); errors are OpenAI error objects, also inside a stream that has
already started. Request bodies are validated once, here, by pydantic models.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictFloat, StrictInt, Tag

from mediaserver.errors import ApiError, InvalidParameter
from mediaserver.llm.generation import LlmStream
from mediaserver.llm.tools import ToolCall, ToolCallDelta, parse_tools
from mediaserver.llm.types import ChatMessage, GenerationParams, Role
from mediaserver.state import CAPABILITIES, LLM, SETTINGS
from mediaserver.transport.common import sse_error
from mediaserver.transport.openai.bodies import parse_body, read_json_object
from mediaserver.transport.openai.chat_images import ImagePart, image_inputs

log = logging.getLogger(__name__)

MAX_STOP_SEQUENCES = 4


# --- request bodies ----------------------------------------------------------------------------
class _Lenient(BaseModel):
    # Fields OpenAI defines that do not change the answer here (user, metadata, store ...) are ignored.
    model_config = ConfigDict(extra="ignore")


class _TextPart(_Lenient):
    type: Literal["text"]
    text: str


class _FunctionCall(_Lenient):
    name: str
    arguments: str


class _ToolCall(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: _FunctionCall


def _part_kind(part: Any) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return {"text": "TextPart", "image_url": "ImagePart"}.get(kind) if isinstance(kind, str) else None


# A content part is judged as the kind its ``type`` says (a 400 names what is wrong with that kind, or
# that its type is none of them); the tags are class-like names, which validation_error leaves out of
# the place it names.
_ContentPart = Annotated[
    Annotated[_TextPart, Tag("TextPart")] | Annotated[ImagePart, Tag("ImagePart")],
    Discriminator(
        _part_kind,
        custom_error_type="invalid_content_part",
        custom_error_message="a content part is an object whose type is 'text' or 'image_url'",
    ),
]


class _Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_ContentPart] | None = None
    tool_calls: list[_ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # the call a ``tool`` message answers


class _StreamOptions(_Lenient):
    include_usage: StrictBool = False


class _ChatBody(_Lenient):
    model: str = Field(min_length=1)
    messages: list[_Message] = Field(min_length=1)
    stream: StrictBool = False  # (a boolean, as OpenAI checks: "yes" is a 400, not a stream)
    stream_options: _StreamOptions | None = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: StrictFloat | None = Field(None, ge=0, le=2)
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: StrictInt | None = None
    # vLLM's extension: 1 turns the model's default repetition penalty off (llama.cpp models only).
    repetition_penalty: StrictFloat | None = Field(None, ge=0.5, le=2.0)
    frequency_penalty: StrictFloat | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: StrictFloat | None = Field(None, ge=-2.0, le=2.0)
    n: StrictInt | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict[str, Any] | None = None
    logprobs: StrictBool | None = None


class _EmbeddingsBody(_Lenient):
    model: str = Field(min_length=1)
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None


async def _read_json(request: web.Request) -> dict[str, Any]:
    return await read_json_object(
        request, max_bytes=request.app[SETTINGS].llm_max_request_bytes, setting="llm_max_request_bytes"
    )


def _content(message: _Message) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return "".join(part.text for part in message.content if isinstance(part, _TextPart))


def _messages(chat: _ChatBody) -> list[ChatMessage]:
    roles: dict[str, Role] = {
        "system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"
    }  # fmt: skip
    messages = []
    called: set[str] = set()  # the ids of the calls made so far in the history
    for index, m in enumerate(chat.messages):
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise InvalidParameter(f"messages[{index}].content is missing", param="messages")
        if m.role == "tool" and not m.tool_call_id:
            raise InvalidParameter(f"messages[{index}] (role tool) needs tool_call_id", param="messages")
        if m.role == "tool" and m.tool_call_id not in called:
            raise InvalidParameter(  # as OpenAI: a result answers a call an earlier assistant message made
                f"messages[{index}] (role tool) answers tool_call_id {m.tool_call_id!r}, which no earlier assistant "
                "message's tool_calls has",
                param="messages",
            )
        called.update(c.id for c in m.tool_calls or ())
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ())
        if calls and m.role != "assistant":
            raise InvalidParameter(f"messages[{index}]: only assistant messages have tool_calls", param="messages")
        tool_call_id = m.tool_call_id if m.role == "tool" else None
        images = image_inputs(index, m.content)
        if images and m.role != "user":
            raise InvalidParameter(f"messages[{index}]: only user messages have images", param="messages")
        messages.append(ChatMessage(roles[m.role], _content(m), calls, tool_call_id, images))
    return messages


def parse_chat(body: Any) -> tuple[_ChatBody, list[ChatMessage], GenerationParams]:
    chat = parse_body(_ChatBody, body)
    if chat.n is not None and chat.n != 1:
        raise InvalidParameter(f"n must be 1 on this server (one choice per request), got {chat.n}", param="n")
    tools = parse_tools(chat.tools, chat.tool_choice, chat.parallel_tool_calls)
    if chat.response_format and chat.response_format.get("type", "text") != "text":
        raise InvalidParameter("only response_format {'type': 'text'} is supported", param="response_format")
    if chat.logprobs:
        raise InvalidParameter("logprobs are not supported by this server", param="logprobs")
    max_tokens = chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens
    param = "max_completion_tokens" if chat.max_completion_tokens is not None else "max_tokens"
    if max_tokens is not None and max_tokens <= 0:
        raise InvalidParameter(f"{param} must be at least 1, got {max_tokens}", param=param)
    stop = (chat.stop,) if isinstance(chat.stop, str) else tuple(chat.stop or ())
    if len(stop) > MAX_STOP_SEQUENCES:
        raise InvalidParameter(f"stop takes at most {MAX_STOP_SEQUENCES} sequences, got {len(stop)}", param="stop")
    messages = _messages(chat)
    params = GenerationParams(
        max_tokens=max_tokens,
        temperature=chat.temperature,
        top_p=chat.top_p,
        stop=stop,
        seed=chat.seed,
        repeat_penalty=chat.repetition_penalty,
        tools=tools,
        frequency_penalty=chat.frequency_penalty,
        presence_penalty=chat.presence_penalty,
    )
    return chat, messages, params


# --- chat completions --------------------------------------------------------------------------
def _usage_json(stream: LlmStream) -> dict[str, Any] | None:
    usage = stream.usage
    if usage is None:
        return None
    result: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens is not None:  # the engine said how much of the prompt its cache held
        result["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return result


def _finish(stream: LlmStream) -> str:
    """OpenAI's reason: ``length`` for an answer stopped at ``max_tokens``, a call in it included
    (its arguments are as far as they were written), else ``tool_calls`` for one with calls."""
    if stream.finish_reason == "length":
        return "length"
    return "tool_calls" if stream.tool_calls else "stop"


def _param_error(exc: ApiError, param: str) -> ApiError:
    """The service names ``max_tokens``; the client may have said ``max_completion_tokens``."""
    if exc.param == "max_tokens" and param != "max_tokens":
        return InvalidParameter(exc.message.replace("max_tokens", param), param=param)
    return exc


async def chat_completions_handler(request: web.Request) -> web.StreamResponse:
    request.app[CAPABILITIES].require("llm")
    llm = request.app[LLM]
    chat, messages, params = parse_chat(await _read_json(request))
    limit = request.app[SETTINGS].llm_max_images
    if sum(len(m.images) for m in messages) > limit:
        raise InvalidParameter(f"a request takes at most {limit} images (llm_max_images)", param="messages")
    param = "max_completion_tokens" if chat.max_completion_tokens is not None else "max_tokens"
    try:
        stream = llm.stream(messages, params, model=chat.model)
    except ApiError as exc:
        raise _param_error(exc, param) from None
    completion_id = "chatcmpl-" + secrets.token_hex(12)
    created = int(time.time())
    async with stream:
        events = stream.events()
        # The first delta (or the end) comes before any byte is sent, so a full queue, a prompt
        # over the context window or an unreachable upstream is still a proper HTTP error.
        first = await anext(events, None)
        if not chat.stream:
            pieces = [first] if isinstance(first, str) else []
            pieces += [delta async for delta in events if isinstance(delta, str)]
            text = "".join(pieces)
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
            if stream.tool_calls:
                message["content"] = text or None
                message["tool_calls"] = [call.openai() for call in stream.tool_calls]
            body = {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": stream.model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": _finish(stream),
                    }
                ],
                "usage": _usage_json(stream),
                "system_fingerprint": None,
            }
            return web.json_response(body)
        return await _sse(request, stream, events, first, completion_id, created, chat)


async def _sse(
    request: web.Request,
    stream: LlmStream,
    events: AsyncIterator[str | ToolCallDelta],
    first: str | ToolCallDelta | None,
    completion_id: str,
    created: int,
    chat: _ChatBody,
) -> web.StreamResponse:
    include_usage = chat.stream_options is not None and chat.stream_options.include_usage
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": stream.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            body["usage"] = None
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    try:
        await response.write(chunk({"role": "assistant", "content": ""}))
        if first is not None:
            await response.write(_delta_chunk(chunk, first))
            try:
                async for delta in events:
                    await response.write(_delta_chunk(chunk, delta))
            except ApiError as exc:  # a timeout or upstream failure after the stream started
                await response.write(sse_error(request, exc))
                return response
        await response.write(chunk({}, _finish(stream)))
        if include_usage:
            usage_chunk = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": stream.model,
                "system_fingerprint": None,
                "choices": [],
                "usage": _usage_json(stream),
            }
            await response.write(b"data: " + json.dumps(usage_chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:
        # The client went away: leaving ``async with stream`` stops the generation.
        log.info("chat completion %s: client disconnected mid-stream", completion_id)
    return response


def _delta_chunk(chunk: Callable[[dict[str, Any]], bytes], delta: str | ToolCallDelta) -> bytes:
    if isinstance(delta, str):
        return chunk({"content": delta})
    return chunk({"tool_calls": [delta.openai()]})


# --- embeddings --------------------------------------------------------------------------------
async def embeddings_handler(request: web.Request) -> web.Response:
    request.app[CAPABILITIES].require("llm")
    llm = request.app[LLM]
    body = parse_body(_EmbeddingsBody, await _read_json(request))
    texts = [body.input] if isinstance(body.input, str) else body.input
    result = await llm.embed(texts, model=body.model)
    dimensions = len(result.vectors[0]) if result.vectors else 0
    if body.dimensions is not None and body.dimensions != dimensions:
        raise InvalidParameter(
            f"dimensions must be {dimensions} for {result.model!r} (it cannot shorten its vectors)",
            param="dimensions",
        )
    data = []
    for index, vector in enumerate(result.vectors):
        embedding: list[float] | str
        if body.encoding_format == "base64":
            embedding = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        else:
            embedding = [float(x) for x in vector]
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "model": result.model,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions_handler)
    app.router.add_post("/v1/embeddings", embeddings_handler)
