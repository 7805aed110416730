"""The ``openai`` ASR backend against a second, real mediaserver process on loopback.

The front server has no local copy of its default model: settings alone (``remote_models``) send
``tiny.en`` to the upstream's ``/v1/audio/transcriptions``. Faults: an upstream that is not there at
start, one stopped mid-load and started again, an error answer, garbage, and one that never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web
from prometheus_client import generate_latest

from mediaserver.asr.guards import normalized_words
from mediaserver.asr.remote import RemoteEngine
from mediaserver.audio.decode import encode_wav
from mediaserver.config import RemoteModel, Settings
from mediaserver.state import ASR
from mediaserver.tts.service import TtsService
from tests.conftest import Clip, LiveServer
from tests.cpu import decodes_like_avx512
from tests.integration.test_ws_stream import check_streamed_partials, connect, pcm16, silence
from tests.ports import free_port
from tests.processes import front_server, mediaserver_process, serving, wait_http_ok
from tests.unit.test_guards import streamed_utterance

KITCHEN = "Turn on the kitchen lights and close the garage door."


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def upstream(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A second mediaserver (``python -m mediaserver``), its base URL."""
    process, url = mediaserver_process(tmp_path_factory.mktemp("upstream"), name="upstream")
    process.start()
    try:
        await wait_http_ok(f"{url}/health", process=process.process)
        yield url
    finally:
        process.stop()


def remote(url: str, **fields: Any) -> RemoteModel:
    values: dict[str, Any] = {
        "backend": "openai",
        "url": f"{url}/v1",
        "model": "tiny.en",
        "multilingual": False,
        "probe_interval_s": 0.5,
        "retries": 1,
        "retry_backoff_ms": 50,
        **fields,
    }
    return RemoteModel(**values)


async def willow(http: aiohttp.ClientSession, server: LiveServer, body: bytes, query: str = "") -> tuple[int, Any]:
    async with http.post(f"{server.url}/api/willow{query}", data=body) as resp:
        return resp.status, await resp.json()


async def health(http: aiohttp.ClientSession, server: LiveServer) -> dict[str, Any]:
    async with http.get(f"{server.url}/health") as resp:
        assert resp.status == 200
        result: dict[str, Any] = await resp.json()
        return result


async def wait_backend(http: aiohttp.ClientSession, server: LiveServer, state: str, timeout_s: float = 15.0) -> None:
    async def poll() -> None:
        while (await health(http, server))["backends"]["tiny.en"]["state"] != state:
            await asyncio.sleep(0.1)

    await asyncio.wait_for(poll(), timeout_s)


async def test_settings_alone_send_the_default_model_to_a_second_mediaserver(
    upstream: str,
    base_settings: Settings,
    tts_service: TtsService,
    speech: Callable[[str], Clip],
    wer: Callable[[str, str], float],
) -> None:
    clip = speech(KITCHEN)
    async with (
        front_server(base_settings, tts_service, remote_models={"tiny.en": remote(upstream)}) as front,
        aiohttp.ClientSession() as http,
    ):
        await wait_backend(http, front, "up")
        status, body = await willow(http, front, clip.pcm16k_bytes)
        assert status == 200 and wer(KITCHEN, body["text"]) <= 0.2, body
        form = aiohttp.FormData()
        form.add_field("file", clip.wav_bytes(), filename="a.wav")
        form.add_field("model", "whisper-1")
        form.add_field("response_format", "verbose_json")
        form.add_field("timestamp_granularities[]", "word")
        async with http.post(f"{front.url}/v1/audio/transcriptions", data=form) as resp:
            verbose = await resp.json()
        assert resp.status == 200 and wer(KITCHEN, verbose["text"]) <= 0.2, verbose
        assert verbose["language"] == "english"
        words = [w["word"] for w in verbose["words"]]
        assert wer(KITCHEN, " ".join(words)) <= 0.2 and all(w["end"] >= w["start"] for w in verbose["words"])
        # Several at once: each a concurrent upstream request, all right.
        results = await asyncio.gather(*(willow(http, front, clip.pcm16k_bytes) for _ in range(6)))
        assert all(s == 200 and wer(KITCHEN, b["text"]) <= 0.2 for s, b in results), results
        info = await health(http, front)
        assert info["status"] == "ok"
        assert info["backends"]["tiny.en"]["backend"] == "openai"
        assert info["backends"]["tiny.en"]["url"] == f"{upstream}/v1"
        assert "tiny.en" in info["models_loaded"]
        async with http.get(f"{front.url}/metrics") as resp:
            metrics = await resp.text()
        assert 'mediaserver_asr_backend_requests_total{backend="openai",model="tiny.en",outcome="ok"} 8.0' in metrics
        assert 'mediaserver_asr_backend_up{backend="openai",model="tiny.en"} 1.0' in metrics


