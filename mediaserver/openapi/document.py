"""OpenAPI 3.1 description of the REST API, served at /api/openapi.json, and a self-contained docs page.

Written by hand (the API is small) so that it documents the wire contracts exactly, including the
Willow headers and chunked bodies that a generator would not infer.
"""

from __future__ import annotations

from typing import Any

from mediaserver.openapi.llm import llm_paths
from mediaserver.openapi.rtc import rtc_paths
from mediaserver.openapi.schema import (
    ERROR_OPENAI,
    ERROR_WIS,
    PROMPT_DESCRIPTION,
    error_responses,
    header_param,
    json_body,
    multipart_body,
    query_param,
)

_WIS_RESULT = {
    "type": "object",
    "properties": {
        "language": {"type": "string", "example": "en"},
        "text": {"type": "string", "example": "turn on the kitchen lights."},
        "translation": {"type": "string", "description": "present when translate=true"},
        "infer_time": {"type": "number", "description": "ms"},
        "infer_speedup": {"type": "integer"},
        "audio_duration": {"type": "integer", "description": "ms"},
        "voice_auth": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "voice_auth=true: the enrolled speakers it matched, score (.3f) by name, best first",
        },
        "speaker_status": {"type": "string", "example": "I heard alice say:"},
    },
    "required": ["language", "text"],
}
_SPEAKER = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "clips": {"type": "integer"},
        "speech_s": {"type": "number"},
        "enrolled_at": {"type": "integer", "description": "Unix time"},
        "replaced": {"type": "boolean"},
    },
    "required": ["name", "clips", "speech_s", "enrolled_at"],
}
_SPEAKER_LIST = {
    "type": "object",
    "properties": {"speakers": {"type": "array", "items": _SPEAKER}, "max": {"type": "integer"}},
    "required": ["speakers"],
}


_WIS_QUERY = [
    query_param(
        "model",
        {"type": "string"},
        "model name; WIS sizes tiny..large resolve to the closest installed model",
    ),
    query_param("beam_size", {"type": "integer", "minimum": 1}, "beam width (never overridden by the server)"),
    query_param("detect_language", {"type": "boolean"}, "detect the spoken language"),
    query_param("force_language", {"type": "string"}, "Whisper language code; wins over detect_language"),
    query_param("translate", {"type": "boolean"}, "also return an English translation"),
    query_param("stats", {"type": "boolean"}, "add infer_time, infer_speedup, audio_duration"),
    query_param("save_audio", {"type": "boolean"}, "write the decoded audio to /audio/willow.wav"),
    query_param(
        "voice_auth",
        {"type": "boolean"},
        "speaker verification against the enrolled speakers (/api/speakers); 406 text/plain `Unauthorized voice` "
        "when none matches",
    ),
    query_param("prompt", {"type": "string"}, PROMPT_DESCRIPTION),
]


_OPENAI_FIELDS = {
    "file": {"type": "string", "format": "binary"},
    "model": {"type": "string", "example": "whisper-1"},
    "prompt": {"type": "string", "description": PROMPT_DESCRIPTION},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "response_format": {"type": "string", "enum": ["json", "text", "srt", "verbose_json", "vtt"]},
}


_DIARIZED_SEGMENT = {
    "type": "object",
    "required": ["type", "id", "start", "end", "text", "speaker"],
    "properties": {
        "type": {"type": "string", "enum": ["transcript.text.segment"]},
        "id": {"type": "string"},
        "start": {"type": "number"},
        "end": {"type": "number"},
        "text": {"type": "string"},
        "speaker": {"type": "string", "description": "a known speaker's name, else A, B, ..."},
    },
}
_DIARIZED = {
    "type": "object",
    "description": "response_format=diarized_json",
    "required": ["task", "duration", "text", "segments"],
    "properties": {
        "task": {"type": "string", "enum": ["transcribe"]},
        "duration": {"type": "number"},
        "text": {"type": "string"},
        "segments": {"type": "array", "items": _DIARIZED_SEGMENT},
        "usage": {"type": "object"},
    },
}


# --- speech out (TTS) --------------------------------------------------------------------------

_AUDIO = {"schema": {"type": "string", "format": "binary"}}
_TTS_ERRORS = (400, 401, 413, 503, 504)


