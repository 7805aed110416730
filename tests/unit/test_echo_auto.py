"""``echo_cancellation: auto`` (audio/echo_presence.py): the canceller's output where the microphone
carries the answers' echo, the microphone itself where it carries none (a device that cancels its
own echo). Simulated devices (tests/echo_room.py), Piper answers, a real person
(tests/human_speech.py)."""

from __future__ import annotations

import numpy as np
import pytest

from mediaserver.audio.echo import OUTPUT_LATENCY_SAMPLES, EchoCanceller, SpeechGate
from mediaserver.audio.echo_line import EchoLine
from mediaserver.audio.echo_presence import EchoPresence
from mediaserver.config import Settings
from tests import echo_room as room
from tests.echo_room import RATE, Audio
from tests.human_speech import default_dir, load_clips

PIECE = 320  # (the answers and the person: tests/unit/conftest.py)


def run(ec: EchoCanceller, reference: Audio, mic: Audio) -> tuple[Audio, float | None, float | None]:
    """(output, stream time at which auto decided no echo, ... echo), the whole reference recorded
    up front and the microphone fed in 20 ms pieces."""
    ec.played(reference, 0)
    out, quiet_at, echo_at = [], None, None
    for i in range(0, mic.size, PIECE):
        out.append(ec.process(mic[i : i + PIECE]))
        if ec.detect is not None and ec.detect.echo is False and quiet_at is None:
            quiet_at = (i + PIECE) / RATE
        if ec.detect is not None and ec.detect.echo and echo_at is None:
            echo_at = (i + PIECE) / RATE
    return np.concatenate(out), quiet_at, echo_at


def no_echo_device(answers: list[Audio], person: Audio, seed: int = 8) -> tuple[room.Trial, Audio]:
    """A device that cancels its own echo: the person and a -60 dBFS floor reach its microphone, the
    answer does not; the person starts 0.2-0.6 of the way into the answer (2.8 s in with seed 8)."""
    trial = room.simulate(answers[:1], np.random.default_rng(seed), near=person, delays_ms=[150], cut_after_s=None)
    noise = trial.mic - trial.echo - trial.near
    return trial, (trial.near + noise).astype(np.float32)


