"""Pieces of the remote engines that need no server: prefix alignment, long-audio windows, URLs,
settings, the scheduler's async path (batches in flight at once, cancelled when nobody waits), and
what an answer that reports no scores becomes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import numpy as np
import pytest

from mediaserver.asr.engine import AsrJob
from mediaserver.asr.remote import force_prefix, redact_url
from mediaserver.asr.remote_openai import OpenAIEngine
from mediaserver.asr.scheduler import AsrScheduler
from mediaserver.asr.triton import split_long
from mediaserver.config import RemoteModel, Settings
from mediaserver.errors import Overloaded
from mediaserver.events import Transcript, TranscriptionOptions
from mediaserver.transport.openai.transcription_stream import word_logprobs
from mediaserver.transport.openai.transcriptions import to_verbose_json


@pytest.mark.parametrize(
    ("prefix", "text", "expected"),
    [
        (None, "hello there", "hello there"),
        ("Turn on the", "Turn on the kitchen lights.", "Turn on the kitchen lights."),
        ("Turn on the", "turn on the kitchen lights.", "Turn on the kitchen lights."),  # case and punctuation
        ("Turn on, the", "Turn on the kitchen lights.", "Turn on, the kitchen lights."),
        ("What is the weather", "What's the weather like?", "What is the weather like?"),  # merged words
        ("Set a timer", "Set the timer for ten minutes.", "Set a timer for ten minutes."),  # promised words win
        ("Hello", "", "Hello"),
    ],
)
def test_force_prefix_keeps_what_partials_promised(prefix: str | None, text: str, expected: str) -> None:
    assert force_prefix(prefix, text) == expected


def test_split_long_cuts_at_the_quiet_frames_and_keeps_every_sample() -> None:
    rng = np.random.default_rng(0)
    second = 16000
    speech = [rng.standard_normal(10 * second).astype(np.float32) * 0.3 for _ in range(7)]
    gaps = [np.zeros(second // 2, np.float32) for _ in range(7)]
    audio = np.concatenate([part for pair in zip(speech, gaps, strict=True) for part in pair])  # 73.5 s
    pieces = split_long(audio)
    assert sum(p.size for p in pieces) == audio.size
    assert np.array_equal(np.concatenate(pieces), audio)
    assert all(p.size <= 28 * second for p in pieces) and len(pieces) == 4
    for piece in pieces[:-1]:  # each cut fell in a gap: the piece ends in silence
        assert float(np.abs(piece[-240:]).max()) == 0.0
    assert split_long(audio[: 5 * second])[0].size == 5 * second


def test_redact_url() -> None:
    assert redact_url("http://user:secret@host:8000/v1") == "http://host:8000/v1"
    assert redact_url("grpc://triton:8001") == "grpc://triton:8001"


def test_credentials_in_the_url_and_an_api_key_are_refused_at_start() -> None:
    # Both failed every request with a 502 (two Authorization headers), an operator trial found.
    with pytest.raises(ValueError, match=r"in the url .* or as api_key, not both"):
        RemoteModel(backend="openai", url="http://user:pass@asr.lan/v1", api_key="k")
    assert RemoteModel(backend="openai", url="http://user:pass@asr.lan/v1").api_key is None
    assert RemoteModel(backend="openai", url="http://asr.lan/v1", api_key="k").api_key is not None


def test_remote_models_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "MEDIASERVER_REMOTE_MODELS",
        '{"large": {"backend": "openai", "url": "http://vllm:8000/v1", "api_key": "sk-secret", "max_concurrency": 32}}',
    )
    remote = Settings().remote_models["large"]
    assert remote.backend == "openai" and remote.max_concurrency == 32 and remote.timeout_s == 60.0
    assert remote.api_key is not None and remote.api_key.get_secret_value() == "sk-secret"
    assert "sk-secret" not in repr(remote)
    monkeypatch.setenv("MEDIASERVER_REMOTE_MODELS", '{"x": {"backend": "grpc", "url": "u"}}')
    with pytest.raises(ValueError, match="backend"):
        Settings()


def _transcript(job: AsrJob) -> Transcript:
    return Transcript(text="ok", language="en", language_probability=1.0, duration_s=job.audio.size / 16000)


async def test_async_batches_run_side_by_side_and_are_cancelled_when_nobody_waits() -> None:
    # The batch function stands in for a remote backend: the scheduler's contract is what is tested.
    release = asyncio.Event()
    running = 0
    most = 0
    cancelled = 0

    async def batch(jobs: Sequence[AsrJob], backlog: int) -> list[Transcript | BaseException]:
        nonlocal running, most, cancelled
        running += 1
        most = max(most, running)
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled += 1
            raise
        finally:
            running -= 1
        return [_transcript(job) for job in jobs]

    scheduler = AsrScheduler("m", None, async_batch_fn=batch, max_batch=1, max_inflight_batches=3, max_wait_ms=0)
    job = AsrJob(np.zeros(16000, np.float32), TranscriptionOptions())
    try:
        waiting = [asyncio.create_task(scheduler.submit(job)) for _ in range(4)]
        while running < 3:
            await asyncio.sleep(0.01)
        # Three in flight hold every slot (the worker cannot take a fourth), and the fourth is queued.
        assert scheduler._inflight.locked()
        assert most == 3 and scheduler.depth == 1
        waiting[0].cancel()  # its batch has no other caller: cancelled with it
        while cancelled < 1:
            await asyncio.sleep(0.01)
        release.set()
        results = await asyncio.gather(*waiting[1:])
        assert [r.text for r in results] == ["ok"] * 3
        with pytest.raises(asyncio.CancelledError):
            await waiting[0]
        assert not scheduler._inflight_tasks
    finally:
        await scheduler.aclose()


async def test_retry_after_counts_the_batches_a_remote_engine_runs_side_by_side() -> None:
    """A full queue's Retry-After: queued batches / ``max_inflight_batches`` x the measured batch time."""
    release = asyncio.Event()
    running = 0

    async def batch(jobs: Sequence[AsrJob], backlog: int) -> list[Transcript | BaseException]:
        nonlocal running
        running += 1
        await release.wait()
        return [_transcript(job) for job in jobs]

    scheduler = AsrScheduler(
        "m", None, async_batch_fn=batch, max_batch=1, max_inflight_batches=3, max_wait_ms=0, max_queue=6
    )
    job = AsrJob(np.zeros(16000, np.float32), TranscriptionOptions())
    try:
        waiting = [asyncio.create_task(scheduler.submit(job)) for _ in range(3)]
        while running < 3:
            await asyncio.sleep(0.01)
        waiting += [asyncio.create_task(scheduler.submit(job)) for _ in range(6)]
        while scheduler.depth < 6:
            await asyncio.sleep(0.01)
        scheduler.estimated_batch_s = 1.5  # as if measured
        with pytest.raises(Overloaded) as refused:
            await scheduler.submit(job)
        assert refused.value.retry_after_s == pytest.approx(6 / 3 * 1.5)  # not 6 x 1.5: three at a time
        release.set()
        await asyncio.gather(*waiting)
    finally:
        await scheduler.aclose()


