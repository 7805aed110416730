"""ASR settings at non-default values: each builds its own ``AsrService`` (the bundled tiny.en, loaded
in about a second) and shows what the setting changes, where the shared service runs the defaults."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from mediaserver.asr.engine import AsrJob, WhisperEngine
from mediaserver.asr.models import ModelRegistry, bundled_tiny_en_dir
from mediaserver.asr.service import AsrService
from mediaserver.asr.windows import Window
from mediaserver.config import Settings
from mediaserver.devices import choose_device
from mediaserver.events import SAMPLE_RATE_HZ, Transcript, TranscriptionOptions
from mediaserver.metrics import Metrics
from tests.conftest import SENTENCES, synthesize

OPTIONS = TranscriptionOptions(language="en", with_segment_timestamps=False)


@contextlib.asynccontextmanager
async def service(base_settings: Settings, **overrides: Any) -> AsyncIterator[AsrService]:
    """A service of its own with tiny.en loaded, on ``base_settings`` with ``overrides``."""
    settings = base_settings.model_copy(update={"asr_preload_models": ["tiny.en"], **overrides})
    asr = AsrService(settings, choose_device("cpu", "auto", 2), ModelRegistry(settings), Metrics())
    await asr.start()
    try:
        yield asr
    finally:
        await asr.aclose()


async def engine_of(asr: AsrService) -> WhisperEngine:
    engine = (await asr.get_model("tiny.en")).engine
    assert isinstance(engine, WhisperEngine)
    return engine


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE_HZ), np.float32)


def kitchen() -> np.ndarray:
    return synthesize(SENTENCES["kitchen"]).audio16k.astype(np.float32)


async def test_max_loaded_models_unloads_the_least_recently_used(base_settings: Settings) -> None:
    tiny = str(bundled_tiny_en_dir())
    async with service(base_settings, max_loaded_models=1, asr_extra_models={"tiny-copy": tiny}) as asr:
        assert asr.loaded_models == ["tiny.en"]
        result = await asr.transcribe(kitchen(), OPTIONS, model="tiny-copy")
        assert "kitchen" in result.text.lower()
        assert asr.loaded_models == ["tiny-copy"]  # the default (4) keeps both


async def test_vad_min_speech_ms_makes_a_short_command_silence(base_settings: Settings) -> None:
    audio = kitchen()  # about 3 s of speech, well over the default 120 ms
    async with service(base_settings, vad_min_speech_ms=6000) as asr:
        result = await asr.transcribe(audio, OPTIONS)
    assert (result.text, result.speech_detected) == ("", False)


async def test_asr_batching_off_decodes_each_job_with_faster_whispers_own_loop(base_settings: Settings) -> None:
    async with service(base_settings, asr_batching=False) as asr:
        engine = await engine_of(asr)
        result = await asr.transcribe(kitchen(), OPTIONS)
        assert "kitchen" in result.text.lower()
        assert (engine.counters["sequential"], engine.counters["windows"]) == (1, 0)  # batched: (0, 1)


async def test_asr_vad_filter_off_encodes_the_silence_too(base_settings: Settings) -> None:
    """20 s of silence, a command, 15 s of silence: Silero VAD keeps one window of speech; without
    it the whole 38 s is cut into windows."""
    audio = np.concatenate([silence(20.0), kitchen(), silence(15.0)])
    async with service(base_settings, asr_vad_filter=False) as asr:
        engine = await engine_of(asr)
        result = await asr.transcribe(audio, OPTIONS)
        assert "kitchen" in result.text.lower()
        assert engine.counters["windows"] >= 2  # with the filter: 1


async def test_asr_speech_pad_ms_pads_the_speech_window(base_settings: Settings) -> None:
    audio = kitchen()
    padded = np.concatenate([silence(5.0), audio, silence(5.0)])
    seen: list[float] = []
    async with service(base_settings, asr_speech_pad_ms=2000) as asr:
        engine = await engine_of(asr)
        real_run = engine._decoder._run

        def spy(windows: Any) -> Any:
            seen.extend(w.audio.size / SAMPLE_RATE_HZ for w in windows)
            return real_run(windows)

        engine._decoder._run = spy  # type: ignore[method-assign]
        result = await asr.transcribe(padded, OPTIONS)
    assert "kitchen" in result.text.lower()
    # The speech (at most the clip) plus 2 s either side; the default 300 ms gives at most clip + 0.6 s.
    assert seen and seen[0] >= audio.size / SAMPLE_RATE_HZ + 3.0, seen


async def test_asr_encoder_max_windows_sets_the_windows_per_encoder_call(base_settings: Settings) -> None:
    clips = [synthesize(SENTENCES[key]).audio16k.astype(np.float32) for key in ("kitchen", "weather", "music")]
    jobs = [AsrJob(clip, OPTIONS) for clip in clips]
    calls: list[int] = []
    async with service(base_settings, asr_encoder_max_windows=1) as asr:
        engine = await engine_of(asr)
        real_encode = engine.model.encode

        def counting_encode(features: np.ndarray) -> Any:
            calls.append(len(features))
            return real_encode(features)

        engine.model.encode = counting_encode
        results = await asyncio.to_thread(engine.transcribe_batch, jobs)
    assert all(isinstance(r, Transcript) and r.text for r in results), results
    assert calls[:3] == [1, 1, 1], calls  # the default, 2: [2, 1]


async def test_asr_replicas_runs_two_batches_at_once(base_settings: Settings) -> None:
    """Two jobs in batches of one: with two replicas the second batch is encoded while the first
    is, which one replica never does (the first waits in its encoder until the second arrives)."""
    inside = 0
    most = 0
    lock = threading.Lock()
    both = threading.Event()
    async with service(base_settings, asr_replicas=2, asr_max_batch=1) as asr:
        engine = await engine_of(asr)
        assert engine.replicas == 2
        real_encode = engine.model.encode

        def encode(features: np.ndarray) -> Any:
            nonlocal inside, most
            with lock:
                inside += 1
                most = max(most, inside)
                if inside == 2:
                    both.set()
            both.wait(timeout=10.0)
            try:
                return real_encode(features)
            finally:
                with lock:
                    inside -= 1

        engine.model.encode = encode
        results = await asyncio.gather(*(asr.transcribe(kitchen(), OPTIONS) for _ in range(2)))
    assert all("kitchen" in r.text.lower() for r in results)
    assert most == 2


# --- the scheduler: how long a batch collects -------------------------------------------------------


async def seconds_to_the_engine(asr: AsrService) -> float:
    """Seconds from a lone job's submission to its batch reaching the engine (a spy on the
    scheduler's call into the engine): how long the scheduler collected before closing the batch."""
    scheduler = (await asr.get_model("tiny.en")).scheduler
    real = scheduler._batch_fn
    assert real is not None
    reached: list[float] = []

    def spy(jobs: Any, backlog: int) -> Any:
        reached.append(time.monotonic())
        return real(jobs, backlog)

    scheduler._batch_fn = spy
    submitted = time.monotonic()
    await asr.transcribe(silence(1.0), OPTIONS)
    assert len(reached) == 1
    return reached[0] - submitted


