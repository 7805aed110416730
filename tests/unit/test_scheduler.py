"""The ASR scheduler with a real tiny.en engine: batching, routing, priorities, bounds, failures."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from mediaserver.asr.engine import AsrJob, WhisperEngine
from mediaserver.asr.models import assemble_base_model, bundled_tiny_en_dir
from mediaserver.asr.scheduler import AsrScheduler, Superseded
from mediaserver.config import Settings
from mediaserver.errors import Overloaded
from mediaserver.events import Priority, Transcript, TranscriptionOptions
from tests.conftest import SENTENCES

OPTIONS = TranscriptionOptions(language="en", with_segment_timestamps=False)


@pytest.fixture(scope="module")
def engine() -> WhisperEngine:
    path = bundled_tiny_en_dir()
    assert path is not None
    return WhisperEngine("tiny.en", str(path), cpu_threads=2)


@pytest.fixture(scope="module")
def base_engine() -> WhisperEngine:
    return WhisperEngine("base", str(assemble_base_model(Settings().model_cache_dir, progress=False)), cpu_threads=2)


class Recorder:
    """Wraps an engine to record what each batch held (and optionally hold the worker).

    Without an engine it is a gated fake for the ordering tests, which care about which job runs
    when, not about what was said: each job's "transcript" is its key, returned at once. The tests
    of batching, WER and failures keep the real engine."""

    def __init__(self, engine: WhisperEngine | None = None) -> None:
        self.engine = engine
        self.batches: list[list[str]] = []
        self.backlogs: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.started_at = 0.0  # when the first batch reached the engine (monotonic)

    def __call__(self, jobs: Sequence[AsrJob], backlog: int) -> list[Transcript | BaseException]:
        if not self.started.is_set():
            self.started_at = time.monotonic()
        self.started.set()
        self.gate.wait(timeout=30)
        self.batches.append([JOB_KEYS.get(id(job.audio), "?") for job in jobs])
        self.backlogs.append(backlog)
        if self.engine is None:
            return [
                Transcript(JOB_KEYS.get(id(j.audio), "?"), "en", 1.0, j.audio.size / 16000, model="fake") for j in jobs
            ]
        return self.engine.transcribe_batch(jobs, backlog)


JOB_KEYS: dict[int, str] = {}


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Yield to the loop until ``check`` holds (the scheduler's state changes on the loop, not in time)."""
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0)


def job(speech: Any, key: str, **options: Any) -> AsrJob:
    audio = speech(key).audio16k.copy()  # a distinct array per job, so the recorder can tell them apart
    JOB_KEYS[id(audio)] = key
    return AsrJob(audio, TranscriptionOptions(**{"language": "en", **options}))


async def test_concurrent_jobs_form_batches_and_results_return_to_their_job(
    engine: WhisperEngine, speech: Any, wer: Any
) -> None:
    recorder = Recorder(engine)
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=4, max_wait_ms=50, max_queue=16)
    keys = ["kitchen", "weather", "remind", "music", "story", "garden", "kitchen", "weather"]
    try:
        results = await asyncio.gather(*(scheduler.submit(job(speech, k)) for k in keys))
    finally:
        await scheduler.aclose()
    for key, result in zip(keys, results, strict=True):
        assert wer(SENTENCES[key], result.text) <= 0.2, (key, result.text)
    assert sum(len(b) for b in recorder.batches) == len(keys)
    assert max(len(b) for b in recorder.batches) > 1
    assert len(recorder.batches) < len(keys)


async def test_finals_run_before_partials_before_files(speech: Any) -> None:
    recorder = Recorder()
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=1, max_wait_ms=0, max_queue=16)
    recorder.gate.clear()
    try:
        blocker = asyncio.ensure_future(scheduler.submit(job(speech, "kitchen")))
        await asyncio.to_thread(recorder.started.wait, 10)
        file_job = asyncio.ensure_future(scheduler.submit(job(speech, "story"), priority=Priority.FILE))
        partial = asyncio.ensure_future(scheduler.submit(job(speech, "music"), priority=Priority.PARTIAL))
        final = asyncio.ensure_future(scheduler.submit(job(speech, "weather"), priority=Priority.FINAL))
        await until(lambda: scheduler.depth == 3)  # all three queued behind the blocker
        recorder.gate.set()
        await asyncio.gather(blocker, file_job, partial, final)
    finally:
        await scheduler.aclose()
    assert [b[0] for b in recorder.batches] == ["kitchen", "weather", "music", "story"]
    # The engine learns how many jobs still wait behind each batch (its packing policy needs it).
    assert recorder.backlogs == [0, 2, 1, 0]


