"""The legacy WIS chatbot: GET /api/chatbot → {"response"}, GET /api/chatbot/tts → the answer spoken,
and WS /api/ws/chatbot (text in, text out)."""

from __future__ import annotations

import io
from typing import Any
from urllib.parse import unquote

import aiohttp
import av
import numpy as np

from mediaserver.asr.service import AsrService
from mediaserver.audio.decode import resample_mono
from mediaserver.events import TranscriptionOptions
from mediaserver.llm.service import LlmService
from tests.llm_engine import wait_busy, wait_idle, wait_stopped


async def test_chatbot_answers_in_wis_shape(server: Any) -> None:
    params = {"text": "Name three colors.", "temperature": "0", "max_new_tokens": "40"}
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/chatbot", params=params) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert set(body) == {"response"}
    assert isinstance(body["response"], str) and body["response"].strip() == body["response"] != ""


async def test_chatbot_bad_input_is_400_in_wis_shape(server: Any) -> None:
    async with aiohttp.ClientSession() as session:
        for params, param in (
            ({}, "text"),
            ({"text": "   "}, "text"),
            ({"text": "hi", "max_new_tokens": "0"}, "max_new_tokens"),
            ({"text": "hi", "max_new_tokens": "99999"}, "max_new_tokens"),
            ({"text": "hi", "temperature": "hot"}, "temperature"),
        ):
            async with session.get(f"{server.url}/api/chatbot", params=params) as resp:
                assert resp.status == 400, params
                body = await resp.json()
            assert set(body) == {"error", "code"}
            assert param in body["error"]


async def test_chatbot_tts_speaks_the_answer(server: Any, asr_service: AsrService, wer: Any) -> None:
    params = {"text": "Name three colors.", "temperature": "0", "max_new_tokens": "40", "format": "wav"}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/api/chatbot/tts", params=params) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.content_type == "audio/wav"
            answer = unquote(resp.headers["X-Response"])
            body = await resp.read()
        async with session.get(f"{server.url}/api/chatbot/tts", params={**params, "format": "aiff"}) as bad:
            assert bad.status == 400
            assert "formats: WAV, FLAC, OGG, MP3" in (await bad.json())["error"]
    with av.open(io.BytesIO(body), mode="r") as container:
        stream = container.streams.audio[0]
        rate = stream.sample_rate
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    audio = resample_mono(samples.astype(np.float32) / 32768.0, rate)
    heard = await asr_service.transcribe(audio, TranscriptionOptions(language="en", with_segment_timestamps=False))
    assert answer and wer(answer, heard.text) <= 0.25, (answer, heard.text)


async def test_ws_chatbot_text_frame_in_text_frame_out(server: Any) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(f"{server.url}/api/ws/chatbot") as ws:
        await ws.send_str("Name three colors.")
        first = await ws.receive(timeout=60)
        assert first.type == aiohttp.WSMsgType.TEXT
        assert first.data and not first.data.startswith("error:")
        await ws.send_bytes(b"\x00\x01")
        refused = await ws.receive(timeout=10)
        assert refused.type == aiohttp.WSMsgType.TEXT and refused.data.startswith("error:")
        await ws.send_str("Say hello.")
        second = await ws.receive(timeout=60)
        assert second.type == aiohttp.WSMsgType.TEXT and not second.data.startswith("error:")


async def test_ws_chatbot_hang_up_mid_answer_stops_the_generation(server: Any, llm_service: LlmService) -> None:
    await wait_idle(llm_service)
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(f"{server.url}/api/ws/chatbot")
        await ws.send_str("Tell me a long story about a cat who travels the world.")
        (busy,) = await wait_busy(llm_service)
        await ws.close()
    # The story would run to hundreds of tokens; the close stops it within a few.
    generated = await wait_stopped(llm_service, busy)
    assert generated < 100, generated
    await wait_idle(llm_service)


async def test_every_chatbot_endpoint_defaults_to_llm_chatbot_max_tokens(
    server_factory: Any, llm_service: LlmService
) -> None:
    """A question without ``max_new_tokens`` (every socket question) gets ``llm_chatbot_max_tokens``
    (7 here; WIS's 512 by default) on the GET and on the WebSocket alike."""
    live = await server_factory(llm_chatbot_max_tokens=7)
    story = "Tell me a long story about a cat who travels the world."
    registry = llm_service.metrics_registry.registry
    labels = {"model": llm_service.sources.default_name or ""}

    def generated() -> float:
        return registry.get_sample_value("mediaserver_llm_completion_tokens_total", labels) or 0.0

    await wait_idle(llm_service)
    before = generated()
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{live.url}/api/chatbot", params={"text": story}) as resp:
            assert resp.status == 200, await resp.text()
            await resp.json()
        by_get = generated() - before
        async with session.ws_connect(f"{live.url}/api/ws/chatbot") as ws:
            await ws.send_str(story)
            reply = await ws.receive(timeout=60)
            assert reply.type == aiohttp.WSMsgType.TEXT and not reply.data.startswith("error:"), reply
        by_socket = generated() - before - by_get
    assert (by_get, by_socket) == (7, 7)