def _tts_paths() -> dict[str, Any]:
    wis_tts_query = [
        {
            "name": "text",
            "in": "query",
            "required": True,
            "schema": {"type": "string"},
            "description": "what to say; Willow's unencoded text (spaces, UTF-8, '&') is taken when last",
        },
        query_param(
            "format", {"type": "string", "enum": ["WAV", "FLAC", "OGG", "MP3"]}, "any case; default WAV (streamed)"
        ),
        query_param("speaker", {"type": "string"}, "a voice or alias (WIS names such as CLB mean the default voice)"),
        query_param("language", {"type": "string"}, "pick a voice speaking this language (en, en-US ...)"),
        query_param("speed", {"type": "number", "minimum": 0.25, "maximum": 4.0}, "1.0 is the voice's own pace"),
        query_param("nocache", {"type": "string"}, "any value but 0 bypasses the response cache"),
    ]
    audio_response = {
        "description": "audio, streamed sentence by sentence (chunked); X-WIS-Cache: HIT, MISS or BYPASS",
        "headers": {"X-WIS-Cache": {"schema": {"type": "string", "enum": ["HIT", "MISS", "BYPASS"]}}},
        "content": {t: _AUDIO for t in ("audio/wav", "audio/flac", "audio/ogg", "audio/mpeg")},
    }
    return {
        "/api/tts": {
            "get": {
                "summary": "WIS text to speech (what Willow devices fetch)",
                "parameters": wis_tts_query,
                "responses": {"200": audio_response, **error_responses(ERROR_WIS, *_TTS_ERRORS)},
            }
        },
        "/api/speaker": {
            "get": {
                "summary": "the voices, the default voice and the aliases",
                "responses": {
                    "200": {"description": "voices", **json_body({"type": "object"})},
                    **error_responses(ERROR_WIS, 503),
                },
            }
        },
        "/api/sts": {
            "post": {
                "summary": "speech to speech: the transcript of audio_file, spoken (text in X-Transcript)",
                "parameters": [*_WIS_QUERY, *wis_tts_query[1:5]],
                "requestBody": multipart_body({"audio_file": {"type": "string", "format": "binary"}}, ["audio_file"]),
                "responses": {"200": audio_response, **error_responses(ERROR_WIS, *_TTS_ERRORS)},
            }
        },
        "/v1/audio/speech": {
            "post": {
                "summary": "OpenAI-compatible text to speech",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["model", "input", "voice"],
                                "properties": {
                                    "model": {
                                        "type": "string",
                                        "enum": [
                                            "tts-1",
                                            "tts-1-hd",
                                            "gpt-4o-mini-tts",
                                            "gpt-4o-mini-tts-2025-12-15",
                                            "piper",
                                        ],
                                    },
                                    "input": {"type": "string", "maxLength": 4096},
                                    "voice": {
                                        "oneOf": [
                                            {
                                                "type": "string",
                                                "description": "a voice, or an OpenAI voice name (alias)",
                                            },
                                            {
                                                "type": "object",
                                                "properties": {"id": {"type": "string"}},
                                                "required": ["id"],
                                            },
                                        ]
                                    },
                                    "instructions": {"type": "string", "description": "accepted and ignored"},
                                    "response_format": {
                                        "type": "string",
                                        "enum": ["mp3", "opus", "aac", "flac", "wav", "pcm"],
                                        "default": "mp3",
                                    },
                                    "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0, "default": 1.0},
                                    "stream_format": {"type": "string", "enum": ["audio", "sse"], "default": "audio"},
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "24 kHz mono audio, streamed; or speech.audio.delta/done events (sse)",
                        "content": {
                            **{t: _AUDIO for t in ("audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav")},
                            "audio/pcm": _AUDIO,
                            "text/event-stream": {"schema": {"type": "string"}},
                        },
                    },
                    **error_responses(ERROR_OPENAI, *_TTS_ERRORS),
                },
            }
        },
    }


