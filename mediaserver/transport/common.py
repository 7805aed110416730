"""Parsing of untrusted request values, shared by the REST handlers.

Every value is validated once here, into a typed value or an ApiError naming the parameter.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, TypeVar

from aiohttp import BodyPartReader, web

from mediaserver.asr.vocabulary import check_prompt
from mediaserver.config import Settings
from mediaserver.errors import ApiError, AudioTooLarge, InvalidParameter, RequestTimeout
from mediaserver.events import FinalTranscript, TranscriptionOptions, TurnDecided
from mediaserver.languages import normalize_language
from mediaserver.state import SETTINGS
from mediaserver.stream.options import StreamOptions

_T = TypeVar("_T")
_TRUE = frozenset({"1", "true", "yes", "on", "t", "y"})
_FALSE = frozenset({"0", "false", "no", "off", "f", "n", ""})

# A streamed response that failed after its 200 went out: the code, for the metrics middleware (app.py).
FAILED_AFTER_HEADERS: Final = web.RequestKey("failed_after_headers", ApiError)


def failed_after_headers(request: web.Request, exc: ApiError) -> None:
    """A streamed response failed after its status line went out (an SSE stream ended by an error
    event, an audio stream cut short): ``/metrics`` counts it
    (``mediaserver_responses_failed_after_headers_total{route, code}``) and the log says so; the
    request itself counts with the status the client got."""
    request[FAILED_AFTER_HEADERS] = exc


def sse_error(request: web.Request, exc: ApiError) -> bytes:
    """The event that ends an SSE stream failing after its headers (``data: {"error": ...}``, the
    shape OpenAI's streams use), the failure recorded (``failed_after_headers``)."""
    failed_after_headers(request, exc)
    error = {"message": exc.message, "type": "server_error", "param": exc.param, "code": exc.code}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


class LoneSurrogate(ValueError):
    """JSON text whose string escapes a lone UTF-16 surrogate (``"\\ud800"``): valid JSON, but not
    Unicode text. Python keeps it in a ``str``, and it fails wherever the text is encoded: the TTS
    cache key, the LLM's prompt, Whisper's tokenizer (a trial's 500s and closed sessions)."""

    def __init__(self, value: Any) -> None:
        self.value = value  # what was parsed (a Realtime event's ``event_id`` is told back)
        super().__init__(
            "the JSON holds a lone UTF-16 surrogate escape (such as \\ud800 without its pair): "
            "that is not Unicode text; send text as UTF-8, or escape a character outside the BMP as a surrogate pair"
        )


def loads_json(raw: str | bytes | bytearray) -> Any:
    """``json.loads`` for untrusted input: a ValueError for anything that is not JSON, including
    nesting too deep for the parser (``"[" * 5000``), which ``json`` reports as a RecursionError,
    and ``LoneSurrogate`` for JSON whose strings are not Unicode text."""
    if not isinstance(raw, str):
        # UTF-8 (RFC 8259), strictly: json.loads would also take UTF-16 and UTF-32, and UTF-8's
        # encoding of a surrogate (b"\\xed\\xa0\\x80"), decoding with "surrogatepass" (a review).
        raw = bytes(raw).decode("utf-8-sig")  # (a UnicodeDecodeError is a ValueError)
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    # In text decoded strictly a surrogate can only come in escaped: look only where one is.
    if ("\\ud" in raw or "\\uD" in raw) and not unicode_text(value):
        raise LoneSurrogate(value)
    return value


def unicode_text(value: Any) -> bool:
    """Every string in a parsed JSON value (keys too) encodes as UTF-8."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def json_error(exc: Exception, fallback: str) -> str:
    """What to tell a client whose JSON ``loads_json`` refused: ``fallback`` (the surface's own
    sentence), or what is wrong with text that parses but is not Unicode."""
    if isinstance(exc, UnicodeDecodeError):
        return f"{fallback.rstrip('.')} (it is not UTF-8 text: {exc.reason} at byte {exc.start}; JSON is sent as UTF-8)"
    return str(exc) if isinstance(exc, LoneSurrogate) else fallback


def parse_bool(params: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = params.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InvalidParameter(f"parameter {name!r} must be true or false, got {raw!r}", param=name)


def parse_int(params: Mapping[str, str], name: str, default: int, *, minimum: int, maximum: int) -> int:
    raw = params.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidParameter(f"parameter {name!r} must be an integer, got {raw!r}", param=name) from None
    if not minimum <= value <= maximum:
        raise InvalidParameter(f"parameter {name!r} must be between {minimum} and {maximum}, got {value}", param=name)
    return value


def parse_float(
    params: Mapping[str, str], name: str, default: float | None, *, minimum: float, maximum: float
) -> float | None:
    raw = params.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise InvalidParameter(f"parameter {name!r} must be a number, got {raw!r}", param=name) from None
    if not math.isfinite(value):  # ("nan" and "inf" parse; a trial read "between -inf and inf, got nan")
        raise InvalidParameter(f"parameter {name!r} must be a finite number, got {raw!r}", param=name)
    if not minimum <= value <= maximum:
        raise InvalidParameter(f"parameter {name!r} must be between {minimum} and {maximum}, got {value}", param=name)
    return value


def parse_language(raw: str | None, name: str, *, message: str | None = None) -> str | None:
    try:
        return normalize_language(raw)
    except ValueError:
        raise InvalidParameter(message or f"parameter {name!r}: unsupported language {raw!r}", param=name) from None


async def read_body_limited(request: web.Request, *, max_bytes: int, idle_timeout_s: float) -> bytes:
    """Read a (possibly chunked) body as it streams in, refusing more than ``max_bytes``.

    ``idle_timeout_s`` bounds the wait for each next piece, so a device that stops sending
    mid-upload cannot hold a request open forever.
    """
    if request.content_length is not None and request.content_length > max_bytes:
        raise AudioTooLarge(f"request body is {request.content_length} bytes; the limit is {max_bytes} bytes")
    parts: list[bytes] = []
    total = 0
    while True:
        try:
            async with asyncio.timeout(idle_timeout_s):
                chunk = await request.content.readany()
        except TimeoutError:
            raise RequestTimeout(f"request body stalled: no data for {idle_timeout_s:.0f} s") from None
        if not chunk:
            break
        total += len(chunk)
        if total > max_bytes:
            raise AudioTooLarge(f"request body exceeds the limit of {max_bytes} bytes")
        parts.append(chunk)
    return b"".join(parts)


@dataclass
class MultipartFields:
    files: dict[str, bytes]  # the last file of each field
    values: dict[str, list[str]]
    stray_files: list[str]
    file_lists: dict[str, list[bytes]] = field(default_factory=dict)  # every file of each field, in order

    def require_file(self, field: str) -> bytes:
        data = self.files.get(field)
        if data is None:
            got = f"; got a file under {', '.join(repr(s) for s in self.stray_files)}" if self.stray_files else ""
            raise InvalidParameter(f"the multipart field {field!r} with the audio file is required{got}", param=field)
        return data


async def read_multipart(
    request: web.Request,
    max_bytes: int,
    *,
    file_fields: tuple[str, ...],
    max_value_bytes: int = 65536,
    value_limits: Mapping[str, int] | None = None,
) -> MultipartFields:
    """Stream a multipart/form-data body, bounding the total size and each text field (to
    ``max_value_bytes``, or to its own limit in ``value_limits``), and the wait for each next piece
    (``body_read_timeout_s``: a 408, as ``read_body_limited``'s; a fault trial's upload that stopped
    mid-body held its request open, unanswered, for as long as the client waited)."""

    idle_s = request.app[SETTINGS].body_read_timeout_s

    async def piece(read: Awaitable[_T]) -> _T:
        try:
            async with asyncio.timeout(idle_s):
                return await read
        except TimeoutError:
            raise RequestTimeout(f"request body stalled: no data for {idle_s:.0f} s") from None

    if not request.content_type.startswith("multipart/"):
        raise InvalidParameter(
            f"expected a multipart/form-data body, got {request.content_type or 'none'}", param="body"
        )
    if request.content_length is not None and request.content_length > max_bytes:
        raise AudioTooLarge(f"request body is {request.content_length} bytes; the limit is {max_bytes} bytes")
    try:
        reader = await piece(request.multipart())
    except (ValueError, AssertionError) as exc:
        raise InvalidParameter(f"malformed multipart body: {exc}", param="body") from None
    files: dict[str, bytes] = {}
    file_lists: dict[str, list[bytes]] = {}
    values: dict[str, list[str]] = {}
    stray: list[str] = []
    total = 0
    try:
        while True:
            part = await piece(reader.next())
            if part is None:
                break
            if not isinstance(part, BodyPartReader):
                raise InvalidParameter("nested multipart bodies are not supported", param="body")
            name = part.name or ""
            # A file under a name we do not expect is skipped (not parsed as text), so the
            # missing-field check below can name the field the client should have used.
            stray_file = name not in file_fields and part.filename is not None
            limit = max_bytes if name in file_fields or stray_file else (value_limits or {}).get(name, max_value_bytes)
            buf = bytearray()
            while chunk := await piece(part.read_chunk(65536)):
                total += len(chunk)
                if total > max_bytes:
                    raise AudioTooLarge(f"request body exceeds the limit of {max_bytes} bytes")
                if stray_file:
                    continue
                buf += chunk
                if len(buf) > limit:
                    if name in file_fields:
                        raise AudioTooLarge(f"field {name!r} exceeds the limit of {limit} bytes")
                    raise InvalidParameter(f"field {name!r} is too long", param=name)
            if stray_file:
                stray.append(name)
            elif name in file_fields:
                files[name] = bytes(buf)
                file_lists.setdefault(name, []).append(files[name])
            else:
                try:
                    values.setdefault(name, []).append(buf.decode("utf-8"))
                except UnicodeDecodeError:
                    raise InvalidParameter(f"field {name!r} is not valid UTF-8", param=name) from None
    except (ValueError, AssertionError) as exc:
        raise InvalidParameter(f"malformed multipart body: {exc}", param="body") from None
    return MultipartFields(files, values, stray, file_lists)


_STREAM_KEYS = ("model", "beam_size", "language", "force_language", "detect_language", "task", "prompt")


def _as_text(key: str, value: object) -> str | None:
    """A stream option as text (a query string's are; JSON's numbers and booleans are taken as
    theirs); an object or a list is no option's value (a trial's ``"prompt": {"x": 1}`` was)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        kind = "object" if isinstance(value, dict) else "array"
        raise InvalidParameter(f"{key} must be a string, got a JSON {kind}", param=key)
    return str(value)