async def test_asr_max_wait_ms_keeps_a_lone_jobs_batch_open_that_long(base_settings: Settings) -> None:
    async with service(base_settings, asr_max_wait_ms=400) as asr:
        waited = await seconds_to_the_engine(asr)
    assert waited >= 0.4, waited  # the default (5 ms, at most the 50 ms collect) sends it at once


async def test_asr_max_collect_ms_lets_a_batch_collect_while_jobs_keep_coming(base_settings: Settings) -> None:
    """A job every 150 ms, each within the 800 ms wait of the last: a 5 s collect limit gathers all
    ten into one batch. At the default (50 ms, raised to the wait) the batch closes 800 ms after
    its first job, with about six."""
    sizes: list[int] = []
    settings = {"asr_max_wait_ms": 800, "asr_max_collect_ms": 5000, "asr_max_batch": 64}
    async with service(base_settings, **settings) as asr:
        scheduler = (await asr.get_model("tiny.en")).scheduler
        real = scheduler._batch_fn
        assert real is not None

        def spy(jobs: Any, backlog: int) -> Any:
            sizes.append(len(jobs))
            return real(jobs, backlog)

        scheduler._batch_fn = spy
        jobs = []
        for _ in range(10):  # the arrivals are paced (a client's rate), nothing waits on the sleep
            jobs.append(asyncio.ensure_future(asr.transcribe(silence(0.5), OPTIONS)))
            await asyncio.sleep(0.15)
        await asyncio.gather(*jobs)
    assert sizes == [10], sizes


# --- packing short jobs into shared windows ------------------------------------------------------------


async def decode_together(asr: AsrService, backlog: int = 0) -> tuple[WhisperEngine, list[Window]]:
    """Three commands in one engine batch with ``backlog`` more said to wait: the windows decoded."""
    engine = await engine_of(asr)
    seen: list[Window] = []
    real_run = engine._decoder._run

    def spy(windows: Any) -> Any:
        seen.extend(windows)
        return real_run(windows)

    engine._decoder._run = spy  # type: ignore[method-assign]
    jobs = [AsrJob(synthesize(SENTENCES[k]).audio16k.astype(np.float32), OPTIONS) for k in PACKED]
    results = await asyncio.to_thread(engine.transcribe_batch, jobs, backlog)
    assert all(isinstance(r, Transcript) and r.text for r in results), results
    engine._decoder._run = real_run  # type: ignore[method-assign]
    return engine, seen


