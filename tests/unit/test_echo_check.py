"""The barge-in word check (stream/echo_check.py): a barge-in whose words the answer has played is
its echo. The words rule, the pausing of ``AudioOut``, and a real ``StreamSession`` (real ASR on
Piper speech) deciding on an answerer that records what it is asked (as test_stream_session.py's)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from mediaserver.asr.service import AsrService
from mediaserver.assistant.audio_out import AudioOut
from mediaserver.assistant.pacing import send_paced
from mediaserver.audio.echo import SpeechGate
from mediaserver.audio.echo_line import EchoLine
from mediaserver.config import Settings
from mediaserver.events import FinalTranscript, SpeechStarted, SpeechStopped, TranscriptionOptions
from mediaserver.stream.echo_check import EchoCheck, Pausable, echo_share, words
from mediaserver.stream.options import StreamOptions
from mediaserver.stream.session import StreamSession
from mediaserver.turns.fetch import default_dir, fetch
from mediaserver.turns.model import TurnModel
from tests.conftest import FIXTURES, SENTENCES, Clip, synthesize
from tests.unit.test_segmenter import Marking
from tests.unit.test_stream_session import Recorder, feed, open_session, silence, until

RATE_HZ = 16000


def test_words_are_lowercase_without_punctuation() -> None:
    assert words("Cows, being herbivores — eat GRASS! Don’t they?") == [
        "cows",
        "being",
        "herbivores",
        "eat",
        "grass",
        "don't",
        "they",
    ]
    assert words(" ... !") == []


def test_the_echo_share_is_the_share_of_heard_words_that_were_played() -> None:
    played = "Cows, being herbivores, primarily consume grass. They also eat hay."
    assert echo_share("being herbivores primarily", played) == 1.0
    assert echo_share("Cows eat hay, thank you.", played) == pytest.approx(3 / 5)
    assert echo_share("go forward ten meters", played) == 0.0
    # A fragment cut mid-word at either end: its edge words count when they begin or end a played word.
    assert echo_share("Being her.", played) == 1.0
    assert echo_share("vores, primarily", played) == 1.0
    assert echo_share("being her primarily", played) == pytest.approx(2 / 3)  # not inside the fragment
    assert echo_share("...", played) is None


def test_a_ducked_audio_out_plays_quieter_from_the_next_frame_without_a_step() -> None:
    """``AudioOut.duck``: the frames taken after it are that many dB quieter, the first of them
    moving from the old gain to the new (no click), and ``clear`` (a barge-in) plays as written."""
    out = AudioOut(RATE_HZ)
    out.write((np.full(RATE_HZ, 10000, dtype="<i2")).tobytes())

    def take() -> np.ndarray:
        frame = out.take()
        assert frame is not None
        return np.frombuffer(frame, dtype="<i2")

    assert set(take()) == {10000} and not out.ducked
    out.duck(20)
    ramp, ducked = take(), take()
    assert out.ducked and (ramp[0], ramp[-1]) == (10000, 1000) and np.all(np.diff(ramp) <= 0)
    assert set(ducked) == {1000} and not out.rose
    out.duck(0)
    assert take()[0] == 1000 and out.rose  # louder again: the sender marks it (EchoLine.sent)
    assert set(take()) == {10000} and not out.rose
    out.duck(6)
    out.clear()
    out.write((np.full(RATE_HZ, 10000, dtype="<i2")).tobytes())
    assert set(take()) == {10000} and not out.ducked


async def test_a_paused_audio_out_sends_nothing_and_resumes_where_it_paused() -> None:
    out = AudioOut(RATE_HZ)
    pcm = b"".join((n % 30000).to_bytes(2, "little") for n in range(RATE_HZ))  # 1 s, every sample distinct
    out.write(pcm)
    sent: list[bytes] = []
    sender = asyncio.create_task(send_paced(out, sent.append, lead_s=0.1))
    try:
        await until(lambda: len(sent) >= 5)
        out.pause()
        paused_at = len(sent)
        out.write(pcm)  # the answer goes on being written while paused
        await asyncio.sleep(0.3)  # 15 frames' time
        assert len(sent) == paused_at and out.paused and out.busy
        out.resume()
        await until(lambda: not out.busy)
        assert b"".join(sent) == pcm + pcm  # nothing lost, nothing repeated, in order
        out.write(pcm)
        out.pause()
        out.clear()  # a barge-in cut: nothing is held any more
        assert not out.paused and not out.busy
    finally:
        out.close()
        await asyncio.wait_for(sender, 10)


class SpeakingAnswerer:
    """An answerer (``Answerer`` and ``Pausable``) whose answer is playing ``played``."""

    def __init__(self, played: str) -> None:
        self.played = played
        self.speaking = True
        self.paused = False
        self.pauses = 0
        self.resumes = 0
        self.interrupts = 0
        self.ducks: list[float] = []
        self.questions: list[str] = []

    def pause(self) -> bool:
        if not self.speaking:
            return False
        self.paused = True
        self.pauses += 1
        return True

    def resume(self) -> None:
        self.paused = False
        self.resumes += 1

    def duck(self, db: float) -> None:
        self.ducks.append(db)

    def played_text(self) -> str:
        return self.played

    def spoke_within(self, seconds: float) -> bool:
        return False

    async def interrupt(self) -> bool:
        was, self.speaking, self.paused = self.speaking, False, False
        self.interrupts += 1
        return was

    async def answer(self, user_text: str, *, speech_ended_at: float | None = None) -> None:
        self.questions.append(user_text)

    def observe_transcript(self, seconds: float) -> None:
        pass


def utterance(clip: Clip) -> np.ndarray:
    return np.concatenate([silence(0.3), clip.audio16k, silence(1.0)])


@pytest.mark.parametrize("echo", [True, False])
async def test_speech_over_the_answer_pauses_it_and_its_words_decide(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], echo: bool
) -> None:
    settings = base_settings.model_copy(update={"assistant_barge_in_echo_check": True})
    played = SENTENCES["kitchen"] if echo else SENTENCES["story"]
    answerer = SpeakingAnswerer(f"Sure. {played} Anything else?")
    assert isinstance(answerer, Pausable)
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        await feed(session, utterance(speech("kitchen")))
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        assert len(recorder.of(SpeechStarted)) == 1 and answerer.pauses == 1
        assert final.echo is echo, final
        if echo:  # the answer's own words: not answered, the answer goes on
            assert answerer.resumes == 1 and answerer.interrupts == 0 and answerer.questions == []
            assert answerer.speaking and not answerer.paused
        else:  # the user: the answer is cut and the words are the next turn
            assert answerer.interrupts == 1 and answerer.questions == [final.transcript.text]
            assert "kitchen" in final.transcript.text.lower()


@pytest.mark.parametrize("match", [0.8, 0.4])
async def test_assistant_barge_in_echo_match_is_the_share_of_words_that_makes_an_echo(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], match: float
) -> None:
    # "Turn on the kitchen lights and close the garage door.": 7 of its 10 words were played.
    settings = base_settings.model_copy(
        update={"assistant_barge_in_echo_check": True, "assistant_barge_in_echo_match": match}
    )
    answerer = SpeakingAnswerer("Turn the lights on, close the door.")
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        await feed(session, utterance(speech("kitchen")))
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        share = echo_share(final.transcript.text, answerer.played)
        assert share is not None and 0.4 <= share < 0.8, final
        assert final.echo is (match == 0.4)
        assert answerer.interrupts == (0 if match == 0.4 else 1)


async def test_an_answer_paused_past_assistant_barge_in_echo_wait_ms_is_cut(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    # (No gap filling: the audio held back below is a pause of the test, not the speaker's silence.)
    settings = base_settings.model_copy(
        update={"assistant_barge_in_echo_check": True, "assistant_barge_in_echo_wait_ms": 200, "stream_gap_fill_ms": 0}
    )
    answerer = SpeakingAnswerer(SENTENCES["kitchen"])  # the words would be its echo ...
    audio = utterance(speech("kitchen"))
    half = audio.size // 2
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        await feed(session, audio[:half])
        assert answerer.pauses == 1
        # ... but the speech goes on past 200 ms without a decision: the answer is cut as without the check.
        await until(lambda: answerer.interrupts == 1, timeout_s=10)
        await feed(session, audio[half:])
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        assert answerer.pauses == 1 and answerer.interrupts == 1 and answerer.resumes == 0
        assert final.echo is False and answerer.questions == [final.transcript.text]


async def test_without_assistant_barge_in_echo_check_speech_cuts_the_answer_at_once(  # the default
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    settings = base_settings.model_copy(update={"assistant_barge_in_echo_check": False})
    answerer = SpeakingAnswerer(SENTENCES["kitchen"])
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        await feed(session, utterance(speech("kitchen")))
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        assert answerer.pauses == 0 and answerer.interrupts == 1
        assert final.echo is False and answerer.questions == [final.transcript.text]


@pytest.mark.parametrize(
    ("suspects", "suspect", "played", "paused", "cut"),
    [
        (True, True, "kitchen", True, False),  # its own words: resumed, not answered
        (True, True, "story", True, True),  # other words: cut, answered
        (True, False, "kitchen", False, True),  # a start like a person's: cut at once
        (False, True, "kitchen", False, True),  # assistant_barge_in_echo_suspects off: cut at once
        ("all", False, "kitchen", True, False),  # all: a start like a person's is held too, its words decide
        ("all", False, "story", True, True),
    ],
)
async def test_a_suspect_start_pauses_the_answer_and_its_words_alone_decide(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    suspects: bool | str,
    suspect: bool,
    played: str,
    paused: bool,
    cut: bool,
) -> None:
    """With the word check off (the default), a speech start on frames like the canceller's leaks
    (``SpeechStart.suspect``) pauses the answer as the check would, and the words decide, without the
    residual rule (the canceller's measure says 60 dB here, which the check would take for echo)."""
    settings = base_settings.model_copy(update={"assistant_barge_in_echo_suspects": suspects})
    assert settings.assistant_barge_in_echo_check is False
    answerer = SpeakingAnswerer(SENTENCES[played])
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        session._echo_attached.removed = lambda from_ms_ago, to_ms_ago: 60.0
        session._segmenter.gate = Marking(1 if suspect else 0)  # every frame, or none
        await feed(session, utterance(speech("kitchen")))
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        assert answerer.pauses == (1 if paused else 0), final
        assert answerer.interrupts == (1 if cut else 0) and final.echo is not cut
        assert answerer.resumes == (0 if cut else 1)
        assert answerer.questions == ([final.transcript.text] if cut else [])


def loudest(clip: Clip, frame: int = 480) -> tuple[np.ndarray, int, int]:
    """The clip's 16 kHz audio, where its loudest three 30 ms frames begin, and the frame size: a
    burst cut from there is voiced from its first frame."""
    audio = clip.audio16k
    starts = range(0, audio.size - 10 * frame, frame)
    return audio, max(starts, key=lambda k: float(np.abs(audio[k : k + 3 * frame]).mean())), frame


def burst(speech: Callable[[str], Clip]) -> np.ndarray:
    """0.3 s of silence, then a burst of the clip's loudest three 30 ms frames (90 ms of speech)."""
    clip, loud, frame = loudest(speech("kitchen"))
    return np.concatenate([silence(0.3), clip[loud : loud + 3 * frame]])


@contextlib.asynccontextmanager
async def over_the_answer(
    asr_service: AsrService, settings: Settings, gate: Marking
) -> AsyncIterator[tuple[StreamSession, Recorder, SpeakingAnswerer]]:
    """A server-VAD session whose answer is playing (``SpeakingAnswerer``), its segmenter asking
    ``gate`` about each frame."""
    answerer = SpeakingAnswerer(SENTENCES["weather"])
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        session._segmenter.gate = gate
        yield session, recorder, answerer


@pytest.mark.parametrize(
    ("restart", "defer", "duck_db"),
    [(True, True, 0), (True, False, 0), (False, True, 0), (False, False, 20), (True, False, 20), (True, True, 20)],
)
async def test_a_suspect_burst_at_a_restart_too_short_to_keep_does_not_pause_the_answer(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    restart: bool,
    defer: bool,
    duck_db: float,
) -> None:
    """A suspect start just after the device's playback started afresh (``SpeechStart.restart``: a
    sentence after the device ran dry, an answer resumed) waits to pause the answer until it has
    stream_min_speech_ms of voice (assistant_barge_in_echo_defer_restarts): such leaks paused a
    user trial's long answers every 1-2 s. A burst (90 ms of speech) then pauses nothing and is not
    said to the client; a longer one (300 ms) pauses the answer once it is long enough, and its
    words decide. Other suspect starts, or with the setting off, pause at once, unless
    assistant_barge_in_echo_duck_db is above 0: then every suspect start waits so, the answer
    played that much quieter while it waits, and as written again once it is decided; but one at a
    restart, with the setting on, waits with the answer as written (a duck's end is a restart: its
    leak ducked again made dip after dip)."""
    settings = base_settings.model_copy(
        update={
            "assistant_barge_in_echo_defer_restarts": defer,
            "assistant_barge_in_echo_resume_ms": 0,
            "assistant_barge_in_echo_duck_db": duck_db,
        }
    )
    clip, loud, frame = loudest(speech("kitchen"))
    # (Every frame like a leak.)
    async with over_the_answer(asr_service, settings, Marking(1, restart=restart)) as (session, recorder, answerer):
        await feed(session, np.concatenate([burst(speech), silence(0.8)]))
        if not ((restart and defer) or duck_db):
            assert (answerer.pauses, answerer.resumes) == (1, 1), recorder.events  # paused, came to nothing
            assert not answerer.ducks
            return
        assert answerer.pauses == 0 and not recorder.events, recorder.events
        ducked = [duck_db, 0.0] if duck_db and not (restart and defer) else []
        assert answerer.ducks == ducked  # quieter while it waited (not at a restart, deferred so)
        await feed(session, np.concatenate([clip[loud : loud + 10 * frame], silence(0.8)]))
        await until(lambda: answerer.resumes == 1 or answerer.interrupts == 1)
        assert answerer.pauses == 1 and recorder.of(SpeechStarted), recorder.events
        assert answerer.ducks == ducked * 2  # as written again once it paused


@pytest.mark.parametrize(("suspects", "cancelled"), [("all", True), ("all", False), (True, True)])
async def test_suspects_all_holds_any_burst_over_the_answer_and_a_discarded_one_resumes_it(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    suspects: bool | str,
    cancelled: bool,
) -> None:
    """``assistant_barge_in_echo_suspects`` all: on a stream the server cancels echo on, a start like
    a person's (no frame like a leak) is held too, so a burst the segmenter then discards (too short
    to be speech) resumes the answer instead of having cut it (a device trial: such a leak cut a long
    answer for good). Without a canceller, or at true, it cuts the answer at once."""
    settings = base_settings.model_copy(
        update={"assistant_barge_in_echo_suspects": suspects, "assistant_barge_in_echo_resume_ms": 0}
    )
    async with over_the_answer(asr_service, settings, Marking(0)) as (session, recorder, answerer):  # none like a leak
        if cancelled:
            session._echo_attached.removed = lambda from_ms_ago, to_ms_ago: 0.5
        await feed(session, np.concatenate([burst(speech), silence(0.8)]))
        await until(lambda: answerer.resumes == 1 or answerer.interrupts == 1)
        if suspects == "all" and cancelled:
            assert (answerer.pauses, answerer.resumes, answerer.interrupts) == (1, 1, 0), recorder.events
        else:
            assert (answerer.pauses, answerer.interrupts) == (0, 1), recorder.events


@pytest.mark.parametrize(
    ("duck_starts", "cancelled", "duck_db"),
    [("all", True, 20.0), ("all", False, 20.0), ("all", True, 0.0), ("suspect", True, 20.0)],
)
async def test_duck_starts_all_ducks_a_start_like_a_persons_and_cuts_the_answer_only_once_it_is_long_enough(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    duck_starts: str,
    cancelled: bool,
    duck_db: float,
) -> None:
    """``assistant_barge_in_echo_duck_starts`` all: on a stream the server cancels echo on, a start
    like a person's (no frame like a leak) waits too, the answer ducked: a burst the segmenter then
    discards (a leak as loud and as kept as a person) leaves the answer playing, as written again,
    nothing told to the client; a longer one cuts it (not a pause: it is not suspect) once it has
    stream_min_speech_ms of voice, and its start is told then. Without a canceller, with the duck
    off, or at suspect (the default), such a start cuts the answer at once."""
    settings = base_settings.model_copy(
        update={
            "assistant_barge_in_echo_duck_starts": duck_starts,
            "assistant_barge_in_echo_duck_db": duck_db,
            "assistant_barge_in_echo_duck_reach_ms": 0,  # (cut once long enough: the reach, below)
        }
    )
    clip, loud, frame = loudest(speech("kitchen"))
    async with over_the_answer(asr_service, settings, Marking(0)) as (session, recorder, answerer):  # none like a leak
        if cancelled:
            session._echo_attached.removed = lambda from_ms_ago, to_ms_ago: 0.5
        await feed(session, np.concatenate([burst(speech), silence(0.8)]))
        if not (duck_starts == "all" and cancelled and duck_db):
            assert (answerer.pauses, answerer.interrupts, answerer.ducks) == (0, 1, []), recorder.events
            return
        assert answerer.ducks == [duck_db, 0.0] and answerer.interrupts == answerer.pauses == 0, recorder.events
        assert not recorder.events  # (a burst that came to nothing: never told)
        await feed(session, clip[loud : loud + 10 * frame])
        await until(lambda: answerer.interrupts == 1)
        assert answerer.pauses == 0 and answerer.ducks == [duck_db, 0.0] * 2, recorder.events
        assert recorder.of(SpeechStarted) and not recorder.of(SpeechStopped)  # cut while it is still spoken


@pytest.mark.parametrize(
    ("reach_ms", "voiced_s", "cut"), [(500, 0.3, False), (500, 0.6, True), (800, 0.6, False), (500, 1.08, True)]
)
async def test_duck_starts_all_cuts_only_once_the_voice_outlasts_the_ducks_reach_and_else_pauses(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    reach_ms: int,
    voiced_s: float,
    cut: bool,
) -> None:
    """``assistant_barge_in_echo_duck_reach_ms``: with duck_starts all, a start like a person's that
    ducked the answer cuts it only once its voice goes on past the duck's reach (the echo goes quiet
    when the duck is heard at the microphone; a person talks on). Voice that ends sooner (the leak of
    a delay jump, cut 0.1-0.3 s after its duck: tools/echo_live_jump.py) pauses the answer as a
    suspect start does, and its words decide; voice that goes on past the reach cuts it while it
    is still spoken."""
    settings = base_settings.model_copy(
        update={
            "assistant_barge_in_echo_duck_starts": "all",
            "assistant_barge_in_echo_duck_reach_ms": reach_ms,
        }
    )
    clip, loud, frame = loudest(speech("kitchen"))
    voice = np.tile(clip[loud : loud + 3 * frame], 12)[: int(voiced_s * RATE_HZ)]  # the loudest frames: all voiced
    async with over_the_answer(asr_service, settings, Marking(0)) as (session, recorder, answerer):  # none like a leak
        session._echo_attached.removed = lambda from_ms_ago, to_ms_ago: 0.5
        await feed(session, np.concatenate([silence(0.3), voice]))
        # (The start is heard 90 ms into the voice, and the reach counts from there; webrtcvad calls
        # some 120 ms after the voice voiced: 0.6 s of it is voiced to 540 ms past the start.)
        if cut:
            await until(lambda: answerer.interrupts == 1)  # cut, not paused, while it is still spoken
            assert answerer.pauses == 0 and not recorder.of(SpeechStopped), recorder.events
            return
        assert answerer.interrupts == answerer.pauses == 0 and answerer.ducks == [20.0], recorder.events
        await feed(session, silence(0.8))
        await until(lambda: bool(recorder.of(SpeechStopped)))
        # Paused (not cut) once its utterance ended, as written again: its words decide.
        assert answerer.pauses == 1 and answerer.ducks == [20.0, 0.0], recorder.events
        assert recorder.of(SpeechStarted), recorder.events


@pytest.mark.parametrize("cancelled", [True, False])
async def test_an_utterance_the_paused_answer_waits_on_ends_on_silence_not_at_the_turn_cap(
    asr_service: AsrService, base_settings: Settings, cancelled: bool
) -> None:
    """Semantic turns wait up to the eagerness cap (4 s) for words that read unfinished; an echoed
    fragment is cut mid-sentence by the pause, so it read so, and the answer waited 4 s in silence,
    then the decode, past assistant_barge_in_echo_wait_ms, and was cut (a device trial). An utterance
    the paused answer waits on ends at silence detection's hangover (500 ms) and its words decide (here
    not the answer's: cut); one that cut the answer at once (no canceller) is a turn like any other."""
    # (tiny.en writes the fragment as a sentence, "... the history of it.", whose words would end the
    # turn at 600 ms: the turn model alone judges here, once, and it scores the fragment unfinished.)
    update = {"assistant_barge_in_echo_suspects": "all", "turn_finished_silence_ms": 0, "turn_rescore_ms": 0}
    settings = base_settings.model_copy(update=update)
    answerer = SpeakingAnswerer(SENTENCES["story"])
    fragment = synthesize("Tell me about the history of the").audio16k
    recorder = Recorder()
    options = StreamOptions(
        transcription=TranscriptionOptions(language="en"), server_vad=True, turn_detection="semantic"
    )
    session = StreamSession(asr_service, settings, recorder, options, turn_model=TurnModel(fetch(default_dir())))
    async with contextlib.aclosing(session):
        session.assistant = answerer
        assert session.semantic_turns
        if cancelled:
            session._echo_attached.removed = lambda from_ms_ago, to_ms_ago: 0.5
        session._segmenter.gate = Marking(0)
        await feed(session, np.concatenate([silence(0.3), fragment, silence(1.5)]))
        if cancelled:
            [stopped] = recorder.of(SpeechStopped)  # within the 1.5 s of silence fed
            assert not stopped.discarded
            await until(lambda: bool(recorder.of(FinalTranscript)))
            assert answerer.pauses == 1 and answerer.interrupts == 1, recorder.events
        else:
            assert answerer.pauses == 0 and answerer.interrupts == 1
            assert not recorder.of(SpeechStopped), recorder.events  # 1.5 s into the pause: still the turn


@pytest.mark.parametrize(
    ("setting", "removed", "echo"),
    [(2.0, 2.5, True), (2.0, 1.2, False), (8.0, 6.0, False), (0.0, 60.0, False), (2.0, None, False)],
)
async def test_assistant_barge_in_echo_removed_db_takes_the_cancellers_residual_for_echo(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    setting: float,
    removed: float | None,
    echo: bool,
) -> None:
    """Words that are not the answer's ("kitchen" over a story), on a stream whose canceller took
    ``removed`` dB out of them: its residual echo when that is ``assistant_barge_in_echo_removed_db`` or
    more (0: off; None: no measure), else a real barge-in."""
    settings = base_settings.model_copy(
        update={"assistant_barge_in_echo_check": True, "assistant_barge_in_echo_removed_db": setting}
    )
    answerer = SpeakingAnswerer(SENTENCES["story"])
    asked: list[tuple[int, int]] = []

    def measure(from_ms_ago: int, to_ms_ago: int) -> float | None:
        asked.append((from_ms_ago, to_ms_ago))
        return removed

    clip = speech("kitchen")
    clip_ms = clip.audio16k.size * 1000 // RATE_HZ
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        session._echo_attached.removed = measure
        await feed(session, utterance(clip))
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        assert final.echo is echo, final
        assert answerer.interrupts == (0 if echo else 1) and answerer.resumes == (1 if echo else 0)
        # Asked once, for the utterance, counted back from the latest audio fed (the utterance ends
        # with its hangover, so at 0 ms ago), and beginning before the clip's speech.
        [(begin, end)] = asked
        assert final.audio_end_ms - final.audio_start_ms == begin - end
        assert 0 <= end < 1000 + clip_ms  # within the second of silence fed after the clip
        assert clip_ms < begin


async def test_right_after_the_answer_ended_the_cancellers_measure_does_not_make_an_echo(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip]
) -> None:
    """Speech starting within a second of the answer's end (nothing left to pause): a quick reply
    overlaps the echo's tail, so however much the canceller took out of it, only its words count."""
    settings = base_settings.model_copy(update={"assistant_barge_in_echo_check": True})
    answerer = SpeakingAnswerer(SENTENCES["story"])
    answerer.speaking = False
    answerer.spoke_within = lambda seconds: True  # type: ignore[method-assign]
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        session._echo_attached.removed = lambda from_ms_ago, to_ms_ago: 60.0
        await feed(session, utterance(speech("kitchen")))
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        assert final.echo is False and answerer.pauses == 0
        assert answerer.questions == [final.transcript.text]


