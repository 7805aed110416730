"""The TTS service with the real Piper voice: sentence order, streaming, fairness, cancellation,
resampling, the bounded queue, voices, and a round trip through the server's own ASR."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from mediaserver.asr.service import AsrService
from mediaserver.audio.decode import resample_mono
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter, Overloaded
from mediaserver.events import TranscriptionOptions
from mediaserver.metrics import Metrics
from mediaserver.tts.metrics import TtsMetrics
from mediaserver.tts.scheduler import TtsScheduler
from mediaserver.tts.service import TextTooLong, TtsService
from mediaserver.tts.types import SynthesisParams, TtsChunk
from mediaserver.tts.voices import UnknownSpeaker, UnknownVoice, VoiceRegistry, check_speaker
from tests.faults import one_sentence_later
from tests.wer import word_error_rate

LONG = " ".join(f"This is sentence number {n} of a long answer." for n in range(1, 13))


def metric(service: TtsService, name: str, **labels: str) -> float:
    value = service.app_metrics.registry.get_sample_value(name, labels)
    return float(value or 0.0)


async def test_sentences_come_in_order_and_the_first_before_the_rest_exist(tts_service: TtsService) -> None:
    voice = await tts_service.voice(None)
    scheduler = (await tts_service.load(voice)).scheduler
    text = "Good morning. The weather is mild today. Take an umbrella anyway. Have a nice day."
    chunks: list[TtsChunk] = []
    done_at_first = -1
    before = scheduler.sentences_done
    async with tts_service.speak(text, voice) as speech:
        async for chunk in speech:
            if not chunks:
                done_at_first = scheduler.sentences_done - before
            chunks.append(chunk)
    assert [c.sentence for c in chunks] == [
        "Good morning.",
        "The weather is mild today.",
        "Take an umbrella anyway.",
        "Have a nice day.",
    ]
    assert [c.sentence_index for c in chunks] == [0, 1, 2, 3]
    assert all(c.sample_rate_hz == voice.sample_rate_hz and c.duration_s > 0.5 for c in chunks)
    # The first sentence was handed out while later ones were not synthesized yet.
    assert 1 <= done_at_first < 4


async def test_a_short_request_is_not_held_up_by_a_long_one(tts_service: TtsService) -> None:
    voice = await tts_service.voice(None)
    order: list[tuple[str, int]] = []
    first_long = asyncio.Event()

    async def long_request() -> None:
        async with tts_service.speak(LONG, voice) as speech:
            async for chunk in speech:
                order.append(("long", chunk.sentence_index))
                first_long.set()

    async def short_request() -> None:
        await first_long.wait()
        async with tts_service.speak("Yes.", voice) as speech:
            async for _ in speech:
                order.append(("short", 0))

    await asyncio.gather(long_request(), short_request())
    position = order.index(("short", 0))
    long_before = [i for kind, i in order[:position] if kind == "long"]
    # It waited for the long text's sentences already running, not for its 12 sentences.
    assert len(long_before) <= 3, order
    assert len(order) == 13


async def test_leaving_drops_every_pending_sentence(tts_service: TtsService) -> None:
    voice = await tts_service.voice(None)
    scheduler = (await tts_service.load(voice)).scheduler
    dropped_before = metric(tts_service, "mediaserver_tts_dropped_sentences_total", voice=voice.name)
    done_before = scheduler.sentences_done
    async with tts_service.speak(LONG, voice) as speech:
        async for _ in speech:
            break  # the client went away after the first sentence
    assert scheduler.open_streams == 0
    dropped = metric(tts_service, "mediaserver_tts_dropped_sentences_total", voice=voice.name) - dropped_before
    assert dropped >= 12 - 1 - tts_service.settings.tts_lookahead_sentences
    await one_sentence_later(tts_service, voice)  # what was running in a thread finishes; nothing new starts
    assert scheduler.sentences_done - done_before <= 1 + tts_service.settings.tts_lookahead_sentences + 1


async def test_cancelling_the_consumer_drops_the_rest(tts_service: TtsService) -> None:
    """Barge-in: the task reading the audio is cancelled."""
    voice = await tts_service.voice(None)
    scheduler = (await tts_service.load(voice)).scheduler
    got_one = asyncio.Event()

    async def play() -> None:
        async with tts_service.speak(LONG, voice) as speech:
            async for _ in speech:
                got_one.set()
                await asyncio.sleep(3600)  # "playing"

    task = asyncio.ensure_future(play())
    await asyncio.wait_for(got_one.wait(), timeout=60)
    done = scheduler.sentences_done
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert scheduler.open_streams == 0
    await one_sentence_later(tts_service, voice)  # what was running finishes; nothing new starts
    assert scheduler.sentences_done - done <= tts_service.settings.tts_lookahead_sentences + 1


async def test_text_deltas_in_audio_out(tts_service: TtsService) -> None:
    """The streaming entry point: audio of the first sentence while the text is still arriving."""
    voice = await tts_service.voice(None)
    text = "The lights are on. The door is locked. It is 7:30 p.m. and 21.5 degrees inside."
    release_rest = asyncio.Event()
    tokens = re.findall(r".{1,4}", text)
    first_sentence_end = text.index("The door") + 4

    async def llm() -> AsyncIterator[str]:
        sent = 0
        for token in tokens:
            if sent >= first_sentence_end:
                await release_rest.wait()  # the rest only comes once audio came out
            yield token
            sent += len(token)

    chunks: list[TtsChunk] = []
    async with tts_service.speak(llm(), voice) as speech:
        async for chunk in speech:
            chunks.append(chunk)
            release_rest.set()
    # Written out: "7:30 p.m." and "21.5" do not end a sentence however the deltas cut them.
    assert [c.sentence for c in chunks] == [
        "The lights are on.",
        "The door is locked.",
        "It is 7:30 p.m. and 21.5 degrees inside.",
    ]


@pytest.mark.parametrize("rate", [16000, 24000, 48000])
async def test_audio_at_the_rates_transports_need(tts_service: TtsService, rate: int) -> None:
    voice = await tts_service.voice(None)
    native = await tts_service.synthesize("Hello there. How are you?", voice, SynthesisParams())
    result = await tts_service.synthesize("Hello there. How are you?", voice, sample_rate_hz=rate)
    assert result.sample_rate_hz == rate
    # Piper's random noise makes each take slightly different: the lengths agree roughly.
    assert result.duration_s == pytest.approx(native.duration_s, rel=0.15)
    samples = np.frombuffer(result.pcm, "<i2")
    assert np.abs(samples).max() > 3000  # speech, not silence


async def test_speed(tts_service: TtsService) -> None:
    """speed is Piper's length scale (1/speed): phonemes shrink or stretch, pauses less so."""
    voice = await tts_service.voice(None)
    text = "Please remind me to call my mother tomorrow morning."
    normal = await tts_service.synthesize(text, voice, SynthesisParams(speed=1.0))
    fast = await tts_service.synthesize(text, voice, SynthesisParams(speed=2.0))
    slow = await tts_service.synthesize(text, voice, SynthesisParams(speed=0.5))
    assert fast.duration_s < normal.duration_s * 0.8
    assert slow.duration_s > normal.duration_s * 1.4