def spec() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mediaserver",
            "version": "0.1.0",
            "description": "Speech recognition and synthesis over the Willow/WIS and OpenAI audio APIs.",
        },
        "components": {
            "securitySchemes": {
                "basic": {"type": "http", "scheme": "basic"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API key (api_keys), or a short-lived client secret ek_... "
                    "(POST /v1/realtime/client_secrets) on the realtime endpoints and the /rtc/ page's",
                },
            }
        },
        "paths": {
            "/api/willow": {
                "post": {
                    "summary": "Willow device ASR (chunked upload of one utterance)",
                    "parameters": [
                        *_WIS_QUERY,
                        header_param(
                            "x-audio-codec",
                            {"type": "string", "enum": ["pcm", "wav", "amrwb"]},
                            "default pcm",
                        ),
                        header_param("x-audio-sample-rate", {"type": "integer"}, "PCM rate, default 16000"),
                        header_param("x-audio-bits", {"type": "integer"}, "PCM sample width, default 16"),
                        header_param("x-audio-channel", {"type": "integer"}, "PCM channels, default 1"),
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                    },
                    "responses": {
                        "200": {"description": "transcript", **json_body(_WIS_RESULT)},
                        **error_responses(ERROR_WIS, 400, 401, 408, 413, 503, 504),
                        "406": {"description": "voice not authorized", "content": {"text/plain": {}}},
                    },
                }
            },
            "/api/asr": {
                "post": {
                    "summary": "WIS file ASR (multipart audio_file); always includes stats",
                    "parameters": _WIS_QUERY,
                    "requestBody": multipart_body(
                        {"audio_file": {"type": "string", "format": "binary"}}, ["audio_file"]
                    ),
                    "responses": {
                        "200": {"description": "transcript with stats", **json_body(_WIS_RESULT)},
                        **error_responses(ERROR_WIS, 400, 401, 413, 503, 504),
                    },
                }
            },
            "/api/speakers": {
                "get": {
                    "summary": "the enrolled speakers (names, clips, seconds of speech; never their voice embeddings)",
                    "responses": {
                        "200": {"description": "speakers", **json_body(_SPEAKER_LIST)},
                        **error_responses(ERROR_WIS, 401, 503),
                    },
                },
                "post": {
                    "summary": "enrol a speaker from one or more recordings (any format FFmpeg reads)",
                    "requestBody": multipart_body(
                        {
                            "name": {"type": "string", "description": "1-64 letters, digits, spaces, _ or -"},
                            "file": {"type": "string", "format": "binary", "description": "repeat for more clips"},
                            "replace": {"type": "boolean", "description": "enrol an enrolled name again"},
                        },
                        ["name", "file"],
                    ),
                    "responses": {
                        "201": {"description": "enrolled", **json_body(_SPEAKER)},
                        "200": {"description": "enrolled again (replace=true)", **json_body(_SPEAKER)},
                        **error_responses(ERROR_WIS, 400, 401, 409, 413, 503),
                    },
                },
            },
            "/api/speakers/{name}": {
                "delete": {
                    "summary": "forget a speaker (its stored voice is deleted)",
                    "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "204": {"description": "deleted"},
                        **error_responses(ERROR_WIS, 400, 401, 404, 503),
                    },
                }
            },
            "/api/ping": {
                "get": {
                    "summary": "liveness for WIS clients",
                    "responses": {"200": {"description": "pong", **json_body({"type": "object"})}},
                }
            },
            "/v1/audio/transcriptions": {
                "post": {
                    "summary": "OpenAI-compatible transcription",
                    "requestBody": multipart_body(
                        {
                            **_OPENAI_FIELDS,
                            "language": {"type": "string"},
                            "response_format": {
                                "type": "string",
                                "enum": ["json", "text", "srt", "verbose_json", "vtt", "diarized_json"],
                                "description": "diarized_json: segments with a speaker label each (any model;"
                                " gpt-4o-transcribe-diarize is the default model)",
                            },
                            "known_speaker_names[]": {
                                "type": "array",
                                "maxItems": 4,
                                "items": {"type": "string"},
                                "description": "diarized_json: names for the speakers of known_speaker_references[]",
                            },
                            "known_speaker_references[]": {
                                "type": "array",
                                "maxItems": 4,
                                "items": {"type": "string", "example": "data:audio/wav;base64,UklGR..."},
                                "description": "diarized_json: a data URL of 2-10 s of each known speaker",
                            },
                            "chunking_strategy": {
                                "type": "string",
                                "enum": ["auto"],
                                "description": "accepted for OpenAI's clients (an object with type server_vad too);"
                                " the server always cuts the audio at its voice activity",
                            },
                            "timestamp_granularities[]": {
                                "type": "array",
                                "items": {"type": "string", "enum": ["word", "segment"]},
                            },
                            "stream": {
                                "type": "boolean",
                                "description": "server-sent transcript.text.delta events, then transcript.text.done"
                                " (response_format json or text); with diarized_json each segment is a delta"
                                " (with its segment_id) then a transcript.text.segment event",
                            },
                            "include[]": {
                                "type": "array",
                                "items": {"type": "string", "enum": ["logprobs"]},
                                "description": "word logprobs (response_format json)",
                            },
                        },
                        ["file", "model"],
                    ),
                    "responses": {
                        "200": {
                            "description": "transcript in the requested format, or its events with stream=true",
                            "content": {
                                **json_body({"oneOf": [{"type": "object"}, _DIARIZED]})["content"],
                                "text/event-stream": {"schema": {"type": "string"}},
                            },
                        },
                        **error_responses(ERROR_OPENAI, 400, 401, 413, 503, 504),
                    },
                }
            },
            "/v1/audio/translations": {
                "post": {
                    "summary": "OpenAI-compatible translation to English",
                    "requestBody": multipart_body(dict(_OPENAI_FIELDS), ["file", "model"]),
                    "responses": {
                        "200": {"description": "English text", **json_body({"type": "object"})},
                        **error_responses(ERROR_OPENAI, 400, 401, 413, 503, 504),
                    },
                }
            },
            "/v1/models": {
                "get": {"summary": "models and aliases", "responses": {"200": {"description": "model list"}}}
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "one model or alias of /v1/models (OpenAI's model object)",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "example": "whisper-1"},
                            "description": "an id /v1/models lists",
                        }
                    ],
                    "responses": {
                        "200": {"description": "the model", **json_body({"type": "object"})},
                        **error_responses(ERROR_OPENAI, 401, 404),
                    },
                }
            },
            **_tts_paths(),
            "/health": {"get": {"summary": "health and loaded models", "responses": {"200": {"description": "ok"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "metrics"}}}},
            **llm_paths(),
            **rtc_paths(),
        },
    }