def _check(base_settings: Settings, **update: object) -> EchoCheck:
    settings = base_settings.model_copy(update={"assistant_barge_in_echo_check": True, **update})
    return EchoCheck(settings, lambda coro, name: asyncio.get_running_loop().create_task(coro, name=name))


async def _came_to_nothing(check: EchoCheck, answerer: SpeakingAnswerer, how: str) -> None:
    """The utterance held over the answer ends without being the user's: too short, or no words."""
    if how == "discarded":
        check.discarded(answerer)
    else:
        assert await check.decide(answerer, "", check.ended()) is False


@pytest.mark.parametrize("how", ["discarded", "no words"])
@pytest.mark.parametrize("resume_ms", [300, 0])
async def test_speech_right_after_a_start_that_came_to_nothing_decides_over_the_still_paused_answer(
    base_settings: Settings, how: str, resume_ms: int
) -> None:
    """A leak's segment ends as a person starts (live: the same stream millisecond): with
    ``assistant_barge_in_echo_resume_ms`` the answer is still paused when the person's start comes,
    so no answer audio goes out over them; at 0 it resumed in between and is paused again."""
    check = _check(base_settings, assistant_barge_in_echo_resume_ms=resume_ms)
    answerer = SpeakingAnswerer("There are many types of cows.")
    assert check.hold(answerer)  # the leak's start pauses the answer
    await _came_to_nothing(check, answerer, how)
    assert answerer.paused is (resume_ms > 0) and answerer.resumes == (0 if resume_ms else 1)
    assert check.hold(answerer)  # the person starts
    assert answerer.paused and answerer.pauses == (1 if resume_ms else 2)
    assert await check.decide(answerer, "Go forward ten meters.", check.ended()) is False
    assert answerer.interrupts == 1 and answerer.resumes == (0 if resume_ms else 1)


