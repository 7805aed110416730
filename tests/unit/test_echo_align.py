"""Answers that start afresh on a device whose playback had run dry (mediaserver/audio/echo.py,
``EchoLine.align_start`` and the speech gate's ``restart_ms``; issue #37).

A device plays an answer's first audio from its next frame after the audio arrives. Sent at a
random moment, it lands 0 or one frame later than the server's clock places it, so two answers give
the canceller two echo delays, and AEC3 let the next answer's first syllable through ("Bees"): live,
the answers whose placement moved by a frame were the runs a leak cut (docs/echo.md). So the first
frame waits for the microphone's next frame and goes right after it, and the gate notes speech
starting soon after such a restart as suspect.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any, Literal

import numpy as np
import pytest

from mediaserver.assistant.audio_out import AudioOut
from mediaserver.assistant.pacing import send_paced
from mediaserver.audio import echo_line
from mediaserver.audio.echo import EchoCanceller, SpeechGate
from mediaserver.audio.echo_line import EchoLine
from mediaserver.config import Settings

RATE = 16000
FRAME = 320  # the microphone's 20 ms frames


def returns_at_once(coro: Coroutine[Any, Any, None]) -> bool:
    """The coroutine finishes without waiting on anything (its first step returns)."""
    try:
        coro.send(None)
    except StopIteration:
        return True
    coro.close()
    return False


def pcm(seconds: float) -> bytes:
    return (np.full(int(RATE * seconds), 0.1) * 32767).astype("<i2").tobytes()


async def test_an_answer_starting_afresh_goes_right_after_the_microphones_next_frame() -> None:
    line = EchoLine.of(Settings(echo_align_wait_ms=1000))  # the longest: only the frame ends the wait
    line.arrived(FRAME)
    waiting = asyncio.create_task(line.align_start())
    await asyncio.sleep(0)
    assert not waiting.done()  # idle device: waits for the microphone
    line.arrived(FRAME)
    await asyncio.wait_for(waiting, 5)  # the frame came: go now
    assert line.sent(pcm(0.1), RATE) == 2 * FRAME  # placed at the frame the device records now


async def test_no_wait_while_the_device_still_plays_or_where_the_microphone_cannot_tell() -> None:
    line = EchoLine.of(Settings())
    assert returns_at_once(line.align_start())  # no microphone audio yet
    line.arrived(FRAME)
    line.sent(pcm(1.0), RATE)
    assert returns_at_once(line.align_start())  # a second of audio still to play: back to back
    off = EchoLine.of(Settings(echo_align_wait_ms=0))  # the setting at 0: never waits
    off.arrived(FRAME)
    assert returns_at_once(off.align_start())
    chunky = EchoLine.of(Settings())  # frames longer than the wait (200 ms against 60)
    chunky.arrived(10 * FRAME)
    assert returns_at_once(chunky.align_start())
    longer = EchoLine.of(Settings())  # 40 ms microphone frames, 20 ms answer frames
    longer.arrived(2 * FRAME)
    assert not returns_at_once(longer.align_start())  # the first answer frame waits ...
    longer.sent(pcm(0.02), RATE)
    assert returns_at_once(longer.align_start())  # ... the next follows it back to back, as every one after


async def test_a_microphone_that_stopped_sending_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(echo_line, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])}))
    line = EchoLine.of(Settings())
    line.arrived(FRAME)
    clock[0] += 0.5  # its next frame was due 0.48 s ago (a device muted while it plays)
    assert returns_at_once(line.align_start())
    clock[0] -= 0.5 - 0.03  # 10 ms late: still waited for, up to the 60 ms past when it was due
    waiting = asyncio.create_task(line.align_start())
    await asyncio.sleep(0)
    assert not waiting.done()
    await asyncio.wait_for(waiting, 5)  # ... and no longer: nothing came


async def test_the_first_frame_waits_for_the_alignment_and_a_barge_in_meanwhile_drops_it() -> None:
    """``send_paced(align=...)`` awaits it before each frame; audio cleared while it waits is not sent."""
    out = AudioOut(RATE)
    sent: list[bytes] = []
    release = asyncio.Event()
    calls = 0

    async def align() -> None:
        nonlocal calls
        calls += 1
        await release.wait()

    first = b"\x01\x00" * (2 * FRAME)
    out.write(first)
    task = asyncio.create_task(send_paced(out, sent.append, lead_s=60.0, align=align))
    async with asyncio.timeout(5):
        while not calls:
            await asyncio.sleep(0.001)
    assert not sent  # held until aligned
    out.clear()  # a barge-in while it waits
    following = b"\x07\x00" * (2 * FRAME)  # two frames
    out.write(following)
    release.set()
    async with asyncio.timeout(5):
        while not sent:
            await asyncio.sleep(0.001)
    out.close()
    await asyncio.wait_for(task, 5)
    assert b"".join(sent) == following  # nothing of the cleared audio
    assert calls >= 2  # once per frame taken


def test_speech_soon_after_a_restart_is_suspect() -> None:
    """``restart_ms`` (echo_speech_gate_restart_ms, default 600; here 600 and 0): past ``converge_s``,
    a frame within that long of where playback started afresh is suspect however loud; later, or
    with the setting at 0, a loud frame is not."""
    line = EchoLine.of(Settings())
    line.arrived(3 * RATE)
    line.sent(pcm(2.5), RATE)  # the first answer, from the microphone's clock: a restart
    line.process(np.zeros(3 * RATE, np.float32))
    ec: EchoCanceller = line.canceller
    loud = np.full(480, 0.05, np.float32)
    gates = {ms: SpeechGate(ec, 20.0, 600.0, 100.0, converge_s=1.0, restart_ms=ms) for ms in (600, 0)}
    for gate in gates.values():
        gate(np.full(480, 1e-3, np.float32))  # the output's floor: the loud frame is 34 dB above it
    line.arrived(3 * RATE)
    at = line.sent(pcm(2.0), RATE)  # 0.5 s after the first ended: the next answer starts afresh
    assert at == 6 * RATE
    line.process(np.zeros(3 * RATE + 4800, np.float32))  # 300 ms into its echo
    since = ec.since_restart_ms()
    assert since is not None and 250 <= since <= 350
    assert gates[600](loud) and gates[600].last_suspect and gates[600].last_restart
    assert gates[600](loud, after=int(0.4 * RATE)) and not gates[600].last_suspect  # a frame before the restart
    assert not gates[600].last_restart
    assert gates[0](loud) and not gates[0].last_suspect and not gates[0].last_restart
    line.process(np.zeros(8000, np.float32))  # 800 ms in
    assert gates[600](loud) and not gates[600].last_suspect
    line.arrived(2 * FRAME)
    line.sent(pcm(0.1), RATE)  # while it still plays: back to back, no restart
    assert ec.since_restart_ms() == since + 500
    # Back to back too, but louder again after a duck (``AudioOut.rose``): its echo's onset is one.
    louder_at = line.sent(pcm(0.1), RATE, louder=True)
    line.process(np.zeros(louder_at + 1600 - ec.position, np.float32))  # 100 ms into its echo
    assert ec.since_restart_ms() == 100


def test_audio_sent_without_a_stretch_of_quiet_is_no_restart() -> None:
    """A track that sends its frames in real time (WebRTC) plays back to back: no restart at each
    frame. A restart takes ``echo_speech_gate_onset_gap_ms`` (100; here also 1000) without audio."""
    line = EchoLine.of(Settings())
    line.arrived(FRAME)
    for _ in range(50):  # one frame sent as each arrives (1 s)
        line.sent(pcm(0.02), RATE)
        line.arrived(FRAME)
    assert line.canceller._restarts == deque([FRAME])  # the first only
    for gap_ms, restarts in ((100, 2), (1000, 1)):
        line = EchoLine.of(Settings(echo_speech_gate_onset_gap_ms=gap_ms))
        line.arrived(FRAME)
        line.sent(pcm(0.5), RATE)
        line.arrived(FRAME + int(0.8 * RATE))  # 0.3 s after the answer ended
        line.sent(pcm(0.5), RATE)
        assert len(line.canceller._restarts) == restarts, gap_ms


async def test_only_the_first_frame_waits_when_the_microphone_frames_are_longer() -> None:
    """40 ms microphone frames, 20 ms answer frames through ``send_paced``: the first frame waits
    for the microphone, the rest build the lead back to back (none waits again), however fast or
    slow this machine runs them."""
    line = EchoLine.of(Settings(echo_align_wait_ms=1000))
    waits = 0
    wait = line._arrival.wait

    async def counted() -> Literal[True]:
        nonlocal waits
        waits += 1
        return await wait()

    line._arrival.wait = counted  # type: ignore[method-assign]
    out = AudioOut(RATE)
    out.write(pcm(1.0))
    sent: list[bytes] = []

    def send(frame: bytes) -> None:
        line.sent(frame, RATE)
        sent.append(frame)

    line.arrived(2 * FRAME)
    task = asyncio.create_task(send_paced(out, send, lead_s=0.2, align=line.align_start))
    async with asyncio.timeout(5):
        while not waits:
            await asyncio.sleep(0.001)
    assert not sent
    line.arrived(2 * FRAME)  # the microphone's next frame: the answer goes
    async with asyncio.timeout(10):
        while len(sent) < 10:  # the 0.2 s lead
            await asyncio.sleep(0.001)
    out.close()
    await asyncio.wait_for(task, 5)
    assert waits == 1
