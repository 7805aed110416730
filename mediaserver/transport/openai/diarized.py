"""``response_format=diarized_json`` on ``/v1/audio/transcriptions``: who said what, and when.

The speaker turns come from mediaserver/speakers/diarize.py; each turn is transcribed on its own
with the request's model (all turns are submitted at once, so the scheduler batches them), and each
Whisper segment of a turn becomes one ``transcript.text.segment`` (``id``, ``start``, ``end``,
``text``, ``speaker``), times in the whole recording. The shapes follow the ``openai`` SDK's
``TranscriptionDiarized`` and stream events: with ``stream=true`` each segment goes out as a
``transcript.text.delta`` (with its ``segment_id``) then a ``transcript.text.segment``, and one
``transcript.text.done`` ends the stream.

``known_speaker_names[]`` / ``known_speaker_references[]`` (up to 4, data URLs of 2-10 s clips)
name the clusters that sound like them; the others are ``A``, ``B``, ...
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from mediaserver.audio.decode import decode_any
from mediaserver.errors import ApiError, InvalidAudio, InvalidParameter, ModelUnavailable
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray, TranscriptionOptions
from mediaserver.speakers.diarize import SpeakerTurn, Vectors, diarize
from mediaserver.speakers.service import SpeakerService
from mediaserver.state import ASR, SETTINGS, SPEAKERS
from mediaserver.transport.common import sse_error
from mediaserver.transport.openai.transcription_stream import AUDIO_TOKENS_PER_S, event

log = logging.getLogger(__name__)

MAX_KNOWN_SPEAKERS = 4
REFERENCE_MIN_S, REFERENCE_MAX_S = 2.0, 10.0
REFERENCE_FIELDS = ("known_speaker_references[]", "known_speaker_references")
NAME_FIELDS = ("known_speaker_names[]", "known_speaker_names")
REFERENCE_MAX_BYTES = 8 * 1024 * 1024  # a data URL of 10 s of 48 kHz stereo WAV is 2.6 MB
PAD_S = 0.2  # audio kept on each side of a turn, at most half the pause to the next
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)", re.S)


@dataclass(frozen=True)
class DiarizedRequest:
    names: list[str]
    references: list[bytes]


def _all(values: dict[str, list[str]], names: tuple[str, ...]) -> list[str]:
    return [v for name in names for v in values.get(name, [])]


def parse_request(values: dict[str, list[str]], *, diarized: bool) -> DiarizedRequest:
    """The known speakers and ``chunking_strategy`` of a transcription request (400s for bad ones)."""
    chunking = values.get("chunking_strategy", [])
    chunk_type = values.get("chunking_strategy[type]", [])
    if chunking and chunking[-1].strip().lower() not in ("auto", ""):
        raise InvalidParameter(
            f"chunking_strategy must be 'auto' or an object with type 'server_vad'; got {chunking[-1]!r}",
            param="chunking_strategy",
        )
    if chunk_type and chunk_type[-1] != "server_vad":
        raise InvalidParameter(
            f"chunking_strategy.type must be 'server_vad'; got {chunk_type[-1]!r}", param="chunking_strategy"
        )
    names = [n.strip() for n in _all(values, NAME_FIELDS)]
    references = _all(values, REFERENCE_FIELDS)
    if (names or references) and not diarized:
        raise InvalidParameter(
            "known_speaker_names[] and known_speaker_references[] need response_format=diarized_json",
            param="known_speaker_names",
        )
    if len(names) != len(references):
        raise InvalidParameter(
            f"known_speaker_names[] and known_speaker_references[] must pair up; got {len(names)} name(s) "
            f"and {len(references)} reference(s)",
            param="known_speaker_references" if names else "known_speaker_names",
        )
    if len(names) > MAX_KNOWN_SPEAKERS:
        raise InvalidParameter(
            f"at most {MAX_KNOWN_SPEAKERS} known speakers; got {len(names)}", param="known_speaker_names"
        )
    if any(not n for n in names) or len(set(names)) != len(names):
        raise InvalidParameter("known_speaker_names[] must be distinct and not empty", param="known_speaker_names")
    return DiarizedRequest(names, [_data_url(ref, index) for index, ref in enumerate(references)])


def _data_url(value: str, index: int) -> bytes:
    match = _DATA_URL.fullmatch(value.strip())
    if match is None:
        raise InvalidParameter(
            f"known_speaker_references[{index}] must be a data URL (data:audio/wav;base64,...); got {value[:40]!r}",
            param="known_speaker_references",
        )
    mime = (match["mime"] or "").lower()
    if mime and not mime.startswith(("audio/", "video/")) and mime != "application/octet-stream":
        raise InvalidParameter(
            f"known_speaker_references[{index}] is {mime}, not audio", param="known_speaker_references"
        )
    try:
        return base64.b64decode(re.sub(r"\s+", "", match["data"]), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParameter(
            f"known_speaker_references[{index}] is not valid base64", param="known_speaker_references"
        ) from None


def speaker_service(app: web.Application) -> SpeakerService:
    """The speaker service, or a 503 that says why diarization is off."""
    service = app.get(SPEAKERS)
    if service is None:
        raise ModelUnavailable("diarization is off: speaker recognition is not running")
    if service.problem is not None:
        raise ModelUnavailable(f"diarization is off: {service.problem}")
    return service


async def known_speakers(service: SpeakerService, wanted: DiarizedRequest) -> list[tuple[str, Vectors]]:
    """Each known speaker's name and voice embedding (400 for a reference that is not 2-10 s of speech)."""
    found: list[tuple[str, Vectors]] = []
    for index, (name, data) in enumerate(zip(wanted.names, wanted.references, strict=True)):
        where = f"known_speaker_references[{index}] ({name})"
        try:
            audio = await asyncio.to_thread(decode_any, data, max_duration_s=REFERENCE_MAX_S + 0.5)
        except ApiError as exc:
            raise InvalidParameter(
                f"{where} is not usable audio: {exc.message}", param="known_speaker_references"
            ) from None
        if audio.size < REFERENCE_MIN_S * SAMPLE_RATE_HZ * 0.9:
            raise InvalidParameter(
                f"{where} is {audio.size / SAMPLE_RATE_HZ:.1f} s long; references must be "
                f"{REFERENCE_MIN_S:g} to {REFERENCE_MAX_S:g} s",
                param="known_speaker_references",
            )
        try:
            vector, _ = await service.embed(audio)
        except InvalidAudio as exc:
            raise InvalidParameter(f"{where}: {exc.message}", param="known_speaker_references") from None
        found.append((name, vector))
    return found


