"""OpenAI audio REST API: /v1/audio/transcriptions, /v1/audio/translations.

Shapes follow the OpenAI spec (shared/reference/protocols.md) so the official SDKs work with only
``base_url`` changed. OpenAI model names (``whisper-1`` ...) map to the server's default model.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from aiohttp import web

from mediaserver.asr.vocabulary import check_prompt
from mediaserver.audio.decode import decode_any
from mediaserver.errors import ApiError, InvalidParameter
from mediaserver.events import DEFAULT_TEMPERATURES, SAMPLE_RATE_HZ, Segment, Task, Transcript, TranscriptionOptions
from mediaserver.languages import language_name
from mediaserver.state import ASR, METRICS, SETTINGS
from mediaserver.transport.common import parse_bool, parse_float, parse_language, read_multipart
from mediaserver.transport.openai.diarized import (
    REFERENCE_FIELDS,
    REFERENCE_MAX_BYTES,
    diarized_json,
    known_speakers,
    parse_request,
    speaker_service,
    stream_diarized,
    transcribe_diarized,
)
from mediaserver.transport.openai.transcription_stream import stream_transcript, word_logprobs

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt", "diarized_json")
GRANULARITIES = ("word", "segment")
STREAM_FORMATS = ("json", "text", "diarized_json")  # OpenAI streams these only


def _timestamp(seconds: float, *, decimal: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def to_srt(transcript: Transcript) -> str:
    blocks = []
    for index, seg in enumerate(transcript.segments, start=1):
        start = _timestamp(seg.start_s, decimal=",")
        end = _timestamp(seg.end_s, decimal=",")
        blocks.append(f"{index}\n{start} --> {end}\n{seg.text.strip()}\n")
    return "\n".join(blocks)


def to_vtt(transcript: Transcript) -> str:
    lines = ["WEBVTT", ""]
    for seg in transcript.segments:
        lines.append(f"{_timestamp(seg.start_s, decimal='.')} --> {_timestamp(seg.end_s, decimal='.')}")
        lines.append(seg.text.strip())
        lines.append("")
    return "\n".join(lines)


def to_verbose_json(transcript: Transcript, task: Task, granularities: set[str]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": task,
        "language": language_name(transcript.language) if transcript.language else "",
        "duration": round(transcript.duration_s, 3),
        "text": transcript.text,
    }
    if "segment" in granularities:
        body["segments"] = [_verbose_segment(seg) for seg in transcript.segments]
    if "word" in granularities:
        body["words"] = [
            {"word": w.word.strip(), "start": round(w.start_s, 3), "end": round(w.end_s, 3)} for w in transcript.words
        ]
    body["usage"] = _usage(transcript)
    return body


def _verbose_segment(seg: Segment) -> dict[str, Any]:
    """A verbose_json segment; the decode's scores only when the engine reported them (a remote
    server that answers text only reports none: they are left out, not sent as zeros)."""
    body: dict[str, Any] = {
        "id": seg.id,
        "seek": seg.seek,
        "start": round(seg.start_s, 3),
        "end": round(seg.end_s, 3),
        "text": seg.text,
        "tokens": list(seg.tokens),
    }
    scores = {
        "temperature": seg.temperature,
        "avg_logprob": seg.avg_logprob,
        "compression_ratio": seg.compression_ratio,
        "no_speech_prob": seg.no_speech_prob,
    }
    body.update({name: value for name, value in scores.items() if value is not None})
    return body


def _usage(transcript: Transcript) -> dict[str, Any]:
    return {"type": "duration", "seconds": math.ceil(transcript.duration_s)}


def _single(values: dict[str, list[str]], name: str) -> str | None:
    found = values.get(name)
    return found[-1] if found else None


async def _handle(request: web.Request, task: Task) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    asr = request.app[ASR]
    reference_limit = min(settings.max_upload_bytes, REFERENCE_MAX_BYTES)
    fields = await read_multipart(
        request,
        settings.max_upload_bytes,
        file_fields=("file",),
        value_limits=dict.fromkeys(REFERENCE_FIELDS, reference_limit),
    )
    data = fields.require_file("file")
    values = fields.values
    requested_model = _single(values, "model")
    if not requested_model:
        raise InvalidParameter("the field 'model' is required (for example 'whisper-1')", param="model")
    response_format = (_single(values, "response_format") or "json").strip().lower()
    if response_format not in RESPONSE_FORMATS:
        raise InvalidParameter(
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; got {response_format!r}",
            param="response_format",
        )
    diarized = response_format == "diarized_json"
    granularities = set(values.get("timestamp_granularities[]", []) + values.get("timestamp_granularities", []))
    unknown = granularities - set(GRANULARITIES)
    if unknown:
        raise InvalidParameter(
            f"timestamp_granularities must be 'word' and/or 'segment'; got {sorted(unknown)}",
            param="timestamp_granularities",
        )
    if granularities and diarized:
        raise InvalidParameter(
            "timestamp_granularities is not supported with response_format=diarized_json (segments carry their times)",
            param="timestamp_granularities",
        )
    if granularities and response_format != "verbose_json":
        raise InvalidParameter(
            "timestamp_granularities requires response_format=verbose_json", param="timestamp_granularities"
        )
    if diarized and task == "translate":
        raise InvalidParameter("response_format=diarized_json is for transcriptions only", param="response_format")
    wanted = parse_request(values, diarized=diarized)
    raw_stream = _single(values, "stream")  # (a trial's stream=maybe was taken as false)
    stream = parse_bool({"stream": raw_stream}, "stream") if raw_stream is not None else False
    if stream and task == "translate":
        raise InvalidParameter("stream=true is not supported for translations", param="stream")
    if stream and response_format not in STREAM_FORMATS:
        raise InvalidParameter(
            f"stream=true needs response_format json, text or diarized_json; got {response_format!r}",
            param="response_format",
        )
    include = set(values.get("include[]", []) + values.get("include", []))
    if include - {"logprobs"}:
        raise InvalidParameter(f"include may only name 'logprobs'; got {sorted(include)}", param="include")
    with_logprobs = "logprobs" in include
    if with_logprobs and diarized:
        raise InvalidParameter(
            "include[]=logprobs is not supported with response_format=diarized_json", param="include"
        )
    if with_logprobs and response_format != "json":
        raise InvalidParameter("include[]=logprobs needs response_format=json", param="include")
    temperature = parse_float({k: v[-1] for k, v in values.items()}, "temperature", None, minimum=0.0, maximum=1.0)
    language = None if task == "translate" else parse_language(_single(values, "language"), "language")
    options = TranscriptionOptions(
        language=language,
        task=task,
        beam_size=settings.default_beam_size,
        temperature=(temperature,) if temperature else DEFAULT_TEMPERATURES,
        initial_prompt=check_prompt(_single(values, "prompt"), settings, "prompt"),
        word_timestamps="word" in granularities or with_logprobs,
        # Every format decodes with Whisper's timestamps, so each gives the same text (asr_upload_timestamps).
        with_segment_timestamps=settings.asr_upload_timestamps or response_format in ("srt", "vtt", "verbose_json"),
    )
    # whisper-1 and the other OpenAI names name no model of ours: they translate, or transcribe another
    # language, with whatever can (translation_model where the default is English-only).
    model_name = asr.models.for_options(requested_model, options)
    try:
        audio = await asyncio.to_thread(decode_any, data, max_duration_s=settings.max_audio_duration_s)
    except ApiError as exc:  # (not audio, too long: the file is what is wrong)
        exc.param = exc.param or "file"
        raise
    request.app[METRICS].audio_seconds.labels("openai").inc(audio.size / SAMPLE_RATE_HZ)
    if diarized:
        speakers = speaker_service(request.app)
        references = await known_speakers(speakers, wanted)  # a bad reference is a 400 before any stream
        loaded = await asr.get_model(model_name)
        asr.models.check_options(loaded.name, options)

        def work() -> Any:
            return transcribe_diarized(request.app, speakers, audio, options, loaded.name, references)

        if stream:
            return await stream_diarized(request, work)
        return web.json_response(diarized_json(await work()))
    if stream:
        loaded = await asr.get_model(model_name)  # an unknown model or option is a 400 before the stream
        asr.models.check_options(loaded.name, options)
        return await stream_transcript(
            request, lambda: asr.transcribe(audio, options, model=loaded.name), with_logprobs=with_logprobs
        )
    transcript = await asr.transcribe(audio, options, model=model_name)
    if response_format == "text":
        return web.Response(text=transcript.text + "\n", content_type="text/plain")
    if response_format == "srt":
        return web.Response(text=to_srt(transcript), content_type="text/plain")
    if response_format == "vtt":
        return web.Response(text=to_vtt(transcript), content_type="text/vtt")
    if response_format == "verbose_json":
        return web.json_response(to_verbose_json(transcript, task, granularities or {"segment"}))
    body: dict[str, Any] = {"text": transcript.text, "usage": _usage(transcript)}
    if with_logprobs:
        body["logprobs"] = word_logprobs(transcript.segments)
    return web.json_response(body)


async def transcriptions_handler(request: web.Request) -> web.StreamResponse:
    return await _handle(request, "transcribe")


async def translations_handler(request: web.Request) -> web.StreamResponse:
    return await _handle(request, "translate")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/transcriptions", transcriptions_handler)
    app.router.add_post("/v1/audio/translations", translations_handler)