def test_auto_passes_a_microphone_that_carries_no_echo(answers: list[Audio], person: Audio) -> None:
    trial, mic = no_echo_device(answers, person)
    first_sound = int(np.argmax(np.abs(trial.reference) > 1e-3)) / RATE
    assert trial.barge_at is not None
    onset = trial.barge_at / RATE
    auto = EchoCanceller(detect=EchoPresence())
    out, quiet_at, echo_at = run(auto, trial.reference, mic)
    assert quiet_at is not None and echo_at is None
    # decided before the person spoke: 0.8 s of answer audio 1 s old (its echo in at the longest delay)
    assert quiet_at - first_sound <= 2.0 and quiet_at < onset
    assert auto.passing
    # From then on the microphone itself, 8 ms late as the canceller's output is.
    late = np.concatenate([np.zeros(OUTPUT_LATENCY_SAMPLES, np.float32), mic])[: out.size]
    start = int(quiet_at * RATE) + PIECE
    assert np.array_equal(out[start:], late[start:])
    gate = SpeechGate(auto, 20.0, 600.0, 8.0, hold_s=2.0)
    assert gate(np.zeros(480, np.float32))  # the gate stands aside, even inside the echo's tail
    # What ``on`` would have done to the same person: AEC3 with no echo to find takes part of them.
    on_out, _, _ = run(EchoCanceller(), trial.reference, mic)
    speaking = np.zeros(out.size // room.VAD_FRAME, bool)
    speaking[trial.barge_at // room.VAD_FRAME : (trial.barge_at + person.size) // room.VAD_FRAME] = True
    kept = [room.correlation(x[OUTPUT_LATENCY_SAMPLES:], trial.near, speaking[:-1]) for x in (out, on_out)]
    assert kept[0] > 0.99 > kept[1]


def test_auto_cancels_a_microphone_that_carries_the_echo(answers: list[Audio]) -> None:
    trial = room.simulate(answers, np.random.default_rng(1), delays_ms=[150])
    first_sound = int(np.argmax(np.abs(trial.reference) > 1e-3)) / RATE
    auto = EchoCanceller(detect=EchoPresence())
    out, quiet_at, echo_at = run(auto, trial.reference, trial.mic)
    # found once 2 s of levels are compared (a stream that starts with its answer); undecided until
    # then, which cancels as ``on`` does
    assert echo_at is not None and echo_at <= first_sound + 2.0 and quiet_at is None
    on, _, _ = run(EchoCanceller(), trial.reference, trial.mic)
    assert np.array_equal(out, on)  # exactly what ``on`` puts out


@pytest.mark.parametrize("person_name", ["librivox_0870", "arctic_a0009", "goforward", "jfk"])
def test_a_person_over_an_answer_that_is_not_played_is_no_echo(answers: list[Audio], person_name: str) -> None:
    """A client that sends its microphone only while its user speaks (push to talk; a Realtime app
    appending the question after cancelling an answer it stopped playing): the answer still plays on
    the server's clock, and the person's levels are compared with it from the stream's first frame.
    On a few frames two unrelated voices correlate as well as an echo (1.0 on two or three: every
    such stream was found to echo and had its speech cancelled); a delay counts only once
    ``echo_auto_min_compared_s`` of it is compared."""
    _, audio, _ = load_clips(default_dir(), [person_name])[0]
    voice = (audio / room.rms(audio) * 0.07).astype(np.float32)
    floor = np.random.default_rng(3).normal(0, 1e-3, voice.size).astype(np.float32)  # -60 dBFS
    reference = np.concatenate(answers)

    def decided() -> tuple[float | None, float | None, EchoPresence]:
        line = EchoLine()
        line.set_mode("auto", Settings(_env_file=None))
        _, quiet_at, echo_at = run(line.canceller, reference, voice + floor)
        assert line.canceller.detect is not None
        return quiet_at, echo_at, line.canceller.detect

    _, echo_at, detect = decided()
    assert echo_at is None, (echo_at, detect.likeness)
    assert detect.likeness is not None and detect.likeness < 0.85


def test_the_auto_settings(answers: list[Audio], person: Audio) -> None:
    trial, mic = no_echo_device(answers, person)

    def decided(**values: float) -> tuple[float | None, float | None]:
        line = EchoLine()
        line.set_mode("auto", Settings(_env_file=None, **values))  # type: ignore[arg-type]
        _, quiet_at, echo_at = run(line.canceller, trial.reference, mic)
        return quiet_at, echo_at

    default_quiet, _ = decided()
    assert default_quiet is not None
    later, _ = decided(echo_auto_min_sound_s=2.5)
    assert later is not None and later >= default_quiet + 1.0
    assert decided(echo_auto_quiet_likeness=0.0) == (None, None)  # never found quiet: cancelled as with on
    echoing = room.simulate(answers, np.random.default_rng(1), delays_ms=[150])
    line = EchoLine()
    line.set_mode("auto", Settings(_env_file=None, echo_auto_echo_likeness=1.0))
    _, quiet_at, echo_at = run(line.canceller, echoing.reference, echoing.mic)
    assert echo_at is None and quiet_at is None  # undecided: still cancelled
    for compared_s in (1.0, 4.0):  # each delay judged on this much at least: the echo found once it is
        line = EchoLine()
        line.set_mode("auto", Settings(_env_file=None, echo_auto_min_compared_s=compared_s))
        _, quiet_at, echo_at = run(line.canceller, echoing.reference, echoing.mic)
        assert echo_at is not None and compared_s <= echo_at <= compared_s + 1.0 and quiet_at is None
    line.set_mode("on", Settings(_env_file=None))
    assert line.canceller.detect is None and not line.canceller.passing


@pytest.mark.parametrize("ahead_s", [1.0, 3.0])
def test_audio_faster_than_real_time_is_no_microphone(monkeypatch: pytest.MonkeyPatch, ahead_s: float) -> None:
    """A client that sends a recording faster than real time (an SDK app appending a file) has no
    loudspeaker playing into it: once its audio is ``echo_auto_streamed_ahead_s`` ahead of the wall
    clock, auto passes it (and the speech gate stands aside: its barge-in is heard at once)."""
    from mediaserver.audio import echo_line as echo

    clock = [100.0]
    monkeypatch.setattr(echo, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])}))
    line = EchoLine.of(Settings(_env_file=None, echo_auto_streamed_ahead_s=ahead_s))
    line.set_mode("auto", Settings(_env_file=None))
    assert line.canceller.detect is not None
    for _ in range(50):  # 5 s of audio at real time, in 0.1 s pieces: a microphone
        line.arrived(1600)
        clock[0] += 0.1
    assert not line.canceller.detect.streamed and line.canceller.detect.echo is None
    sent = 0.0
    while not line.canceller.detect.streamed:  # then twice as fast as real time
        line.arrived(1600)
        clock[0] += 0.05
        sent += 0.05  # seconds ahead
        assert sent <= ahead_s + 0.1
    assert sent >= ahead_s - 0.1
    assert line.canceller.passing and line.canceller.detect.echo is False
    gate = SpeechGate(line.canceller, 20.0, 600.0, 8.0, hold_s=2.0)
    line.canceller.played(np.full(16000, 0.1, np.float32), line.canceller.position)
    assert gate(np.zeros(480, np.float32))