async def test_a_transcript_says_how_long_its_job_queued(speech: Any) -> None:
    """``queue_time_s``: from submit to the start of the job's batch, measured by the scheduler."""
    recorder = Recorder()
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=1, max_wait_ms=0, max_queue=16)
    recorder.gate.clear()
    try:
        before_first = time.monotonic()
        first = asyncio.ensure_future(scheduler.submit(job(speech, "kitchen")))
        await asyncio.to_thread(recorder.started.wait, 10)
        first_started = time.monotonic()
        second = asyncio.ensure_future(scheduler.submit(job(speech, "weather")))
        await asyncio.sleep(0.3)  # the second job waits behind the held first batch at least this long
        recorder.gate.set()
        done_first, done_second = await asyncio.gather(first, second)
        after = time.monotonic()
    finally:
        await scheduler.aclose()
    assert 0.0 <= done_first.queue_time_s <= first_started - before_first
    assert 0.3 <= done_second.queue_time_s <= after - first_started


async def test_full_queue_refuses_new_work(speech: Any) -> None:
    recorder = Recorder()
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=1, max_wait_ms=0, max_queue=2)
    recorder.gate.clear()
    try:
        running = asyncio.ensure_future(scheduler.submit(job(speech, "kitchen")))
        await asyncio.to_thread(recorder.started.wait, 10)
        queued = [asyncio.ensure_future(scheduler.submit(job(speech, k))) for k in ("music", "story")]
        await until(lambda: scheduler.depth == 2)
        scheduler.estimated_batch_s = 1.7  # as if measured
        with pytest.raises(Overloaded, match="overloaded") as refused:
            await scheduler.submit(job(speech, "garden"))
        # Retry-After: the two queued jobs take two batches of one at the measured batch time.
        assert refused.value.retryable and refused.value.retry_after_s == pytest.approx(2 * 1.7)
        recorder.gate.set()
        results = await asyncio.gather(running, *queued)
    finally:
        await scheduler.aclose()
    assert all(r.text for r in results)


async def test_jobs_nobody_waits_for_take_no_room_in_the_queue(speech: Any) -> None:
    """Callers that hung up (cancelled), timed out or were superseded leave their jobs in the queue
    until the worker reaches them, but a new caller is not refused for them."""
    recorder = Recorder()
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=1, max_wait_ms=0, max_queue=3)
    recorder.gate.clear()
    try:
        running = asyncio.ensure_future(scheduler.submit(job(speech, "kitchen")))
        await asyncio.to_thread(recorder.started.wait, 10)
        gone = [asyncio.ensure_future(scheduler.submit(job(speech, k))) for k in ("music", "story")]
        with pytest.raises(TimeoutError):
            await scheduler.submit(job(speech, "remind"), timeout_s=0.05)
        await until(lambda: scheduler.depth == 2)  # the timed-out one no longer counts
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        assert scheduler.depth == 0
        # Three queued jobs are still in the queue, none counts: three new ones fit, a fourth does not.
        waiting = [asyncio.ensure_future(scheduler.submit(job(speech, k))) for k in ("garden", "weather", "music")]
        await until(lambda: scheduler.open_jobs == 4)  # the running job's caller and these three
        assert scheduler.depth == 3
        with pytest.raises(Overloaded):
            await scheduler.submit(job(speech, "story"))
        recorder.gate.set()
        results = await asyncio.gather(running, *waiting)
        assert scheduler.depth == 0
    finally:
        await scheduler.aclose()
    assert all(r.text for r in results)
    assert [b[0] for b in recorder.batches] == ["kitchen", "garden", "weather", "music"]


async def test_a_failing_job_fails_alone(base_engine: WhisperEngine, speech: Any, wer: Any) -> None:
    recorder = Recorder(base_engine)
    scheduler = AsrScheduler("base", recorder, max_batch=4, max_wait_ms=50, max_queue=16)
    try:
        good = asyncio.ensure_future(scheduler.submit(job(speech, "kitchen")))
        # An invalid language code is a real failure inside faster-whisper's tokenizer.
        bad = asyncio.ensure_future(scheduler.submit(job(speech, "music", language="zz")))
        other = asyncio.ensure_future(scheduler.submit(job(speech, "weather")))
        results = await asyncio.gather(good, bad, other, return_exceptions=True)
    finally:
        await scheduler.aclose()
    assert any(len(b) > 1 for b in recorder.batches)  # they shared a batch
    assert isinstance(results[1], Exception)
    assert isinstance(results[0], Transcript) and wer(SENTENCES["kitchen"], results[0].text) <= 0.2
    assert isinstance(results[2], Transcript) and wer(SENTENCES["weather"], results[2].text) <= 0.2


