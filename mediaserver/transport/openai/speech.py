"""OpenAI ``POST /v1/audio/speech``: the official SDKs' text-to-speech, with ``base_url`` changed.

``model``: ``tts-1``, ``tts-1-hd``, ``gpt-4o-mini-tts`` (and its dated name) or ``piper``; all mean
the Piper engine. ``voice``: a voice of this server, an alias (OpenAI's ``alloy`` … ``cedar`` mean
the default voice unless ``tts_voice_aliases`` says otherwise) or ``{"id": name}``.
``response_format``: mp3 (default), opus, aac, flac, wav, pcm, all at 24 kHz mono as OpenAI sends
them (pcm is raw signed 16-bit little-endian). ``speed``: 0.25 to 4.0. ``instructions`` is accepted
and ignored (Piper has no style control). ``stream_format``: ``audio`` (the default: the encoded
file, sent in chunks as sentences are made) or ``sse`` (``speech.audio.delta`` events carrying
base64 pieces of the encoded file, then ``speech.audio.done``). Errors use OpenAI's error object.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, StrictFloat

from mediaserver.errors import InvalidParameter, UnknownModel
from mediaserver.state import SETTINGS
from mediaserver.transport.openai.bodies import parse_body, read_json_object
from mediaserver.transport.tts_http import SpeechRequest, respond_with_speech, tts_of
from mediaserver.tts.encode import FORMATS
from mediaserver.tts.types import SynthesisParams

OPENAI_TTS_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
MODELS = (*OPENAI_TTS_MODELS, "piper")
RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
OPENAI_RATE_HZ = 24000
CACHE_HEADER = "X-Cache"


class VoiceId(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str


class SpeechBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: str
    voice: str | VoiceId
    instructions: str | None = None
    response_format: str = "mp3"
    speed: StrictFloat = 1.0  # (a number: a trial's ``true`` was taken as 1.0)
    stream_format: Literal["audio", "sse"] = "audio"


async def _body(request: web.Request) -> SpeechBody:
    settings = request.app[SETTINGS]
    body = await read_json_object(request, max_bytes=settings.max_upload_bytes, setting="max_upload_bytes")
    return parse_body(SpeechBody, body)


async def speech_handler(request: web.Request) -> web.StreamResponse:
    tts = tts_of(request)
    body = await _body(request)
    if body.model not in MODELS:
        raise UnknownModel(f"unknown TTS model {body.model!r}; models: {', '.join(MODELS)}", param="model")
    tts.check_text(body.input, param="input")
    response_format = body.response_format.strip().lower()
    if response_format not in RESPONSE_FORMATS:
        raise InvalidParameter(
            f"unknown response_format {body.response_format!r}; formats: {', '.join(RESPONSE_FORMATS)}",
            param="response_format",
        )
    tts.check_speed(body.speed)
    name = body.voice.id if isinstance(body.voice, VoiceId) else body.voice
    voice = await tts.voice(name)
    spoken = SpeechRequest(
        body.input, voice, SynthesisParams(speed=body.speed), FORMATS[response_format], sample_rate_hz=OPENAI_RATE_HZ
    )
    return await respond_with_speech(request, spoken, cache_header=CACHE_HEADER, sse=body.stream_format == "sse")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", speech_handler)