@pytest.mark.parametrize("how", ["discarded", "no words"])
async def test_a_start_that_came_to_nothing_resumes_the_answer_after_assistant_barge_in_echo_resume_ms(
    base_settings: Settings, how: str
) -> None:
    check = _check(base_settings, assistant_barge_in_echo_resume_ms=150)
    answerer = SpeakingAnswerer("There are many types of cows.")
    assert check.hold(answerer)
    ended = time.monotonic()
    await _came_to_nothing(check, answerer, how)
    assert answerer.paused
    await until(lambda: answerer.resumes == 1, timeout_s=10)
    assert time.monotonic() - ended >= 0.15 and not answerer.paused and answerer.interrupts == 0
    # The answer's own words resume it at once: that is no person starting.
    assert check.hold(answerer)
    assert await check.decide(answerer, "many types of cows", check.ended()) is True
    assert answerer.resumes == 2 and not answerer.paused


async def test_a_start_joining_the_resume_wait_is_cut_after_assistant_barge_in_echo_wait_ms(
    base_settings: Settings,
) -> None:
    """Speech that starts while the answer waits to resume waits on its own decision, and the
    pause's expiry holds for it as for the first (the answer is cut, not left paused)."""
    check = _check(base_settings, assistant_barge_in_echo_resume_ms=5000, assistant_barge_in_echo_wait_ms=150)
    answerer = SpeakingAnswerer("There are many types of cows.")
    assert check.hold(answerer)
    check.discarded(answerer)
    assert check.hold(answerer)
    await until(lambda: answerer.interrupts == 1, timeout_s=10)
    assert answerer.resumes == 0


