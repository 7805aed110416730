"""Speech over HTTP, shared by the WIS (/api/tts, /api/sts) and OpenAI (/v1/audio/speech) routes.

One path for every format: look the request up in the response cache; on a miss, synthesize
sentence by sentence and write each sentence's encoded audio as soon as it exists (chunked
transfer), so a device starts playing while the rest is made. A WAV's header carries its real sizes
when its whole audio is known before the header goes out (one sentence, a cache hit, or every WAV
of the WIS routes, which wait for the whole answer as WIS did); a streamed one (OpenAI's speech
endpoint) carries 0xFFFFFFFF, "read to the end" (``tts/encode.py``). The response starts only once the
first sentence is ready: a failure before that is still a proper error response. A client that
hangs up is noticed while it waits (not only at the next write), and leaving the request drops all
of its unsynthesized sentences at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from mediaserver.errors import ApiError, GatewayTimeout
from mediaserver.state import CAPABILITIES, SETTINGS, TTS
from mediaserver.transport.common import failed_after_headers, sse_error
from mediaserver.tts.cache import cache_key
from mediaserver.tts.encode import UNKNOWN_SIZE, AudioFormat, StreamEncoder, output_rate, with_wav_sizes
from mediaserver.tts.service import Speech, TtsService
from mediaserver.tts.types import SynthesisParams, TtsChunk, VoiceInfo

log = logging.getLogger(__name__)

# How often a request waiting for audio checks whether its client is still there.
DISCONNECT_POLL_S = 0.1


SSE_ERROR_WRITE_S = 5.0  # how long a stream's closing error event may take to go out


class SynthesisTimeout(GatewayTimeout):
    status = 504
    code = "timeout"


class ClientGone(Exception):
    """The HTTP client closed its connection."""


def tts_of(request: web.Request) -> TtsService:
    """The TTS service, or a 503 naming why TTS is off on this server."""
    request.app[CAPABILITIES].require("tts")
    return request.app[TTS]


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    voice: VoiceInfo
    params: SynthesisParams
    fmt: AudioFormat
    sample_rate_hz: int | None = None  # None: the voice's own rate (when the codec takes it)

    @property
    def output_rate_hz(self) -> int:
        return output_rate(self.fmt, self.sample_rate_hz or self.voice.sample_rate_hz)

    def key(self) -> str:
        return cache_key(
            text=self.text,
            voice=self.voice.name,
            speed=self.params.speed,
            speaker=self.params.speaker,
            format=self.fmt.name,
            rate=self.output_rate_hz,
        )


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def next_chunk(speech: Speech, request: web.Request) -> TtsChunk | None:
    """The next sentence's audio (None at the end); ``ClientGone`` if the client hangs up first."""
    task: asyncio.Future[TtsChunk] = asyncio.ensure_future(speech.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                try:
                    return task.result()
                except StopAsyncIteration:
                    return None
            if _gone(request):
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await task


Framer = Callable[[bytes], bytes]


def _sse_delta(data: bytes) -> bytes:
    event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")}
    return f"data: {json.dumps(event)}\n\n".encode()


def sse_done(characters: int) -> bytes:
    """OpenAI's closing event; usage counts input characters (there are no tokens here)."""
    usage = {"input_tokens": characters, "output_tokens": 0, "total_tokens": characters}
    return f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode()


async def _cut_off(
    request: web.Request, response: web.StreamResponse, exc: ApiError, *, sse: bool
) -> web.StreamResponse:
    """Synthesis failed or timed out mid-answer, the 200 already sent: an SSE stream ends with an
    error event (OpenAI's shape, as the other streams); an audio stream can only be cut short, the
    connection closed (its chunked encoding left unfinished, which tells the client)."""
    failed_after_headers(request, exc)  # (logged once, by the metrics middleware)
    if sse:
        # Bounded: a client that stopped reading must not hold the handler past the deadline.
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(SSE_ERROR_WRITE_S):
                await response.write(sse_error(request, exc))
                await response.write_eof()
                return response
    if request.transport is not None:
        request.transport.close()
    return response


async def respond_with_speech(
    request: web.Request,
    spoken: SpeechRequest,
    *,
    cache: bool = True,
    nocache: bool = False,
    cache_header: str | None = None,
    sse: bool = False,
    whole_wav: bool = False,
    headers: dict[str, str] | None = None,
    started_at: float | None = None,
) -> web.StreamResponse:
    """Serve ``spoken`` from the cache or synthesize and stream it (see the module docstring).

    ``cache=False`` leaves the cache out entirely (no lookup, nothing counted); ``nocache`` is a
    client's explicit bypass (counted as such). ``sse`` wraps the encoded audio in OpenAI's
    ``speech.audio.delta`` / ``speech.audio.done`` server-sent events. ``whole_wav``: a WAV answer
    is synthesized whole before it starts, so its header always carries the real sizes (the WIS
    routes: WIS answered complete files, and Willow's player is known to read those and zero-size
    headers, not 0xFFFFFFFF ones), unless that takes past ``tts_wis_whole_wav_s`` from
    ``started_at`` (the loop's time the request began; default: now).
    """
    tts = tts_of(request)
    settings = request.app[SETTINGS]
    loop = asyncio.get_running_loop()
    deadline = (started_at if started_at is not None else loop.time()) + settings.tts_wis_whole_wav_s
    headers = dict(headers or {})
    use_cache = cache and not sse and tts.cache.enabled
    key = spoken.key()
    if use_cache and nocache:
        tts.cache.count("bypass")
        status = "BYPASS"
        use_cache = False
    elif use_cache:
        hit = tts.cache.get(key)
        if hit is not None:
            body, content_type = hit
            if cache_header:
                headers.update({cache_header: "HIT", "Cache-Control": "public"})
            return web.Response(body=body, content_type=content_type, headers=headers)
        status = "MISS"
    else:
        status = "BYPASS"
    if cache_header:
        headers[cache_header] = status
        if status == "MISS":
            headers["Cache-Control"] = "public"
    frame: Framer = _sse_delta if sse else (lambda data: data)
    rate = spoken.output_rate_hz
    response: web.StreamResponse | None = None
    pending: asyncio.Future[TtsChunk | None] | None = None  # a sentence asked for past the whole WAV's wait
    try:
        async with (
            asyncio.timeout(settings.tts_request_timeout_s),
            tts.speak(spoken.text, spoken.voice, spoken.params, sample_rate_hz=rate) as speech,
        ):
            chunk = await next_chunk(speech, request)
            ready: list[TtsChunk] = []
            total_bytes: int | None = None
            unknown_size = UNKNOWN_SIZE
            if spoken.fmt.name == "wav" and not sse and (whole_wav or len(speech.sentences) <= 1):
                # One sentence (it is all here now), or a whole answer asked for: the WAV header
                # carries the real sizes. A whole answer waits until tts_wis_whole_wav_s after the
                # request began: a long one then streams on with XTTS's zero-size header, even
                # mid-sentence (a trial's 4000 characters took 8-14 s to their headers, past a Willow
                # device's 10 s timeout).
                bounded = whole_wav and len(speech.sentences) > 1
                while chunk is not None:
                    ready.append(chunk)
                    if not bounded:
                        chunk = await next_chunk(speech, request)
                        continue
                    pending = asyncio.ensure_future(next_chunk(speech, request))
                    done, _ = await asyncio.wait({pending}, timeout=max(0.0, deadline - loop.time()))
                    if not done:  # (the sentence under way goes out as it comes)
                        unknown_size, chunk = 0, None
                        break
                    chunk, pending = pending.result(), None
                if unknown_size == UNKNOWN_SIZE:
                    total_bytes = sum(len(part.pcm) for part in ready)
            encoder = StreamEncoder(spoken.fmt, rate, total_bytes=total_bytes, unknown_size=unknown_size)
            response = web.StreamResponse(headers=headers)
            response.content_type = "text/event-stream" if sse else spoken.fmt.content_type
            await response.prepare(request)
            parts: list[bytes] = []
            try:
                for part in ready:
                    data = encoder.push(part.pcm)
                    if data:
                        await response.write(frame(data))
                        parts.append(data)
                if pending is not None:
                    chunk, pending = await pending, None
                while chunk is not None:
                    data = encoder.push(chunk.pcm)
                    if data:
                        await response.write(frame(data))
                        parts.append(data)
                    chunk = await next_chunk(speech, request)
                tail = encoder.finish()
                if tail:
                    await response.write(frame(tail))
                    parts.append(tail)
                if sse:
                    await response.write(sse_done(len(spoken.text)))
            finally:
                encoder.close()
            await response.write_eof()
    except (ClientGone, ConnectionResetError):
        log.debug("TTS client %s went away; its remaining sentences were dropped", request.remote)
        return response or web.Response(status=499)
    except TimeoutError:
        timeout = SynthesisTimeout(
            f"speech synthesis did not finish within {settings.tts_request_timeout_s:.0f} s "
            "(tts_request_timeout_s); retry later"
        )
        if response is None:
            raise timeout from None
        return await _cut_off(request, response, timeout, sse=sse)
    except ApiError as exc:
        if response is None:
            raise
        return await _cut_off(request, response, exc, sse=sse)
    finally:
        if pending is not None:  # (the answer ended before it was taken: nobody waits for it)
            pending.cancel()
            pending.add_done_callback(lambda done: done.cancelled() or done.exception())
    if use_cache:
        body = b"".join(parts)
        # A hit is known whole before it is sent: its WAV header carries the real sizes.
        tts.cache.put(key, with_wav_sizes(body) if spoken.fmt.name == "wav" else body, spoken.fmt.content_type)
    return response
