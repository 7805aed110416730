"""The rest of the REST surface over real sockets: WIS /api/asr file uploads in real codecs, long
audio, silence and noise, the service endpoints (ping, health, metrics, OpenAPI, docs), error pages
and concurrent OpenAI requests."""

from __future__ import annotations

import asyncio
import io
import re
import wave
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families

from mediaserver.state import SETTINGS
from mediaserver.transport.wyoming.server import WYOMING_PORT
from tests.conftest import SENTENCES, encode_with_pyav, long_clip, noise


def _form(field: str, filename: str, data: bytes, **values: str) -> aiohttp.FormData:
    form = aiohttp.FormData(default_to_multipart=True)
    for name, value in values.items():
        form.add_field(name, value)
    form.add_field(field, data, filename=filename, content_type="application/octet-stream")
    return form


async def _post_asr(url: str, filename: str, data: bytes, query: str = "") -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/api/asr{query}", data=_form("audio_file", filename, data)) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def _post_openai(url: str, filename: str, data: bytes, **values: str) -> tuple[int, Any]:
    form = _form("file", filename, data, model=values.pop("model", "whisper-1"), **values)
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/audio/transcriptions", data=form) as resp:
        return resp.status, await resp.json(content_type=None)


def _wav16(audio: np.ndarray, rate_hz: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate_hz)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


# --- /api/asr with real files ----------------------------------------------------------------------

FORMATS = [
    ("flac", "flac", "flac"),
    ("mp3", "mp3", "mp3"),
    ("ogg", "libopus", "opus"),
    ("webm", "libopus", "webm"),
    ("mp4", "aac", "m4a"),
    ("wav", None, "wav"),
]


@pytest.mark.parametrize(("container", "codec", "extension"), FORMATS, ids=[f[2] for f in FORMATS])
async def test_asr_file_upload_in_real_codecs(
    server: Any, speech: Any, wer: Any, container: str, codec: str | None, extension: str
) -> None:
    key = "kitchen" if extension in ("flac", "ogg", "m4a") else "weather"
    clip = speech(key)
    data = clip.wav_bytes() if codec is None else encode_with_pyav(clip, container, codec)
    status, result = await _post_asr(server.url, f"speech.{extension}", data)
    assert status == 200, result
    assert {"infer_time", "infer_speedup", "audio_duration", "language", "text"} <= set(result)
    assert isinstance(result["infer_time"], float) and result["infer_time"] > 0
    # WIS's definition, which holds however slow the machine: audio ms over inference ms, floored.
    assert isinstance(result["infer_speedup"], int)
    # (The fields are rounded, so the floor may differ by one from what they give back.)
    ratio = result["audio_duration"] / result["infer_time"]
    assert ratio - 1.01 < result["infer_speedup"] <= ratio + 0.01, result
    clip_ms = len(clip.pcm22k) / clip.rate_hz * 1000
    assert abs(result["audio_duration"] - clip_ms) <= 120, (result["audio_duration"], clip_ms)
    assert result["language"] == "en"
    assert wer(SENTENCES[key], result["text"]) <= 0.2, result["text"]


async def test_asr_without_audio_file_field(server: Any) -> None:
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("language", "en")
    async with aiohttp.ClientSession() as session, session.post(f"{server.url}/api/asr", data=form) as resp:
        assert resp.status == 400
        assert resp.content_type == "application/json"
        body = await resp.json()
    assert isinstance(body["error"], str) and "audio_file" in body["error"]


@pytest.mark.parametrize(
    ("path", "wrong_field", "expected_field"),
    [("/api/asr", "file", "audio_file"), ("/v1/audio/transcriptions", "audio_file", "file")],
)
async def test_audio_under_the_wrong_field_name_names_the_right_field(
    server: Any, speech: Any, path: str, wrong_field: str, expected_field: str
) -> None:
    form = _form(wrong_field, "speech.wav", speech("kitchen").wav_bytes(), model="whisper-1")
    async with aiohttp.ClientSession() as session, session.post(f"{server.url}{path}", data=form) as resp:
        assert resp.status == 400
        body = await resp.json()
    message = body["error"] if isinstance(body["error"], str) else body["error"]["message"]
    assert f"'{expected_field}'" in message and "required" in message, message