async def test_a_start_joining_the_resume_wait_keeps_the_answer_paused_until_its_words_decide(
    base_settings: Settings,
) -> None:
    """The joined start cancels the pending resume: past ``assistant_barge_in_echo_resume_ms`` the
    answer is still paused, waiting on it. If it too comes to nothing, the answer resumes at once
    (one wait a pause: noise in bursts cannot keep it silent)."""
    check = _check(base_settings, assistant_barge_in_echo_resume_ms=100)
    answerer = SpeakingAnswerer("There are many types of cows.")
    assert check.hold(answerer)
    check.discarded(answerer)
    assert check.hold(answerer)  # within the 100 ms
    await asyncio.sleep(0.3)
    assert answerer.paused and answerer.resumes == 0
    check.discarded(answerer)
    assert not answerer.paused and answerer.resumes == 1 and answerer.pauses == 1


async def test_suspects_all_counts_a_stream_as_cancelled_only_where_auto_found_echo(
    asr_service: AsrService, base_settings: Settings
) -> None:
    """``all`` holds every start on a stream whose echo the server cancels: not on one whose canceller
    ``auto`` found free of echo (it passes the microphone: a device that cancels its own echo), where a
    start cuts the answer as it did."""
    async with open_session(asr_service, base_settings, server_vad=True) as (session, _):
        assert not session._echo_attached.cancelling  # no canceller
        line = EchoLine.of(base_settings)
        line.set_mode("auto", base_settings)
        session.attach_echo(line)
        assert session._echo_attached.cancelling  # undecided: cancelled
        assert line.canceller.detect is not None
        line.canceller.detect.echo = False
        assert not session._echo_attached.cancelling  # passing
        line.canceller.detect.echo = True
        assert session._echo_attached.cancelling


