"""Settings of streams, wake words, noise, semantic turns, sessions and decoding options at
non-default values: each test shows what the value changes, built on the real parts (Piper speech,
the microWakeWord models, the Smart Turn model, tiny.en)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from mediaserver.asr.service import AsrService
from mediaserver.audio.noise import new_filter, parse_level
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    FinalTranscript,
    SpeechStarted,
    SpeechStopped,
    TranscriptionOptions,
    TurnDecided,
)
from mediaserver.metrics import Metrics
from mediaserver.session_registry import SessionRegistry
from mediaserver.state import SETTINGS
from mediaserver.stream.options import StreamOptions
from mediaserver.stream.session import StreamSession
from mediaserver.transport.common import stream_options_from
from mediaserver.transport.openai.realtime.config import TurnDetection
from mediaserver.transport.wis.query import parse_wis_query
from mediaserver.turns.fetch import default_dir, fetch
from mediaserver.turns.model import TurnModel, load_shared
from mediaserver.wake.gate import new_gate, parse_wake_option
from mediaserver.wake.models import UnknownWakeModel, WakeModels
from tests.conftest import synthesize
from tests.unit.test_stream_session import Recorder, feed, silence

# --- decoding options ----------------------------------------------------------------------------


def test_default_beam_size_is_the_beam_of_requests_that_name_none() -> None:
    settings = Settings(_env_file=None, default_beam_size=3)
    assert stream_options_from({}, settings).transcription.beam_size == 3  # WebSocket, Realtime, devices
    app = web.Application()
    app[SETTINGS] = settings
    assert parse_wis_query(make_mocked_request("POST", "/api/willow", app=app)).options.beam_size == 3  # WIS


def test_max_beam_size_refuses_a_larger_beam() -> None:
    settings = Settings(_env_file=None, max_beam_size=4)
    assert stream_options_from({"beam_size": "4"}, settings).transcription.beam_size == 4
    with pytest.raises(InvalidParameter) as caught:
        stream_options_from({"beam_size": "5"}, settings)  # the default (10) takes it
    assert caught.value.param == "beam_size"
    app = web.Application()
    app[SETTINGS] = settings
    with pytest.raises(InvalidParameter):
        parse_wis_query(make_mocked_request("POST", "/api/willow?beam_size=5", app=app))


# --- noise suppression -----------------------------------------------------------------------------


def test_noise_default_suppresses_noise_on_streams_that_do_not_say() -> None:
    on = Settings(_env_file=None, noise_default=True, noise_suppression_level=3)
    assert parse_level(None, on) == 3 and new_filter(parse_level(None, on), on) is not None
    assert parse_level(False, on) == 0  # a stream that says no still gets none
    assert parse_level(None, Settings(_env_file=None, noise_suppression_level=3)) == 0  # the default: off


def test_a_noise_level_in_a_query_string_is_the_level_it_names() -> None:
    """A docs audit: a query string's noise_suppression=1 read as "on" (the default level, 2) where
    the JSON number 1 is level 1; the digits are levels in both, the words are on and off."""
    settings = Settings(_env_file=None)
    assert [parse_level(text, settings) for text in ("0", "1", "3", "4")] == [0, 1, 3, 4]
    assert [parse_level(value, settings) for value in (0, 1, 3)] == [0, 1, 3]
    on = settings.noise_suppression_level
    assert [parse_level(text, settings) for text in ("true", "on", "yes", "false", "off")] == [on, on, on, 0, 0]
    with pytest.raises(InvalidParameter):  # (a review: "²" is a digit to str.isdigit, and int() refused it)
        parse_level("²", settings)


# --- wake words ----------------------------------------------------------------------------------


def test_wake_enabled_off_refuses_wake_word_streams() -> None:
    assert parse_wake_option(True, Settings(_env_file=None)) == ["okay_nabu"]
    with pytest.raises(InvalidParameter, match="wake_enabled") as caught:
        parse_wake_option(True, Settings(_env_file=None, wake_enabled=False))
    assert caught.value.param == "wake"


def test_wake_models_dir_adds_a_custom_wake_word(tmp_path: Path) -> None:
    builtin = WakeModels.load().get("hey_jarvis")
    shutil.copy(builtin.tflite_path, tmp_path / "hey_house.tflite")
    micro = {"probability_cutoff": 0.9, "sliding_window_size": 5}
    config = {"type": "micro", "wake_word": "Hey House", "model": "hey_house.tflite", "micro": micro}
    (tmp_path / "hey_house.json").write_text(json.dumps(config))
    with pytest.raises(UnknownWakeModel):
        parse_wake_option("hey_house", Settings(_env_file=None))
    settings = Settings(_env_file=None, wake_models_dir=tmp_path)
    assert parse_wake_option("hey_house", settings) == ["hey_house"]
    gate = new_gate(["hey_house"], settings)
    try:
        audio = np.concatenate([np.zeros(16000, np.float32), synthesize("hey jarvis, what time is it").audio16k])
        assert [d.name for d in gate.detector.process_float(audio)] == ["hey_house"]
    finally:
        gate.close()


def test_wake_refractory_s_reports_a_word_said_again_within_it_once() -> None:
    word = np.concatenate([np.zeros(16000, np.float32), synthesize("okay nabu").audio16k, np.zeros(16000)])
    twice = np.concatenate([word, word])  # the same word twice, about 3 s apart
    gate = new_gate(["okay_nabu"], Settings(_env_file=None, wake_refractory_s=6.0))
    try:
        assert [d.name for d in gate.detector.process_float(twice)] == ["okay_nabu"]  # 2 s (default): twice
    finally:
        gate.close()


# --- the streams' VAD segmenter --------------------------------------------------------------------


async def stream_events(asr_service: AsrService, settings: Settings, audio: np.ndarray) -> Recorder:
    """The events of a server-VAD stream (silence detection) fed ``audio``."""
    recorder = Recorder()
    options = StreamOptions(
        transcription=TranscriptionOptions(language="en", with_segment_timestamps=False), server_vad=True
    )
    session = StreamSession(asr_service, settings, recorder, options)
    try:
        await feed(session, audio)
    finally:
        await session.aclose()
    return recorder


async def test_stream_vad_preroll_ms_starts_the_utterance_that_much_earlier(
    asr_service: AsrService, base_settings: Settings
) -> None:
    """Only the start of a command (its first second, no end): where the utterance is said to begin."""
    audio = np.concatenate([silence(1.5), synthesize("Turn on the kitchen lights").audio16k[:SAMPLE_RATE_HZ]])
    starts = []
    for preroll_ms in (150, 900):  # the default, and more
        settings = base_settings.model_copy(update={"stream_vad_preroll_ms": preroll_ms})
        started = (await stream_events(asr_service, settings, audio)).of(SpeechStarted)
        assert len(started) == 1, started
        starts.append(started[0].audio_start_ms)
    assert abs(starts[0] - starts[1] - 750) <= 40, starts


async def test_stream_min_speech_ms_discards_a_shorter_utterance(
    asr_service: AsrService, base_settings: Settings
) -> None:
    audio = np.concatenate([silence(0.5), synthesize("Turn on the kitchen lights.").audio16k, silence(1.0)])
    settings = base_settings.model_copy(update={"stream_min_speech_ms": 5000})  # the command: about 2 s
    recorder = await stream_events(asr_service, settings, audio)
    assert [e.discarded for e in recorder.of(SpeechStopped)] == [True]  # the default (200 ms) keeps it
    assert recorder.of(FinalTranscript) == []


async def test_stream_max_utterance_s_cuts_a_longer_utterance(asr_service: AsrService, base_settings: Settings) -> None:
    clip = synthesize("Turn on the kitchen lights and close the garage door.").audio16k
    audio = np.concatenate([silence(0.5), clip, silence(1.0)])
    settings = base_settings.model_copy(update={"stream_max_utterance_s": 1.5})
    recorder = await stream_events(asr_service, settings, audio)
    started, stopped = recorder.of(SpeechStarted), recorder.of(SpeechStopped)
    assert clip.size / SAMPLE_RATE_HZ > 2.0 and len(started) >= 2 and len(stopped) >= 2, recorder.events
    # The first utterance ends at 1.5 s however the speech goes on (the default 28 s takes it whole).
    assert stopped[0].audio_end_ms - started[0].audio_start_ms <= 1500, (started, stopped)


# --- sessions ------------------------------------------------------------------------------------


class Session:
    """What the registry holds of a session: its last activity and a close."""

    def __init__(self) -> None:
        self.last_activity = time.monotonic()
        self.closed = asyncio.Event()

    async def aclose(self) -> None:
        self.closed.set()


async def test_session_idle_timeout_s_closes_an_idle_session_and_keeps_an_active_one() -> None:
    registry = SessionRegistry(Settings(_env_file=None, session_idle_timeout_s=0.4), Metrics())
    idle, active = Session(), Session()
    registry.add("idle", idle)
    registry.add("active", active)
    try:
        async with asyncio.timeout(10.0):  # the default (7 days) closes nothing
            while not idle.closed.is_set():
                active.last_activity = time.monotonic()
                await asyncio.sleep(0.05)
        assert registry.ids() == ["active"] and not active.closed.is_set()
    finally:
        await registry.aclose()


# --- semantic turns ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def turn_model() -> TurnModel:
    return TurnModel(fetch(default_dir()), batch_max=8)


async def test_turn_batch_max_caps_the_pauses_scored_together() -> None:
    model = await asyncio.to_thread(load_shared, Settings(_env_file=None, turn_batch_max=2))
    assert model is not None
    pause = np.zeros(3200, np.float32)
    clips = [np.concatenate([synthesize(text).audio16k.astype(np.float32), pause]) for text in ("So, um,", "and then")]
    scores = await asyncio.gather(*(model.score(clip) for clip in clips * 3))
    assert max(score.batch for score in scores) == 2  # the default (8) scores all six together


async def test_turn_threads_are_the_turn_models_onnx_runtime_threads() -> None:
    model = await asyncio.to_thread(load_shared, Settings(_env_file=None, turn_threads=3))
    assert model is not None
    assert model.weights.get().get_session_options().intra_op_num_threads == 3  # the default: 1


async def unfinished_turn_ends_after(
    asr_service: AsrService,
    settings: Settings,
    turn_model: TurnModel,
    silence_s: float,
    eagerness: Literal["low", "medium", "high", "auto"] | None = None,
) -> int | None:
    """ms of silence after 'I want to go to the' (its last word keeps the turn open) before the
    semantic turn ends at the eagerness cap; None when it has not ended after ``silence_s``."""
    recorder = Recorder()
    options = StreamOptions(
        transcription=TranscriptionOptions(language="en", with_segment_timestamps=False),
        server_vad=True,
        turn_detection="semantic",
        eagerness=eagerness,
    )
    session = StreamSession(asr_service, settings, recorder, options, turn_model=turn_model)
    try:
        assert session.semantic_turns
        speech = synthesize("I want to go to the").audio16k.astype(np.float32)
        await feed(session, np.concatenate([silence(0.5), speech]))
        speech_end_ms = session.samples_received * 1000 // SAMPLE_RATE_HZ
        await feed(session, silence(silence_s))
        stopped = recorder.of(SpeechStopped)
        return stopped[0].audio_end_ms - speech_end_ms if stopped else None
    finally:
        await session.aclose()


async def test_turn_eagerness_and_turn_wait_low_ms_set_the_cap_of_sessions_that_name_none(
    asr_service: AsrService, base_settings: Settings, turn_model: TurnModel
) -> None:
    settings = base_settings.model_copy(update={"turn_eagerness": "low", "turn_wait_low_ms": 1200})
    waited = await unfinished_turn_ends_after(asr_service, settings, turn_model, silence_s=3.0)
    # auto (medium, 4 s) or the default low (8 s) would still wait after 3 s of silence.
    assert waited is not None and 900 <= waited <= 2000, waited


async def test_turn_wait_high_ms_is_the_cap_of_eager_sessions(
    asr_service: AsrService, base_settings: Settings, turn_model: TurnModel
) -> None:
    settings = base_settings.model_copy(update={"turn_wait_high_ms": 800})
    waited = await unfinished_turn_ends_after(asr_service, settings, turn_model, silence_s=1.8, eagerness="high")
    assert waited is not None and 500 <= waited <= 1600, waited  # the default (2 s) has not ended it yet


# --- Realtime ------------------------------------------------------------------------------------


def test_realtime_prefix_padding_ms_is_the_padding_of_sessions_that_set_none() -> None:
    settings = Settings(_env_file=None, realtime_prefix_padding_ms=120)
    assert TurnDetection().segmenter(settings).preroll_ms == 120  # the default: 300
    assert TurnDetection().describe(settings)["prefix_padding_ms"] == 120
    assert TurnDetection(prefix_padding_ms=40).segmenter(settings).preroll_ms == 40  # a session's own wins


async def test_turn_wait_medium_ms_is_the_cap_of_medium_sessions(
    asr_service: AsrService, base_settings: Settings, turn_model: TurnModel
) -> None:
    settings = base_settings.model_copy(update={"turn_wait_medium_ms": 1200})
    waited = await unfinished_turn_ends_after(asr_service, settings, turn_model, silence_s=3.0, eagerness="medium")
    assert waited is not None and 900 <= waited <= 2000, waited  # the default (4 s) has not ended it yet


async def semantic_pause(
    asr_service: AsrService, settings: Settings, turn_model: TurnModel
) -> tuple[Recorder, list[int]]:
    """A semantic stream fed an unfinished turn and 1.5 s of silence: its events, and the pause's
    silence (ms) each time a final was started on it (a spy on the session's finals)."""
    recorder = Recorder()
    options = StreamOptions(
        transcription=TranscriptionOptions(language="en", with_segment_timestamps=False),
        server_vad=True,
        turn_detection="semantic",
        eagerness="low",
    )
    session = StreamSession(asr_service, settings, recorder, options, turn_model=turn_model)
    finals_at: list[int] = []
    real_start = session._finals.start

    def start(audio: Any, name: str) -> Any:
        finals_at.append(session._segmenter.silence_ms)
        return real_start(audio, name)

    session._finals.start = start  # type: ignore[method-assign]
    try:
        assert session.semantic_turns
        speech = synthesize("I want to go to the").audio16k.astype(np.float32)
        await feed(session, np.concatenate([silence(0.5), speech, silence(1.5)]))
        async with asyncio.timeout(30.0):
            while not recorder.of(TurnDecided):  # the model's answer on the pause
                await asyncio.sleep(0.01)
    finally:
        await session.aclose()
    return recorder, finals_at


async def test_turn_candidate_silence_ms_is_the_pause_the_turn_model_scores(
    asr_service: AsrService, base_settings: Settings, turn_model: TurnModel
) -> None:
    settings = base_settings.model_copy(update={"turn_candidate_silence_ms": 700})
    recorder, _ = await semantic_pause(asr_service, settings, turn_model)
    decided = recorder.of(TurnDecided)
    assert 700 <= decided[0].silence_ms < 800, decided  # the default: 200 ms


async def test_turn_final_silence_ms_is_the_pause_the_final_starts_at(
    asr_service: AsrService, base_settings: Settings, turn_model: TurnModel
) -> None:
    settings = base_settings.model_copy(update={"turn_final_silence_ms": 150})
    _, finals_at = await semantic_pause(asr_service, settings, turn_model)
    assert finals_at and 150 <= finals_at[0] < 200, finals_at  # the default: 30 ms