DOCS_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mediaserver API</title>
<style>body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}
code,pre{background:#f4f4f4;padding:.1rem .3rem}section{border-top:1px solid #ddd;padding:.5rem 0}
.m{font-weight:bold;text-transform:uppercase;margin-right:.5rem}</style></head>
<body><h1>mediaserver API</h1>
<p>Machine-readable spec: <a href="/api/openapi.json">/api/openapi.json</a> (OpenAPI 3.1).</p>
<div id="ops">Loading…</div>
<script type="module">
const spec = await (await fetch('/api/openapi.json')).json();
const root = document.getElementById('ops'); root.textContent = '';
for (const [path, ops] of Object.entries(spec.paths)) {
  for (const [method, op] of Object.entries(ops)) {
    const s = document.createElement('section');
    const h = document.createElement('h3');
    h.innerHTML = `<span class="m"></span><code></code>`;
    h.querySelector('.m').textContent = method; h.querySelector('code').textContent = path;
    s.append(h);
    const p = document.createElement('p'); p.textContent = op.summary || ''; s.append(p);
    const params = (op.parameters || []).map(x => `${x.in} ${x.name}: ${x.description || ''}`);
    const body = op.requestBody ? Object.entries(op.requestBody.content).map(([ct, c]) =>
      `body ${ct}` + (c.schema && c.schema.properties ? ': ' + Object.keys(c.schema.properties).join(', ') : '')) : [];
    if (params.length || body.length) { const pre = document.createElement('pre');
      pre.textContent = [...params, ...body].join('\\n'); s.append(pre); }
    const codes = document.createElement('p');
    codes.textContent = 'responses: ' + Object.keys(op.responses || {}).join(', '); s.append(codes);
    root.append(s);
  }
}
</script></body></html>
"""

INDEX_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mediaserver</title></head>
<body style="font:15px/1.5 system-ui,sans-serif;max-width:50rem;margin:2rem auto">
<h1>mediaserver</h1>
<ul>
<li><a href="/api/docs">REST API documentation</a></li>
<li><a href="/health">/health</a> · <a href="/metrics">/metrics</a> · <a href="/v1/models">/v1/models</a></li>
</ul></body></html>
"""