async def test_asr_garbage_file(server: Any) -> None:
    status, body = await _post_asr(server.url, "speech.mp3", b"\xffnot really audio" * 200)
    assert status == 400
    assert isinstance(body["error"], str) and "Invalid audio" in body["error"]


async def test_asr_bad_force_language(server: Any, speech: Any) -> None:
    status, body = await _post_asr(server.url, "speech.wav", speech("kitchen").wav_bytes(), "?force_language=zz")
    assert status == 400
    assert "force_language" in body["error"] and "zz" in body["error"]


# --- long audio ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_audio() -> Any:
    clip = long_clip()
    assert len(clip.pcm22k) / clip.rate_hz > 30.0
    return clip


@pytest.mark.slow
async def test_long_audio_through_wis(server: Any, long_audio: Any, wer: Any) -> None:
    status, result = await _post_asr(server.url, "long.wav", long_audio.wav_bytes())
    assert status == 200, result
    assert result["audio_duration"] > 30000
    assert wer(long_audio.text, result["text"]) <= 0.2, result["text"]
    tail = _words(result["text"])[-12:]
    for word in ("tomatoes", "beans", "garden"):  # the last sentence, after the 30 s window
        assert word in tail, tail


@pytest.mark.slow
async def test_long_audio_verbose_segments_go_past_30s(server: Any, long_audio: Any, wer: Any) -> None:
    duration = len(long_audio.pcm22k) / long_audio.rate_hz
    status, result = await _post_openai(server.url, "long.wav", long_audio.wav_bytes(), response_format="verbose_json")
    assert status == 200, result
    segments = result["segments"]
    assert segments
    starts = [s["start"] for s in segments]
    assert starts == sorted(starts)
    assert 30.0 < segments[-1]["end"] <= duration + 0.1, (segments[-1], duration)
    assert wer(long_audio.text, result["text"]) <= 0.2, result["text"]


# --- silence and noise -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["silence", "noise"])
async def test_silence_and_noise_give_empty_text(server: Any, kind: str) -> None:
    audio = np.zeros(16000 * 4, np.float32) if kind == "silence" else noise(4.0, 0.1)
    data = _wav16(audio)
    status, result = await _post_asr(server.url, f"{kind}.wav", data)
    assert status == 200, result
    assert result["text"] == ""
    assert result["audio_duration"] == 4000
    status, result = await _post_openai(server.url, f"{kind}.wav", data)
    assert status == 200, result
    assert result["text"] == ""


# --- service endpoints -----------------------------------------------------------------------------


async def test_ping(server: Any) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/ping") as resp:
        assert resp.status == 200
        assert await resp.json() == {"message": "pong"}


async def test_health(server: Any) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/health") as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body["status"] == "ok"
    assert "tiny.en" in body["models_loaded"]
    assert "tiny.en" in body["models_available"]
    assert body["model_aliases"]["whisper-1"] == "tiny.en"  # the names OpenAI clients send
    assert body["features"]["asr"]["enabled"] is True
    assert "CPU" in body["features"]["asr"]["reason"]
    # Where the Wyoming face listens: the port it took (0 asked for any).
    host = server.app[SETTINGS].wyoming_bind_host()
    wyoming = {"enabled": True, "host": host, "port": server.app[WYOMING_PORT]}
    limit = server.app[SETTINGS].wyoming_max_connections
    assert body["wyoming"] == {**wyoming, "connections": {"open": 0, "max": limit}}, body["wyoming"]
    # Semantic turns for the voice loop, silence detection for transcription (turn_detection auto):
    # make setup fetched the turn model, and the text's second opinion (turn_text_model auto) runs
    # on the bundled SmolLM2's engine.
    assert body["turns"] == {
        "default": "auto",
        "default_in_force": "auto",
        "default_for": {"voice_loop": "semantic", "transcription": "silence"},
        "model_loaded": True,
        "in_memory": True,
        "model_path": body["turns"]["model_path"],
        "text_model": "auto",
        "text_model_in_force": "llm",
    }
    assert body["turns"]["model_path"].endswith(".onnx")


