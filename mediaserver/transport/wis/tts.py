"""WIS speech out: GET /api/tts, GET /api/speaker and POST /api/sts.

``/api/tts`` takes what Willow devices and WAS send (shared/reference/willow-contract.md §5, §5.3):
``text`` (required), ``format`` (WAV, FLAC, OGG, MP3; any case; Willow asks for WAV), ``speaker``
(a voice; WIS's own names such as ``CLB`` mean the default voice, and so does a name it does not
know, as XTTS speaks one: ``X-WIS-Voice`` names the voice that spoke), ``language``, ``speed`` and
``nocache``. The firmware does not URL-encode the text and WAS puts ``text=`` last, so everything
after ``text=`` up to the next known parameter (this route's, or Coqui's or XTTS's) is the text,
``&`` and all; raw spaces and UTF-8 in the request line are accepted by ``lenient_http``. A WAV
answer is the whole file with its real sizes, as WIS answered (Willow's player reads those); the
other formats are streamed. Responses are cached like WIS's nginx did (``X-WIS-Cache:
HIT|MISS|BYPASS``, ``?nocache=1`` skips the cache).

``/api/sts`` (broken in WIS) works: multipart ``audio_file`` plus the WIS ASR query options in,
the transcript spoken back out, with the text in ``X-Transcript`` (percent-encoded UTF-8).
"""

from __future__ import annotations

import asyncio
import logging
import re
from urllib.parse import quote, unquote_plus

from aiohttp import web

from mediaserver.audio.decode import decode_any
from mediaserver.errors import InvalidParameter
from mediaserver.events import SAMPLE_RATE_HZ, Priority
from mediaserver.state import ASR, METRICS, SETTINGS
from mediaserver.transport.common import parse_float, read_multipart
from mediaserver.transport.tts_http import SpeechRequest, respond_with_speech, tts_of
from mediaserver.transport.wis.query import parse_format, parse_wis_query
from mediaserver.tts.encode import encode_all, output_rate
from mediaserver.tts.types import SynthesisParams
from mediaserver.tts.voices import PIPER_VOICE_NAME, UnknownVoice

log = logging.getLogger(__name__)

CACHE_HEADER = "X-WIS-Cache"
_KNOWN = ("format", "speaker", "voice", "language", "speed", "nocache")
# The other TTS servers' parameters a WIS client may send (ignored here, but where the text ends):
# Coqui's TTS server's, and XTTS's WillowStreamingInputs (willow-contract.md section 5.2).
_OTHERS = (
    *("speaker_id", "style_wav", "language_id", "stream_chunk_size", "overlap_wav_len", "temperature"),
    *("length_penalty", "repetition_penalty", "top_k", "top_p", "do_sample", "enable_text_splitting", "decoder"),
)
_TEXT_START = re.compile(r"(?:^|&)text=")
_NEXT_KNOWN = re.compile(r"&(?:" + "|".join(_KNOWN + _OTHERS) + r")=")
VOICE_HEADER = "X-WIS-Voice"


def text_from_query(raw_query: str) -> str | None:
    """The ``text`` parameter as Willow sends it: unencoded, last, possibly holding ``&``.

    Everything after ``text=`` up to the next parameter this route knows is the text; ``+`` and
    ``%20`` are spaces, as in any query string.
    """
    match = _TEXT_START.search(raw_query)
    if match is None:
        return None
    rest = raw_query[match.end() :]
    cut = _NEXT_KNOWN.search(rest)
    return unquote_plus(rest[: cut.start()] if cut else rest, errors="replace")


def _nocache(value: str | None) -> bool:
    """nginx's ``proxy_cache_bypass $arg_nocache``: any value but empty or 0 bypasses."""
    return value is not None and value.strip() not in ("", "0")


