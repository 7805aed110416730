"""Noise suppression and automatic gain (WebRTC, ``audio/noise.py``) in front of Whisper: Piper
sentences mixed with white noise and with babble (other Piper sentences overlapped) at 0, 5 and
10 dB SNR, transcribed with suppression off and on by the shared tiny.en; and the start options
that turn it on (device WebSocket, Realtime)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from mediaserver.asr.service import AsrService
from mediaserver.audio.noise import NoiseFilter
from mediaserver.events import Priority, TranscriptionOptions
from mediaserver.state import SESSIONS, SETTINGS
from mediaserver.transport.openai.realtime.session import RealtimeSession
from tests.conftest import SENTENCES, LiveServer, synthesize
from tests.cpu import decodes_like_avx512
from tests.integration.test_ws_stream import connect, pcm16
from tests.wer import word_error_rate


def _corpus() -> tuple[str, ...]:
    """tools/speech_corpus.py's sentences (tools/ is not a package: loaded by path)."""
    path = Path(__file__).resolve().parents[2] / "tools" / "speech_corpus.py"
    spec = importlib.util.spec_from_file_location("_speech_corpus", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return tuple(module.SENTENCES)


# The corpus's first 24 sentences: enough words (~200) that one sentence going wrong moves a row's
# WER by a few points, not by ten.
CORPUS = _corpus()
TARGETS = CORPUS[:24]
BABBLE_TEXTS = CORPUS[-8:]
LEAD_S = 1.0  # noise alone before the speech, as a device streams it (the suppressor learns the floor)


def white(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@functools.cache
def _babble_bed() -> np.ndarray:
    """Four Piper sentences on top of each other, staggered, looped: 'other people talking'."""
    voices = [synthesize(text).audio16k for text in BABBLE_TEXTS]
    length = max(v.size for v in voices) + 16000
    bed = np.zeros(length, np.float32)
    for index, voice in enumerate(voices):
        start = index * 4000
        bed[start : start + voice.size] += voice[: length - start]
    return bed


def babble(n: int, seed: int) -> np.ndarray:
    bed = np.tile(_babble_bed(), n // _babble_bed().size + 2)
    offset = int(np.random.default_rng(seed).integers(0, _babble_bed().size))
    return bed[offset : offset + n]


NOISES: dict[str, Callable[[int, int], np.ndarray]] = {"white": white, "babble": babble}


def mix(speech: np.ndarray, kind: str, snr_db: float | None, seed: int) -> np.ndarray:
    """Speech after LEAD_S of noise, noise scaled to ``snr_db`` below the speech's power (None: clean)."""
    lead = np.zeros(int(16000 * LEAD_S), np.float32)
    tail = np.zeros(8000, np.float32)
    clean = np.concatenate([lead, speech, tail])
    if snr_db is None:
        return clean
    noise = NOISES[kind](clean.size, seed)
    speech_power = float(np.mean(speech.astype(np.float64) ** 2))
    noise_power = float(np.mean(noise.astype(np.float64) ** 2))
    scale = np.sqrt(speech_power / (noise_power * 10 ** (snr_db / 10)))
    noisy: np.ndarray = (clean + noise * scale).astype(np.float32)
    return noisy


def suppress(audio: np.ndarray, level: int = 2, gain_dbfs: int = 3) -> np.ndarray:
    """The filter as a stream runs it: 20 ms pieces through one NoiseFilter."""
    noise_filter = NoiseFilter(level, gain_dbfs)
    return np.concatenate([noise_filter.process(audio[i : i + 320]) for i in range(0, audio.size, 320)])


async def total_wer(asr: AsrService, kind: str, snr_db: float | None, on: bool) -> float:
    """Word errors over every target sentence / reference words (one WER for the set). One clip at a
    time: concurrent clips could be packed into one batch differently from run to run."""
    errors = 0.0
    for seed, text in enumerate(TARGETS):
        audio = mix(synthesize(text).audio16k, kind, snr_db, seed)
        if on:
            audio = suppress(audio)
        options = TranscriptionOptions(language="en", beam_size=1)
        transcript = await asr.transcribe(audio, options, model="tiny.en", priority=Priority.FINAL)
        errors += word_error_rate(text, transcript.text) * len(text.split())
    return errors / sum(len(text.split()) for text in TARGETS)


@decodes_like_avx512
@pytest.mark.slow
@pytest.mark.timeout(600)  # 96 transcriptions one at a time: about 40 s on an idle machine
async def test_suppression_helps_on_white_noise_and_leaves_clean_speech(asr_service: AsrService) -> None:
    """What the docs claim: better on white noise at 5 dB, and clean speech no worse than +0.5
    points. The other conditions (0 and 10 dB, babble, where the server's path gains nothing or
    loses) are tools/bench_noise.py's table, not asserted here."""
    white_off = await total_wer(asr_service, "white", 5.0, False)
    white_on = await total_wer(asr_service, "white", 5.0, True)
    clean_off = await total_wer(asr_service, "white", None, False)
    clean_on = await total_wer(asr_service, "white", None, True)
    print(f"white 5 dB: off {white_off:6.1%}  on {white_on:6.1%}; clean: off {clean_off:6.1%}  on {clean_on:6.1%}")
    assert white_on < white_off, (white_off, white_on)
    assert clean_on <= clean_off + 0.005, (clean_off, clean_on)


async def test_device_stream_start_option(server: LiveServer, wer: Any) -> None:
    """noise_suppression on the device WebSocket: echoed in ready, audio cleaned before the VAD."""
    audio = mix(synthesize(SENTENCES["kitchen"]).audio16k, "white", 5.0, 3)
    async with connect(server) as client:
        ready = await client.start(mode="push_to_talk", noise_suppression=True, language="en")
        assert ready["noise_suppression"] == 2  # noise_suppression_level
        await client.send_audio(pcm16(audio), 3200)
        await client.send("stop")
        final = (await client.until("final"))[-1]
        assert wer(SENTENCES["kitchen"], final["text"]) <= 0.3, final
        ready = await client.start(mode="push_to_talk", noise_suppression=4)
        assert ready["noise_suppression"] == 4
        ready = await client.start(mode="push_to_talk", noise_suppression=False)
        assert ready["noise_suppression"] == 0
        await client.send("start", noise_suppression="loud")
        error = (await client.until("error"))[-1]
        assert error["code"] == "invalid_parameter" and "noise_suppression" in error["message"], error


async def test_device_stream_query_option(server: LiveServer) -> None:
    async with connect(server, "?mode=server_vad&noise_suppression=far_field") as client:
        ready = (await client.until("ready"))[-1]
        assert ready["noise_suppression"] == 2  # noise_far_field_level


async def test_realtime_noise_reduction_cleans_the_input(server: LiveServer, asr_service: AsrService) -> None:
    """OpenAI Realtime's noise_reduction (far_field): echoed in session.updated, and the committed
    audio goes through a filter at noise_far_field_level: the transcript is the one of that filter's
    output (the same clip filtered here and transcribed by the same model)."""
    from tests.integration.test_realtime import Client, configure, manual, until_completed

    settings = server.app[SETTINGS]
    options = TranscriptionOptions(language="en", beam_size=1)

    async def text_of(audio: np.ndarray) -> str:
        return (await asr_service.transcribe(audio, options, model="tiny.en", priority=Priority.FINAL)).text

    # A clip whose transcript the filter changes, so that the comparison below tells filtered from not.
    for seed, text in enumerate(TARGETS):
        audio = mix(synthesize(text).audio16k, "white", 0.0, seed)
        cleaned = suppress(audio, settings.noise_far_field_level, settings.noise_auto_gain_dbfs)
        expected = await text_of(cleaned)
        if word_error_rate(expected, await text_of(audio)) > 0:  # other words, not just other case
            break
    else:
        pytest.fail("the filter changed no transcript")
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{server.url}/v1/realtime?intent=transcription", max_msg_size=0)
        client = Client(ws)
        try:
            await client.next("session.created")
            updated = await configure(
                client, manual(format={"type": "audio/pcm", "rate": 16000}, noise_reduction={"type": "far_field"})
            )
            assert updated["session"]["audio"]["input"]["noise_reduction"] == {"type": "far_field"}, updated
            session = server.app[SESSIONS].get(updated["session"]["id"])
            assert isinstance(session, RealtimeSession) and session.noise is not None
            assert session.noise.level == server.app[SETTINGS].noise_far_field_level == 2
            await client.stream(pcm16(audio), chunk_ms=200, rate_hz=16000)
            await client.send({"type": "input_audio_buffer.commit"})
            (completed,) = await until_completed(client)
            assert word_error_rate(expected, completed["transcript"]) == 0, (completed["transcript"], expected)
        finally:
            await client.close()