def stock_phrase_leak() -> np.ndarray:
    """What the server's canceller lets through of an answer's echo on a simulated device
    (tests/echo_room.py) as it converges on the first answer, on which Whisper writes its stock phrase,
    "Thank you.", with a no_speech_prob of about 0.8 (tools/echo_stock_phrases.py, seed 8's leak):
    tests/fixtures/stock_phrase_leak.wav (its README says how it was made). Made at test time it
    differed by machine: AEC3's and Piper's floating point follow the CPU, and on an AMD EPYC the
    slice made so far decoded to no words at all (the test then had no stock phrase to weigh)."""
    from tests.human_speech import decode

    return decode((FIXTURES / "stock_phrase_leak.wav").read_bytes(), "wav")


@pytest.mark.parametrize(
    ("setting", "leak", "passing", "echo"),
    [
        (0.65, True, False, True),
        (0.9, True, False, False),
        (0.0, True, False, False),
        (0.65, False, False, False),
        (0.65, True, True, False),
    ],
)
async def test_assistant_barge_in_echo_no_speech_takes_whispers_stock_phrase_on_the_residual_for_echo(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    setting: float,
    leak: bool,
    passing: bool,
    echo: bool,
) -> None:
    """A suspect start over the answer (the default settings) on what the canceller leaked: Whisper
    writes words that are not the answer's ("Thank you."), which cut it, unless its no-speech score
    reaches assistant_barge_in_echo_no_speech (0 = off); a person's words ("kitchen") still cut it, and
    so does anything on a stream whose canceller ``auto`` found free of echo (``passing``: it cancels
    nothing there, and measures 0 dB removed, not None: a review)."""
    settings = base_settings.model_copy(update={"assistant_barge_in_echo_no_speech": setting})
    answerer = SpeakingAnswerer(SENTENCES["story"])
    audio = stock_phrase_leak() if leak else speech("kitchen").audio16k
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        if passing:
            line = EchoLine.of(settings)
            line.set_mode("auto", settings)
            session.attach_echo(line)
            assert line.canceller.detect is not None
            line.canceller.detect.echo = False
            # (What a passing canceller measures once audio went through it: the microphone as it came.)
            session._echo_attached.removed = lambda from_ms_ago, to_ms_ago: 0.0
            assert not session._echo_attached.cancelling
        else:
            session._echo_attached.removed = lambda from_ms_ago, to_ms_ago: 0.5
        session._segmenter.gate = Marking(1)  # a suspect start
        await feed(session, np.concatenate([silence(0.3), audio, silence(1.0)]))
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        no_speech = max(s.no_speech_prob or 0.0 for s in final.transcript.segments)
        print(f"\n{final.transcript.text!r}: no_speech_prob {no_speech:.2f}")
        assert final.transcript.text.strip()
        assert (no_speech >= 0.65) is leak
        assert answerer.pauses == 1 and final.echo is echo
        assert answerer.interrupts == (0 if echo else 1) and answerer.resumes == (1 if echo else 0)


