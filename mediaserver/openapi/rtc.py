"""OpenAPI paths of the WebRTC signalling endpoints (/api/rtc/asr, /api/rtc/config, /v1/realtime/calls)
and of the streaming WebSockets (/api/ws/asr, /v1/realtime), merged by document.spec(). Media and events
then flow over the peer connection or the socket, not HTTP: OpenAPI describes only the upgrade (a GET
answered 101), the messages are in docs/ws-protocol.md and docs/realtime.md."""

from __future__ import annotations

from typing import Any

from mediaserver.openapi.schema import (
    ERROR_OPENAI,
    ERROR_WIS,
    PROMPT_DESCRIPTION,
    error_responses,
    json_body,
    query_param,
)

_SDP = {"type": "string", "description": "an SDP session description"}
_OFFER = {
    "type": "object",
    "required": ["sdp", "type"],
    "properties": {"sdp": _SDP, "type": {"const": "offer"}},
}
_ANSWER = {
    "type": "object",
    "required": ["sdp", "type"],
    "properties": {"sdp": _SDP, "type": {"const": "answer"}},
}
_STREAM_QUERY = [
    query_param("model", {"type": "string"}, "ASR model name or alias"),
    query_param("beam_size", {"type": "integer", "minimum": 1}, "beam width"),
    query_param("language", {"type": "string"}, "Whisper language code (force_language is a synonym)"),
    query_param("force_language", {"type": "string"}, "Whisper language code"),
    query_param("detect_language", {"type": "boolean"}, "detect the spoken language"),
    query_param("task", {"type": "string", "enum": ["transcribe", "translate"]}, "transcribe or translate"),
    query_param("prompt", {"type": "string"}, PROMPT_DESCRIPTION),
]


def _websocket_paths() -> dict[str, Any]:
    return {
        "/api/ws/asr": {
            "get": {
                "summary": "device WebSocket: PCM in, partial and final transcripts (and the voice loop's answers) "
                "out; the messages are in docs/ws-protocol.md",
                "description": "Any key of the start message given in the query string is an implicit start "
                "(docs/ws-protocol.md, 'Query-string start'); the common ones are listed.",
                "parameters": [
                    query_param("sample_rate", {"type": "integer"}, "the PCM rate in Hz"),
                    query_param("encoding", {"type": "string", "enum": ["pcm16", "float32"]}, "PCM encoding"),
                    query_param("channels", {"type": "integer", "minimum": 1}, "interleaved channels"),
                    query_param("mode", {"type": "string", "enum": ["server_vad", "push_to_talk"]}, "turn taking"),
                    query_param("partials", {"type": "boolean"}, "partial transcripts"),
                    query_param("language", {"type": "string"}, "Whisper language code"),
                    query_param("model", {"type": "string"}, "ASR model name or alias"),
                ],
                "responses": {
                    "101": {"description": "WebSocket upgrade (a bad query-string start: an error, then close 1008)"},
                    **error_responses(ERROR_WIS, 401, 403),
                },
            }
        },
        "/v1/realtime": {
            "get": {
                "summary": "OpenAI Realtime API over WebSocket: transcription sessions and spoken conversations "
                "(docs/realtime.md)",
                "parameters": [
                    query_param("model", {"type": "string", "example": "gpt-realtime"}, "the session's model"),
                    query_param("intent", {"type": "string", "enum": ["transcription"]}, "a transcription session"),
                ],
                "responses": {
                    "101": {"description": "WebSocket upgrade (subprotocol realtime)"},
                    **error_responses(ERROR_OPENAI, 400, 401, 403, 426, 503),
                },
            }
        },
    }


