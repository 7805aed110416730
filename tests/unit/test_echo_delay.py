"""mediaserver.audio.echo_delay: the delay tracker in front of AEC3, on the simulated device
(tests/echo_room.py) with Piper answers as the far end.

After the echo's delay jumps, AEC3 alone needs seconds to find it (ERLE 13.6 dB over the echo from
2 s after the jump measured on the first session here); the tracker finds it in about a second and
moves the reference, so AEC3 keeps the delay it converged on (40.7 dB).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from mediaserver.audio import echo_delay
from mediaserver.audio.echo import OUTPUT_LATENCY_SAMPLES, EchoCanceller
from mediaserver.audio.echo_delay import DelayTracker
from mediaserver.audio.echo_line import EchoLine
from mediaserver.config import Settings
from tests import echo_room as room
from tests.echo_room import RATE, Audio, Trial

MS = RATE // 1000


def cancel(trial: Trial, tracker: DelayTracker | None) -> tuple[Audio, EchoCanceller]:
    ec = EchoCanceller(tracker=tracker)
    ec.played(trial.reference, 0)
    out = np.concatenate([ec.process(trial.mic[i : i + 320]) for i in range(0, trial.mic.size, 320)])
    return np.concatenate([out[OUTPUT_LATENCY_SAMPLES:], np.zeros(OUTPUT_LATENCY_SAMPLES, np.float32)]), ec


def erle_after(trial: Trial, out: Audio, seconds: float) -> float:
    """ERLE over the echo-only frames from ``seconds`` after the delay jump."""
    echo_only, _ = trial.frames()
    mask = echo_only[: out.size // room.VAD_FRAME].copy()
    mask[: (trial.delays[1][0] + int(seconds * RATE)) // room.VAD_FRAME] = False
    assert mask.sum() > 100
    return room.erle_db(trial.mic, out, mask)


@pytest.fixture(scope="module")
def jump_up(answers: list[Audio]) -> Trial:
    return room.simulate([*answers, *answers], np.random.default_rng(3), delays_ms=[60, 260])


@pytest.fixture(scope="module")
def untracked(jump_up: Trial) -> float:
    out, _ = cancel(jump_up, None)
    return erle_after(jump_up, out, 2.0)


def test_a_later_echo_is_found_within_two_seconds_and_cancelled_as_before(jump_up: Trial, untracked: float) -> None:
    tracker = DelayTracker(1.0, 500)
    told: list[tuple[str, float]] = []
    tracker.on_change = lambda change, delay_ms: told.append((change, delay_ms))
    out, ec = cancel(jump_up, tracker)
    assert len(told) == 1 and told[0][0] == "moved" and abs(told[0][1] - 260) <= 2, told
    assert tracker.baseline is not None and abs(tracker.baseline - 60 * MS) <= 2 * MS
    assert tracker.shifts == 1 and abs(tracker.shift - 200 * MS) <= 2 * MS
    assert ec.shifted_at is not None and 0 < ec.shifted_at - jump_up.delays[1][0] <= 2 * RATE  # measured 0.95 s
    tracked = erle_after(jump_up, out, 2.0)
    assert tracked >= 30.0  # measured 40.7 dB
    assert tracked >= untracked + 10.0  # AEC3 alone: 13.6 dB


def test_an_earlier_echo_is_left_to_aec3_and_the_baseline_follows(answers: list[Audio]) -> None:
    """Re-aligning for an earlier echo would read the reference ahead of the microphone, which an
    answer's first moments are not (they are sent as the microphone reaches them): AEC3 finds the
    new delay itself, and the tracker takes it as its baseline once the canceller removes the echo
    again, so that a later jump is measured from there."""
    trial = room.simulate([*answers, *answers], np.random.default_rng(5), delays_ms=[250, 40])
    tracker = DelayTracker(1.0, 500)
    told: list[tuple[str, float]] = []
    tracker.on_change = lambda change, delay_ms: told.append((change, delay_ms))
    out, _ = cancel(trial, tracker)
    assert tracker.shifts == 0 and tracker.shift == 0
    assert told and all(change == "followed" for change, _ in told) and abs(told[-1][1] - 40) <= 2, told
    assert tracker.rebaselines >= 1 and tracker.baseline is not None and abs(tracker.baseline - 40 * MS) <= 2 * MS
    alone, _ = cancel(trial, None)
    assert abs(erle_after(trial, out, 2.0) - erle_after(trial, alone, 2.0)) < 0.5  # 18.1 dB both


def test_a_reference_recorded_just_in_time_is_shifted_as_well(jump_up: Trial, untracked: float) -> None:
    """As a stream records it: each piece of answer audio when the microphone reaches it, at most
    0.3 s ahead (the server's pacing lead). The later echo is found and re-aligned from the
    reference kept back, as with the whole reference recorded up front."""
    tracker = DelayTracker(1.0, 500)
    ec = EchoCanceller(tracker=tracker)
    recorded, pieces = 0, []
    for i in range(0, jump_up.mic.size, 320):
        ahead = min(jump_up.reference.size, i + 320 + int(0.3 * RATE))
        if ahead > recorded:
            ec.played(jump_up.reference[recorded:ahead], recorded)
            recorded = ahead
        pieces.append(ec.process(jump_up.mic[i : i + 320]))
    out = np.concatenate(pieces)
    out = np.concatenate([out[OUTPUT_LATENCY_SAMPLES:], np.zeros(OUTPUT_LATENCY_SAMPLES, np.float32)])
    assert tracker.shifts == 1 and abs(tracker.shift - 200 * MS) <= 2 * MS
    assert erle_after(jump_up, out, 2.0) >= untracked + 10.0  # measured 40.7 dB, as up front


def test_a_person_over_a_steady_echo_moves_nothing(answers: list[Audio], person: Audio) -> None:
    trial = room.simulate(answers, np.random.default_rng(4), near=person, delays_ms=[120], cut_after_s=0.4)
    tracker = DelayTracker(1.0, 500)
    cancel(trial, tracker)
    assert tracker.baseline is not None and abs(tracker.baseline - 120 * MS) <= 2 * MS
    assert tracker.shifts == 0


@pytest.mark.parametrize("guarded", [True, False])
def test_a_steady_echos_reflections_move_nothing(
    answers: list[Audio], guarded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A steady 120 ms echo in a reverberant room, half-second windows: a few windows peak, only just
    # sharp, at a reflection. A move needs AEC3 to have had the echo and a peak of MOVE_SHARPNESS;
    # without those two guards (checked here, so the room is one that tests them) it moves twice.
    trial = room.simulate([*answers, *answers], np.random.default_rng(7), delays_ms=[120])
    tracker = DelayTracker(0.5, 500)
    if not guarded:
        monkeypatch.setattr(echo_delay, "MOVE_SHARPNESS", 0.0)
        monkeypatch.setattr(
            DelayTracker, "converged", property(lambda self: True, lambda self, value: None), raising=False
        )
    cancel(trial, tracker)
    assert tracker.baseline is not None and abs(tracker.baseline - 120 * MS) <= 2 * MS
    assert (tracker.shifts == 0) == guarded


def test_the_settings_reach_the_tracker_and_off_is_off(jump_up: Trial, untracked: float) -> None:
    assert EchoLine.of(Settings(echo_delay_track_s=0)).canceller.tracker is None
    assert DelayTracker.of(Settings(echo_delay_track_s=0)) is None
    tracker = EchoLine.of(
        Settings(echo_delay_track_s=0.5, echo_delay_track_max_ms=250, echo_delay_track_lost_db=3)
    ).canceller.tracker
    assert tracker is not None
    assert (tracker.window, tracker.hop, tracker.max_lag, tracker.lost_db) == (8000, 2000, 250 * MS, 3.0)
    default = EchoLine.of(Settings()).canceller.tracker  # the server's default: on, a 1 s window
    assert default is not None and (default.window, default.max_lag) == (RATE, 500 * MS)
    measured = EchoLine.of(Settings(echo_delay_track_s=1.0)).canceller.tracker
    assert measured is not None and (measured.window, measured.max_lag) == (RATE, 500 * MS)


@pytest.mark.parametrize(
    ("settings", "found"),
    [
        (Settings(echo_delay_track_s=0.6, echo_delay_track_max_ms=300), True),  # shorter windows find it too
        # (each delay compares the whole window, with the answer audio up to the longest delay before it)
        (Settings(echo_delay_track_s=0.5, echo_delay_track_max_ms=500), True),
        (Settings(echo_delay_track_s=1.0, echo_delay_track_max_ms=200), False),  # 260 ms is past the longest
        (Settings(echo_delay_track_s=1.0, echo_delay_track_lost_db=0.5), False),  # it still removes over 0.5 dB
    ],
)
def test_the_settings_change_what_is_found(jump_up: Trial, untracked: float, settings: Settings, found: bool) -> None:
    tracker = DelayTracker.of(settings)
    out, _ = cancel(jump_up, tracker)
    assert tracker is not None and (abs(tracker.shift - 200 * MS) <= 2 * MS) == found
    assert (erle_after(jump_up, out, 2.0) >= untracked + 10.0) == found


def test_a_gap_in_the_microphone_starts_the_windows_again(jump_up: Trial) -> None:
    ec = EchoCanceller(tracker=DelayTracker(1.0, 500))
    ec.played(jump_up.reference, 0)
    for i in range(0, 8 * RATE, 320):
        ec.process(jump_up.mic[i : i + 320])
    tracker = ec.tracker
    assert tracker is not None and tracker.baseline is not None
    estimates = tracker.estimates
    ec.skip(RATE // 2)  # the device sent nothing for 0.5 s
    for i in range(8 * RATE + RATE // 2, 8 * RATE + RATE, 320):
        ec.process(jump_up.mic[i : i + 320])
    assert tracker.estimates == estimates  # a whole window of audio after the gap is needed first
    assert tracker.shifts == 0


def test_a_jump_before_aec3_converged_is_followed_and_a_later_one_still_moves() -> None:
    # The tracker alone, the canceller's removal given: the delay jumps before AEC3 was ever seen
    # removing the echo (no move then: it is still converging), AEC3 finds the new delay itself (it
    # removes 20 dB there: followed, and it has had the echo), then a later jump moves the reference.
    rng = np.random.default_rng(5)
    reference = rng.standard_normal(10 * RATE).astype(np.float32) * 0.1
    tracker = DelayTracker(1.0, 500)
    phases = [(0, 60, 0.0), (2, 260, 0.0), (4, 260, 20.0), (7, 400, 0.0)]  # (from s, delay ms, removed dB)
    for start in range(0, 10 * RATE, 320):
        _, delay_ms, removed = [p for p in phases if p[0] * RATE <= start][-1]
        delay = delay_ms * MS
        idx = np.arange(start, start + 320) - delay
        mic = np.where(idx >= 0, reference[np.clip(idx, 0, None)], 0.0).astype(np.float32)
        tracker.push(mic, reference[start : start + 320], functools.partial(float, removed))
        if start < 4 * RATE:
            assert tracker.shifts == 0  # not before AEC3 has had the echo
    assert tracker.rebaselines >= 1 and tracker.converged
    assert tracker.baseline is not None and abs(tracker.baseline - 260 * MS) <= 2 * MS
    assert tracker.shifts >= 1 and abs(tracker.shift - 140 * MS) <= 2 * MS