PACKED = ("kitchen", "weather", "music")


async def test_asr_pack_min_waiting_and_gap_s_pack_three_jobs_with_the_gap_between(base_settings: Settings) -> None:
    """Three jobs: the default min_waiting (asr_max_batch + 1 = 9) decodes each alone; at 2 they
    share a window, each 3 s of silence from the next (the default gap: 1 s)."""
    async with service(base_settings, asr_pack_min_waiting=2, asr_pack_gap_s=3.0) as asr:
        _, windows = await decode_together(asr)
    members = windows[0].members
    assert len(members) == 3, [len(w.members) for w in windows]
    gaps = [b.window_start_s - a.window_end_s for a, b in itertools.pairwise(members)]
    assert all(abs(gap - 3.0) < 0.01 for gap in gaps), gaps


async def test_asr_pack_max_job_s_decodes_longer_jobs_alone(base_settings: Settings) -> None:
    async with service(base_settings, asr_pack_min_waiting=2, asr_pack_max_job_s=1.0) as asr:
        engine, windows = await decode_together(asr)
    # Every command is over 1 s: none is packed (the default 10 s packs all three).
    assert not any(w.packed for w in windows) and engine.counters["jobs_alone"] == 3


async def test_asr_pack_max_window_s_caps_the_packed_audio(base_settings: Settings) -> None:
    durations = sorted(synthesize(SENTENCES[k]).audio16k.size / SAMPLE_RATE_HZ for k in PACKED)
    # Room for the two shortest and the gap between them, not for the third (the default 24 s holds all).
    limit = durations[0] + durations[1] + 1.0 + 0.9
    async with service(base_settings, asr_pack_min_waiting=2, asr_pack_max_window_s=limit) as asr:
        _, windows = await decode_together(asr)
    packed = [w for w in windows if w.packed]
    assert [len(w.members) for w in packed] == [2], [len(w.members) for w in windows]
    assert packed[0].duration_s <= limit


async def test_asr_pack_min_saving_s_packs_only_when_the_encoder_time_saved_is_worth_it(
    base_settings: Settings,
) -> None:
    """With the encoder measured at 1 s a window: three jobs save 3 s, under a 5 s minimum (the
    default 1 s packs them); six waiting (three here, three queued) save 6 s and are packed."""
    async with service(base_settings, asr_pack_min_waiting=2, asr_pack_min_saving_s=5.0) as asr:
        engine = await engine_of(asr)
        engine.packing_policy.encode_s_per_window = 1.0  # as measured (a real one varies with the machine)
        _, alone = await decode_together(asr)
        engine.packing_policy.encode_s_per_window = 1.0
        _, packed = await decode_together(asr, backlog=3)
    assert not any(w.packed for w in alone)
    assert [len(w.members) for w in packed if w.packed] == [3], [len(w.members) for w in packed]


async def test_asr_lead_silence_ms_puts_silence_before_speech_said_at_once(base_settings: Settings) -> None:
    """A job whose speech starts at once (cut at its first loud sample) is decoded after
    ``asr_lead_silence_ms`` of silence, its timestamps without it; speech that starts later, or the
    setting at 0, gets none (tools/eval_lead.py)."""
    audio = kitchen()
    at_once = audio[int(np.nonzero(np.abs(audio) > 0.01)[0][0]) :]
    options = TranscriptionOptions(language="en", with_segment_timestamps=True)
    for value in (100, 300, 0):
        leads: list[float] = []
        async with service(base_settings, asr_lead_silence_ms=value) as asr:
            engine = await engine_of(asr)
            real_run = engine._decoder._run

            def spy(windows: list[Window], real_run: Any = real_run, leads: list[float] = leads) -> Any:
                leads.extend(w.lead_s for w in windows)
                return real_run(windows)

            engine._decoder._run = spy  # type: ignore[method-assign,assignment]
            result = await asr.transcribe(at_once, options)
            later = await asr.transcribe(np.concatenate([silence(1.0), audio]), options)
        assert "kitchen" in result.text.lower() and "kitchen" in later.text.lower()
        assert len(leads) == 2, leads
        # Silero finds the speech within a frame or two of the cut: a lead of nearly all the setting.
        assert value / 1000 - 0.07 <= leads[0] <= value / 1000 and leads[1] == 0.0, (value, leads)
        duration_s = at_once.size / SAMPLE_RATE_HZ
        first, last = result.segments[0], result.segments[-1]
        assert 0.0 <= first.start_s < 0.3 and last.end_s <= duration_s + 0.01, (result.segments, duration_s)