async def test_deadline_and_cancellation_withdraw_queued_jobs(speech: Any) -> None:
    recorder = Recorder()
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=1, max_wait_ms=0, max_queue=16)
    recorder.gate.clear()
    try:
        running = asyncio.ensure_future(scheduler.submit(job(speech, "kitchen")))
        await asyncio.to_thread(recorder.started.wait, 10)
        with pytest.raises(TimeoutError):
            await scheduler.submit(job(speech, "story"), timeout_s=0.1)
        cancelled = asyncio.ensure_future(scheduler.submit(job(speech, "garden")))
        await until(lambda: scheduler.depth == 1)  # queued (the timed-out one does not count)
        cancelled.cancel()
        # The cancellation is taken (the job withdrawn) before the running batch ends: on a loaded
        # machine the batch thread's wake-up could otherwise reach the scheduler first.
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        recorder.gate.set()
        await running
        await scheduler.submit(job(speech, "music"))
    finally:
        await scheduler.aclose()
    ran = [b[0] for b in recorder.batches]
    assert ran == ["kitchen", "music"]


async def test_wait_never_exceeds_slack_of_most_urgent_job(speech: Any) -> None:
    # max_wait is huge, but the lone job's deadline is near: it must run instead of waiting for company.
    # The deadline (30 s) is far above the decode time on any machine, and the estimated batch time
    # leaves 2 s of slack: waiting for company (60 s) would miss the deadline, running now does not.
    recorder = Recorder()
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=8, max_wait_ms=60_000, max_queue=16)
    scheduler.estimated_batch_s = 28.0
    try:
        result = await scheduler.submit(job(speech, "kitchen"), timeout_s=30.0)
    finally:
        await scheduler.aclose()
    assert result.text
    assert recorder.batches == [["kitchen"]]


async def test_a_burst_of_arrivals_is_gathered_into_one_batch(engine: WhisperEngine, speech: Any, wer: Any) -> None:
    # Jobs arrive one at a time, each once the collector has taken the one before into the batch it
    # is gathering (submitted, no longer queued) and no batch has started: every arrival finds the
    # collector waiting for company, so they all share one batch instead of the first running alone
    # and the rest waiting for it. Decided by that order, not by arrivals timed to fall within
    # max_wait: the gaps are a few turns of the loop, far under it even on a loaded machine.
    recorder = Recorder(engine)
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=16, max_wait_ms=500, max_collect_ms=5000, max_queue=16)
    keys = ["kitchen", "weather", "remind", "music", "story", "garden", "kitchen", "weather"]
    jobs = [job(speech, k) for k in keys]  # synthesized before the first arrives
    submitted: list[asyncio.Future[Transcript]] = []
    try:
        for arrival in jobs:
            submitted.append(asyncio.ensure_future(scheduler.submit(arrival)))
            await until(lambda: scheduler.open_jobs == len(submitted) and scheduler.depth == 0)
            assert not recorder.started.is_set(), f"a batch started after {len(submitted)} arrival(s)"
        results = await asyncio.gather(*submitted)
    finally:
        await scheduler.aclose()
    assert recorder.batches == [keys]
    for key, result in zip(keys, results, strict=True):
        assert wer(SENTENCES[key], result.text) <= 0.2, (key, result.text)


async def test_a_lone_job_waits_only_max_wait_not_max_collect(speech: Any) -> None:
    recorder = Recorder()
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=16, max_wait_ms=20, max_collect_ms=60_000, max_queue=16)
    try:
        lone = job(speech, "kitchen")
        submitted_at = time.monotonic()
        first = asyncio.ensure_future(scheduler.submit(lone))
        assert await asyncio.to_thread(recorder.started.wait, 30)  # half max_collect: fails if it waited for that
        # It ran after about max_wait, far from max_collect: the same bound as 0.3 s of sleep gave.
        assert recorder.started_at - submitted_at < 0.3, recorder.started_at - submitted_at
        second = await scheduler.submit(job(speech, "music"))
        assert (await first).text and second.text
    finally:
        await scheduler.aclose()
    assert recorder.batches == [["kitchen"], ["music"]]