@pytest.mark.parametrize(
    ("setting", "share", "echo"),
    [(0.6, 0.8, True), (0.6, 0.5, False), (0.9, 0.8, False), (0.0, 1.0, False), (0.6, None, False)],
)
async def test_assistant_barge_in_echo_residual_share_takes_the_cancellers_residual_for_echo(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    setting: float,
    share: float | None,
    echo: bool,
) -> None:
    """A suspect start over the answer (the check itself off, the default) whose words are not the
    answer's ("kitchen" over a story) cuts it, unless ``assistant_barge_in_echo_residual_share`` or
    more of its voiced frames were the canceller's residual echo (``SpeechGate.residual_share``; 0:
    off; None: not measured): then it is the echo, and the answer resumes. The share is asked for the
    utterance's own span."""
    settings = base_settings.model_copy(update={"assistant_barge_in_echo_residual_share": setting})
    answerer = SpeakingAnswerer(SENTENCES["story"])
    asked: list[tuple[float, float]] = []

    def measure(from_ms_ago: float, to_ms_ago: float) -> float | None:
        asked.append((from_ms_ago, to_ms_ago))
        return share

    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        session._echo_attached.removed = lambda from_ms_ago, to_ms_ago: 0.5
        session._echo_attached.residual_share = measure
        session._segmenter.gate = Marking(1)  # a suspect start
        await feed(session, utterance(speech("kitchen")))
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        assert "kitchen" in final.transcript.text.lower()
        assert answerer.pauses == 1 and final.echo is echo, final
        assert answerer.interrupts == (0 if echo else 1) and answerer.resumes == (1 if echo else 0)
        [(begin, end)] = asked
        assert final.audio_end_ms - final.audio_start_ms == begin - end


