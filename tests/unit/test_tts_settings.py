"""TTS settings at non-default values, with the real Piper voice: the default voice and the aliases,
voice downloads' timeout and size limit, sentence length, the speed range, how many voices stay
loaded, the response cache's entry and total size, and a voice's workers and ONNX Runtime threads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.metrics import Metrics
from mediaserver.tts.engine import load_engine
from mediaserver.tts.piper_engine import PiperEngine
from mediaserver.tts.service import TtsService
from mediaserver.tts.text import split_sentences
from mediaserver.tts.types import Pcm16, SynthesisParams
from mediaserver.tts.voices import UnknownVoice, VoiceRegistry, bundled_voices, tts_unavailable

BUNDLED = "en_US-joe-medium"
COPY = "en_GB-copy-medium"  # the bundled voice under another name, in tts_voices_dir
RUN_ON = " ".join(["and then the lights went on again"] * 3)  # 104 characters without a full stop


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("voices")
    bundled = bundled_voices()[0]
    (directory / f"{COPY}.onnx").symlink_to(bundled.model_path)
    shutil.copy(bundled.config_path, directory / f"{COPY}.onnx.json")
    return directory


def settings(voices_dir: Path, **overrides: object) -> Settings:
    return Settings(_env_file=None, tts_voices_dir=voices_dir, tts_allow_download=False, **overrides)  # type: ignore[arg-type]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tuned(voices_dir: Path) -> AsyncIterator[TtsService]:
    """A TTS service with short sentences, a narrow speed range, one loaded voice, a small cache entry."""
    service = TtsService(
        settings(
            voices_dir,
            tts_max_sentence_chars=40,
            tts_min_speed=0.5,
            tts_max_speed=2.0,
            tts_max_loaded_voices=1,
            tts_cache_max_entry_bytes=1000,
        ),
        Metrics(),
    )
    await service.start()
    yield service
    await service.aclose()


# --- voices ----------------------------------------------------------------------------------------


def test_the_default_voice_is_the_configured_one(voices_dir: Path) -> None:
    registry = VoiceRegistry(settings(voices_dir, tts_default_voice=COPY))
    assert registry.resolve(None).name == COPY
    assert registry.resolve("alloy").name == COPY  # the aliases of "@default" follow it
    assert registry.resolve(BUNDLED).name == BUNDLED  # still there by name
    assert VoiceRegistry(settings(voices_dir)).resolve(None).name == BUNDLED


def test_a_default_voice_that_is_not_installed_turns_tts_off_naming_it(voices_dir: Path) -> None:
    missing = settings(voices_dir, tts_default_voice="de_DE-nobody-low")
    assert tts_unavailable(missing) == (
        f"the default voice 'de_DE-nobody-low' is not installed (voices: {BUNDLED}, {COPY})"
    )
    with pytest.raises(UnknownVoice, match="the configured default voice"):
        VoiceRegistry(missing).resolve(None)


def test_voice_aliases_replace_the_built_in_ones(voices_dir: Path) -> None:
    registry = VoiceRegistry(settings(voices_dir, tts_voice_aliases={"narrator": COPY, "host": "@default"}))
    assert registry.resolve("narrator").name == COPY
    assert registry.resolve("Host").name == BUNDLED
    with pytest.raises(UnknownVoice, match=r"aliases of configured voices: host, narrator\)"):
        registry.resolve("alloy")  # a built-in alias, no longer configured


# --- downloads ---------------------------------------------------------------------------------------


def mirror_registry(voices_dir: Path, port: int, **settings: Any) -> VoiceRegistry:
    """A voice registry that downloads from a mirror on loopback ``port`` into ``voices_dir``."""
    return VoiceRegistry(
        Settings(
            _env_file=None,
            tts_voices_dir=voices_dir,
            tts_download_url=f"http://127.0.0.1:{port}/{{lang_code}}-{{voice_name}}-{{voice_quality}}{{extension}}",
            **settings,
        )
    )


@contextlib.asynccontextmanager
async def mirror(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[int]:
    """A voice mirror on loopback answering every file with ``handler``: its port."""
    app = web.Application()
    app.router.add_get("/{name}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def test_a_download_that_stalls_ends_at_the_timeout(tmp_path: Path) -> None:
    """The voice server accepts and never answers (a stalled mirror, which no real one does on demand)."""
    stalled: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stalled.append(writer)

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    registry = mirror_registry(tmp_path, port, tts_download_timeout_s=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(UnknownVoice, match="timed out") as caught:
            await asyncio.wait_for(registry.resolve_or_download("de_DE-thorsten-medium"), 60)
    finally:
        for writer in stalled:
            writer.close()
        server.close()
        await server.wait_closed()
    assert time.monotonic() - started < 30
    assert caught.value.status == 400 and stalled
    async with asyncio.timeout(30):  # the download's thread gives up too (its socket's own timeout), cleaning up
        while os.listdir(tmp_path):
            await asyncio.sleep(0.05)


async def test_a_download_that_trickles_ends_at_the_timeout_too(tmp_path: Path) -> None:
    """A mirror that sends a few bytes every 50 ms never lets a socket read time out: the download
    as a whole is bounded by tts_download_timeout_s, and its thread cleans up."""
    sent: list[int] = []

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 60_000_000
        await response.prepare(request)
        while True:
            await response.write(b"\0" * 16)
            sent.append(16)
            await asyncio.sleep(0.05)

    async with mirror(trickle) as port:
        registry = mirror_registry(tmp_path, port, tts_download_timeout_s=1.0)
        with pytest.raises(UnknownVoice, match="timed out"):
            await asyncio.wait_for(registry.resolve_or_download("de_DE-thorsten-medium"), 60)
        async with asyncio.timeout(30):  # the thread stopped reading, and removed its part file
            while os.listdir(tmp_path):
                await asyncio.sleep(0.05)
        assert sent  # it did trickle


async def test_a_download_larger_than_the_limit_is_refused_and_removed(tmp_path: Path) -> None:
    """A real Piper voice (the bundled one, 60 MB) served on loopback, over a 1 MiB limit."""
    bundled = bundled_voices()[0]
    files = {f"{COPY}.onnx": bundled.model_path, f"{COPY}.onnx.json": bundled.config_path}

    async def serve(request: web.Request) -> web.FileResponse:
        path = files.get(request.match_info["name"])
        if path is None:
            raise web.HTTPNotFound()
        return web.FileResponse(path)

    async with mirror(serve) as port:
        registry = mirror_registry(tmp_path, port, tts_download_max_bytes=1024 * 1024)
        with pytest.raises(UnknownVoice, match=r"larger than tts_download_max_bytes \(1048576\)"):
            await asyncio.wait_for(registry.resolve_or_download(COPY), 60)
    assert os.listdir(tmp_path) == []  # no partial file is left behind


async def test_a_voice_the_mirror_has_not_or_cannot_serve_is_said_so_plainly(tmp_path: Path) -> None:
    """A made-up Piper name: the mirror's 404 is "not a voice it has", an unreachable mirror is named
    with the setting to change, not a raw "<urlopen error [Errno -2] ...>" (a Home Assistant trial)."""

    async def missing(request: web.Request) -> web.Response:
        raise web.HTTPNotFound()

    async with mirror(missing) as port:
        with pytest.raises(UnknownVoice, match=rf"not a voice 127.0.0.1:{port} has: HTTP 404") as caught:
            await asyncio.wait_for(mirror_registry(tmp_path, port).resolve_or_download("en_US-nosuch-medium"), 60)
        assert "urlopen" not in caught.value.message
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]  # bound, not listening: refused
    try:
        with pytest.raises(UnknownVoice, match=r"could not be reached to download it: .*tts_download_url") as caught:
            await asyncio.wait_for(mirror_registry(tmp_path, port).resolve_or_download("en_US-nosuch-medium"), 60)
        assert "urlopen" not in caught.value.message
    finally:
        closed.close()
    assert os.listdir(tmp_path) == []


# --- speaking ------------------------------------------------------------------------------------------


async def test_runs_without_a_full_stop_are_cut_at_the_sentence_limit(tuned: TtsService) -> None:
    assert split_sentences(RUN_ON) == [RUN_ON]  # the default 400 keeps it whole
    pieces = await tuned.split(RUN_ON)
    assert len(pieces) == 3 and all(len(piece) <= 40 for piece in pieces)
    assert " ".join(pieces) == RUN_ON
    voice = await tuned.voice(None)
    async with tuned.open(voice, SynthesisParams()) as speech:  # deltas, as an LLM's tokens come: cut alike
        for word in RUN_ON.split(" "):
            speech.feed(word + " ")
        speech.end()
        spoken = [chunk.sentence async for chunk in speech if chunk.pcm]
    assert spoken == pieces


def test_speeds_outside_the_configured_range_are_refused(tuned: TtsService) -> None:
    for speed in (0.4, 2.1):  # inside the default 0.25 to 4.0
        with pytest.raises(InvalidParameter, match=f"between 0.5 and 2.0, got {speed}"):
            tuned.check_speed(speed)
    assert tuned.check_speed(0.5) == 0.5 and tuned.check_speed(2.0) == 2.0


async def test_only_the_configured_number_of_voices_stay_loaded(tuned: TtsService) -> None:
    default = await tuned.voice(None)
    await tuned.load(default)
    assert tuned.loaded_voices == [BUNDLED]
    copy = await tuned.voice(COPY)
    await tuned.load(copy)
    assert tuned.loaded_voices == [COPY]  # the idle default was unloaded (the default 4 keeps both)


def test_responses_over_the_entry_limit_are_not_cached(tuned: TtsService) -> None:
    assert tuned.cache.max_entry_bytes == 1000
    assert not tuned.cache.put("over", b"x" * 1001, "audio/wav")  # the default 8 MiB would keep it
    assert tuned.cache.put("under", b"x" * 1000, "audio/wav")
    assert tuned.cache.get("under") == (b"x" * 1000, "audio/wav") and tuned.cache.get("over") is None


def test_the_response_cache_keeps_at_most_tts_cache_max_bytes(voices_dir: Path) -> None:
    cache = TtsService(settings(voices_dir, tts_cache_max_bytes=3000), Metrics()).cache
    for key in ("first", "second", "third", "fourth"):
        assert cache.put(key, b"x" * 1000, "audio/wav")
    # The oldest went to make room (the default 64 MiB keeps all four).
    assert cache.size_bytes == 3000 and cache.get("first") is None and cache.get("fourth") is not None


def test_tts_onnx_threads_are_the_voices_onnx_runtime_threads(voices_dir: Path) -> None:
    config = settings(voices_dir, tts_onnx_threads=3)
    engine = load_engine(bundled_voices()[0], config)
    assert isinstance(engine, PiperEngine)
    options = engine._voice.session.get_session_options()
    assert options.intra_op_num_threads == 3  # the default (0) leaves ONNX Runtime one per core


def test_tts_noise_scales_of_zero_make_the_same_text_the_same_audio(voices_dir: Path) -> None:
    """Piper draws new noise for every synthesis (the voice's own noise_scale 0.667, noise_w 0.8): the
    same sentence twice is two different clips. With tts_noise_scale and tts_noise_w_scale at 0 it is
    the same clip, sample for sample."""
    sentence, params = "Set a timer for the pasta and play some quiet music.", SynthesisParams()
    default = load_engine(bundled_voices()[0], settings(voices_dir))
    first, second = default.synthesize(sentence, params), default.synthesize(sentence, params)
    assert first.size != second.size or (first != second).any()
    steady = load_engine(bundled_voices()[0], settings(voices_dir, tts_noise_scale=0.0, tts_noise_w_scale=0.0))
    first, second = steady.synthesize(sentence, params), steady.synthesize(sentence, params)
    assert first.size == second.size and (first == second).all()
    with pytest.raises(ValueError, match="tts_noise_scale"):
        Settings(_env_file=None, tts_noise_scale=-0.1)


async def test_tts_workers_per_voice_synthesizes_two_sentences_at_once(voices_dir: Path) -> None:
    """Three sentences of one request: the first runs alone (it is the first audio), then the next
    two are synthesized together by two workers, which one worker (the default) never does."""
    service = TtsService(settings(voices_dir, tts_workers_per_voice=2), Metrics())
    await service.start()
    lock = threading.Lock()
    both = threading.Event()
    calls = inside = most = 0
    try:
        voice = await service.voice(None)
        engine = (await service.load(voice)).engine
        real = engine.synthesize

        def synthesize(sentence: str, params: SynthesisParams) -> Pcm16:
            nonlocal calls, inside, most
            with lock:
                calls += 1
                first = calls == 1
                inside += 1
                most = max(most, inside)
                if inside == 2:
                    both.set()
            if not first:
                both.wait(timeout=10.0)
            try:
                return real(sentence, params)
            finally:
                with lock:
                    inside -= 1

        engine.synthesize = synthesize  # type: ignore[method-assign]
        async with service.open(voice, SynthesisParams()) as speech:
            speech.feed("The first one. The second one. The third one.")
            speech.end()
            spoken = [chunk.sentence async for chunk in speech if chunk.pcm]
    finally:
        await service.aclose()
    assert len(spoken) == 3 and most == 2, (spoken, most)