async def test_silence_never_reaches_the_decoder(engine: WhisperEngine) -> None:
    result = engine.transcribe_one(AsrJob(np.zeros(16000 * 3, np.float32), OPTIONS))
    assert result.text == "" and result.speech_detected is False


async def test_closed_scheduler_refuses_and_close_is_idempotent(engine: WhisperEngine, speech: Any) -> None:
    scheduler = AsrScheduler("tiny.en", engine.transcribe_batch)
    await scheduler.aclose()
    await scheduler.aclose()
    with pytest.raises(Overloaded):
        await scheduler.submit(job(speech, "kitchen"))


async def test_a_superseded_partial_is_dropped_not_computed(speech: Any) -> None:
    recorder = Recorder()
    scheduler = AsrScheduler("tiny.en", recorder, max_batch=1, max_wait_ms=0, max_queue=16)
    recorder.gate.clear()
    try:
        running = asyncio.ensure_future(scheduler.submit(job(speech, "kitchen")))
        await asyncio.to_thread(recorder.started.wait, 10)
        older = asyncio.ensure_future(
            scheduler.submit(job(speech, "music"), priority=Priority.PARTIAL, supersede_key="session-1")
        )
        other_session = asyncio.ensure_future(
            scheduler.submit(job(speech, "garden"), priority=Priority.PARTIAL, supersede_key="session-2")
        )
        await until(lambda: scheduler.depth == 2)  # both queued before the newer one comes
        newer = asyncio.ensure_future(
            scheduler.submit(job(speech, "story"), priority=Priority.PARTIAL, supersede_key="session-1")
        )
        with pytest.raises(Superseded):
            await older
        recorder.gate.set()
        await asyncio.gather(running, other_session, newer)
    finally:
        await scheduler.aclose()
    ran = [b[0] for b in recorder.batches]
    assert "music" not in ran
    assert sorted(ran) == ["garden", "kitchen", "story"]


async def test_mixed_languages_tasks_and_options_in_one_batch(
    base_engine: WhisperEngine, speech: Any, wer: Any
) -> None:
    recorder = Recorder(base_engine)
    scheduler = AsrScheduler("base", recorder, max_batch=8, max_wait_ms=100, max_queue=16)
    jobs = [
        job(speech, "kitchen"),  # English, forced
        job(speech, "weather", language=None),  # detect
        job(speech, "music", task="translate", language=None),  # translate
        job(speech, "story", beam_size=3),
        job(speech, "garden", with_segment_timestamps=False),
    ]
    try:
        results = await asyncio.gather(*(scheduler.submit(j) for j in jobs))
    finally:
        await scheduler.aclose()
    assert len(recorder.batches) == 1 and len(recorder.batches[0]) == 5  # one batch held them all
    for key, result in zip(["kitchen", "weather", "music", "story", "garden"], results, strict=True):
        assert wer(SENTENCES[key], result.text) <= 0.25, (key, result.text)
    probability = results[1].language_probability
    assert results[1].language == "en" and probability is not None and probability > 0.5
    assert results[2].task == "translate"
    assert results[0].segments and results[4].segments


async def test_with_two_replicas_two_batches_run_at_once(
    tiny_two_replicas: WhisperEngine, speech: Any, wer: Any
) -> None:
    """The second batch starts while the first is still in the engine, each on a replica of its own."""
    inside = 0
    most_inside = 0
    lock = threading.Lock()

    def batch_fn(jobs: Sequence[AsrJob], backlog: int) -> list[Transcript | BaseException]:
        nonlocal inside, most_inside
        with lock:
            inside += 1
            most_inside = max(most_inside, inside)
        try:
            return tiny_two_replicas.transcribe_batch(jobs, backlog)
        finally:
            with lock:
                inside -= 1

    scheduler = AsrScheduler("tiny.en", batch_fn, max_batch=2, max_wait_ms=5, max_inflight_batches=2)
    keys = ["kitchen", "weather", "remind", "music", "story", "garden"]
    try:
        results = await asyncio.gather(*(scheduler.submit(job(speech, k)) for k in keys))
    finally:
        await scheduler.aclose()
    assert most_inside == 2
    for key, result in zip(keys, results, strict=True):
        assert wer(SENTENCES[key], result.text) <= 0.2, (key, result.text)


@pytest.fixture(scope="module")
def tiny_two_replicas() -> WhisperEngine:
    path = bundled_tiny_en_dir()
    assert path is not None
    return WhisperEngine("tiny.en", str(path), cpu_threads=1, replicas=2)