async def test_a_full_queue_refuses_at_once(tts_service: TtsService) -> None:
    voice = await tts_service.voice(None)
    engine = (await tts_service.load(voice)).engine
    scheduler = TtsScheduler(engine, workers=1, max_streams=2, lookahead=1, metrics=TtsMetrics.of(Metrics()))
    try:
        first = scheduler.open(SynthesisParams())
        second = scheduler.open(SynthesisParams())
        with pytest.raises(Overloaded, match="retry later"):
            scheduler.open(SynthesisParams())
        first.close()
        third = scheduler.open(SynthesisParams())  # a slot is free again
        third.add("Done.")
        third.end()
        chunk = await asyncio.wait_for(third.next(), timeout=60)
        assert chunk is not None and chunk.sentence == "Done."
        assert await third.next() is None
        second.close()
    finally:
        await scheduler.aclose()


def test_text_and_speed_limits(tts_service: TtsService) -> None:
    with pytest.raises(InvalidParameter, match="empty"):
        tts_service.check_text("  \n ")
    with pytest.raises(TextTooLong, match="tts_max_input_chars") as too_long:
        tts_service.check_text("a" * (tts_service.settings.tts_max_input_chars + 1))
    assert too_long.value.status == 413
    for speed in (0.1, 5.0):
        with pytest.raises(InvalidParameter, match="between"):
            tts_service.check_speed(speed)
    assert tts_service.check_speed(0.25) == 0.25


def test_voice_names_aliases_and_languages(base_settings: Settings) -> None:
    registry = VoiceRegistry(base_settings)
    default = registry.resolve(None)
    assert default.name == "en_US-joe-medium" and default.source == "bundled"
    for alias in ("alloy", "nova", "CLB", "clb", "default"):
        assert registry.resolve(alias).name == default.name
    assert registry.resolve("EN_us-JOE-medium").name == default.name
    assert registry.resolve(None, language="en-US").name == default.name
    assert registry.resolve("CLB", language="en").name == default.name
    with pytest.raises(UnknownVoice, match="voices: en_US-joe-medium") as unknown:
        registry.resolve("no-such-voice")
    assert unknown.value.status == 400
    with pytest.raises(UnknownVoice, match="languages: en-US"):
        registry.resolve(None, language="de")