@dataclass(frozen=True)
class Diarized:
    text: str
    duration_s: float
    segments: list[dict[str, Any]]
    output_tokens: int


def _slices(turns: list[SpeakerTurn], duration_s: float) -> list[tuple[float, float]]:
    bounds = []
    for i, turn in enumerate(turns):
        before = turns[i - 1].end_s if i else 0.0
        after = turns[i + 1].start_s if i + 1 < len(turns) else duration_s
        start = max(0.0, turn.start_s - min(PAD_S, (turn.start_s - before) / 2))
        end = min(duration_s, turn.end_s + min(PAD_S, (after - turn.end_s) / 2))
        bounds.append((start, end))
    return bounds


async def transcribe_diarized(
    app: web.Application,
    service: SpeakerService,
    audio: AudioArray,
    options: TranscriptionOptions,
    model: str,
    references: list[tuple[str, Vectors]],
) -> Diarized:
    """Diarize ``audio`` (naming the clusters like ``references``), then transcribe every speaker
    turn with ``model``."""
    settings = app[SETTINGS]
    asr = app[ASR]
    turns = await diarize(
        service.embed_windows,
        audio,
        cluster_threshold=settings.diarize_cluster_threshold,
        references=references,
        name_threshold=settings.speaker_threshold,
    )
    duration_s = audio.size / SAMPLE_RATE_HZ
    options = dataclasses.replace(options, with_segment_timestamps=True, word_timestamps=False)
    slices = _slices(turns, duration_s)
    transcripts = await asyncio.gather(
        *(
            asr.transcribe(audio[int(s * SAMPLE_RATE_HZ) : int(e * SAMPLE_RATE_HZ)], options, model=model)
            for s, e in slices
        )
    )
    segments: list[dict[str, Any]] = []
    tokens = 0
    for turn, (offset, end), transcript in zip(turns, slices, transcripts, strict=True):
        for seg in transcript.segments:
            text = seg.text.strip()
            tokens += len(seg.tokens)
            if not text:
                continue
            start = min(max(offset + seg.start_s, turn.start_s), turn.end_s)
            segments.append(
                {
                    "type": "transcript.text.segment",
                    "id": f"seg_{len(segments)}",
                    "start": round(start, 3),
                    "end": round(max(start, min(offset + seg.end_s, end, turn.end_s)), 3),
                    "text": text,
                    "speaker": turn.speaker,
                }
            )
    log.info("diarized %.1f s: %d turn(s), %d speaker(s)", duration_s, len(turns), len({t.speaker for t in turns}))
    return Diarized(" ".join(s["text"] for s in segments), duration_s, segments, tokens)


def diarized_json(result: Diarized) -> dict[str, Any]:
    return {
        "task": "transcribe",
        "duration": round(result.duration_s, 3),
        "text": result.text,
        "segments": result.segments,
        "usage": {"type": "duration", "seconds": math.ceil(result.duration_s)},
    }


def _token_usage(result: Diarized) -> dict[str, Any]:
    audio_tokens = math.ceil(result.duration_s * AUDIO_TOKENS_PER_S)
    return {
        "type": "tokens",
        "input_tokens": audio_tokens,
        "input_token_details": {"audio_tokens": audio_tokens, "text_tokens": 0},
        "output_tokens": result.output_tokens,
        "total_tokens": audio_tokens + result.output_tokens,
    }


async def stream_diarized(request: web.Request, work: Any) -> web.StreamResponse:
    """SSE: per segment a delta (with its ``segment_id``) and the segment, then the done event.
    Errors after the headers are a final ``data: {"error": ...}`` event, as for the other streams."""
    response = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        try:
            result: Diarized = await work()
        except ApiError as exc:
            await response.write(sse_error(request, exc))
            return response
        for index, segment in enumerate(result.segments):
            delta = segment["text"] if index == 0 else " " + segment["text"]
            await response.write(event({"type": "transcript.text.delta", "delta": delta, "segment_id": segment["id"]}))
            await response.write(event(segment))
        done = {"type": "transcript.text.done", "text": result.text, "usage": _token_usage(result)}
        await response.write(event(done))
        await response.write_eof()
    except ConnectionResetError:
        log.info("streamed diarized transcription: the client disconnected mid-stream")
    return response