async def test_metrics_after_requests(server: Any, speech: Any) -> None:
    status, _ = await _post_asr(server.url, "speech.wav", speech("kitchen").wav_bytes())
    assert status == 200
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/api/ping") as resp:
            assert resp.status == 200
        async with session.get(f"{server.url}/metrics") as resp:
            assert resp.status == 200
            assert resp.content_type == "text/plain"
            text = await resp.text()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    names = {name for name, _ in samples}
    assert "mediaserver_requests_total" in names
    assert samples[("mediaserver_requests_total", (("route", "/api/asr"), ("status", "200")))] >= 1
    assert samples[("mediaserver_requests_total", (("route", "/api/ping"), ("status", "200")))] >= 1
    assert samples[("mediaserver_audio_seconds_total", (("route", "asr"),))] > 0
    assert "mediaserver_inference_seconds_count" in names
    assert any(name == "mediaserver_inference_seconds_count" and value > 0 for (name, _), value in samples.items())
    assert "mediaserver_asr_queue_depth" in names
    windows = samples[("mediaserver_asr_windows_total", (("kind", "windows"), ("model", "tiny.en")))]
    assert windows >= 1  # the utterance above went through the engine's batched path
    alone = samples[("mediaserver_asr_jobs_total", (("model", "tiny.en"), ("packing", "alone")))]
    assert alone >= 1  # a lone request is never packed with others
    assert ("mediaserver_asr_jobs_total", (("model", "tiny.en"), ("packing", "packed"))) in samples


async def test_openapi_spec_is_valid(server: Any) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/openapi.json") as resp:
        assert resp.status == 200
        spec = await resp.json()
    validate(spec)
    for path in ("/api/willow", "/api/asr", "/v1/audio/transcriptions"):
        assert path in spec["paths"], path
    assert "post" in spec["paths"]["/api/asr"]


async def test_docs_page_is_html(server: Any) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/docs") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/html"
        html = await resp.text()
    assert html.lstrip().lower().startswith("<!doctype html")
    assert "/api/openapi.json" in html


async def test_static_dir_serves_its_files_and_its_rtc_page(server_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "rtc").mkdir()
    (tmp_path / "hello.txt").write_text("hello from the operator's static_dir")
    (tmp_path / "rtc" / "index.html").write_text("<!doctype html><title>my rtc page</title>")
    own = await server_factory(static_dir=tmp_path)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{own.url}/static/hello.txt") as resp:
            assert resp.status == 200
            assert await resp.text() == "hello from the operator's static_dir"
        async with session.get(f"{own.url}/rtc") as resp:
            assert resp.status == 200
            assert "my rtc page" in await resp.text()  # not the bundled static/rtc page


async def test_unknown_path_is_404_json(server: Any) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/nothing-here") as resp:
        assert resp.status == 404
        assert resp.content_type == "application/json"
        body = await resp.json()
    assert isinstance(body["error"], str) and body["code"] == "not_found"
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/v1/nothing-here") as resp:
        assert resp.status == 404
        body = await resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}  # OpenAI error shape under /v1
    assert body["error"]["code"] == "not_found"


async def test_get_on_willow_is_405_json(server: Any) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/willow") as resp:
        assert resp.status == 405
        assert resp.content_type == "application/json"
        assert "POST" in resp.headers.get("Allow", "")
        body = await resp.json()
    assert isinstance(body["error"], str) and body["code"] == "method_not_allowed"


# --- concurrency -----------------------------------------------------------------------------------

CONCURRENT_TEXTS = [
    *SENTENCES.values(),
    "The train to Boston leaves from platform seven at noon.",
    "Please order two pizzas with mushrooms and extra cheese.",
]


@pytest.mark.slow
async def test_concurrent_requests_get_their_own_transcripts(server: Any, speech: Any, wer: Any) -> None:
    assert len(CONCURRENT_TEXTS) == 8
    uploads = [speech(text).wav_bytes() for text in CONCURRENT_TEXTS]
    results = await asyncio.gather(
        *(_post_openai(server.url, f"speech{i}.wav", data) for i, data in enumerate(uploads))
    )
    for text, (status, body) in zip(CONCURRENT_TEXTS, results, strict=True):
        assert status == 200, body
        assert wer(text, body["text"]) <= 0.2, (text, body["text"])
