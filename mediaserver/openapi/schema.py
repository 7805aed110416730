"""What the OpenAPI document's parts share: the two error shapes and the builders of parameters,
bodies and error responses (``document``, ``llm`` and ``rtc`` use them)."""

from __future__ import annotations

from typing import Any

ERROR_WIS = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "code": {"type": "string"}},
    "required": ["error"],
}
ERROR_OPENAI = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}


def query_param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def header_param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema, "description": description}


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def error_responses(schema: dict[str, Any], *codes: int) -> dict[str, Any]:
    text = {
        400: "bad input",
        401: "authentication required",
        403: "a WebSocket from a page of another origin, with no API key or client secret (cors_allow_origins)",
        406: "voice not authorized",
        408: "body stalled",
        404: "not found",
        409: "conflict (already there, or full)",
        413: "upload or audio too long",
        426: "a plain request to a WebSocket endpoint: upgrade the connection",
        503: "overloaded or model unavailable",
        504: "timed out",
    }
    return {str(c): {"description": text[c], **json_body(schema)} for c in codes}


def multipart_body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {
            "multipart/form-data": {"schema": {"type": "object", "properties": properties, "required": required}}
        },
    }


# The ``prompt`` of WIS, WebRTC and OpenAI uploads (asr/vocabulary.py).
PROMPT_DESCRIPTION = (
    "words Whisper should expect (names, rare words), after the server's asr_vocabulary; "
    "the two at most asr_max_prompt_chars characters (else 400)"
)
