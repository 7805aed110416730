"""POST /api/willow as a Willow device sends it: raw HTTP/1.1, hand-written chunk framing, no
Content-Length, 2048-byte buffers paced in real time, a new connection per utterance."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from mediaserver.state import ASR
from tests.conftest import FIXTURES, SENTENCES, noise

CHUNK_BYTES = 2048  # the device recorder's buffer: 64 ms of 16 kHz 16-bit mono


async def device_post(
    host: str,
    port: int,
    path: str,
    body: bytes,
    *,
    headers: dict[str, str] | None = None,
    seconds_of_audio: float | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[int, dict[str, str], bytes]:
    """Send like ESP-ADF http_stream: chunked framing written by hand, paced if a duration is given."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        lines = [
            f"POST {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "User-Agent: Willow/0.1",
            "Transfer-Encoding: chunked",
        ]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        pace_s = seconds_of_audio * chunk_bytes / len(body) if seconds_of_audio and body else 0.0
        started = time.monotonic()
        for index, offset in enumerate(range(0, len(body), chunk_bytes)):
            chunk = body[offset : offset + chunk_bytes]
            writer.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            await writer.drain()
            if pace_s:
                await asyncio.sleep(max(0.0, started + (index + 1) * pace_s - time.monotonic()))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return await read_response(reader)
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=60)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += data[:-2]
    else:
        body = await reader.read()
    return status, headers, body


def streaming_wav(pcm16k: bytes) -> bytes:
    """A WAV as ESP-ADF's wav_encoder streams it: the header is written before the length is known."""
    header = struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 0, b"WAVE", b"fmt ", 16, 1, 1, 16000, 32000, 2, 16, b"data", 0)
    return header + pcm16k


PCM_HEADERS = {"x-audio-sample-rate": "16000", "x-audio-bits": "16", "x-audio-channel": "1", "x-audio-codec": "pcm"}


@pytest.mark.parametrize("codec", ["pcm", "wav", "amrwb"])
async def test_device_upload_paced_in_real_time(server: Any, speech: Any, wer: Any, codec: str) -> None:
    clip = speech("kitchen")
    duration_s = len(clip.audio16k) / 16000
    if codec == "pcm":
        body = clip.pcm16k_bytes
    elif codec == "wav":
        body = streaming_wav(clip.pcm16k_bytes)
    else:
        body = (FIXTURES / "kitchen_lights.amr").read_bytes()
    headers = dict(PCM_HEADERS, **{"x-audio-codec": codec})
    status, resp_headers, raw = await device_post(
        server.host, server.port, "/api/willow", body, headers=headers, seconds_of_audio=duration_s
    )
    assert status == 200, raw
    assert resp_headers["content-type"].startswith("application/json")
    assert len(raw) < 2048  # the device reads at most 2048 bytes
    result = json.loads(raw)
    assert set(result) == {"language", "text"}
    assert result["language"] == "en"
    assert wer(SENTENCES["kitchen"], result["text"]) <= 0.15, result["text"]


async def test_missing_audio_headers_default_to_16k_pcm(server: Any, speech: Any, wer: Any) -> None:
    clip = speech("weather")
    status, _, raw = await device_post(server.host, server.port, "/api/willow", clip.pcm16k_bytes)
    assert status == 200, raw
    assert wer(SENTENCES["weather"], json.loads(raw)["text"]) <= 0.15


async def test_pcm_at_other_rates_and_channels(server: Any, speech: Any, wer: Any) -> None:
    clip = speech("remind")
    stereo = np.repeat(clip.pcm22k.reshape(-1, 1), 2, axis=1).astype("<i2").tobytes()
    headers = {"x-audio-sample-rate": "22050", "x-audio-bits": "16", "x-audio-channel": "2", "x-audio-codec": "pcm"}
    status, _, raw = await device_post(server.host, server.port, "/api/willow", stereo, headers=headers)
    assert status == 200, raw
    assert wer(SENTENCES["remind"], json.loads(raw)["text"]) <= 0.15