def test_a_voice_dropped_in_the_voices_dir_is_listed(base_settings: Settings, tmp_path: Path) -> None:
    default = VoiceRegistry(base_settings).resolve(None)
    (tmp_path / "en_GB-copy-medium.onnx").symlink_to(default.model_path)
    shutil.copy(default.config_path, tmp_path / "en_GB-copy-medium.onnx.json")
    (tmp_path / "broken.onnx").write_bytes(b"")  # no config, empty: not a voice
    registry = VoiceRegistry(base_settings.model_copy(update={"tts_voices_dir": tmp_path}))
    assert registry.names() == ["en_US-joe-medium", "en_GB-copy-medium"]
    copy = registry.resolve("en_GB-copy-medium")
    assert copy.source == "voices_dir" and copy.sample_rate_hz == 22050


async def test_a_speaker_the_voice_does_not_have_is_refused(
    base_settings: Settings, tmp_path: Path, tts_service: TtsService
) -> None:
    """Piper would speak an unknown speaker with the voice's default one; the service refuses it."""
    default = VoiceRegistry(base_settings).resolve(None)
    config = json.loads(default.config_path.read_text())
    config.update(num_speakers=2, speaker_id_map={"amy": 0, "bob": 1})
    (tmp_path / "en_GB-two-medium.onnx").symlink_to(default.model_path)
    (tmp_path / "en_GB-two-medium.onnx.json").write_text(json.dumps(config))
    two = VoiceRegistry(base_settings.model_copy(update={"tts_voices_dir": tmp_path})).resolve("en_GB-two-medium")
    assert two.speakers == ("amy", "bob")
    for speaker in (None, "bob", "1"):
        check_speaker(two, speaker)
    for speaker in ("carol", "2"):
        with pytest.raises(UnknownSpeaker, match="its speakers: amy, bob") as caught:
            check_speaker(two, speaker)
        assert caught.value.status == 400 and caught.value.code == "speaker_not_found"
    with pytest.raises(UnknownSpeaker, match="has one speaker"):
        async with tts_service.speak("Hi.", default, SynthesisParams(speaker="amy")):
            raise AssertionError("spoken with the default speaker")


# --- round trip: speech synthesized here, transcribed by the server's own ASR -----------------

ROUND_TRIP = [
    "Set an alarm for 6:45 tomorrow morning.",
    "The meeting with Dr. Patel starts at 3:30 p.m.",
    "Add 2 liters of milk and 12 eggs to the shopping list.",
    "It is 21 degrees in Berlin and 28 degrees in Madrid.",
    "Call Sarah Johnson at 9 o'clock tonight.",
    "The train to Chicago leaves from platform 4 at 7:15.",
    "Remind me to pay 150 dollars to Michael on Friday.",
    "Turn the living room lights down to 30 percent.",
    "My flight number is 2468 and it lands at 11:20.",
    "Emma was born on March 3rd, 1995, in Boston.",
    "Play the next song by Taylor Swift at volume 8.",
    "The recipe needs 3.5 cups of flour and 2 teaspoons of salt.",
]
_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
_NUMBER_WORDS = {word: str(i) for i, word in enumerate(_DIGITS)}


def spoken_form(text: str) -> str:
    """What Whisper's English normalizer does for this comparison: $150 = 150 dollars, 30% = 30
    percent, 3rd = 3, two = 2, Dr. = doctor, 6.45 = 6:45."""
    text = text.lower()
    text = re.sub(r"\$(\d[\d,.]*)", r"\1 dollars", text)
    text = text.replace("%", " percent").replace("dr.", "doctor").replace("p.m.", "pm")
    text = re.sub(r"(\d+)(st|nd|rd|th)\b", r"\1", text)
    text = re.sub(r"(\d+)[.:](\d\d)\b", r"\1:\2", text)
    return " ".join(_NUMBER_WORDS.get(word, word) for word in text.split())


async def test_round_trip_through_the_servers_own_asr(tts_service: TtsService, asr_service: AsrService) -> None:
    voice = await tts_service.voice(None)

    async def heard(sentence: str) -> str:
        result = await tts_service.synthesize(sentence, voice)
        audio = resample_mono(np.frombuffer(result.pcm, "<i2").astype(np.float32) / 32768.0, result.sample_rate_hz)
        transcript = await asr_service.transcribe(audio, TranscriptionOptions(language="en"), model="base")
        return transcript.text

    # All at once: the TTS queue interleaves them, the ASR scheduler batches them.
    texts = await asyncio.gather(*(heard(sentence) for sentence in ROUND_TRIP))
    errors = 0.0
    words = 0
    for sentence, text in zip(ROUND_TRIP, texts, strict=True):
        count = len(sentence.split())
        errors += word_error_rate(spoken_form(sentence), spoken_form(text)) * count
        words += count
    assert errors / words <= 0.10, list(zip(ROUND_TRIP, texts, strict=True))
