"""OpenAPI paths of the LLM endpoints (chat completions, embeddings, the WIS chatbot), merged by document.spec()."""

from __future__ import annotations

from typing import Any

from mediaserver.openapi.schema import ERROR_OPENAI, ERROR_WIS, error_responses, json_body, query_param

# --- function calling ---
_TOOL_CALL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string", "description": "JSON text"}},
        },
    },
}
_TOOL = {
    "type": "object",
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object", "description": "a JSON Schema (checked: 400 when it is not one)"},
            },
            "required": ["name"],
        },
    },
    "required": ["type", "function"],
}
_TOOL_PROPERTIES = {
    "tools": {"type": "array", "items": _TOOL, "maxItems": 128},
    "tool_choice": {
        "oneOf": [
            {"type": "string", "enum": ["auto", "none", "required"]},
            {
                "type": "object",
                "properties": {"type": {"const": "function"}, "function": {"type": "object"}},
                "description": "a function of tools (400, param tool_choice, when it is not one)",
            },
        ]
    },
    "parallel_tool_calls": {"type": "boolean"},
}
# --- end function calling ---
_MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "tool_calls": {"type": "array", "items": _TOOL_CALL, "description": "an assistant message's calls"},
        "tool_call_id": {"type": "string", "description": "the call a tool message answers"},
        "content": {
            "oneOf": [
                {"type": "null", "description": "an assistant message with tool_calls only"},
                {"type": "string"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                        "required": ["type", "text"],
                    },
                },
            ]
        },
    },
    "required": ["role"],
}
_USAGE = {
    "type": "object",
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
        "prompt_tokens_details": {
            "type": "object",
            "description": "present when the engine reports it: prompt tokens its prompt cache already held",
            "properties": {"cached_tokens": {"type": "integer"}},
        },
    },
}
_CHAT_REQUEST = {
    "type": "object",
    "properties": {
        "model": {"type": "string", "example": "gpt-4o-mini", "description": "a model of /v1/models or an alias"},
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
        "stream": {"type": "boolean", "default": False},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "max_tokens": {
            "type": "integer",
            "minimum": 1,
            "description": "at most llm_max_completion_tokens; unset: llm_default_max_tokens",
        },
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2, "description": "unset: the model's default"},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "description": "unset: the model's default"},
        "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
        "seed": {"type": "integer"},
        "repetition_penalty": {
            "type": "number",
            "minimum": 0.5,
            "maximum": 2,
            "description": "vLLM's extension (llama.cpp models here); 1 = off; unset: the model's default",
        },
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "description": "unset: 0"},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "description": "unset: 0"},
        "n": {"type": "integer", "const": 1},
        **_TOOL_PROPERTIES,
    },
    "required": ["model", "messages"],
}
_CHAT_RESPONSE = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "chat.completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": "integer"},
                    "message": {
                        "type": "object",
                        "properties": {
                            "role": {"const": "assistant"},
                            "content": {"type": ["string", "null"]},
                            "tool_calls": {"type": "array", "items": _TOOL_CALL},
                        },
                    },
                    "finish_reason": {"type": "string", "enum": ["stop", "length", "tool_calls"]},
                },
            },
        },
        "usage": _USAGE,
    },
}
_EMBEDDINGS_REQUEST = {
    "type": "object",
    "properties": {
        "model": {"type": "string", "example": "text-embedding-3-small"},
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "description": "must equal the model's size"},
    },
    "required": ["model", "input"],
}
_EMBEDDINGS_RESPONSE = {
    "type": "object",
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {
                        "oneOf": [
                            {"type": "array", "items": {"type": "number"}},
                            {"type": "string", "description": "base64 of little-endian float32"},
                        ]
                    },
                },
            },
        },
        "model": {"type": "string"},
        "usage": _USAGE,
    },
}


_CHATBOT_QUERY = [
    {"name": "text", "in": "query", "required": True, "schema": {"type": "string"}},
    query_param(
        "max_new_tokens",
        {"type": "integer", "minimum": 1},
        "at most llm_max_completion_tokens; default llm_chatbot_max_tokens (512)",
    ),
    query_param("temperature", {"type": "number"}, "sampling temperature"),
    query_param("top_p", {"type": "number"}, "nucleus sampling"),
    query_param("repetition_penalty", {"type": "number"}, "llama.cpp repeat penalty (embedded models)"),
]


def llm_paths() -> dict[str, Any]:
    return {
        "/v1/chat/completions": {
            "post": {
                "summary": "OpenAI-compatible chat completion (SSE chat.completion.chunk events with stream=true)",
                "requestBody": {"required": True, **json_body(_CHAT_REQUEST)},
                "responses": {
                    "200": {
                        "description": "a chat.completion, or with stream=true an SSE stream ending 'data: [DONE]'",
                        "content": {
                            "application/json": {"schema": _CHAT_RESPONSE},
                            "text/event-stream": {"schema": {"type": "string"}},
                        },
                    },
                    **error_responses(ERROR_OPENAI, 400, 401, 413, 503, 504),
                    "502": {"description": "the upstream LLM failed or cannot be reached", **json_body(ERROR_OPENAI)},
                },
            }
        },
        "/v1/embeddings": {
            "post": {
                "summary": "OpenAI-compatible embeddings (llama.cpp embedding mode, micro-batched, cached)",
                "requestBody": {"required": True, **json_body(_EMBEDDINGS_REQUEST)},
                "responses": {
                    "200": {"description": "one vector per input", **json_body(_EMBEDDINGS_RESPONSE)},
                    **error_responses(ERROR_OPENAI, 400, 401, 413, 503),
                },
            }
        },
        "/api/chatbot": {
            "get": {
                "summary": "WIS chatbot: one question, one answer",
                "parameters": _CHATBOT_QUERY,
                "responses": {
                    "200": {
                        "description": "the answer",
                        **json_body({"type": "object", "properties": {"response": {"type": "string"}}}),
                    },
                    **error_responses(ERROR_WIS, 400, 401, 503, 504),
                },
            }
        },
        "/api/chatbot/tts": {
            "get": {
                "summary": "WIS chatbot, spoken: the answer as audio (streamed by sentence), its text in X-Response",
                "parameters": [
                    *_CHATBOT_QUERY,
                    query_param("format", {"type": "string", "enum": ["WAV", "FLAC", "OGG", "MP3"]}, "any case"),
                    query_param("speaker", {"type": "string"}, "a voice or alias, as for /api/tts"),
                    query_param("language", {"type": "string"}, "pick a voice speaking this language"),
                ],
                "responses": {
                    "200": {
                        "description": "the answer spoken; X-Response holds its text (percent-encoded UTF-8)",
                        "headers": {"X-Response": {"schema": {"type": "string"}}},
                        "content": {
                            t: {"schema": {"type": "string", "format": "binary"}}
                            for t in ("audio/wav", "audio/flac", "audio/ogg", "audio/mpeg")
                        },
                    },
                    **error_responses(ERROR_WIS, 400, 401, 503, 504),
                },
            }
        },
        "/api/ws/chatbot": {
            "get": {
                "summary": "WIS chatbot WebSocket: a text frame in (the question), a text frame out (the answer)",
                "responses": {"101": {"description": "WebSocket upgrade"}, **error_responses(ERROR_WIS, 401, 403, 503)},
            }
        },
    }
