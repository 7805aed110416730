"""The query parameters WIS's routes share: the ASR options of /api/willow, /api/asr and /api/sts, and
the audio format of /api/tts, /api/sts and /api/chatbot/tts."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from mediaserver.asr.vocabulary import check_prompt
from mediaserver.errors import InvalidParameter
from mediaserver.events import TranscriptionOptions
from mediaserver.state import SETTINGS
from mediaserver.transport.common import parse_bool, parse_int, parse_language
from mediaserver.tts.encode import FORMATS, AudioFormat

WIS_FORMATS = ("WAV", "FLAC", "OGG", "MP3")


@dataclass(frozen=True)
class WisRequest:
    model: str | None
    options: TranscriptionOptions
    translate: bool
    stats: bool
    save_audio: bool
    voice_auth: bool
    reported_language: str | None  # None → report what was detected


def parse_wis_query(request: web.Request) -> WisRequest:
    settings = request.app[SETTINGS]
    query = request.query
    force_language = parse_language(
        query.get("force_language"),
        "force_language",
        message=f"Invalid force_language: {query.get('force_language')!r} is not a Whisper language code",
    )
    detect_language = parse_bool(query, "detect_language", False)
    beam_size = parse_int(query, "beam_size", settings.default_beam_size, minimum=1, maximum=settings.max_beam_size)
    if force_language:
        language: str | None = force_language
    elif detect_language:
        language = None
    else:
        language = settings.default_language
    voice_auth = parse_bool(query, "voice_auth", False)
    return WisRequest(
        model=query.get("model") or None,
        options=TranscriptionOptions(
            language=language,
            beam_size=beam_size,
            initial_prompt=check_prompt(query.get("prompt"), settings, "prompt"),
            with_segment_timestamps=settings.asr_upload_timestamps,  # (the text is the same as OpenAI uploads')
        ),
        translate=parse_bool(query, "translate", False),
        stats=parse_bool(query, "stats", False) or voice_auth,
        save_audio=parse_bool(query, "save_audio", False),
        voice_auth=voice_auth,
        reported_language=language,
    )


def parse_format(raw: str | None, default: str) -> AudioFormat:
    name = (raw or default).strip().upper()
    if name not in WIS_FORMATS:
        raise InvalidParameter(f"unknown format {raw!r}; formats: {', '.join(WIS_FORMATS)}", param="format")
    return FORMATS[name.lower()]