def stream_options_from(
    values: Mapping[str, object], settings: Settings, *, base: StreamOptions | None = None
) -> StreamOptions:
    """Streaming options from a query string or a JSON object (start/stop messages, session.update).

    Keys: model, beam_size, language (or force_language), detect_language, task, prompt. Missing or
    empty values keep ``base`` (or the server defaults), as WIS does with ``obj.get(k) or default``.
    """
    base = base or StreamOptions(
        transcription=TranscriptionOptions(
            language=settings.default_language,
            beam_size=settings.default_beam_size,
            with_segment_timestamps=False,
        )
    )
    text = {k: t for k in _STREAM_KEYS if (t := _as_text(k, values.get(k))) is not None and t.strip() != ""}
    options = base.transcription
    beam_size = parse_int(text, "beam_size", options.beam_size, minimum=1, maximum=settings.max_beam_size)
    language = options.language
    raw_language = text.get("language") or text.get("force_language")
    if raw_language is not None:
        language = parse_language(raw_language, "language")
    elif "detect_language" in text:
        language = None if parse_bool(text, "detect_language") else settings.default_language
    task = text.get("task", options.task)
    if task not in ("transcribe", "translate"):
        raise InvalidParameter(f"task must be 'transcribe' or 'translate', got {task!r}", param="task")
    prompt = check_prompt(text["prompt"], settings, "prompt") if "prompt" in text else options.initial_prompt
    model = text.get("model", base.model)
    transcription = replace(
        options,
        language=language,
        beam_size=beam_size,
        task="translate" if task == "translate" else "transcribe",
        initial_prompt=prompt,
    )
    turn_detection, eagerness = _turn_options(values, base)
    return replace(base, model=model, transcription=transcription, turn_detection=turn_detection, eagerness=eagerness)