@pytest.mark.parametrize(("after_start", "echo"), [(10.0, True), (1.0, False)])
async def test_the_residual_share_is_the_utterances_own_through_the_real_gate(
    asr_service: AsrService,
    base_settings: Settings,
    speech: Callable[[str], Clip],
    monkeypatch: pytest.MonkeyPatch,
    after_start: float,
    echo: bool,
) -> None:
    """The wiring of the residual share, with the server's own canceller and speech gate on the
    stream: the segmenter notes the utterance's voiced frames (while the paused answer waits on it),
    and the session hands the gate's share over the utterance to the word check. The canceller's
    measure reads 10 (residual echo) until the start is told, then ``after_start``: at 10 every frame
    was residual (the echo, whatever "kitchen" says); at 1 only the frames that started it were,
    far under 0.6 of the utterance, and its words cut the answer."""
    from mediaserver.audio.echo_delay import ResidualEcho

    # (The check on, so that the start is held whatever the gate says of it; the other rules off: AEC3
    # takes some dB out of a person under a white-noise answer, and Whisper's score varies. The paused
    # answer waits for the decode however long it takes: in a full run on 2 cores it took 5.7 s once,
    # past the 5 s wait, and the answer was cut before its words were weighed.)
    update = {
        "assistant_barge_in_echo_check": True,
        "assistant_barge_in_echo_removed_db": 0.0,
        "assistant_barge_in_echo_no_speech": 0.0,
        "assistant_barge_in_echo_wait_ms": 60000,
    }
    settings = base_settings.model_copy(update=update)
    answerer = SpeakingAnswerer(SENTENCES["story"])
    async with open_session(asr_service, settings, server_vad=True) as (session, recorder):
        session.assistant = answerer
        line = EchoLine.of(settings)
        line.set_mode("on", settings)
        session.attach_echo(line)

        def sharpness(self: ResidualEcho) -> float:
            return after_start if recorder.of(SpeechStarted) else 10.0

        monkeypatch.setattr(ResidualEcho, "sharpness", sharpness)
        mic = np.concatenate([silence(3.0), speech("kitchen").audio16k, silence(1.0)])
        # The answer plays throughout (white noise at -26 dBFS as its audio), past the gate's hold.
        line.canceller.played(np.random.default_rng(0).normal(0, 0.05, mic.size + RATE_HZ).astype(np.float32), 0)
        for start in range(0, mic.size, 320):
            await session.feed(line.process(mic[start : start + 320]))
        await until(lambda: bool(recorder.of(FinalTranscript)))
        [final] = recorder.of(FinalTranscript)
        # (Words, not the story's: AEC3's suppressor garbles some of them under the answer.)
        assert final.transcript.text.strip(), final
        assert answerer.pauses == 1 and final.echo is echo, final
        assert answerer.interrupts == (0 if echo else 1) and answerer.resumes == (1 if echo else 0)