def rtc_paths() -> dict[str, Any]:
    return {
        **_websocket_paths(),
        "/api/rtc/asr": {
            "post": {
                "summary": "WebRTC signalling: an SDP offer in, the answer out (no trickle ICE); then the WIS "
                "data-channel protocol and the microphone track",
                "parameters": _STREAM_QUERY,
                "requestBody": {"required": True, **json_body(_OFFER)},
                "responses": {
                    "200": {"description": "the SDP answer", **json_body(_ANSWER)},
                    **error_responses(ERROR_WIS, 400, 401, 503),
                },
            }
        },
        "/api/rtc/config": {
            "get": {
                "summary": "the ICE servers a browser should use (STUN, TURN with credentials)",
                "responses": {
                    "200": {
                        "description": "RTCConfiguration.iceServers",
                        **json_body(
                            {
                                "type": "object",
                                "properties": {"iceServers": {"type": "array", "items": {"type": "object"}}},
                            }
                        ),
                    }
                },
            }
        },
        "/v1/realtime/calls": {
            "post": {
                "summary": "OpenAI Realtime conversation over WebRTC: an SDP offer in, 201 with the answer out",
                "parameters": [query_param("model", {"type": "string"}, "gpt-realtime or a chat model")],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/sdp": {"schema": _SDP},
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["sdp"],
                                "properties": {
                                    "sdp": _SDP,
                                    "session": {"type": "string", "description": "the session configuration, JSON"},
                                },
                            }
                        },
                    },
                },
                "responses": {
                    "201": {
                        "description": "the SDP answer; Location names the call",
                        "headers": {"Location": {"schema": {"type": "string"}}},
                        "content": {"application/sdp": {"schema": _SDP}},
                    },
                    **error_responses(ERROR_OPENAI, 400, 401, 503),
                },
            }
        },
        **_client_secret_paths(),
        "/v1/realtime/calls/{call_id}/hangup": {
            "post": {
                "summary": "end a Realtime call",
                "parameters": [{"name": "call_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "the call is closed"},
                    **error_responses(ERROR_OPENAI, 401, 404),
                },
            }
        },
    }


_SECRET_NOTE = (
    "a short-lived client secret (ek_...) for a browser: it opens /v1/realtime (Bearer, or the WebSocket "
    "subprotocol openai-insecure-api-key.<secret>) and /v1/realtime/calls (Bearer), only for a session of the "
    "kind it was minted for, until it expires; its session config applies"
)
_EXPIRES_AFTER = {
    "type": "object",
    "properties": {
        "anchor": {"type": "string", "enum": ["created_at"]},
        "seconds": {"type": "integer", "minimum": 10, "maximum": 7200, "default": 600},
    },
}
_SECRET_FIELDS: dict[str, Any] = {"value": {"type": "string"}, "expires_at": {"type": "integer"}}
_CLIENT_SECRET = {"type": "object", "required": ["value", "expires_at"], "properties": _SECRET_FIELDS}


def _client_secret_paths() -> dict[str, Any]:
    errors = error_responses(ERROR_OPENAI, 400, 401, 413)
    return {
        "/v1/realtime/client_secrets": {
            "post": {
                "summary": "mint " + _SECRET_NOTE,
                "requestBody": json_body(
                    {
                        "type": "object",
                        "properties": {
                            "expires_after": _EXPIRES_AFTER,
                            "session": {"type": "object", "description": "type realtime (default) or transcription"},
                        },
                    }
                ),
                "responses": {
                    "200": {
                        "description": "the secret and the session it opens",
                        **json_body(
                            {
                                "type": "object",
                                "required": ["value", "expires_at", "session"],
                                "properties": {**_SECRET_FIELDS, "session": {"type": "object"}},
                            }
                        ),
                    },
                    **errors,
                },
            }
        },
        "/v1/realtime/sessions": {
            "post": {
                "summary": "beta: a conversation session config (flat shape) and " + _SECRET_NOTE,
                "requestBody": json_body({"type": "object"}),
                "responses": {
                    "200": {
                        "description": "the session, with client_secret {value, expires_at} (default 60 s)",
                        **json_body({"type": "object", "properties": {"client_secret": _CLIENT_SECRET}}),
                    },
                    **errors,
                },
            }
        },
        "/v1/realtime/transcription_sessions": {
            "post": {
                "summary": "beta: a transcription session config and " + _SECRET_NOTE,
                "requestBody": json_body({"type": "object"}),
                "responses": {
                    "200": {
                        "description": "the session, with client_secret {value, expires_at} (default 60 s)",
                        **json_body({"type": "object", "properties": {"client_secret": _CLIENT_SECRET}}),
                    },
                    **errors,
                },
            }
        },
    }