@pytest.mark.parametrize("delay_ms", [600, 1000])
def test_a_device_that_plays_late_is_found_to_echo_and_never_passed(answers: list[Audio], delay_ms: float) -> None:
    """A device whose playback lags 0.6-1 s (its buffers): the delays searched reach 1 s, and no echo
    is decided only on answer audio 1 s old, so its echo is never passed uncancelled (searched to
    500 ms, the 600 ms device read as no echo 5.6 s in)."""
    reference, mic, _ = room.echoing_device(answers, delay_ms, 0.7, 7, 1.5)
    auto = EchoCanceller(detect=EchoPresence())
    auto.played(reference, 0)
    passed = False
    for i in range(0, mic.size, PIECE):
        auto.process(mic[i : i + PIECE])
        passed |= auto.passing
    assert auto.detect is not None and auto.detect.echo is True and not passed


@pytest.mark.parametrize("hold_ms", [3000, 0])
def test_a_person_over_the_first_answer_before_auto_has_decided_is_put_out_whole(
    answers: list[Audio], person: Audio, hold_ms: int
) -> None:
    """A device that cancels its own echo, and a person who speaks 0.3 s into the first answer, long
    before auto has decided (a Realtime trial: their question was not heard). With
    ``echo_auto_hold_ms`` the output waits for the decision, then is the microphone itself from the
    start (nothing lost, nothing taken by AEC3); at 0 it goes out at once, as ``on``'s, which took
    part of the person."""
    reference = answers[0]
    rng = np.random.default_rng(3)
    mic = (rng.standard_normal(reference.size + RATE) * 1e-3).astype(np.float32)  # -60 dBFS floor
    at = int(0.3 * RATE)
    mic[at : at + person.size] += person[: mic.size - at]
    ec = EchoCanceller(detect=EchoPresence(), hold_undecided_ms=hold_ms)
    out, quiet_at, echo_at = run(ec, reference, mic)
    assert quiet_at is not None and echo_at is None and ec.holding == 0
    late = np.concatenate([np.zeros(OUTPUT_LATENCY_SAMPLES, np.float32), mic])[: out.size]
    assert out.size == mic.size - mic.size % 160  # every whole frame put out, none dropped
    said = slice(at, at + min(person.size, mic.size - at - OUTPUT_LATENCY_SAMPLES))
    if hold_ms:
        assert np.array_equal(out, late)  # the microphone itself, the first seconds included
    else:
        mask = np.ones((said.stop - said.start) // room.VAD_FRAME, bool)
        kept = room.correlation(out[said][OUTPUT_LATENCY_SAMPLES:], mic[said], mask[:-1])
        assert kept < 0.99, kept


def test_a_microphone_that_echoes_waits_for_the_decision_then_is_cancelled_as_on(answers: list[Audio]) -> None:
    """Held for the decision, an echoing microphone's output is then exactly what ``on`` puts out;
    with a hold shorter than the decision takes, it goes out at the hold's end, cancelled."""
    trial = room.simulate(answers, np.random.default_rng(1), delays_ms=[150])
    on, _, _ = run(EchoCanceller(), trial.reference, trial.mic)
    for hold_ms in (3000, 500):
        ec = EchoCanceller(detect=EchoPresence(), hold_undecided_ms=hold_ms)
        pieces, most = [], 0
        ec.played(trial.reference, 0)
        for i in range(0, trial.mic.size, PIECE):
            pieces.append(ec.process(trial.mic[i : i + PIECE]))
            most = max(most, ec.holding)
        assert ec.detect is not None and ec.detect.echo is True
        assert np.array_equal(np.concatenate(pieces), on)
        assert 0 < most <= hold_ms * RATE // 1000 and most >= min(hold_ms, 1500) * RATE // 1000 - PIECE


@pytest.mark.parametrize(("hold_ms", "mode", "samples"), [(500, "auto", 8000), (0, "auto", 0), (3000, "on", 48000)])
def test_echo_auto_hold_ms_is_the_lines_wait_for_the_decision(hold_ms: int, mode: str, samples: int) -> None:
    """``echo_auto_hold_ms`` reaches the stream's canceller (only ``auto`` has a decision to wait for:
    with ``on`` there is no ``detect``, and nothing waits)."""
    settings = Settings(echo_auto_hold_ms=hold_ms)
    line = EchoLine.of(settings)
    line.set_mode("auto" if mode == "auto" else "on", settings)
    assert line.canceller.hold_undecided_samples == samples
    assert (line.canceller.detect is not None) == (mode == "auto")
    line.sent((np.ones(RATE, np.float32) * 0.1 * 32767).astype("<i2").tobytes(), RATE)
    out = line.process(np.zeros(RATE // 10, np.float32))  # 100 ms into the answer, nothing decided
    assert out.size == (0 if mode == "auto" and hold_ms else RATE // 10 - RATE // 10 % 160)


async def test_held_audio_is_released_once_the_sender_stops_sending() -> None:
    """``HeldRelease``: while the canceller holds audio for auto's decision, the transport is told to
    hear it once no audio has come for ``wait_s`` (a sender that appends only while its user speaks,
    Opus DTX); audio still coming keeps it waiting, and nothing held is nothing to release."""
    import asyncio

    from mediaserver.audio.echo_line import HeldRelease

    settings = Settings(echo_auto_hold_ms=3000)
    line = EchoLine.of(settings)
    line.set_mode("auto", settings)
    line.sent((np.ones(RATE, np.float32) * 0.1 * 32767).astype("<i2").tobytes(), RATE)
    released = asyncio.Event()
    watch = HeldRelease(1.0, released.set)
    for _ in range(5):  # audio keeps coming for 0.5 s: held, and not released meanwhile
        assert line.process(np.zeros(RATE // 50, np.float32)).size == 0
        watch.fed(line)
        await asyncio.sleep(0.1)
        assert not released.is_set()
    assert line.canceller.holding > 0
    async with asyncio.timeout(5):
        await released.wait()  # then nothing comes: released
    assert line.release().size > 0 and line.canceller.holding == 0
    quiet = HeldRelease(0.05, released.clear)
    quiet.fed(line)  # nothing held: nothing to watch
    await asyncio.sleep(0.2)
    assert released.is_set()
    watch.close()
    quiet.close()


def test_settle_decides_no_echo_on_a_quiet_microphone_and_not_on_an_echoing_one(answers: list[Audio]) -> None:
    """``EchoPresence.settle`` (a release when the sender stopped, or a commit, before the usual
    evidence is in): a microphone that does not follow the answer is no echo; one that already
    follows it is not passed."""
    trial = room.simulate(answers[:1], np.random.default_rng(1), delays_ms=[150])
    for mic, passes in ((np.random.default_rng(2).standard_normal(trial.mic.size) * 1e-3, True), (trial.mic, False)):
        ec = EchoCanceller(detect=EchoPresence(), hold_undecided_ms=3000)
        ec.played(trial.reference, 0)
        first = int(np.argmax(np.abs(trial.reference) > 1e-3))
        for i in range(0, first + RATE, PIECE):  # 1 s into the answer: undecided
            ec.process(mic[i : i + PIECE].astype(np.float32))
        assert ec.detect is not None and ec.detect.echo is None and ec.holding > 0
        out = ec.release(settle=True)
        assert out.size > 0 and ec.passing is passes and ec.holding == 0
