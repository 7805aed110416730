"""Diarized transcripts (``response_format=diarized_json``) end to end: a real server, the real
``openai`` SDK, the real GE2E speaker encoder and Whisper, and real human recordings.

The conversation is the LibriVox reader (6 s), JFK (5 s), the reader again (another sentence), each
clip's leading and trailing silence cut, so the true turn boundaries are where the clips meet.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from mediaserver.config import Settings
from mediaserver.speakers.diarize import cluster
from mediaserver.speakers.fetch import default_dir, fetch
from mediaserver.speakers.service import SpeakerService
from tests.conftest import Clip, LiveServer
from tests.human_speech import voiced_span, wav_bytes

HumanClips = list[tuple[str, np.ndarray, str]]
RATE = 16_000
BOUNDARY_TOLERANCE_S = 1.0


@pytest.fixture(scope="module", autouse=True)
def speaker_model() -> Path:
    return fetch(default_dir())


def clip(human_clips: HumanClips, name: str, max_s: float | None = None) -> np.ndarray:
    [audio] = [a for n, a, _ in human_clips if n == name]
    start, end = voiced_span(audio)
    trimmed: np.ndarray = audio[start:end]
    return trimmed[: int(max_s * RATE)] if max_s else trimmed


def conversation(human_clips: HumanClips) -> tuple[np.ndarray, list[tuple[str, float, float]]]:
    """The reader, JFK, the reader: the audio and the true (who, start, end) turns."""
    parts = [
        ("reader", clip(human_clips, "librivox_0870", 6.0)),
        ("jfk", clip(human_clips, "jfk", 5.0)),
        ("reader", clip(human_clips, "librivox_0920")),
    ]
    truth, t = [], 0.0
    for who, audio in parts:
        truth.append((who, t, t + audio.size / RATE))
        t += audio.size / RATE
    return np.concatenate([a for _, a in parts]), truth


def data_url(audio: np.ndarray) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav_bytes(audio)).decode("ascii")


@pytest.fixture
async def server(server_factory: Callable[..., Any], tmp_path: Path) -> LiveServer:
    live: LiveServer = await server_factory(speakers_dir=tmp_path)
    return live


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as sdk:
        yield sdk


def turns_of(segments: list[Any]) -> list[tuple[str, float, float]]:
    """Consecutive segments of one speaker joined: (speaker, start, end)."""
    found: list[tuple[str, float, float]] = []
    for seg in segments:
        if found and found[-1][0] == seg.speaker:
            found[-1] = (seg.speaker, found[-1][1], seg.end)
        else:
            found.append((seg.speaker, seg.start, seg.end))
    return found


async def diarized(client: openai.AsyncOpenAI, audio: np.ndarray, **extra: Any) -> Any:
    return await client.audio.transcriptions.create(
        model="gpt-4o-transcribe-diarize",
        file=("talk.wav", wav_bytes(audio)),
        response_format="diarized_json",
        chunking_strategy="auto",
        **extra,
    )


async def test_two_speakers_are_found_in_order_with_their_words(
    client: openai.AsyncOpenAI, human_clips: HumanClips
) -> None:
    audio, truth = conversation(human_clips)
    result = await diarized(client, audio)
    assert result.task == "transcribe"
    assert result.duration == pytest.approx(audio.size / RATE, abs=0.01)
    assert result.usage is not None and result.usage.type == "duration"
    assert all(seg.type == "transcript.text.segment" for seg in result.segments)
    assert len({seg.id for seg in result.segments}) == len(result.segments)
    turns = turns_of(result.segments)
    speakers = [who for who, _, _ in turns]
    assert speakers == ["A", "B", "A"], turns
    errors = [abs(found[2] - true[2]) for found, true in zip(turns[:2], truth[:2], strict=True)]
    errors += [abs(found[1] - true[1]) for found, true in zip(turns[1:], truth[1:], strict=True)]
    print(f"turns {turns}; truth {truth}; boundary errors {[round(e, 2) for e in errors]} s")
    assert max(errors) < BOUNDARY_TOLERANCE_S, (turns, truth)
    texts = [" ".join(s.text for s in result.segments if s.speaker == who).lower() for who in ("A", "B")]
    assert "dashwood" in texts[0] and "amiable" in texts[0], texts
    assert "americans" in texts[1] and "dashwood" not in texts[1], texts  # JFK's first 5 s
    assert result.text == " ".join(seg.text for seg in result.segments)


async def test_a_known_speaker_is_named_and_the_other_is_a(client: openai.AsyncOpenAI, human_clips: HumanClips) -> None:
    audio, _ = conversation(human_clips)
    reference = clip(human_clips, "librivox_0890")  # the reader, in a sentence not in the audio
    result = await diarized(
        client, audio, known_speaker_names=["reader"], known_speaker_references=[data_url(reference)]
    )
    assert [who for who, _, _ in turns_of(result.segments)] == ["reader", "A", "reader"]
    jfk = " ".join(s.text for s in result.segments if s.speaker == "A").lower()
    assert "americans" in jfk, result.segments


async def test_a_reference_of_someone_absent_names_nobody(client: openai.AsyncOpenAI, human_clips: HumanClips) -> None:
    audio, _ = conversation(human_clips)
    other = clip(human_clips, "arctic_a0009")  # another woman, not in the audio
    result = await diarized(client, audio, known_speaker_names=["slt"], known_speaker_references=[data_url(other)])
    assert [who for who, _, _ in turns_of(result.segments)] == ["A", "B", "A"]


async def test_one_speaker_alone_has_one_label(client: openai.AsyncOpenAI, human_clips: HumanClips) -> None:
    audio = np.concatenate([clip(human_clips, "librivox_0870"), clip(human_clips, "librivox_0920")])
    result = await diarized(client, audio)
    assert {seg.speaker for seg in result.segments} == {"A"}
    assert "dashwood" in result.text.lower()


@pytest.mark.parametrize("audio_of", ["a short command", "silence"])
async def test_a_recording_too_short_to_tell_speakers_apart_keeps_its_words(
    client: openai.AsyncOpenAI, speech: Callable[[str], Clip], audio_of: str
) -> None:
    """A trial's 1.4 s "Turn on the kitchen lights." came back with no text at all: no window had
    the speech the speaker encoder needs, so there was no turn to transcribe. It is one turn of A
    now; silence still gives no words."""
    audio = speech("kitchen").audio16k if audio_of == "a short command" else np.zeros(RATE, np.float32)
    result = await diarized(client, audio)
    if audio_of == "silence":
        assert (result.text, result.segments) == ("", [])
        return
    assert {seg.speaker for seg in result.segments} == {"A"}, result.segments
    assert "kitchen" in result.text.lower(), result.text
    assert result.text == " ".join(seg.text for seg in result.segments)


async def test_a_low_cluster_threshold_joins_different_people(
    server_factory: Callable[..., Any], tmp_path: Path, human_clips: HumanClips
) -> None:
    server: LiveServer = await server_factory(speakers_dir=tmp_path, diarize_cluster_threshold=0.2)
    audio, _ = conversation(human_clips)
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as sdk:
        result = await diarized(sdk, audio)
    assert {seg.speaker for seg in result.segments} == {"A"}


async def test_streamed_diarization_sends_segments_then_done(
    client: openai.AsyncOpenAI, human_clips: HumanClips
) -> None:
    audio, _ = conversation(human_clips)
    stream = await client.audio.transcriptions.create(
        model="gpt-4o-transcribe-diarize",
        file=("talk.wav", wav_bytes(audio)),
        response_format="diarized_json",
        chunking_strategy="auto",
        stream=True,
    )
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and kinds.count("transcript.text.done") == 1
    segments = [e for e in events if e.type == "transcript.text.segment"]
    deltas = [e for e in events if e.type == "transcript.text.delta"]
    assert [who for who, _, _ in turns_of(segments)] == ["A", "B", "A"]
    assert [d.segment_id for d in deltas] == [s.id for s in segments]
    done = events[-1]
    assert done.type == "transcript.text.done"
    assert "".join(d.delta for d in deltas) == done.text == " ".join(s.text for s in segments)


async def test_other_formats_of_the_diarize_model_are_plain_transcripts(
    client: openai.AsyncOpenAI, human_clips: HumanClips
) -> None:
    result = await client.audio.transcriptions.create(
        model="gpt-4o-transcribe-diarize", file=("jfk.wav", wav_bytes(clip(human_clips, "jfk")))
    )
    assert "country" in result.text.lower()
    assert "gpt-4o-transcribe-diarize" in [m.id async for m in client.models.list()]


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"known_speaker_names": ["reader"]}, "known_speaker_references", "pair up"),
        ({"known_speaker_references": ["data:audio/wav;base64,AAAA"]}, "known_speaker_names", "pair up"),
        (
            {"known_speaker_names": list("abcde"), "known_speaker_references": ["data:audio/wav;base64,AA=="] * 5},
            "known_speaker_names",
            "at most 4",
        ),
        (
            {"known_speaker_names": ["x"], "known_speaker_references": ["https://example.com/a.wav"]},
            "known_speaker_references",
            "data URL",
        ),
        (
            {"known_speaker_names": ["x"], "known_speaker_references": ["data:text/plain;base64,aGVsbG8="]},
            "known_speaker_references",
            "not audio",
        ),
        (
            {"known_speaker_names": ["x"], "known_speaker_references": ["data:audio/wav;base64,aGVsbG8="]},
            "known_speaker_references",
            "not usable audio",
        ),
        ({"timestamp_granularities": ["segment"]}, "timestamp_granularities", "diarized_json"),
        ({"include": ["logprobs"]}, "include", "diarized_json"),
        ({"chunking_strategy": "sometimes"}, "chunking_strategy", "auto"),
    ],
)
async def test_bad_diarization_requests_are_clear_400s(
    client: openai.AsyncOpenAI, human_clips: HumanClips, extra: dict[str, Any], param: str, words: str
) -> None:
    fields = {"chunking_strategy": "auto", **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.audio.transcriptions.create(
            model="gpt-4o-transcribe-diarize",
            file=("cards.wav", wav_bytes(clip(human_clips, "cards_005"))),
            response_format="diarized_json",
            **fields,
        )
    assert caught.value.status_code == 400
    assert caught.value.param == param
    assert words in caught.value.body["message"], caught.value.body  # type: ignore[index]


async def test_a_too_short_reference_is_a_400(client: openai.AsyncOpenAI, human_clips: HumanClips) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await diarized(
            client,
            clip(human_clips, "jfk"),
            known_speaker_names=["cards"],
            known_speaker_references=[data_url(clip(human_clips, "cards_001"))],
        )
    assert caught.value.param == "known_speaker_references"
    assert "2 to 10 s" in caught.value.body["message"]  # type: ignore[index]


async def test_without_the_speaker_model_diarization_is_a_503_that_says_why(
    server_factory: Callable[..., Any], tmp_path: Path, human_clips: HumanClips
) -> None:
    server: LiveServer = await server_factory(speakers_dir=tmp_path, speaker_model_path=tmp_path / "missing.pt")
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as sdk:
        with pytest.raises(openai.InternalServerError) as caught:
            await diarized(sdk, clip(human_clips, "jfk"))
    assert caught.value.status_code == 503
    assert "missing.pt" in caught.value.body["message"]  # type: ignore[index]


async def test_clustering_real_windows_finds_the_speakers(human_clips: HumanClips, tmp_path: Path) -> None:
    """The clustering alone, on real 1.5 s windows of three people: three clusters at the default
    threshold, each holding one person's windows only."""
    service = SpeakerService(Settings(speakers_dir=tmp_path))
    await service.start()
    try:
        people = ("librivox_0870", "jfk", "arctic_a0007")
        windows, owners = [], []
        for owner, name in enumerate(people):
            audio = clip(human_clips, name)
            for start in np.arange(0, audio.size / RATE - 1.5, 0.75):
                windows.append(audio[int(start * RATE) : int((start + 1.5) * RATE)])
                owners.append(owner)
        vectors = await service.embed_windows(windows)
        kept = [(v, o) for v, o in zip(vectors, owners, strict=True) if v is not None]
        # A window whose speech is under 1.2 s once the encoder cuts its pauses has no vector.
        assert len(kept) >= 0.6 * len(windows) and {o for _, o in kept} == {0, 1, 2}
        labels = cluster(np.stack([v for v, _ in kept]), Settings().diarize_cluster_threshold)
        truth = np.array([o for _, o in kept])
        assert sorted(set(labels.tolist())) == [0, 1, 2]
        for label in range(3):
            assert len(set(truth[labels == label].tolist())) == 1, (labels, truth)
        assert set(cluster(np.stack([v for v, _ in kept]), 0.2).tolist()) == {0}
    finally:
        await service.aclose()