async def test_stats_fields(server: Any, speech: Any) -> None:
    clip = speech("kitchen")
    status, _, raw = await device_post(server.host, server.port, "/api/willow?stats=true", clip.pcm16k_bytes)
    assert status == 200
    result = json.loads(raw)
    assert isinstance(result["infer_time"], float) and result["infer_time"] > 0
    assert isinstance(result["infer_speedup"], int)
    assert result["audio_duration"] == round(len(clip.audio16k) / 16)
    assert result["infer_speedup"] == int(result["audio_duration"] // result["infer_time"])


async def test_translate_returns_english_translation(server: Any, speech: Any, wer: Any) -> None:
    clip = speech("music")
    status, _, raw = await device_post(server.host, server.port, "/api/willow?translate=true", clip.pcm16k_bytes)
    assert status == 200, raw
    result = json.loads(raw)
    assert wer(SENTENCES["music"], result["text"]) <= 0.2
    assert wer(SENTENCES["music"], result["translation"]) <= 0.3


async def test_detect_language_with_multilingual_model(server: Any, speech: Any, wer: Any) -> None:
    clip = speech("story")
    status, _, raw = await device_post(
        server.host, server.port, "/api/willow?model=base&detect_language=true", clip.pcm16k_bytes
    )
    assert status == 200, raw
    result = json.loads(raw)
    assert result["language"] == "en"
    assert wer(SENTENCES["story"], result["text"]) <= 0.2


async def test_wis_size_names_resolve_to_an_installed_model(server: Any, speech: Any, wer: Any) -> None:
    clip = speech("garden")
    for size in ("tiny", "medium", "large"):
        status, _, raw = await device_post(server.host, server.port, f"/api/willow?model={size}", clip.pcm16k_bytes)
        assert status == 200, (size, raw)
        assert wer(SENTENCES["garden"], json.loads(raw)["text"]) <= 0.2


async def test_force_language_overrides_detection(server: Any, speech: Any) -> None:
    clip = speech("kitchen")
    status, _, raw = await device_post(
        server.host, server.port, "/api/willow?model=base&force_language=en&detect_language=true", clip.pcm16k_bytes
    )
    assert status == 200
    assert json.loads(raw)["language"] == "en"


@pytest.mark.parametrize("kind", ["silence", "noise", "quiet-noise"])
async def test_silence_and_noise_give_no_words(server: Any, kind: str) -> None:
    if kind == "silence":
        audio = np.zeros(16000 * 4, np.float32)
    elif kind == "noise":
        audio = noise(4.0, 0.1)
    else:
        audio = noise(4.0, 0.01, seed=3)
    body = (audio * 32767).astype("<i2").tobytes()
    status, _, raw = await device_post(server.host, server.port, "/api/willow", body)
    assert status == 200, raw
    assert json.loads(raw)["text"] == ""


async def test_save_audio_serves_the_decoded_wav(server: Any, speech: Any) -> None:
    clip = speech("kitchen")
    status, _, _ = await device_post(server.host, server.port, "/api/willow?save_audio=true", clip.pcm16k_bytes)
    assert status == 200
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/audio/willow.wav") as resp:
        assert resp.status == 200
        data = await resp.read()
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    assert abs((len(data) - 44) // 2 - len(clip.audio16k)) <= 1


async def test_allow_save_audio_off_refuses_save_audio(server_factory: Any, speech: Any, tmp_path: Path) -> None:
    private = await server_factory(allow_save_audio=False, save_audio_dir=tmp_path)
    path = "/api/willow?save_audio=true"
    status, _, raw = await device_post(private.host, private.port, path, speech("kitchen").pcm16k_bytes)
    assert status == 400, raw
    assert "save_audio" in json.loads(raw)["error"]
    assert not (tmp_path / "willow.wav").exists()


async def test_voice_auth_without_speaker_model_is_refused(server: Any, speech: Any) -> None:
    clip = speech("kitchen")
    status, headers, raw = await device_post(server.host, server.port, "/api/willow?voice_auth=true", clip.pcm16k_bytes)
    assert status == 406
    assert headers["content-type"].startswith("text/plain")
    assert raw == b"Unauthorized voice"


async def test_unknown_query_parameters_are_ignored(server: Any, speech: Any) -> None:
    clip = speech("kitchen")
    status, _, _ = await device_post(
        server.host,
        server.port,
        "/api/willow?task=transcribe&output=json&speaker=CLB&return_language=1",
        clip.pcm16k_bytes,
    )
    assert status == 200


@pytest.mark.parametrize(
    ("query", "headers", "body", "expected_status", "message_part"),
    [
        ("", PCM_HEADERS, b"", 400, "empty body"),
        ("", dict(PCM_HEADERS, **{"x-audio-codec": "wav"}), b"RIFF\x00\x00\x00\x00WAVEfmt ", 400, "WAV header"),
        ("", dict(PCM_HEADERS, **{"x-audio-codec": "wav"}), b"garbage bytes" * 100, 400, "not a RIFF/WAVE"),
        ("", dict(PCM_HEADERS, **{"x-audio-codec": "amrwb"}), b"\x00\x01garbage" * 100, 400, "Invalid audio"),
        ("", dict(PCM_HEADERS, **{"x-audio-bits": "abc"}), b"\x00" * 3200, 400, "x-audio-bits"),
        ("", dict(PCM_HEADERS, **{"x-audio-sample-rate": "0"}), b"\x00" * 3200, 400, "sample rate"),
        ("", dict(PCM_HEADERS, **{"x-audio-bits": "12"}), b"\x00" * 3200, 400, "sample width"),
        ("", dict(PCM_HEADERS, **{"x-audio-channel": "0"}), b"\x00" * 3200, 400, "channel"),
        ("", PCM_HEADERS, b"\x00", 400, "no complete audio sample"),
        ("?model=large-v9", PCM_HEADERS, b"\x00" * 3200, 400, "available models"),
        ("?force_language=xx", PCM_HEADERS, b"\x00" * 3200, 400, "Invalid force_language"),
        ("?beam_size=0", PCM_HEADERS, b"\x00" * 3200, 400, "beam_size"),
        ("?beam_size=many", PCM_HEADERS, b"\x00" * 3200, 400, "beam_size"),
        ("?stats=maybe", PCM_HEADERS, b"\x00" * 3200, 400, "stats"),
        ("?model=tiny.en&force_language=de", PCM_HEADERS, b"\x00" * 32000, 400, "English-only"),
    ],
)
async def test_bad_input_is_a_clear_4xx(
    server: Any, query: str, headers: dict[str, str], body: bytes, expected_status: int, message_part: str
) -> None:
    status, resp_headers, raw = await device_post(
        server.host, server.port, f"/api/willow{query}", body, headers=headers
    )
    assert status == expected_status, raw
    assert resp_headers["content-type"].startswith("application/json")
    assert message_part in json.loads(raw)["error"]


async def test_huge_chunked_upload_is_413(server_factory: Any) -> None:
    small = await server_factory(max_upload_bytes=64 * 1024)
    body = b"\x00\x01" * (80 * 1024)
    status, _, raw = await device_post(small.host, small.port, "/api/willow", body)
    assert status == 413
    assert "limit" in json.loads(raw)["error"]


async def test_audio_longer_than_the_cap_is_413(server_factory: Any) -> None:
    short = await server_factory(max_audio_duration_s=2.0)
    body = b"\x00\x00" * 16000 * 3
    status, _, raw = await device_post(short.host, short.port, "/api/willow", body)
    assert status == 413
    assert "limit is 2 s" in json.loads(raw)["error"]


async def test_stalled_upload_times_out_with_408(server_factory: Any) -> None:
    impatient = await server_factory(body_read_timeout_s=0.5)
    reader, writer = await asyncio.open_connection(impatient.host, impatient.port)
    writer.write(b"POST /api/willow HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n")
    await writer.drain()
    status, _, raw = await read_response(reader)
    writer.close()
    assert status == 408
    assert "stalled" in json.loads(raw)["error"]


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/api/asr"])
async def test_a_multipart_upload_that_stalls_mid_body_times_out_with_408(server_factory: Any, path: str) -> None:
    """A form upload (the OpenAI SDK's, WIS's) that stops mid-body gets its 408 after
    body_read_timeout_s too (a fault trial: no answer at all, the request held open for as long as
    the client waited), as the JSON error its face answers with."""
    impatient = await server_factory(body_read_timeout_s=0.5)
    reader, writer = await asyncio.open_connection(impatient.host, impatient.port)
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\nRIFF"
    ).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: 1000000\r\n\r\n".encode()
        + head
    )
    await writer.drain()
    async with asyncio.timeout(30):
        status, _, raw = await read_response(reader)
    writer.close()
    assert status == 408, raw
    assert "stalled" in raw.decode(), raw


