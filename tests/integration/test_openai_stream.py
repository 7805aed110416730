"""``stream=true`` on ``/v1/audio/transcriptions`` through the official ``openai`` SDK.

The SDK's ``transcriptions.create(..., stream=True)`` iterates the server's events unchanged: the
``transcript.text.delta`` pieces concatenate to the ``transcript.text.done`` text, which is the
non-streamed text of the same audio, for every model name (``whisper-1`` too). Bad combinations are
400s in OpenAI's shape, and a client that hangs up mid-stream leaves no ASR work behind.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent

from mediaserver.asr.guards import normalized_words
from mediaserver.state import ASR
from tests.conftest import SENTENCES, Clip, LiveServer, long_clip, synthesize
from tests.faults import eventually, requests_with_status

CLEANUP_S = 2.0


def _client(server: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


async def _stream(
    server: LiveServer, wav: bytes, model: str, **extra: Any
) -> tuple[list[TranscriptionTextDeltaEvent], TranscriptionTextDoneEvent]:
    deltas: list[TranscriptionTextDeltaEvent] = []
    done: list[TranscriptionTextDoneEvent] = []
    async with _client(server) as client:
        stream = await client.audio.transcriptions.create(model=model, file=("speech.wav", wav), stream=True, **extra)
        async for event in stream:
            assert not done, f"an event after transcript.text.done: {event}"
            if isinstance(event, TranscriptionTextDeltaEvent):
                deltas.append(event)
            else:
                assert isinstance(event, TranscriptionTextDoneEvent), event
                done.append(event)
    assert len(done) == 1, done
    return deltas, done[0]


async def _plain(server: LiveServer, wav: bytes, model: str) -> str:
    async with _client(server) as client:
        result = await client.audio.transcriptions.create(model=model, file=("speech.wav", wav))
    return result.text


@pytest.mark.parametrize("model", ["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "tiny.en"])
async def test_stream_deltas_make_the_non_streamed_text(server: LiveServer, speech: Any, wer: Any, model: str) -> None:
    wav = speech("kitchen").wav_bytes()
    deltas, done = await _stream(server, wav, model)
    assert deltas, "no transcript.text.delta before the done event"
    assert all(d.type == "transcript.text.delta" and d.delta for d in deltas)
    assert "".join(d.delta for d in deltas) == done.text
    assert done.text == await _plain(server, wav, model)
    assert wer(SENTENCES["kitchen"], done.text) <= 0.15, done.text
    assert done.usage is not None and done.usage.type == "tokens"
    assert done.usage.output_tokens > 0 and done.usage.input_tokens > 0
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    assert done.logprobs is None and all(d.logprobs is None for d in deltas)


async def test_stream_of_long_audio_has_a_delta_per_segment(server: LiveServer, wer: Any) -> None:
    clip = long_clip(("kitchen", "weather", "remind", "music"), repeat=2)  # > 30 s: several segments
    wav = clip.wav_bytes()
    deltas, done = await _stream(server, wav, "whisper-1", response_format="text")
    assert len(deltas) >= 2, deltas
    assert "".join(d.delta for d in deltas) == done.text == await _plain(server, wav, "whisper-1")
    assert wer(clip.text, done.text) <= 0.2, done.text


async def test_stream_with_logprobs(server: LiveServer, speech: Any) -> None:
    wav = speech("weather").wav_bytes()
    deltas, done = await _stream(server, wav, "gpt-4o-transcribe", include=["logprobs"])
    assert deltas
    for delta in deltas:
        assert delta.logprobs, delta
        for entry in delta.logprobs:
            assert entry.token and entry.logprob is not None and entry.logprob <= 0.0
            assert entry.bytes == list(entry.token.encode("utf-8"))
    assert done.logprobs is not None
    assert [e.token for e in done.logprobs] == [e.token for d in deltas for e in d.logprobs or []]
    words = "".join(e.token or "" for e in done.logprobs).split()
    assert words == done.text.split(), (words, done.text)


@pytest.mark.parametrize("response_format", ["verbose_json", "srt", "vtt"])
async def test_stream_refuses_other_formats(server: LiveServer, speech: Any, response_format: Any) -> None:
    async with _client(server) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.audio.transcriptions.create(
                model="whisper-1",
                file=("speech.wav", speech("kitchen").wav_bytes()),
                stream=True,
                response_format=response_format,
            )
    assert caught.value.param == "response_format"
    assert response_format in caught.value.body["message"]  # type: ignore[index]


async def test_translations_do_not_stream(server: LiveServer, speech: Any) -> None:
    form = aiohttp.FormData()
    form.add_field("file", speech("kitchen").wav_bytes(), filename="speech.wav", content_type="audio/wav")
    form.add_field("model", "whisper-1")
    form.add_field("stream", "true")
    async with aiohttp.ClientSession() as session, session.post(server.url + "/v1/audio/translations", data=form) as r:
        body = await r.json()
    assert r.status == 400, body
    assert body["error"]["param"] == "stream" and body["error"]["type"] == "invalid_request_error", body


async def test_a_stream_value_that_is_not_a_boolean_is_a_400(server: LiveServer, speech: Any) -> None:
    """A trial's ``stream=maybe`` was taken as false (a 200 JSON answer), where WIS's own booleans
    (detect_language=maybe) are a 400."""
    form = aiohttp.FormData()
    form.add_field("file", speech("kitchen").wav_bytes(), filename="speech.wav", content_type="audio/wav")
    form.add_field("model", "whisper-1")
    form.add_field("stream", "maybe")
    url = server.url + "/v1/audio/transcriptions"
    async with aiohttp.ClientSession() as session, session.post(url, data=form) as r:
        body = await r.json()
    assert r.status == 400 and body["error"]["param"] == "stream", body
    assert "true or false" in body["error"]["message"], body


async def test_stream_unknown_model_is_a_400_before_the_stream(server: LiveServer, speech: Any) -> None:
    async with _client(server) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.audio.transcriptions.create(
                model="large-v9", file=("speech.wav", speech("kitchen").wav_bytes()), stream=True
            )
    assert caught.value.param == "model"


async def test_hang_up_mid_stream_withdraws_the_work(server: LiveServer) -> None:
    """The client reads the stream's headers, then goes: the handler is cancelled and its queued
    decode leaves the ASR queue within CLEANUP_S instead of running for nobody."""
    clip: Clip = long_clip(repeat=2)  # a minute of speech: the decode is still ahead when the client goes
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'.encode(),
        f'--{boundary}\r\nContent-Disposition: form-data; name="stream"\r\n\r\ntrue\r\n'.encode(),
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'.encode()
        + b"Content-Type: audio/wav\r\n\r\n"
        + clip.wav_bytes()
        + b"\r\n",
        f"--{boundary}--\r\n".encode(),
    ]
    body = b"".join(parts)
    before = await requests_with_status(server.url, 499)
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        (
            "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head
    await eventually(lambda: server.app[ASR].open_jobs() > 0, 10, interval_s=0.005)
    writer.transport.abort()
    await eventually(lambda: server.app[ASR].open_jobs() == 0, CLEANUP_S)

    async def counted() -> bool:
        return await requests_with_status(server.url, 499) > before

    for _ in range(int(CLEANUP_S / 0.05)):
        if await counted():
            break
        await asyncio.sleep(0.05)
    assert await counted(), "the hang-up was not counted as 499"


async def test_logprobs_without_stream(server: LiveServer, speech: Any) -> None:
    async with _client(server) as client:
        result = await client.audio.transcriptions.create(
            model="whisper-1", file=("speech.wav", speech("remind").wav_bytes()), include=["logprobs"]
        )
    assert result.logprobs, result
    assert all(e.logprob is not None and e.logprob <= 0.0 for e in result.logprobs)
    assert "".join(e.token or "" for e in result.logprobs).split() == result.text.split()


@pytest.mark.parametrize(("lead_s", "tail_s"), [(0.0, 0.0), (0.2, 0.3), (0.5, 1.0)])
async def test_every_format_and_logprobs_give_the_same_words(
    server: LiveServer, wer: Any, lead_s: float, tail_s: float
) -> None:
    """The same upload gives the same text in json, text and verbose_json, and include[]=logprobs adds
    its logprobs, not words. (A user trial: json said a 2.2 s question twice where verbose_json said
    it once, and logprobs decoded the silence after the last word again: "... lights, please.
    Please.", on this sentence padded 0.2 / 0.3 s.)"""
    clip = synthesize("Turn on the kitchen lights, please.")
    pcm = np.concatenate(
        [
            np.zeros(round(lead_s * clip.rate_hz), np.int16),
            clip.pcm22k,
            np.zeros(round(tail_s * clip.rate_hz), np.int16),
        ]
    )
    wav = Clip(clip.text, pcm).wav_bytes()
    async with _client(server) as client:
        plain = await client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav))
        text = await client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav), response_format="text")
        verbose = await client.audio.transcriptions.create(
            model="whisper-1", file=("a.wav", wav), response_format="verbose_json"
        )
        scored = await client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav), include=["logprobs"])
    assert plain.text == str(text).strip() == verbose.text, (plain.text, text, verbose.text)
    assert normalized_words(scored.text) == normalized_words(plain.text), (scored.text, plain.text)
    assert wer(clip.text, plain.text) <= 0.2, plain.text


async def test_asr_upload_timestamps_false_decodes_json_without_them(
    server: LiveServer, server_factory: Callable[..., Any]
) -> None:
    """A json upload streams a delta per Whisper segment: decoded with timestamps (the default) two
    sentences are two segments; with ``asr_upload_timestamps`` false, json decodes without them (one
    segment for audio under 20 s) while verbose_json still has them."""
    clip = long_clip(("kitchen", "weather"), repeat=1)
    wav = clip.wav_bytes()
    fast = await server_factory(asr_upload_timestamps=False)
    with_timestamps, _ = await _stream(server, wav, "whisper-1")
    without, _ = await _stream(fast, wav, "whisper-1")
    assert len(with_timestamps) >= 2 and len(without) == 1, (with_timestamps, without)
    async with _client(fast) as client:
        verbose = await client.audio.transcriptions.create(
            model="whisper-1", file=("a.wav", wav), response_format="verbose_json"
        )
    assert verbose.segments is not None and len(verbose.segments) >= 2, verbose
