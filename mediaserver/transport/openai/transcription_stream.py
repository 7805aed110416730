"""``stream=true`` on ``/v1/audio/transcriptions``: OpenAI's server-sent transcript events.

The upload is decoded as one job, exactly as without ``stream`` (so the streamed text is the
non-streamed text), and its segments go out in order as ``transcript.text.delta`` events whose
``delta``s concatenate to the final text; one ``transcript.text.done`` (the text, ``usage``) ends
the stream. Every model name streams, ``whisper-1`` included (OpenAI ignores ``stream`` there; a
client that asks to stream gets a stream). ``include[]=logprobs`` adds Whisper's word probabilities
as ``logprobs`` (one entry per word: the word, its UTF-8 bytes, the natural log of its probability).

Headers go out once the audio is decoded and the model is known (errors until then are ordinary
400s); a queue or engine error after that arrives as a final ``data: {"error": ...}`` event, which
the SDKs raise. A client that hangs up cancels the handler, which withdraws its queued job.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from aiohttp import web

from mediaserver.errors import ApiError
from mediaserver.events import Segment, Transcript
from mediaserver.transport.common import sse_error

log = logging.getLogger(__name__)

AUDIO_TOKENS_PER_S = 50  # Whisper's encoder: one frame per 20 ms of audio


def word_logprobs(segments: tuple[Segment, ...] | list[Segment]) -> list[dict[str, Any]]:
    """OpenAI ``logprobs`` entries for the words of ``segments`` (empty without word timings, and
    without the words whose probability the engine did not report: a remote server's)."""
    return [
        {"token": w.word, "logprob": math.log(max(w.probability, 1e-12)), "bytes": list(w.word.encode("utf-8"))}
        for seg in segments
        for w in seg.words
        if w.probability is not None
    ]


def segment_deltas(transcript: Transcript) -> list[tuple[str, Segment]]:
    """Each segment's piece of ``transcript.text``: in order, they concatenate to it exactly.

    The final text is the segments' texts joined and stripped at both ends, so the first piece loses
    its leading space and the last its trailing one; a segment that adds nothing gives no piece.
    """
    full = transcript.text
    pieces: list[tuple[str, Segment]] = []
    emitted = 0
    joined = ""
    for seg in transcript.segments:
        joined += seg.text
        known = min(len(joined.lstrip()), len(full))
        if known > emitted:
            pieces.append((full[emitted:known], seg))
            emitted = known
    if emitted < len(full):  # never happens when text is the stripped join; kept so nothing is lost
        pieces.append((full[emitted:], transcript.segments[-1]))
    return pieces


def usage(transcript: Transcript) -> dict[str, Any]:
    """Token usage as OpenAI's streaming models report it: audio in (encoder frames), text out."""
    audio_tokens = math.ceil(transcript.duration_s * AUDIO_TOKENS_PER_S)
    output_tokens = sum(len(seg.tokens) for seg in transcript.segments)
    return {
        "type": "tokens",
        "input_tokens": audio_tokens,
        "input_token_details": {"audio_tokens": audio_tokens, "text_tokens": 0},
        "output_tokens": output_tokens,
        "total_tokens": audio_tokens + output_tokens,
    }


def event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode("utf-8") + b"\n\n"


async def stream_transcript(request: web.Request, transcribe: Any, *, with_logprobs: bool) -> web.StreamResponse:
    """Answer with SSE: start the response, await ``transcribe()`` (the one decode job), then send
    a delta per segment and the done event."""
    response = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        try:
            transcript: Transcript = await transcribe()
        except ApiError as exc:  # a full queue or a timeout after the stream has started
            await response.write(sse_error(request, exc))
            return response
        for delta, seg in segment_deltas(transcript):
            body: dict[str, Any] = {"type": "transcript.text.delta", "delta": delta}
            if with_logprobs:
                body["logprobs"] = word_logprobs([seg])
            await response.write(event(body))
        done: dict[str, Any] = {"type": "transcript.text.done", "text": transcript.text, "usage": usage(transcript)}
        if with_logprobs:
            done["logprobs"] = word_logprobs(transcript.segments)
        await response.write(event(done))
        await response.write_eof()
    except ConnectionResetError:
        log.info("streamed transcription: the client disconnected mid-stream")
    return response