def turn_payload(event: TurnDecided) -> dict[str, object]:
    """A turn decision as the WebSocket and WebRTC faces send it (``type: "turn"``; ``text_probability``
    only when the text model scored the pause)."""
    payload: dict[str, object] = {
        "complete": event.complete,
        "by": event.by,
        "probability": None if event.probability is None else round(event.probability, 3),
        "decision_ms": round(event.decision_ms, 1),
        "silence_ms": event.silence_ms,
        "audio_end_ms": event.audio_end_ms,
    }
    if event.text_probability is not None:
        payload["text_probability"] = round(event.text_probability, 4)
    return payload


_TURN_DETECTION: dict[str, Literal["silence", "semantic"]] = {
    "silence": "silence",
    "server_vad": "silence",
    "semantic": "semantic",
    "semantic_vad": "semantic",
}
_EAGERNESS: tuple[Literal["low", "medium", "high", "auto"], ...] = ("low", "medium", "high", "auto")


def _turn_options(
    values: Mapping[str, object], base: StreamOptions
) -> tuple[Literal["silence", "semantic"] | None, Literal["low", "medium", "high", "auto"] | None]:
    """``turn_detection`` (``silence``/``server_vad`` or ``semantic``/``semantic_vad``: how a hands-free
    utterance ends) and ``eagerness`` (``low``, ``medium``, ``high``, ``auto``) of a session."""
    turn_detection, eagerness = base.turn_detection, base.eagerness
    raw = values.get("turn_detection")
    if raw is not None and str(raw).strip() != "":
        if str(raw) not in _TURN_DETECTION:
            raise InvalidParameter(
                f"turn_detection must be 'silence' or 'semantic', got {raw!r}", param="turn_detection"
            )
        turn_detection = _TURN_DETECTION[str(raw)]
    raw = values.get("eagerness")
    if raw is not None and str(raw).strip() != "":
        match = next((e for e in _EAGERNESS if e == str(raw)), None)
        if match is None:
            raise InvalidParameter(f"eagerness must be one of low, medium, high, auto, got {raw!r}", param="eagerness")
        eagerness = match
    return turn_detection, eagerness


def speaker_payload(event: FinalTranscript) -> dict[str, Any] | None:
    """A final's ``speaker`` on the streaming faces: ``{"name", "score"}`` (name null: no enrolled
    speaker matched; score null: too little speech to tell), or null when nobody is enrolled."""
    match = event.speaker
    return None if match is None else {"name": match.name, "score": match.score}
