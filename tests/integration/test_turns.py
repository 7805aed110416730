"""Semantic end of turn (Smart Turn v3.2) in the session core, with real parts: Piper speech streamed
in real time into StreamSessions on the real ASR service and the real turn model.

Piper reads every clip with a sentence's final fall, so a fragment reads unfinished to the audio
model only by its words. The fragments before the pauses here are the ones it scores unfinished
with that intonation ("... a large pizza and", "Remind me to buy", "Play the song by", "What's the
weather in": 0.02-0.13); "Can you tell me about the" or "Set an alarm for" score 0.95+ (finished) on
Piper's reading and are not used as unfinished turns (tools/bench_turns.py reports them all).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import numpy as np
import openai
import pytest
from openai.types.realtime import (
    ConversationItemInputAudioTranscriptionCompletedEvent,
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStoppedEvent,
    SessionCreatedEvent,
    SessionUpdatedEvent,
)

from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    FinalTranscript,
    SessionEvent,
    SpeechStarted,
    SpeechStopped,
    TranscriptionOptions,
    TurnDecided,
)
from mediaserver.stream.options import StreamOptions
from mediaserver.stream.session import StreamSession
from mediaserver.stream.turns import TurnChecks
from mediaserver.turns.fetch import default_dir, fetch
from mediaserver.turns.model import TurnModel
from tests.conftest import Clip, LiveServer
from tests.human_speech import voiced_span

CHUNK = SAMPLE_RATE_HZ // 50  # 20 ms


@pytest.fixture(scope="module")
def turn_model() -> TurnModel:
    return TurnModel(fetch(default_dir()))  # make setup fetched it; a good copy is not downloaded again


@dataclass
class Run:
    speech_end_ms: int  # stream time the last word ends
    events: list[tuple[float, SessionEvent]] = field(default_factory=list)

    def of(self, kind: type) -> list[object]:
        return [e for _, e in self.events if isinstance(e, kind)]


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE_HZ), np.float32)


async def stream_real_time(session: StreamSession, audio: np.ndarray) -> None:
    """Feed 20 ms chunks at the pace of a microphone (no faster, whatever the load)."""
    started = time.monotonic()
    for n, start in enumerate(range(0, audio.size, CHUNK)):
        await session.feed(audio[start : start + CHUNK])
        delay = started + (n + 1) * CHUNK / SAMPLE_RATE_HZ - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


async def speak(
    asr: AsrService,
    settings: Settings,
    model: TurnModel,
    parts: list[np.ndarray],
    pauses_s: list[float],
    turn_detection: Literal["silence", "semantic"] | None = None,
    until: Callable[[Run], bool] = lambda run: bool(run.of(FinalTranscript)),
) -> Run:
    """Speak ``parts`` separated by ``pauses_s``, then 5 s of silence; the session's events once
    ``until`` holds (a final came)."""
    lead = silence(0.5)
    pieces = [lead]
    for i, part in enumerate(parts):
        pieces.append(part)
        if i < len(pauses_s):
            pieces.append(silence(pauses_s[i]))
    speech_end_ms = sum(p.size for p in pieces) * 1000 // SAMPLE_RATE_HZ
    run = Run(speech_end_ms)

    async def emit(event: SessionEvent) -> None:
        run.events.append((time.monotonic(), event))

    transcription = TranscriptionOptions(language="en", with_segment_timestamps=False)
    options = StreamOptions(transcription=transcription, server_vad=True, turn_detection=turn_detection)
    session = StreamSession(asr, settings, emit, options, turn_model=model)
    try:
        await stream_real_time(session, np.concatenate([*pieces, silence(5.0)]))
        async with asyncio.timeout(60):
            while not until(run):
                await asyncio.sleep(0.05)
    finally:
        await session.aclose()
    return run


def words(text: str) -> list[str]:
    return ["".join(c for c in w.lower() if c.isalnum()) for w in text.split()]


COMPLETE = ["What is the capital of France?", "Turn off the lights in the bedroom.", "Remind me to buy milk."]
# (before the pause, after it, the pause): the first part scores unfinished on Piper's reading.
# Each pause is the silence between the words (``gap_for``): the segmenter counts 270-330 ms of it
# (one voiced frame ends its silence), so the first score (200 ms) decides and no rescore (500 ms)
# comes. tiny.en writes "Remind me to buy." and "I'd like to order a large pizza in." with a full
# stop: a pause after words that read finished ends the turn at 600 ms of the segmenter's silence
# (turns/decision.py).
PAUSED = [
    ("I'd like to order a large pizza and", "a bottle of water.", 0.3),
    ("Remind me to buy", "eggs and bread.", 0.3),
    ("Play the song by", "the Beatles.", 0.3),
    ("What's the weather in", "London tomorrow?", 0.3),
]


def gap_for(first: Clip, rest: Clip, silence_s: float) -> float:
    """The pause to put between two Piper clips for ``silence_s`` of silence between their words
    (Piper's own quiet after the first and before the second counts)."""
    quiet_samples = first.audio16k.size - voiced_span(first.audio16k)[1] + voiced_span(rest.audio16k)[0]
    return max(0.0, silence_s - quiet_samples / SAMPLE_RATE_HZ)


async def test_finished_turns_end_at_the_first_pause(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """Semantic turns with eagerness medium wait up to 4 s for an unfinished turn; a finished one ends
    as soon as the model has scored the 200 ms pause (the sessions speak at once: their pauses can
    share a batch)."""
    settings = base_settings.model_copy(update={"turn_detection": "semantic"})
    runs = await asyncio.gather(*(speak(asr_service, settings, turn_model, [speech(t).audio16k], []) for t in COMPLETE))
    for text, run in zip(COMPLETE, runs, strict=True):
        decided = [e for e in run.of(TurnDecided) if isinstance(e, TurnDecided)]
        stopped = [e for e in run.of(SpeechStopped) if isinstance(e, SpeechStopped)]
        finals = [e for e in run.of(FinalTranscript) if isinstance(e, FinalTranscript)]
        assert decided and decided[-1].complete, (text, decided)
        assert len(stopped) == 1 and len(finals) == 1, (text, run.events)
        # Ended by the model, not by the 4 s cap (stream time, so a loaded machine does not change it).
        delay_ms = stopped[0].audio_end_ms - run.speech_end_ms
        assert delay_ms < 2000, (text, delay_ms, decided)
        assert words(finals[0].transcript.text)[:2] == words(text)[:2], (text, finals[0].transcript.text)


async def test_a_pause_mid_sentence_is_not_the_end(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """Each sentence is one utterance and one final although it pauses after a fragment the turn
    model scores unfinished (0.3 s between the words, 270-330 ms of the segmenter's silence): with
    silence detection at 300 ms most of them would be cut at their pause."""
    # The session asks for semantic turns; the words' own end (a finished sentence's 600 ms) is put out
    # of reach: this is the turn model's part (tiny.en writes "Remind me to buy." with a full stop).
    settings = base_settings.model_copy(update={"turn_finished_silence_ms": 2000})
    runs = await asyncio.gather(
        *(
            speak(
                asr_service,
                settings,
                turn_model,
                [speech(first).audio16k, speech(rest).audio16k],
                [gap_for(speech(first), speech(rest), pause)],
                turn_detection="semantic",
            )
            for first, rest, pause in PAUSED
        )
    )
    for (first, rest, pause), run in zip(PAUSED, runs, strict=True):
        stopped = [e for e in run.of(SpeechStopped) if isinstance(e, SpeechStopped)]
        finals = [e for e in run.of(FinalTranscript) if isinstance(e, FinalTranscript)]
        assert len(stopped) == 1 and len(finals) == 1, (first, pause, run.events)
        assert stopped[0].audio_end_ms >= run.speech_end_ms, (first, stopped[0])
        heard = words(finals[0].transcript.text)
        assert words(rest)[-1] in heard and words(first)[0] in heard, (first, rest, heard)


# librivox_0870 cut between "leisure" and "to consider" (tiny.en's word times, tools/turn_cases.py):
# the turn model scores the pause after "And Mr. John Dashwood had then leisure" 0.85 at 200 ms,
# and tiny.en writes those words without a final mark.
LEISURE_CUT = 43680


async def test_the_models_end_on_words_without_a_final_mark_waits_for_the_open_silence(
    asr_service: AsrService,
    base_settings: Settings,
    turn_model: TurnModel,
    human_clips: list[tuple[str, np.ndarray, str]],
) -> None:
    """A real reader pausing 0.4 s mid-sentence after words with no final mark: the model's
    'complete' waits for turn_open_silence_ms (400) of silence, and the speech resuming first keeps
    the sentence one turn; with turn_open_silence_ms 0 the same pause is cut there, by the model."""
    [audio] = [a for name, a, _ in human_clips if name == "librivox_0870"]
    first, last = voiced_span(audio)
    speech = audio[first:last]
    head, tail = speech[: LEISURE_CUT - first], speech[LEISURE_CUT - first :]

    def said(run: Run) -> bool:
        stopped = [e for e in run.of(SpeechStopped) if isinstance(e, SpeechStopped) and not e.discarded]
        return bool(stopped) and len(run.of(FinalTranscript)) >= len(stopped)

    waited, cut = await asyncio.gather(
        *(
            speak(
                asr_service,
                base_settings.model_copy(update={"turn_open_silence_ms": open_ms}),
                turn_model,
                [head, tail],
                [0.4],
                turn_detection="semantic",
                until=said,
            )
            for open_ms in (400, 0)
        )
    )
    finals = [e.transcript.text for e in waited.of(FinalTranscript) if isinstance(e, FinalTranscript)]
    assert len(finals) == 1 and {"leisure", "consider"} <= set(words(finals[0])), finals
    cut_finals = [e.transcript.text for e in cut.of(FinalTranscript) if isinstance(e, FinalTranscript)]
    decided = [e for e in cut.of(TurnDecided) if isinstance(e, TurnDecided) and e.complete]
    assert len(cut_finals) == 2 and words(cut_finals[0])[-1] == "leisure", cut_finals
    assert decided[0].by == "model" and decided[0].silence_ms < 400, decided


def burst_of(clip: Clip, ms: int) -> np.ndarray:
    """The first ``ms`` of a clip's voiced audio: a first syllable said alone, shorter than an utterance."""
    first, _ = voiced_span(clip.audio16k)
    return clip.audio16k[first : first + ms * SAMPLE_RATE_HZ // 1000]


async def test_a_first_syllable_before_a_short_pause_is_kept_with_the_sentence(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """A real reader's "He [pause] might even have been ..." (librivox_0930): the first word, too short
    to be an utterance (stream_min_speech_ms), is not a turn the model judges (it scored 0.97 and cut
    the word off as a discarded burst; the rest, decoded without it, read unpunctuated and waited 2 s).
    The speech resuming within silence detection's hangover joins it to the sentence: one utterance
    from the burst's start, one final, no turn decided in the burst's pause."""
    settings = base_settings.model_copy(update={"turn_detection": "semantic"})
    burst = burst_of(speech("Well."), 90)
    run = await speak(asr_service, settings, turn_model, [burst, speech("Turn off the lights.").audio16k], [0.4])
    burst_end_ms = (SAMPLE_RATE_HZ // 2 + burst.size) * 1000 // SAMPLE_RATE_HZ
    started = [e for e in run.of(SpeechStarted) if isinstance(e, SpeechStarted)]
    stopped = [e for e in run.of(SpeechStopped) if isinstance(e, SpeechStopped)]
    decided = [e for e in run.of(TurnDecided) if isinstance(e, TurnDecided)]
    finals = [e for e in run.of(FinalTranscript) if isinstance(e, FinalTranscript)]
    assert len(started) == 1 and started[0].audio_start_ms < burst_end_ms, run.events
    assert len(stopped) == 1 and not stopped[0].discarded and len(finals) == 1, run.events
    assert all(e.audio_end_ms > burst_end_ms + 400 for e in decided), decided
    assert {"turn", "off", "lights"} <= set(words(finals[0].transcript.text)), finals[0].transcript.text


async def test_a_burst_too_short_to_keep_is_discarded_at_the_silence_hangover(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """Semantic turns wait up to the eagerness cap (4 s) for an unfinished turn; a burst too short to
    keep is no turn: it is discarded when the silence reaches stream_vad_hangover_ms (here 800 ms, not
    the default 500), as silence detection would, without a turn decision or a final."""
    settings = base_settings.model_copy(update={"turn_detection": "semantic", "stream_vad_hangover_ms": 800})
    burst = burst_of(speech("Well."), 90)
    # The 5 s of silence after it are fed in real time: by then the burst is long over.
    run = await speak(asr_service, settings, turn_model, [burst], [], until=lambda run: bool(run.of(SpeechStopped)))
    stopped = [e for e in run.of(SpeechStopped) if isinstance(e, SpeechStopped)]
    assert len(stopped) == 1 and stopped[0].discarded, run.events
    assert not run.of(TurnDecided) and not run.of(FinalTranscript), run.events
    # webrtcvad holds its "voiced" a few frames past a burst: the silence starts up to 150 ms after it
    assert 800 <= stopped[0].audio_end_ms - run.speech_end_ms <= 800 + 150, (stopped, run.speech_end_ms)


async def test_audio_held_while_a_pause_is_judged_is_not_a_gap(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """While a pause is judged, the stream's later audio waits (``turn_decision_hold_ms``). That
    audio has come: the wait is not the sender going quiet, so gap filling (here after 40 ms, less
    than any decision takes) must add no silence to the pause. Fed as fast as it goes, the feed is
    under way whenever the gap watcher looks: every sample the stream time counts was sent."""
    settings = base_settings.model_copy(update={"stream_gap_fill_ms": 40, "turn_detection": "semantic"})
    first, rest, pause = PAUSED[1]
    audio = np.concatenate(
        [
            silence(0.5),
            speech(first).audio16k,
            silence(gap_for(speech(first), speech(rest), pause)),
            speech(rest).audio16k,
            silence(1.0),
        ]
    )
    decided: list[TurnDecided] = []

    async def emit(event: SessionEvent) -> None:
        if isinstance(event, TurnDecided):
            decided.append(event)

    transcription = TranscriptionOptions(language="en", with_segment_timestamps=False)
    session = StreamSession(
        asr_service, settings, emit, StreamOptions(transcription=transcription, server_vad=True), turn_model=turn_model
    )
    try:
        for start in range(0, audio.size, CHUNK):
            await session.feed(audio[start : start + CHUNK])
        assert decided  # pauses were judged (each held the audio behind it)
        frame_ms = session._segmenter.config.frame_ms
        assert session._segmenter.position_ms == audio.size * 1000 // SAMPLE_RATE_HZ // frame_ms * frame_ms
    finally:
        await session.aclose()


# A fragment the turn model scores finished on Piper's falling pitch (0.83 at the first score:
# tools/README.md "bench_turns.py"), ending on a word no sentence ends on. The pause is
# long (1.5 s) so that the model's answer surely arrives inside it, however loaded the machine.
# Not here: "Turn on the" (tiny.en writes "Turn on that", which the words cannot catch) and "Add
# milk, eggs, and" (its comma pauses are scored too: a race with the speech resuming).
UNFINISHED_BY_WORDS = [("How far is it from here to the", "nearest gas station?")]


@pytest.mark.parametrize("by_words", [True, False], ids=["words", "model-alone"])
async def test_a_fragment_ending_on_and_or_the_is_not_the_end_whatever_the_model_hears(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    turn_model: TurnModel,
    by_words: bool,
) -> None:
    """With ``turn_unfinished_words`` (the default) the transcript of the pause, decoded from its
    first 30 ms, keeps the turn open: one final with both parts. The model alone (the setting
    empty) ends the turn at the pause: the control that shows the words are what kept it open."""
    update: dict[str, object] = {"turn_detection": "semantic"}
    if not by_words:
        update["turn_unfinished_words"] = []
        update["turn_unfinished_endings"] = []  # tiny.en may write "... to the..."
    settings = base_settings.model_copy(update=update)
    vetoed = asr_service.metrics.turn_unfinished_words._value.get()
    for first, rest in UNFINISHED_BY_WORDS:
        run = await speak(asr_service, settings, turn_model, [speech(first).audio16k, speech(rest).audio16k], [1.5])
        finals = [e for e in run.of(FinalTranscript) if isinstance(e, FinalTranscript)]
        heard = words(finals[0].transcript.text)
        if by_words:
            assert words(rest)[-1] in heard and words(first)[-1] in heard, (first, heard)  # both parts, one final
        else:
            assert words(rest)[-1] not in heard, (first, heard)  # cut at the pause
    if by_words:
        assert asr_service.metrics.turn_unfinished_words._value.get() > vetoed


async def test_silence_detection_when_the_session_asks_for_it(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """A session that asks for silence detection gets it: nothing is scored and a pause of 800 ms
    ends the utterance as it always did (stream_vad_hangover_ms 500)."""
    first, rest, _ = PAUSED[2]
    pause = 0.8  # longer than stream_vad_hangover_ms (500)
    run = await speak(
        asr_service,
        base_settings,
        turn_model,
        [speech(first).audio16k, speech(rest).audio16k],
        [pause],
        turn_detection="silence",
    )
    assert not run.of(TurnDecided)
    async with asyncio.timeout(60):
        while len(run.of(FinalTranscript)) < 1:
            await asyncio.sleep(0.05)
    assert len(run.of(SpeechStopped)) == 2


async def test_semantic_turns_as_the_servers_default(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """With turn_detection semantic (MEDIASERVER_TURN_DETECTION=semantic) a session that chooses
    nothing gets semantic turns: its pauses are judged, and an unfinished fragment, "I want to go to
    the … train station." with a 0.7 s pause (cut in two by silence detection), is one turn."""
    settings = base_settings.model_copy(update={"turn_detection": "semantic"})
    run = await speak(
        asr_service,
        settings,
        turn_model,
        [speech("I want to go to the").audio16k, speech("train station.").audio16k],
        [0.7],
    )
    assert run.of(TurnDecided)
    stopped = [e for e in run.of(SpeechStopped) if isinstance(e, SpeechStopped)]
    finals = [e for e in run.of(FinalTranscript) if isinstance(e, FinalTranscript)]
    assert len(stopped) == 1 and len(finals) == 1, run.events
    heard = words(finals[0].transcript.text)
    assert "want" in heard and "station" in heard, heard


async def realtime_items(
    server: LiveServer, audio: np.ndarray, turn_detection: dict[str, object], stopped: list[int] | None = None
) -> list[str]:
    """Stream ``audio`` in real time through the Realtime face with the ``openai`` SDK; the
    transcripts of the items it made, once the silence after it has passed (and each
    ``speech_stopped``'s ``audio_end_ms`` into ``stopped``)."""
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    chunk = 2 * SAMPLE_RATE_HZ // 10  # 100 ms at 16 kHz
    transcripts: list[str] = []
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        assert isinstance(await connection.recv(), SessionCreatedEvent)
        session: Any = {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 16000},
                    "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                    "turn_detection": turn_detection,
                }
            },
        }
        await connection.session.update(session=session)
        updated = await connection.recv()
        assert isinstance(updated, SessionUpdatedEvent)

        async def send() -> None:
            started = time.monotonic()
            for n, start in enumerate(range(0, len(pcm), chunk)):
                await connection.input_audio_buffer.append(audio=base64.b64encode(pcm[start : start + chunk]).decode())
                await asyncio.sleep(max(0.0, started + (n + 1) * 0.1 - time.monotonic()))

        committed = 0

        async def receive() -> None:
            nonlocal committed
            async for event in connection:
                if isinstance(event, InputAudioBufferCommittedEvent):
                    committed += 1
                elif isinstance(event, InputAudioBufferSpeechStoppedEvent) and stopped is not None:
                    stopped.append(event.audio_end_ms)
                elif isinstance(event, ConversationItemInputAudioTranscriptionCompletedEvent):
                    transcripts.append(event.transcript)

        receiver = asyncio.create_task(receive())
        try:
            await send()  # ends with 3 s of silence: every turn has ended by then (the eagerness cap aside)
            async with asyncio.timeout(60):
                while len(transcripts) < committed or committed == 0:
                    await asyncio.sleep(0.05)
        finally:
            receiver.cancel()
    return transcripts


async def test_realtime_semantic_vad_with_the_openai_sdk(server: LiveServer, speech: Callable[[str], Clip]) -> None:
    """semantic_vad (eagerness low: up to 8 s for an unfinished turn) keeps "Play the song by ...
    the Beatles." with its 300 ms pause one item; server_vad at 300 ms cuts it in two."""
    first, rest, pause = PAUSED[2]
    audio = np.concatenate(
        [
            silence(0.3),
            speech(first).audio16k,
            silence(gap_for(speech(first), speech(rest), pause)),
            speech(rest).audio16k,
            silence(3.0),
        ]
    ).astype(np.float32)
    semantic, plain = await asyncio.gather(
        realtime_items(server, audio, {"type": "semantic_vad", "eagerness": "low"}),
        realtime_items(server, audio, {"type": "server_vad", "silence_duration_ms": 300}),
    )
    assert len(semantic) == 1, semantic
    assert "beatles" in words(semantic[0]) and "play" in words(semantic[0]), semantic
    assert len(plain) == 2, plain


async def ws_turn_end(
    server: LiveServer, audio: np.ndarray, speed: float = 1.0, **start: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Stream ``audio`` over the device socket (/api/ws/asr, server VAD) at ``speed`` times real
    time; its ready message and every message up to the final of the utterance that ends last."""
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    got: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url}/api/ws/asr") as ws:
        await ws.send_str(json.dumps({"type": "start", "mode": "server_vad", **start}))
        ready = json.loads((await ws.receive(timeout=30)).data)
        assert ready["type"] == "ready", ready

        async def receive() -> None:
            async for msg in ws:
                got.append(json.loads(msg.data))

        receiver = asyncio.create_task(receive())
        frame = 2 * CHUNK
        started = time.monotonic()
        for n, offset in enumerate(range(0, len(pcm), frame)):
            await ws.send_bytes(pcm[offset : offset + frame])
            await asyncio.sleep(max(0.0, started + (n + 1) * CHUNK / SAMPLE_RATE_HZ / speed - time.monotonic()))

        await ws.send_str(json.dumps({"type": "ping"}))  # its pong comes once every frame before it is heard

        def waiting() -> bool:  # the audio is not all heard, or an utterance that ended has no final yet
            if not any(m["type"] == "pong" for m in got):
                return True
            ended: int = sum(m["type"] == "speech_stopped" and not m["discarded"] for m in got)
            finals: int = sum(m["type"] == "final" for m in got)
            return ended == 0 or finals < ended

        async with asyncio.timeout(60):
            while waiting():
                await asyncio.sleep(0.05)
        receiver.cancel()
    return ready, got


async def test_a_ping_after_a_pause_being_judged_comes_after_its_speech_stopped(
    server: LiveServer, speech: Callable[[str], Clip]
) -> None:
    """ping is a barrier for speech_stopped (ws-protocol.md), semantic turns too: a sentence and its
    pause in one message, then ping: the turn model is still scoring the pause when the ping is
    read, and the pong waits for its decision. Before, the pong came first."""
    clip = speech("What is the capital of France?").audio16k
    _, last = voiced_span(clip)
    audio = np.concatenate([silence(0.3), clip[:last], silence(0.3)])
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    got: list[str] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url}/api/ws/asr") as ws:
        await ws.send_str(json.dumps({"type": "start", "mode": "server_vad", "turn_detection": "semantic"}))
        ready = json.loads((await ws.receive(timeout=30)).data)
        assert ready["type"] == "ready" and ready["turn_detection"] == "semantic", ready
        await ws.send_bytes(pcm)
        await ws.send_str(json.dumps({"type": "ping"}))
        async with asyncio.timeout(60):
            while "pong" not in got:
                got.append(json.loads((await ws.receive()).data)["type"])
    assert "speech_stopped" in got and got.index("speech_stopped") < got.index("pong"), got


async def test_the_default_is_semantic_for_the_voice_loop_and_silence_for_transcription(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """turn_detection auto (the default): a device socket the server answers gets semantic turns,
    and "I want to go to the … train station." with a 0.7 s pause is one turn; one that only
    transcribes gets silence detection (stream_vad_hangover_ms 500), which cuts it at the pause."""
    server: LiveServer = await server_factory()
    audio = np.concatenate(
        [silence(0.3), speech("I want to go to the").audio16k, silence(0.7), speech("train station.").audio16k]
    )
    audio = np.concatenate([audio, silence(1.5)])
    ready, got = await ws_turn_end(server, audio, assistant=True, speak=False)  # text answers: no binary frames
    assert ready["turn_detection"] == "semantic", ready
    finals = [m["text"] for m in got if m["type"] == "final"]
    assert len(finals) == 1 and "station" in words(finals[0]) and "want" in words(finals[0]), finals
    ready, got = await ws_turn_end(server, audio)
    assert ready["turn_detection"] == "silence", ready
    assert [m["type"] for m in got].count("final") == 2, got


async def test_real_sentences_end_within_a_second_over_the_device_socket(
    server_factory: Callable[..., Any], human_clips: list[tuple[str, np.ndarray, str]]
) -> None:
    """The suite's real recordings, each a finished sentence (some score 0.01 with the turn model:
    "feels like these days go on forever"), streamed over the device socket to a server whose
    default is semantic turns, with every other setting at its default: each turn ends within 1.0 s
    of the last voiced sample (stream time), and none by the 4 s cap. At twice real time, for the
    suite's time: a pause is judged at the same stream time however fast the audio comes (the
    stream's audio waits while it is, test_a_pause_is_judged_at_the_same_stream_time_...)."""
    server: LiveServer = await server_factory(turn_detection="semantic")

    async def one(audio: np.ndarray) -> tuple[int, list[dict[str, Any]]]:
        first, last = voiced_span(audio)
        speech = audio[max(0, first - SAMPLE_RATE_HZ * 15 // 100) : last]
        lead = silence(0.5)
        # 2 s of silence after the speech: the stream's audio waits while a pause is judged, so every
        # pause has been judged by the time it is all heard; a turn not ended within it (the 4 s cap)
        # has no speech_stopped, and fails below as surely as one ended late.
        ready, got = await ws_turn_end(server, np.concatenate([lead, speech, silence(2.0)]), speed=2.0)
        assert ready["turn_detection"] == "semantic", ready
        return (lead.size + speech.size) * 1000 // SAMPLE_RATE_HZ, got

    results: list[tuple[str, int, list[dict[str, Any]]]] = []
    for batch in range(0, len(human_clips), 3):  # three devices at a time
        clips = human_clips[batch : batch + 3]
        done = await asyncio.gather(*(one(audio) for _, audio, _ in clips))
        results += [(name, end, got) for (name, _, _), (end, got) in zip(clips, done, strict=True)]
    for name, speech_end_ms, got in results:
        if name == "jfk":
            # Known miss (issue #33 note): tiny.en writes JFK's sentence without a final mark and the
            # model scores its end about 0.5, so its last turn waits for the cap; only its first
            # turn, at his own pause after "my fellow Americans", is decided.
            assert any(m["type"] == "turn" and m["complete"] for m in got), got
            continue
        stopped = [m for m in got if m["type"] == "speech_stopped" and not m["discarded"]]
        turns = [m for m in got if m["type"] == "turn" and m["complete"]]
        assert stopped, (name, got)
        # The last word may come after a pause as a burst too short to be an utterance (discarded).
        last_stop = [m for m in got if m["type"] == "speech_stopped"][-1]
        delay_ms = last_stop["audio_end_ms"] - speech_end_ms
        assert 0 <= delay_ms <= 1000, (name, delay_ms, turns)
        # Every utterance's end was decided (none by the cap); a burst too short to keep is no turn (it is
        # discarded at silence detection's hangover, without a turn message).
        assert len(turns) == len(stopped), (name, got)


async def test_an_evenly_read_long_sentence_ends_within_a_second_over_realtime(
    server: LiveServer, speech: Callable[[str], Clip]
) -> None:
    """Piper reads it evenly and the turn model scores it 0.01 (it waited 4.1 s for the cap before
    issue #33); its words read finished, so semantic_vad ends it within 1.0 s of the speech."""
    clip = speech("So I was thinking that maybe we could go to the beach tomorrow afternoon.").audio16k
    _, last = voiced_span(clip)
    lead = silence(0.3)
    audio = np.concatenate([lead, clip[:last], silence(2.5)]).astype(np.float32)
    stopped: list[int] = []
    transcripts = await realtime_items(server, audio, {"type": "semantic_vad"}, stopped)
    assert len(transcripts) == 1 and "beach" in words(transcripts[0]), transcripts
    speech_end_ms = (lead.size + last) * 1000 // SAMPLE_RATE_HZ
    assert len(stopped) == 1 and 0 <= stopped[0] - speech_end_ms <= 1000, (stopped, speech_end_ms)


async def test_without_early_finals_a_finished_sentence_still_ends_on_its_words(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """stream_final_early_ms 0 (finals decoded after the end) leaves semantic turns their evidence: the
    pause's final still starts at turn_final_silence_ms, and the sentence the model scores 0.01 ends on
    its words within a second (a review: it had waited the 4 s cap)."""
    settings = base_settings.model_copy(update={"turn_detection": "semantic", "stream_final_early_ms": 0})
    clip = speech("So I was thinking that maybe we could go to the beach tomorrow afternoon.").audio16k
    _, last = voiced_span(clip)
    run = await speak(asr_service, settings, turn_model, [clip[:last]], [])
    stopped = [e for e in run.of(SpeechStopped) if isinstance(e, SpeechStopped)]
    assert len(stopped) == 1 and 0 <= stopped[0].audio_end_ms - run.speech_end_ms <= 1000, (stopped, run.speech_end_ms)


async def test_a_pauses_first_score_is_judged_on_turn_threshold_however_long_the_pause(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """The first score of a pause is the first (turn_threshold), even where the pause had grown past
    turn_candidate_silence_ms + turn_rescore_ms by then (turn_rescore_ms 0, a large piece of audio):
    counted, not read off the silence. Later scores of it, and another pause's first, as they are."""
    settings = base_settings.model_copy(update={"turn_rescore_ms": 0})
    checks = TurnChecks(turn_model, settings, asr_service.metrics, "first-score")
    audio = np.concatenate([speech("What is the capital of France?").audio16k, silence(0.6)])
    first = await checks.score(audio, 600, 1000)
    again = await checks.score(audio, 900, 1000)
    other = await checks.score(audio, 600, 4000)
    assert first is not None and again is not None and other is not None
    assert (first.first, again.first, other.first) == (True, False, True)


async def test_a_session_asking_for_semantic_turns_without_the_model_is_told_it_has_silence(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip], tmp_path: Path
) -> None:
    """No turn model (the file is missing): the server starts, /health says so, and a device
    socket that asks for semantic turns gets silence detection, told so in its ready message."""
    server: LiveServer = await server_factory(turn_model_path=tmp_path / "missing.onnx")
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/health") as resp:
        health = await resp.json()
    assert health["turns"]["model_loaded"] is False and health["turns"]["default_in_force"] == "silence"
    clip = speech("Remind me to buy").audio16k
    ready, got = await ws_turn_end(
        server, np.concatenate([silence(0.3), clip, silence(1.5)]), turn_detection="semantic"
    )
    assert ready["turn_detection"] == "silence"
    assert "not loaded" in ready["turn_detection_fallback"] and "500 ms" in ready["turn_detection_fallback"]
    assert [m["type"] for m in got].count("final") == 1 and not [m for m in got if m["type"] == "turn"]


async def test_a_turn_model_that_fails_mid_session_ends_that_pause_on_silence(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    """The model throws on every pause: each pause ends as silence detection would (500 ms), the
    session stays up, and every utterance gets its final."""
    broken = TurnModel(fetch(default_dir()))

    def fail(windows: list[np.ndarray]) -> list[Any]:
        raise RuntimeError("onnxruntime: the model failed")

    broken.score_now = fail  # type: ignore[method-assign]  # a fault no real model file produces on demand
    failures = asr_service.metrics.turn_model_failures._value.get()
    first, rest = speech("Play the song by").audio16k, speech("the Beatles.").audio16k
    run = await speak(asr_service, base_settings, broken, [first, rest], [1.0], turn_detection="semantic")
    async with asyncio.timeout(60):
        while len(run.of(FinalTranscript)) < 2:
            await asyncio.sleep(0.05)
    stopped = [e for e in run.of(SpeechStopped) if isinstance(e, SpeechStopped)]
    decided = [e for e in run.of(TurnDecided) if isinstance(e, TurnDecided)]
    assert len(stopped) == 2 and all(d.by == "silence" for d in decided), run.events
    fragment_end_ms = (silence(0.5).size + first.size) * 1000 // SAMPLE_RATE_HZ
    assert 400 <= stopped[0].audio_end_ms - fragment_end_ms <= 700, stopped
    assert asr_service.metrics.turn_model_failures._value.get() > failures
    broken.close()


async def test_silence_filled_for_a_gap_is_not_heard_after_the_audio_that_ended_it(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    """The gap watcher's silence waits, as audio does, while a pause is judged; audio that comes
    meanwhile shows there was no gap, so the silence is dropped. Before, it was heard after that
    audio (a review), and the stream clock ran ahead of the audio received."""
    slow = TurnModel(fetch(default_dir()))
    release = threading.Event()
    real = slow.score_now

    def held(windows: list[np.ndarray]) -> list[Any]:
        release.wait(30)  # a turn model slower than the gap (a fault a real model shows only under load)
        return real(windows)

    slow.score_now = held  # type: ignore[method-assign]
    # (The silence waits at most turn_decision_hold_ms for the decision: long here, so that a loaded
    # machine cannot let it through before the test's audio comes.)
    settings = base_settings.model_copy(update={"turn_detection": "semantic", "turn_decision_hold_ms": 20000})
    transcription = TranscriptionOptions(language="en", with_segment_timestamps=False)
    options = StreamOptions(transcription=transcription, server_vad=True, turn_detection="semantic")
    events: list[SessionEvent] = []

    async def emit(event: SessionEvent) -> None:
        events.append(event)

    session = StreamSession(asr_service, settings, emit, options, turn_model=slow)
    clip, rest = speech("Play the song by").audio16k, speech("the Beatles.").audio16k
    try:
        for start in range(0, clip.size, CHUNK):  # speech, then its pause: the turn model is asked
            await session.feed(clip[start : start + CHUNK])
        await session.feed(silence(0.3))
        async with asyncio.timeout(30):
            while session._gaps.filled_s == 0:  # the watcher found a gap; its silence waits for the model
                await asyncio.sleep(0.01)
        await session.feed(rest)  # the sender was there after all
        release.set()
        final = await session.commit()  # the utterance ends here: no later silence for the watcher to fill
        async with asyncio.timeout(30):
            while session._gaps.task is not None:  # the watcher's waiting silence is heard or dropped
                await asyncio.sleep(0.01)
        assert final is not None and "beatles" in words(final.transcript.text), final
        received_ms = session.samples_received * 1000 // SAMPLE_RATE_HZ
        position_ms = session._segmenter.position_ms  # (the commit counted the tail under a frame too)
        assert 0 <= received_ms - position_ms <= 1, (position_ms, received_ms)
    finally:
        release.set()
        await session.aclose()
        slow.close()


async def feed_at_full_speed(
    asr: AsrService, settings: Settings, model: TurnModel, audio: np.ndarray
) -> list[SessionEvent]:
    """Feed ``audio`` to a semantic-turns session as fast as it takes it (a file streamed at full speed)."""
    events: list[SessionEvent] = []

    async def emit(event: SessionEvent) -> None:
        events.append(event)

    transcription = TranscriptionOptions(language="en", with_segment_timestamps=False)
    options = StreamOptions(transcription=transcription, server_vad=True, turn_detection="semantic")
    session = StreamSession(asr, settings, emit, options, turn_model=model)
    try:
        for start in range(0, audio.size, CHUNK):
            await session.feed(audio[start : start + CHUNK])
        async with asyncio.timeout(60):
            while sum(isinstance(e, FinalTranscript) for e in events) < sum(
                isinstance(e, SpeechStopped) and not e.discarded for e in events
            ) or not any(isinstance(e, SpeechStopped) for e in events):
                await asyncio.sleep(0.05)
    finally:
        await session.aclose()
    return events


async def test_a_pause_is_judged_at_the_same_stream_time_however_fast_the_audio_comes(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], turn_model: TurnModel
) -> None:
    """Two finished sentences 1 s apart, streamed at full speed: the stream waits while the pause is
    judged (turn_decision_hold_ms), so they are two turns as they would be live. Without the wait
    (0) the audio runs past the pause before the decision arrives, and they become one."""
    first, second = speech("What is the capital of France?"), speech("Turn off the lights in the bedroom.")
    audio = np.concatenate([silence(0.3), first.audio16k, silence(1.0), second.audio16k, silence(2.0)])
    held = await feed_at_full_speed(asr_service, base_settings, turn_model, audio)
    unheld = await feed_at_full_speed(
        asr_service, base_settings.model_copy(update={"turn_decision_hold_ms": 0}), turn_model, audio
    )
    held_finals = [e for e in held if isinstance(e, FinalTranscript)]
    assert len(held_finals) == 2, held
    assert "france" in words(held_finals[0].transcript.text), held_finals
    assert len([e for e in unheld if isinstance(e, FinalTranscript)]) == 1, unheld


async def test_a_stalled_event_loop_is_not_a_gap(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    """A busy machine can stall the event loop for longer than ``stream_gap_fill_ms``; audio the
    sender sent meanwhile waits in the socket for the loop to read it. The stall is not the sender
    going quiet: gap filling must add no silence, or a sentence spoken without a pause is cut in two
    (here a 0.4 s stall mid-sentence, longer than the 300 ms hangover). Silence detection, audio
    paced in real time."""
    clip = speech("Turn off the lights in the bedroom and close the garage door.").audio16k
    audio = np.concatenate([silence(0.5), clip, silence(1.5)])
    stall_at = (8000 + voiced_span(clip)[0] + 16000) // CHUNK  # 1 s into the speech
    stopped: list[SpeechStopped] = []
    finals: list[FinalTranscript] = []

    async def emit(event: SessionEvent) -> None:
        if isinstance(event, SpeechStopped):
            stopped.append(event)
        elif isinstance(event, FinalTranscript):
            finals.append(event)

    transcription = TranscriptionOptions(language="en", with_segment_timestamps=False)
    session = StreamSession(
        asr_service, base_settings, emit, StreamOptions(transcription=transcription, server_vad=True)
    )
    loop = asyncio.get_running_loop()
    received: asyncio.Queue[np.ndarray | None] = asyncio.Queue()

    async def transport() -> None:  # as the transports do: what the socket read is fed by a worker
        while (chunk := await received.get()) is not None:
            await session.feed(chunk)

    worker = asyncio.create_task(transport())
    try:
        started = time.monotonic()
        for n, start in enumerate(range(0, audio.size, CHUNK)):
            received.put_nowait(audio[start : start + CHUNK])
            if n == stall_at:
                loop.call_soon(time.sleep, 0.4)  # the loop is busy: nothing runs, nothing is read
            delay = started + (n + 1) * CHUNK / SAMPLE_RATE_HZ - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        received.put_nowait(None)
        await worker
        async with asyncio.timeout(60):
            while not finals:
                await asyncio.sleep(0.05)
        assert len(stopped) == 1, stopped
        assert "garage" in words(finals[0].transcript.text) and "turn" in words(finals[0].transcript.text)
        frame_ms = session._segmenter.config.frame_ms
        assert session._segmenter.position_ms == audio.size * 1000 // SAMPLE_RATE_HZ // frame_ms * frame_ms
    finally:
        worker.cancel()
        await session.aclose()
