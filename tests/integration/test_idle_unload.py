"""Idle unload (``*_keep_alive_s``): models leave memory when unused and load on the next request.

Real parts throughout: the bundled Whisper tiny.en (CTranslate2), the Piper voice, the bundled
SmolLM2 on its own llama-server child. Each test builds its own service with a non-default
keep-alive (the session's shared services keep theirs loaded for good) and waits on the keeper's
state changes, never on a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil
import pytest
from aiohttp import web

from mediaserver.app import create_app
from mediaserver.asr.models import ModelRegistry, bundled_tiny_en_dir
from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.devices import choose_device
from mediaserver.errors import ModelUnavailable
from mediaserver.events import TranscriptionOptions
from mediaserver.llm.engine import LlamaServerEngine
from mediaserver.llm.registry import BUNDLED_NAME
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics
from mediaserver.transport.lenient_http import LenientAppRunner
from mediaserver.tts.service import TtsService
from tests.conftest import Clip
from tests.faults import eventually, metric_samples
from tests.processes import serving

OPTIONS = TranscriptionOptions(language="en")
Speech = Callable[[str], Clip]


def _asr(base: Settings, **overrides: Any) -> AsrService:
    settings = base.model_copy(update={"asr_preload_models": [], **overrides})
    return AsrService(settings, choose_device("cpu", "auto", 0), ModelRegistry(settings), Metrics())


def _serve(app: web.Application) -> contextlib.AbstractAsyncContextManager[str]:
    return serving(app, LenientAppRunner)


async def _transcribe_http(url: str, clip: Clip, model: str) -> tuple[int, Any]:
    form = aiohttp.FormData()
    form.add_field("file", clip.wav_bytes(), filename="speech.wav", content_type="audio/wav")
    form.add_field("model", model)
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/audio/transcriptions", data=form) as resp:
        return resp.status, await resp.json(content_type=None)


async def _health(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/health") as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


def _loaded_metric(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], engine: str, model: str) -> float:
    return samples[("mediaserver_model_loaded", (("engine", engine), ("model", model)))]


# --- settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["asr_keep_alive_s", "tts_keep_alive_s", "llm_keep_alive_s", "turn_keep_alive_s", "speaker_keep_alive_s"]
)
def test_keep_alive_settings_take_ollamas_values_and_refuse_others(field: str) -> None:
    assert getattr(Settings(), field) == -1  # never unload: as before the settings
    for value in (-1, 0, 0.5, 300):
        assert getattr(Settings.model_validate({field: value}), field) == value
    for bad in (-2, -0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"-1 \(never unload\), 0 \(unload after each use\)"):
            Settings.model_validate({field: bad})


def test_keep_alive_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDIASERVER_ASR_KEEP_ALIVE_S", "30")
    monkeypatch.setenv("MEDIASERVER_LLM_KEEP_ALIVE_S", "0")
    settings = Settings()
    assert (settings.asr_keep_alive_s, settings.llm_keep_alive_s, settings.tts_keep_alive_s) == (30, 0, -1)


# --- ASR ------------------------------------------------------------------------------------------


async def test_asr_model_unloads_after_keep_alive_and_the_next_request_reloads_it(
    base_settings: Settings, speech: Speech, wer: Callable[[str, str], float]
) -> None:
    asr = _asr(base_settings, asr_preload_models=["tiny.en"], asr_keep_alive_s=1.0)
    try:
        await asr.start()
        assert asr.loaded_models == ["tiny.en"] and asr.keeper.loads("tiny.en") == 1
        clip = speech("kitchen")
        first = await asr.transcribe(clip.audio16k, OPTIONS)
        answered = time.monotonic()
        assert wer(clip.text, first.text) < 0.2, first.text
        await asr.keeper.wait_for(lambda: not asr.keeper.is_loaded("tiny.en"), timeout_s=30)
        assert time.monotonic() - answered >= 0.95  # not before its keep-alive
        assert asr.loaded_models == []
        state = asr.keeper.status()["tiny.en"]
        assert (state["loaded"], state["unloads"]) == (False, 1)
        again = await asr.transcribe(clip.audio16k, OPTIONS)  # a cold start, not an error
        assert again.text == first.text
        assert asr.loaded_models == ["tiny.en"] and asr.keeper.loads("tiny.en") == 2
    finally:
        await asr.aclose()
    text = asr.metrics.render().decode()
    assert 'mediaserver_model_unloads_total{engine="asr",model="tiny.en",reason="idle"} 1.0' in text
    assert 'mediaserver_model_load_seconds_count{engine="asr",model="tiny.en"} 2.0' in text


async def test_concurrent_requests_during_a_cold_load_share_one_load(
    base_settings: Settings, speech: Speech, wer: Callable[[str, str], float]
) -> None:
    # keep-alive 0: unloaded as soon as the last request is answered.
    asr = _asr(base_settings, asr_keep_alive_s=0)
    try:
        await asr.start()
        assert asr.loaded_models == []  # nothing preloaded: the first requests find it cold
        keys = ["kitchen", "weather", "remind", "music"]
        results = await asyncio.gather(*(asr.transcribe(speech(k).audio16k, OPTIONS) for k in keys))
        for key, result in zip(keys, results, strict=True):
            assert wer(speech(key).text, result.text) < 0.25, (key, result.text)
        assert asr.keeper.loads("tiny.en") == 1
        await asr.keeper.wait_for(lambda: not asr.keeper.is_loaded("tiny.en"), timeout_s=30)
        assert asr.keeper.status()["tiny.en"]["unloads"] == 1
    finally:
        await asr.aclose()


async def test_a_request_that_goes_away_during_a_cold_load_leaves_it_to_the_others(
    base_settings: Settings, speech: Speech
) -> None:
    asr = _asr(base_settings, asr_keep_alive_s=0.5)
    clip = speech("story")
    try:
        first = asyncio.create_task(asr.transcribe(clip.audio16k, OPTIONS))
        await eventually(lambda: "tiny.en" in asr._loading, timeout_s=10)  # the cold load has begun
        first.cancel()  # its client hung up
        with pytest.raises(asyncio.CancelledError):
            await first
        second = await asr.transcribe(clip.audio16k, OPTIONS)  # waits for the same load
        assert "lighthouse" in second.text.lower(), second.text
        assert asr.keeper.loads("tiny.en") == 1
        # Nothing is held by the request that went away: the model idles out.
        await asr.keeper.wait_for(lambda: not asr.keeper.is_loaded("tiny.en"), timeout_s=30)
        assert asr.keeper.status()["tiny.en"]["in_use"] == 0
    finally:
        await asr.aclose()


async def test_an_unload_racing_an_arriving_request_is_safe(base_settings: Settings, speech: Speech) -> None:
    asr = _asr(base_settings, asr_preload_models=["tiny.en"], asr_keep_alive_s=-1)
    clip = speech("garden")
    try:
        await asr.start()
        expected = (await asr.transcribe(clip.audio16k, OPTIONS)).text
        # The request first: it holds its use before the unload looks, so the unload gives up.
        result, unloaded = await asyncio.gather(asr.transcribe(clip.audio16k, OPTIONS), asr._unload_idle("tiny.en"))
        assert (result.text, unloaded) == (expected, False)
        assert asr.keeper.loads("tiny.en") == 1
        # The unload first: it holds the load lock while it frees the model; the request waits for
        # it and loads the model again.
        unloaded, result = await asyncio.gather(asr._unload_idle("tiny.en"), asr.transcribe(clip.audio16k, OPTIONS))
        assert (unloaded, result.text) == (True, expected)
        assert asr.keeper.loads("tiny.en") == 2 and asr.keeper.is_loaded("tiny.en")
        # Back to back with keep-alive 0: each answer arms an unload at once, the next request
        # cancels it or finds the model gone; every one is answered.
        asr.keeper.keep_alive_s = 0
        for _ in range(4):
            assert (await asr.transcribe(clip.audio16k, OPTIONS)).text == expected
        await asr.keeper.wait_for(lambda: not asr.keeper.is_loaded("tiny.en"), timeout_s=30)
    finally:
        await asr.aclose()


async def test_a_failing_load_is_a_503_with_the_reason_and_the_next_request_tries_again(
    base_settings: Settings, speech: Speech, tmp_path: Path
) -> None:
    source = bundled_tiny_en_dir()
    assert source is not None
    model_dir = tmp_path / "flaky"
    model_dir.mkdir()
    for file in source.iterdir():
        (model_dir / file.name).symlink_to(file)
    settings_overrides = {
        "asr_extra_models": {"flaky": str(model_dir)},
        "asr_keep_alive_s": 5.0,
        "llm_enabled": False,
        "tts_enabled": False,
    }
    asr = _asr(base_settings, **settings_overrides)
    app = create_app(asr.settings, asr_service=asr)
    clip = speech("kitchen")
    try:
        async with _serve(app) as url:
            (model_dir / "model.bin").unlink()  # the model file was removed after the start
            status, body = await _transcribe_http(url, clip, "flaky")
            assert status == 503, body
            message = body["error"]["message"]
            assert "'flaky' could not be loaded" in message and "model.bin" in message, message
            health = await _health(url)
            state = health["model_states"]["asr"]["flaky"]
            assert state["loaded"] is False and "could not be loaded" in state["last_error"]
            samples = await metric_samples(url)
            assert samples[("mediaserver_model_load_failures_total", (("engine", "asr"), ("model", "flaky")))] == 1
            # Not cached: the file is back, and the next request loads it and is answered.
            (model_dir / "model.bin").symlink_to(source / "model.bin")
            status, body = await _transcribe_http(url, clip, "flaky")
            assert status == 200, body
            assert "kitchen" in body["text"].lower()
            health = await _health(url)
            state = health["model_states"]["asr"]["flaky"]
            assert state["loaded"] is True and "last_error" not in state and state["load_seconds"] > 0
            assert _loaded_metric(await metric_samples(url), "asr", "flaky") == 1
    finally:
        await asr.aclose()


# --- TTS ------------------------------------------------------------------------------------------


async def test_tts_voice_unloads_after_keep_alive_and_speaks_again(base_settings: Settings) -> None:
    settings = base_settings.model_copy(update={"tts_keep_alive_s": 0.5})
    tts = TtsService(settings, Metrics())
    try:
        await tts.start()  # preloads the default voice
        voice = await tts.voice(None)
        assert tts.loaded_voices == [voice.name]
        await tts.keeper.wait_for(lambda: not tts.keeper.is_loaded(voice.name), timeout_s=30)
        assert tts.loaded_voices == []
        result = await tts.synthesize("The voice came back.", voice)
        assert len(result.pcm) > 0.5 * result.sample_rate_hz * 2  # half a second of speech at least
        assert tts.keeper.loads(voice.name) == 2
        # Unused again, it leaves again.
        await tts.keeper.wait_for(lambda: not tts.keeper.is_loaded(voice.name), timeout_s=30)
        assert tts.keeper.status()[voice.name]["unloads"] == 2
        # Cold again: three requests at once share one load.
        texts = ["One voice.", "Two voices.", "Three voices."]
        results = await asyncio.gather(*(tts.synthesize(text, voice) for text in texts))
        assert all(len(r.pcm) > 0 for r in results)
        assert tts.keeper.loads(voice.name) == 3
    finally:
        await tts.aclose()


# --- LLM ------------------------------------------------------------------------------------------


async def _llm_pid(llm: LlmService) -> int:
    backend = await llm.backend(llm.sources.source(BUNDLED_NAME))
    assert isinstance(backend, LlamaServerEngine) and backend.process.pid is not None
    return backend.process.pid


async def test_llm_engine_stops_when_idle_and_the_next_chat_request_starts_it(base_settings: Settings) -> None:
    settings = base_settings.model_copy(
        update={"llm_keep_alive_s": 1.0, "llm_slots": 1, "tts_enabled": False, "asr_preload_models": []}
    )
    metrics = Metrics()
    asr = AsrService(settings, choose_device("cpu", "auto", 0), ModelRegistry(settings), metrics)
    llm = LlmService(settings, metrics)
    app = create_app(settings, asr_service=asr, llm_service=llm)
    try:
        async with _serve(app) as url:
            await llm.start()  # llm_preload: the child starts now
            pid = await _llm_pid(llm)
            child = psutil.Process(pid)
            assert child.is_running() and child.memory_info().rss > 0
            await llm.keeper.wait_for(lambda: not llm.keeper.is_loaded(BUNDLED_NAME), timeout_s=60)
            assert not psutil.pid_exists(pid) or psutil.Process(pid).create_time() != child.create_time()
            assert llm.loaded_models == []
            # Idle is healthy: unloaded, not down or degraded.
            health = await _health(url)
            assert health["status"] == "ok", health
            model = health["llm"]["models"][BUNDLED_NAME]
            assert model["engine"]["state"] == "unloaded" and model["engine"]["healthy"] is True
            assert model["loaded"] is False and model["unloads"] == 1
            assert health["model_states"]["llm"][BUNDLED_NAME]["loaded"] is False
            assert _loaded_metric(await metric_samples(url), "llm", BUNDLED_NAME) == 0
            # The next chat request starts it again and is answered.
            body: dict[str, Any] = {"model": BUNDLED_NAME}
            body["messages"] = [{"role": "user", "content": "Name three colors."}]
            body |= {"max_tokens": 20, "temperature": 0}
            chat = f"{url}/v1/chat/completions"
            async with aiohttp.ClientSession() as session, session.post(chat, json=body) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
            assert answer["choices"][0]["message"]["content"].strip()
            assert llm.keeper.loads(BUNDLED_NAME) == 2
            new_pid = await _llm_pid(llm)
            assert new_pid != pid and psutil.pid_exists(new_pid)
            health = await _health(url)
            assert health["llm"]["models"][BUNDLED_NAME]["engine"]["state"] == "ready"
            samples = await metric_samples(url)
            assert _loaded_metric(samples, "llm", BUNDLED_NAME) == 1
            load_count = ("mediaserver_model_load_seconds_count", (("engine", "llm"), ("model", BUNDLED_NAME)))
            assert samples[load_count] == 2
            # A client that hangs up mid-answer leaves nothing held: the engine still idles out.
            body |= {"max_tokens": 400, "stream": True}
            body["messages"] = [{"role": "user", "content": "Tell me a long story about a cat."}]
            async with aiohttp.ClientSession() as session:
                resp = await session.post(chat, json=body)
                assert resp.status == 200
                await resp.content.readline()  # the first event: it is generating
                resp.close()  # hang up
            await llm.keeper.wait_for(lambda: not llm.keeper.is_loaded(BUNDLED_NAME), timeout_s=60)
            assert not psutil.pid_exists(new_pid) or psutil.Process(new_pid).status() == psutil.STATUS_ZOMBIE
            # It was cancelled (the engine stopped generating), not run to its 400 tokens.
            outcome = ("backend", "llama.cpp"), ("model", BUNDLED_NAME), ("outcome", "cancelled")
            assert (await metric_samples(url))[("mediaserver_llm_requests_total", outcome)] == 1
    finally:
        await llm.aclose()
        await asr.aclose()


async def test_llm_keep_alive_zero_stops_after_each_answer(base_settings: Settings) -> None:
    settings = base_settings.model_copy(update={"llm_keep_alive_s": 0, "llm_slots": 1, "llm_preload": False})
    llm = LlmService(settings, Metrics())
    try:
        await llm.start()
        assert llm.loaded_models == []  # not preloaded: the first request is the cold start
        params = GenerationParams(max_tokens=8, temperature=0.0)
        answers = await asyncio.gather(
            *(llm.complete([ChatMessage("user", f"Say {word}.")], params) for word in ("yes", "no"))
        )
        assert all(a.text.strip() for a in answers)
        assert llm.keeper.loads(BUNDLED_NAME) == 1  # both waited for the same start
        await llm.keeper.wait_for(lambda: not llm.keeper.is_loaded(BUNDLED_NAME), timeout_s=30)
        assert llm.loaded_models == []
    finally:
        await llm.aclose()


async def test_an_llm_stop_racing_an_arriving_chat_request_is_safe(base_settings: Settings) -> None:
    settings = base_settings.model_copy(update={"llm_keep_alive_s": -1, "llm_slots": 1})
    llm = LlmService(settings, Metrics())
    question = [ChatMessage("user", "Name three colors.")]
    params = GenerationParams(max_tokens=12, temperature=0.0, seed=1)
    try:
        await llm.start()
        expected = (await llm.complete(question, params)).text
        assert expected.strip()
        # The request first: it holds its use before the stop looks, so the engine stays.
        answer, stopped = await asyncio.gather(llm.complete(question, params), llm._unload_idle(BUNDLED_NAME))
        assert (answer.text, stopped) == (expected, False)
        assert llm.keeper.loads(BUNDLED_NAME) == 1
        # The stop first: the request waits for it and starts a new child.
        stopped, answer = await asyncio.gather(llm._unload_idle(BUNDLED_NAME), llm.complete(question, params))
        assert (stopped, answer.text) == (True, expected)
        assert llm.keeper.loads(BUNDLED_NAME) == 2 and llm.loaded_models == [BUNDLED_NAME]
    finally:
        await llm.aclose()


async def test_a_failing_llm_start_is_a_503_with_the_reason_and_the_next_request_tries_again(
    base_settings: Settings, tmp_path: Path
) -> None:
    bundled = LlmService(base_settings, Metrics()).sources.source(BUNDLED_NAME).location
    gguf = tmp_path / "flaky.gguf"
    settings = base_settings.model_copy(
        update={"llm_extra_models": {"flaky": str(gguf)}, "llm_keep_alive_s": 5.0, "llm_slots": 1, "llm_preload": False}
    )
    llm = LlmService(settings, Metrics())
    question = [ChatMessage("user", "Say yes.")]
    params = GenerationParams(max_tokens=4, temperature=0.0)
    try:
        with pytest.raises(ModelUnavailable) as failed:  # the file is not there
            await llm.complete(question, params, model="flaky")
        assert failed.value.status == 503 and str(gguf) in failed.value.message, failed.value.message
        state = llm.keeper.status()["flaky"]
        assert state["loaded"] is False and str(gguf) in state["last_error"]
        model = (await llm.status())["models"]["flaky"]
        # A failed start is not idle: unhealthy (the server is degraded) until a start succeeds.
        assert model["engine"]["state"] == "failed" and model["engine"]["healthy"] is False
        assert model["last_error"] == state["last_error"]
        gguf.symlink_to(bundled)  # the file is back: the next request starts the engine
        assert (await llm.complete(question, params, model="flaky")).text.strip()
        state = llm.keeper.status()["flaky"]
        assert state["loaded"] is True and "last_error" not in state and state["loads"] == 1
        assert (await llm.status())["models"]["flaky"]["engine"]["healthy"] is True
    finally:
        await llm.aclose()


async def test_the_embedding_model_idles_out_with_llm_keep_alive_and_loads_again(base_settings: Settings) -> None:
    settings = base_settings.model_copy(update={"llm_keep_alive_s": 0.5, "llm_preload": False})
    llm = LlmService(settings, Metrics())
    try:
        first = await llm.embed(["the kitchen lights"])
        name = first.model
        assert llm.embedding_keeper.is_loaded(name) and llm.loaded_models == []  # no chat engine for it
        await llm.embedding_keeper.wait_for(lambda: not llm.embedding_keeper.is_loaded(name), timeout_s=30)
        assert llm.embedding_dimensions(name) is None  # gone from memory
        again = await llm.embed(["the kitchen lights"])
        assert np.allclose(again.vectors, first.vectors, atol=1e-5)  # the same model, loaded again
        assert llm.embedding_keeper.loads(name) == 2
    finally:
        await llm.aclose()


def test_this_process_is_not_left_with_children(llm_service: LlmService) -> None:
    """Every llama-server these tests started was stopped (the session's shared service's aside:
    its chat engine and, once something asked it for embeddings, its embedding engine)."""
    shared = {engine.process.pid for engine in llm_service._backends.values() if isinstance(engine, LlamaServerEngine)}
    shared |= {embedder.process.pid for embedder in llm_service._embedders.values()}
    me = psutil.Process(os.getpid())
    assert {c.pid for c in me.children() if "llama-server" in c.name()} <= shared