async def tts_handler(request: web.Request) -> web.StreamResponse:
    """GET /api/tts?text=...&format=WAV&speaker=CLB"""
    tts = tts_of(request)
    settings = request.app[SETTINGS]
    query = request.query
    text = text_from_query(request.rel_url.raw_query_string)
    if text is None:
        raise InvalidParameter("the query parameter 'text' is required", param="text")
    tts.check_text(text)
    fmt = parse_format(query.get("format"), settings.tts_wis_default_format)
    speed = parse_float(query, "speed", 1.0, minimum=float("-inf"), maximum=float("inf"))
    assert speed is not None
    tts.check_speed(speed)
    speaker = query.get("speaker") or query.get("voice")
    language = query.get("language") or None
    try:
        voice = await tts.voice(speaker, language=language)
    except UnknownVoice:
        if not speaker or PIPER_VOICE_NAME.match(speaker.strip()):
            raise  # (no voice speaks the language; a Piper voice asked for by name is not here)
        # XTTS, the WIS stack's TTS, speaks an unknown speaker (a custom voice cloned into it) in its
        # default voice: a WAS set up for one would otherwise get no speech at all. The header says
        # which voice spoke.
        voice = await tts.voice(None, language=language)
        log.info("/api/tts: no voice %r here; spoke in %s, as XTTS speaks an unknown speaker", speaker, voice.name)
    spoken = SpeechRequest(text, voice, SynthesisParams(speed=speed), fmt)
    return await respond_with_speech(
        request,
        spoken,
        nocache=_nocache(query.get("nocache")),
        cache_header=CACHE_HEADER,
        whole_wav=True,
        headers={VOICE_HEADER: voice.name},
    )


async def speaker_handler(request: web.Request) -> web.Response:
    """GET /api/speaker: the voices (WIS listed its speakers as {"speakers": [...]})."""
    tts = tts_of(request)
    registry = tts.voices
    voices = registry.voices()
    return web.json_response(
        {
            "speakers": [v.name for v in voices],
            "default": registry.default_name(),
            "aliases": registry.aliases(),
            "voices": [
                {
                    "name": v.name,
                    "language": v.language,
                    "sample_rate": v.sample_rate_hz,
                    "engine": v.engine,
                    "source": v.source,
                    "description": v.description,
                    "speakers": list(v.speakers),
                    "loaded": v.name in tts.loaded_voices,
                }
                for v in voices
            ],
        }
    )


async def sts_handler(request: web.Request) -> web.StreamResponse:
    """POST /api/sts: speech in (multipart audio_file), its transcript spoken back out."""
    started_at = asyncio.get_running_loop().time()  # (the transcription counts in tts_wis_whole_wav_s)
    tts = tts_of(request)
    settings = request.app[SETTINGS]
    query = request.query
    wis = parse_wis_query(request)
    fmt = parse_format(query.get("format"), settings.tts_wis_default_format)
    speed = parse_float(query, "speed", 1.0, minimum=float("-inf"), maximum=float("inf"))
    assert speed is not None
    tts.check_speed(speed)
    voice = await tts.voice(query.get("speaker") or query.get("voice"), language=query.get("language") or None)
    fields = await read_multipart(request, settings.max_upload_bytes, file_fields=("audio_file",))
    data = fields.require_file("audio_file")
    audio = await asyncio.to_thread(decode_any, data, max_duration_s=settings.max_audio_duration_s)
    request.app[METRICS].audio_seconds.labels("sts").inc(audio.size / SAMPLE_RATE_HZ)
    transcript = await request.app[ASR].transcribe(audio, wis.options, model=wis.model, priority=Priority.FINAL)
    headers = {
        "X-Transcript": quote(transcript.text, safe=" ,.?!'"),
        "X-Language": wis.reported_language or transcript.language,
    }
    text = transcript.text
    if len(text) > settings.tts_max_input_chars:
        text = text[: settings.tts_max_input_chars]
    if not text.strip():  # nothing heard: an empty (valid) file
        body = encode_all(b"", fmt, output_rate(fmt, voice.sample_rate_hz))
        return web.Response(body=body, content_type=fmt.content_type, headers=headers)
    spoken = SpeechRequest(text, voice, SynthesisParams(speed=speed), fmt)
    return await respond_with_speech(
        request, spoken, cache=False, whole_wav=True, headers=headers, started_at=started_at
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/tts", tts_handler)
    app.router.add_get("/api/speaker", speaker_handler)
    app.router.add_post("/api/sts", sts_handler)