async def test_silence_never_leaves_the_machine(upstream: str, base_settings: Settings) -> None:
    async with (
        front_server(base_settings, remote_models={"tiny.en": remote(upstream)}) as front,
        aiohttp.ClientSession() as http,
    ):
        async with asyncio.timeout(60):  # the step that hangs, if one does (CI once timed out here)
            status, body = await willow(http, front, bytes(32000 * 2))
        assert status == 200 and body["text"] == ""
        async with asyncio.timeout(60), http.get(f"{front.url}/metrics") as resp:
            assert "mediaserver_asr_backend_requests_total{" not in await resp.text()


async def test_a_streaming_session_keeps_its_promises_through_the_backend(
    upstream: str,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    wer: Callable[[str, str], float],
) -> None:
    async with front_server(base_settings, remote_models={"tiny.en": remote(upstream)}) as front:
        await check_streamed_partials(front, speech, wer)


async def test_an_error_answer_is_a_502_naming_the_backend_and_the_next_request_works(
    upstream: str, base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    # Configured as multilingual, but the upstream model is English-only: it refuses German (a 400).
    async with (
        front_server(base_settings, remote_models={"tiny.en": remote(upstream, multilingual=True)}) as front,
        aiohttp.ClientSession() as http,
    ):
        body = speech(KITCHEN).pcm16k_bytes
        status, error = await willow(http, front, body, "?force_language=de")
        assert status == 502 and error["code"] == "backend_unavailable", error
        assert f"openai backend at {upstream}/v1" in error["error"] and "HTTP 400" in error["error"]
        assert "English-only" in error["error"]
        status, ok = await willow(http, front, body)
        assert status == 200 and "kitchen" in ok["text"].lower()


async def test_unreachable_at_start_up_the_server_runs_and_says_so(base_settings: Settings) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with (
        front_server(base_settings, remote_models={"tiny.en": remote(dead, retries=2)}) as front,
        aiohttp.ClientSession() as http,
    ):
        await wait_backend(http, front, "down")
        info = await health(http, front)
        assert info["status"] == "degraded" and "health check failed" in info["backends"]["tiny.en"]["reason"]
        status, error = await willow(http, front, _tone())
        assert status == 502 and error["code"] == "backend_unavailable"
        assert f"the openai backend at {dead}/v1 (model 'tiny.en') is unreachable" in error["error"]
        form = aiohttp.FormData()
        tone = (np.frombuffer(_tone(), "<i2") / 32768).astype(np.float32)
        form.add_field("file", encode_wav(tone), filename="a.wav")
        form.add_field("model", "tiny.en")
        async with http.post(f"{front.url}/v1/audio/transcriptions", data=form) as resp:
            body = await resp.json()
        assert resp.status == 502 and body["error"]["type"] == "server_error"
        assert body["error"]["code"] == "backend_unavailable" and dead in body["error"]["message"]
        async with http.get(f"{front.url}/metrics") as resp:
            text = await resp.text()
        # Two requests, each tried once and retried twice, every attempt refused.
        refused = 'mediaserver_asr_backend_requests_total{backend="openai",model="tiny.en",outcome="unreachable"} 6.0'
        assert refused in text


def _tone() -> bytes:
    """A second of a loud warbling tone: passes the VAD gate, so it goes upstream."""
    t = np.arange(16000) / 16000
    wave = 0.5 * np.sin(2 * np.pi * (300 + 200 * np.sin(2 * np.pi * 3 * t)) * t)
    return bytes((wave * 32767).astype("<i2").tobytes())


def fake_upstream(handler: Callable[[web.Request], Any]) -> contextlib.AbstractAsyncContextManager[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return serving(app)


async def test_garbage_is_a_clear_502_and_the_next_answer_is_used(
    base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    # A fake: no real server can be made to answer garbage on demand.
    answers = iter(["<html>502 Bad Gateway</html>", json.dumps({"txt": "no text field"}), json.dumps({"text": "ok"})])

    async def handler(request: web.Request) -> web.Response:
        if request.path.endswith("/models"):
            return web.json_response({"data": []})
        await request.read()
        return web.Response(text=next(answers), content_type="text/html")

    async with (
        fake_upstream(handler) as url,
        front_server(base_settings, remote_models={"tiny.en": remote(url)}) as front,
        aiohttp.ClientSession() as http,
    ):
        body = speech(KITCHEN).pcm16k_bytes
        status, error = await willow(http, front, body)
        assert status == 502 and "returned an invalid answer: not JSON" in error["error"] and url in error["error"]
        status, error = await willow(http, front, body)
        assert status == 502 and "no 'text'" in error["error"]
        status, ok = await willow(http, front, body)
        assert status == 200 and ok["text"] == "ok"


async def test_a_backend_that_never_answers_is_a_504_and_nothing_stays_behind(
    base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    # A fake: a socket that accepts and never answers (a real server cannot be made to hang on demand).
    closed = asyncio.Event()
    connections: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while await reader.read(65536):
            pass
        closed.set()
        writer.close()

    hang = await asyncio.start_server(swallow, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{hang.sockets[0].getsockname()[1]}"
    try:
        async with (
            front_server(base_settings, remote_models={"tiny.en": remote(url, timeout_s=1.0)}) as front,
            aiohttp.ClientSession() as http,
        ):
            status, error = await willow(http, front, speech(KITCHEN).pcm16k_bytes)
            assert status == 504 and error["code"] == "timeout", error
            assert f"the openai backend at {url}/v1 (model 'tiny.en') did not answer within 1 s" in error["error"]
            # The request deadline (shorter than the backend timeout) cancels the upstream request too.
            async with front_server(
                base_settings,
                asr_request_timeout_s=0.5,
                remote_models={"tiny.en": remote(url, timeout_s=30.0, probe_interval_s=60)},
            ) as short:
                closed.clear()
                status, error = await willow(http, short, speech(KITCHEN).pcm16k_bytes)
                assert status == 504 and "did not finish within 0.5 s" in error["error"]
                await asyncio.wait_for(closed.wait(), 5)  # the upstream connection was dropped
                scheduler = (await short.app[ASR].get_model("tiny.en")).scheduler
                # The batch task ends with the dropped connection; its done callback runs a loop turn later.
                for _ in range(100):
                    if not scheduler._inflight_tasks:
                        break
                    await asyncio.sleep(0.02)
                assert scheduler.depth == 0 and not scheduler._inflight_tasks
    finally:
        for writer in connections:
            writer.close()
        hang.close()
        await hang.wait_closed()


async def test_upstream_lost_mid_load_then_back_and_streams_recover(
    tmp_path: Path,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    wer: Callable[[str, str], float],
) -> None:
    process, url = mediaserver_process(tmp_path, name="upstream-outage")
    process.start()
    clip = speech(KITCHEN)
    try:
        await wait_http_ok(f"{url}/health", process=process.process)
        async with (
            front_server(base_settings, remote_models={"tiny.en": remote(url)}) as front,
            aiohttp.ClientSession() as http,
            connect(front) as ws,
        ):
            await ws.start(mode="server_vad")
            utterance = pcm16(np.concatenate([clip.audio16k, silence(1.0)]))
            await ws.send_audio(utterance, 3200)
            assert wer(KITCHEN, (await ws.until("final", timeout=60))[-1]["text"]) <= 0.2

            statuses: list[tuple[int, Any]] = []
            stop = asyncio.Event()

            async def load() -> None:
                while not stop.is_set():
                    statuses.append(await willow(http, front, clip.pcm16k_bytes))

            workers = [asyncio.create_task(load()) for _ in range(3)]
            while sum(s == 200 for s, _ in statuses) < 3:
                await asyncio.sleep(0.05)
            process.kill()
            while sum(s == 502 for s, _ in statuses) < 3:
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*workers)
            assert {s for s, _ in statuses} <= {200, 502}, statuses
            for status, body in statuses:
                if status == 502:
                    assert body["code"] == "backend_unavailable" and url in body["error"], body
            # The stream lives on: its utterance fails with an error event, not a closed socket.
            await ws.send_audio(utterance, 3200)
            error = (await ws.until("error", timeout=60))[-1]
            assert error["code"] == "backend_unavailable" and "audio_start_ms" in error
            await wait_backend(http, front, "down")

            process.start()
            await wait_http_ok(f"{url}/health", process=process.process)
            status, body = await willow(http, front, clip.pcm16k_bytes)
            assert status == 200 and wer(KITCHEN, body["text"]) <= 0.2
            await ws.send_audio(utterance, 3200)
            assert wer(KITCHEN, (await ws.until("final", timeout=60))[-1]["text"]) <= 0.2
            await wait_backend(http, front, "up")
    finally:
        process.stop()


# --- guards: a backend's looping answer is caught here, as the local engine's would be ------------
@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def unguarded_upstream(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A second mediaserver with its loop and hallucination guards off: it answers as Whisper decodes
    (uploads without timestamps, which loop on short clips: asr_upload_timestamps)."""
    process, url = mediaserver_process(
        tmp_path_factory.mktemp("unguarded"),
        name="unguarded",
        asr_guard_max_words_per_s="0",
        asr_guard_repeat_min="0",
        asr_upload_timestamps="false",
    )
    process.start()
    try:
        await wait_http_ok(f"{url}/health", process=process.process)
        yield url
    finally:
        process.stop()


async def _upload(http: aiohttp.ClientSession, url: str, wav: bytes) -> str:
    form = aiohttp.FormData()
    form.add_field("file", wav, filename="a.wav")
    form.add_field("model", "tiny.en")
    async with http.post(f"{url}/v1/audio/transcriptions", data=form) as resp:
        assert resp.status == 200, await resp.text()
        text: str = (await resp.json())["text"]
        return text


@decodes_like_avx512
async def test_a_looping_backend_answer_is_asked_again_and_marked(
    unguarded_upstream: str, base_settings: Settings, human_clips: list[tuple[str, np.ndarray, str]]
) -> None:
    # The real "ten of clubs" as a stream's VAD cuts it: tiny.en on its short window loops on it.
    utterance = streamed_utterance(human_clips, "cards_001", base_settings)
    wav = encode_wav(utterance)
    async with (
        front_server(
            base_settings, remote_models={"tiny.en": remote(unguarded_upstream, response_format="json")}
        ) as front,
        aiohttp.ClientSession() as http,
    ):
        looped = await _upload(http, unguarded_upstream, wav)
        assert len(normalized_words(looped)) >= 6, f"no loop to guard against any more: {looped!r}"
        await wait_backend(http, front, "up")
        service = front.app[ASR]
        engine = (await service.get_model("tiny.en")).engine
        assert isinstance(engine, RemoteEngine)
        before = dict(engine.counters)
        text = await _upload(http, front.url, wav)
        tripped = [k for k, v in engine.counters.items() if k.startswith("guard_redecode_") and v > before[k]]
        assert tripped, (engine.counters, looped, text)  # the looping answer was caught and asked for again
        assert len(normalized_words(text)) <= len(normalized_words(looped)), (looped, text)
        print(f"backend: {looped!r}; front after its guard: {text!r}")
        # Counted where the local engine's guards are (front_server gives its ASR service its own registry).
        metrics = generate_latest(service.metrics.registry).decode()
        reason = tripped[0].removeprefix("guard_redecode_")
        assert f'mediaserver_asr_guard_total{{action="redecode",model="tiny.en",reason="{reason}"}} 1.0' in metrics