async def test_basic_auth_through_user_pass_url(server_factory: Any, speech: Any) -> None:
    guarded = await server_factory(basic_auth_user="willow", basic_auth_password="s3cret!")
    clip = speech("kitchen")
    status, headers, _ = await device_post(guarded.host, guarded.port, "/api/willow", clip.pcm16k_bytes)
    assert status == 401
    assert headers["www-authenticate"].startswith("Basic")
    wrong = base64.b64encode(b"willow:nope").decode()
    status, _, _ = await device_post(
        guarded.host, guarded.port, "/api/willow", clip.pcm16k_bytes, headers={"Authorization": f"Basic {wrong}"}
    )
    assert status == 401
    good = base64.b64encode(b"willow:s3cret!").decode()
    status, _, raw = await device_post(
        guarded.host, guarded.port, "/api/willow", clip.pcm16k_bytes, headers={"Authorization": f"Basic {good}"}
    )
    assert status == 200, raw
    async with aiohttp.ClientSession() as session:
        for path, expected in (("/health", 200), ("/rtc/", 200), ("/api/rtc/config", 401), ("/v1/models", 401)):
            async with session.get(f"{guarded.url}{path}") as resp:
                assert resp.status == expected, path  # probes and static pages open, APIs guarded


async def test_concurrent_devices_are_all_served_and_the_loop_stays_free(server: Any, speech: Any, wer: Any) -> None:
    keys = ["kitchen", "weather", "remind", "music", "story", "garden"]
    uploads = [
        asyncio.ensure_future(device_post(server.host, server.port, "/api/willow", speech(k).pcm16k_bytes))
        for k in keys
    ]
    # While six transcriptions are queued or running, the event loop still answers at once.
    async with asyncio.timeout(30):
        while server.app[ASR].open_jobs() == 0:  # the uploads have reached the ASR queue
            await asyncio.sleep(0.01)
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/ping") as resp:
        assert (await resp.json()) == {"message": "pong"}
    pending_when_pinged = sum(not u.done() for u in uploads)
    results = await asyncio.gather(*uploads)
    assert pending_when_pinged >= 1
    for key, (status, _, raw) in zip(keys, results, strict=True):
        assert status == 200
        assert wer(SENTENCES[key], json.loads(raw)["text"]) <= 0.2, (key, raw)


def test_fixture_is_amr_wb() -> None:
    assert Path(FIXTURES / "kitchen_lights.amr").read_bytes()[:9] == b"#!AMR-WB\n"