def test_exactly_one_batch_function() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        AsrScheduler("m", None)


def _openai_engine() -> OpenAIEngine:
    config = RemoteModel(backend="openai", url="http://127.0.0.1:9/v1", model="whisper-1", multilingual=False)
    return OpenAIEngine("remote", config)


def test_what_a_remote_server_does_not_report_is_left_out_not_made_up() -> None:
    """A text-only answer (``json``, or Triton's) has no language probability and no decode scores:
    verbose_json leaves the scores out, and logprobs the words without a probability."""
    job = AsrJob(np.zeros(16000, np.float32), TranscriptionOptions(language="en"))
    engine = _openai_engine()
    text_only = engine._parse(job, json.dumps({"text": "Turn on the lights."}).encode(), 0.1)
    assert text_only.language_probability is None
    (segment,) = text_only.segments
    assert (segment.temperature, segment.avg_logprob, segment.compression_ratio, segment.no_speech_prob) == (
        None,
        None,
        None,
        None,
    )
    verbose = to_verbose_json(text_only, "transcribe", {"segment"})
    assert verbose["segments"][0].keys() == {"id", "seek", "start", "end", "text", "tokens"}
    assert verbose["segments"][0]["text"] == " Turn on the lights."
    # What the server did report is passed on as it was; its words carry no probability.
    answer = {
        "text": "Turn on the lights.",
        "language": "english",
        "segments": [
            {"start": 0.0, "end": 1.0, "text": " Turn on", "temperature": 0.0, "avg_logprob": -0.25,
             "compression_ratio": 0.9, "no_speech_prob": 0.01},
            {"start": 1.0, "end": 2.0, "text": " the lights.", "avg_logprob": -0.5},
        ],
        "words": [{"word": "Turn", "start": 0.0, "end": 0.4}, {"word": "lights", "start": 1.2, "end": 1.8}],
    }  # fmt: skip
    scored = engine._parse(job, json.dumps(answer).encode(), 0.1)
    first, second = to_verbose_json(scored, "transcribe", {"segment"})["segments"]
    assert (first["temperature"], first["avg_logprob"], first["compression_ratio"], first["no_speech_prob"]) == (
        0.0,
        -0.25,
        0.9,
        0.01,
    )
    assert second["avg_logprob"] == -0.5 and not {"temperature", "compression_ratio", "no_speech_prob"} & second.keys()
    assert [w.word for w in scored.words] == [" Turn", " lights"]
    assert all(w.probability is None for w in scored.words) and word_logprobs(scored.segments) == []


async def test_closing_stops_the_probe_loop_even_as_a_probe_answers() -> None:
    """A remote engine's aclose cancels its health probe loop and waits for it. A cancellation that
    arrives just as a probe answers must still end the loop (Python 3.11's ``asyncio.wait_for``
    swallowed it, CPython gh-86296: the loop ran on and aclose hung, in CI). A probe that answers at
    once puts that moment in nearly every cycle; a real upstream hits it only now and then."""

    class AnswersAtOnce(OpenAIEngine):
        async def _probe(self) -> None:
            await asyncio.sleep(0)

    config = RemoteModel(backend="openai", url="http://127.0.0.1:9/v1", model="tiny.en", probe_interval_s=0.001)
    for cycle in range(100):
        engine = AnswersAtOnce("tiny.en", config)
        engine.start()
        for _ in range(cycle % 7):  # cancel at each step of the loop in turn
            await asyncio.sleep(0)
        closing = asyncio.create_task(engine.aclose())
        done, _ = await asyncio.wait({closing}, timeout=5.0)
        assert closing in done, f"aclose hung in cycle {cycle}"


def test_a_remote_multilingual_model_keeps_cantonese() -> None:
    """Whether a remote server's model has Whisper's Cantonese token is for it to say: 'yue' is listed
    and passed through, as it was before the bundled models were held to their vocabulary (a review)."""
    from mediaserver.asr.models import ModelRegistry
    from mediaserver.events import TranscriptionOptions

    settings = Settings(_env_file=None, remote_models={"large": {"backend": "openai", "url": "http://vllm:8000/v1"}})
    registry = ModelRegistry(settings)
    assert registry.has_cantonese("large") and "yue" in registry.languages("large")
    registry.check_options("large", TranscriptionOptions(language="yue"))