@pytest.mark.parametrize("burst_ms", [250, 0])
async def test_a_burst_over_the_paused_answer_ends_at_assistant_barge_in_echo_burst_ms(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], burst_ms: int
) -> None:
    """With assistant_barge_in_echo_duck_db 0, a suspect burst (90 ms of speech) pauses the answer;
    while the answer waits on it, it is discarded after ``assistant_barge_in_echo_burst_ms`` of
    silence (250 by default) instead of stream_vad_hangover_ms (500; 0 = that), so the pause it
    costs is that much shorter. A longer utterance keeps the hangover (the word check's tests)."""
    settings = base_settings.model_copy(
        update={
            "assistant_barge_in_echo_burst_ms": burst_ms,
            "assistant_barge_in_echo_resume_ms": 0,
            "assistant_barge_in_echo_duck_db": 0.0,  # (a suspect start pauses the answer at once)
        }
    )
    # (Every frame like a leak: a suspect start.)
    async with over_the_answer(asr_service, settings, Marking(1)) as (session, recorder, answerer):
        sound = burst(speech)
        burst_end_ms = sound.size * 1000 // RATE_HZ
        await feed(session, np.concatenate([sound, silence(0.8)]))
        await until(lambda: answerer.resumes == 1)
        [stopped] = recorder.of(SpeechStopped)
        assert answerer.pauses == 1 and stopped.discarded
        waited_ms = stopped.audio_end_ms - burst_end_ms
        hangover_ms = burst_ms or settings.stream_vad_hangover_ms
        # (From the end of the audio fed as the burst: webrtcvad still hears its last 100 ms or so.)
        assert hangover_ms <= waited_ms <= hangover_ms + 150, (waited_ms, hangover_ms)


@pytest.mark.parametrize("hangover_ms", [500, 300])
async def test_a_burst_over_the_ducked_answer_ends_at_the_hangover_and_the_answer_plays_as_written(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], hangover_ms: int
) -> None:
    """With assistant_barge_in_echo_duck_db a suspect burst ducks the answer instead of pausing it;
    it ends at stream_vad_hangover_ms of silence (not assistant_barge_in_echo_burst_ms, which cut a
    person's first word off the rest under the ducked echo in a barge-in test), and the answer plays
    as written again then, nothing told to the client."""
    settings = base_settings.model_copy(
        update={
            "assistant_barge_in_echo_burst_ms": 200,
            "assistant_barge_in_echo_duck_db": 12.0,
            "stream_vad_hangover_ms": hangover_ms,
        }
    )
    # (Every frame like a leak: a suspect start.)
    async with over_the_answer(asr_service, settings, Marking(1)) as (session, recorder, answerer):
        await feed(session, burst(speech))
        assert answerer.ducks == [12.0] and answerer.pauses == 0
        # (webrtcvad still hears the burst's last 100 ms or so: 400 ms of silence is past 300 and
        # that, short of 500.)
        await feed(session, silence(0.4))
        assert answerer.ducks == ([12.0, 0.0] if hangover_ms == 300 else [12.0]), hangover_ms
        await feed(session, silence(0.4))
        assert answerer.ducks == [12.0, 0.0] and answerer.pauses == 0 and not recorder.events


@pytest.mark.parametrize("how", ["clear", "push_to_talk"])
async def test_a_deferred_start_dropped_leaves_the_answer_as_written(
    asr_service: AsrService, base_settings: Settings, speech: Callable[[str], Clip], how: str
) -> None:
    """A suspect start the answer is ducked for, dropped before it is decided (the client's
    ``clear``, or a ``start`` that turns server VAD off, after which nothing would decide it): the
    answer plays as written again at once, and nothing is left deferred."""
    settings = base_settings.model_copy(update={"assistant_barge_in_echo_duck_db": 20.0})
    # (Every frame like a leak: a suspect start.)
    async with over_the_answer(asr_service, settings, Marking(1)) as (session, recorder, answerer):
        await feed(session, burst(speech))
        assert answerer.ducks == [20.0]
        if how == "clear":
            session.clear()
        else:
            session.configure(dataclasses.replace(session.options, server_vad=False))
        assert answerer.ducks == [20.0, 0.0] and session._barge_in.deferred_start is None
        assert answerer.pauses == answerer.interrupts == 0 and not recorder.events


async def test_the_residual_measure_runs_only_for_a_session_that_answers(
    asr_service: AsrService, base_settings: Settings
) -> None:
    """Only a session that answers (its barge-in reads the gate's residual notes) runs the measure:
    a Realtime conversation or a transcription-only stream never reads them, so its gate notes
    nothing, whichever comes first, the canceller or the assistant."""
    async with open_session(asr_service, base_settings, server_vad=True) as (session, _):
        line = EchoLine.of(base_settings)
        line.set_mode("on", base_settings)
        session.attach_echo(line)
        gate = session._segmenter.gate
        assert isinstance(gate, SpeechGate) and not gate.read
        session.assistant = SpeakingAnswerer(SENTENCES["story"])
        assert gate.read
        session.attach_echo(line)  # (the same canceller again, as a Realtime session.update does)
        assert session._segmenter.gate is gate and gate.read
        session.assistant = None
        assert not gate.read
        gate(np.full(480, 0.1, np.float32), 0, True)
        assert gate.residual_share(30, 0) is None  # not measured
