"""send_paced: answer audio at most a lead ahead of real time, frames in order, none after a barge-in.

Every bound here holds on a loaded machine: a late event loop only sends later, which keeps the
audio less far ahead and takes longer, never the reverse.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from mediaserver.assistant.audio_out import AudioOut
from mediaserver.assistant.pacing import send_paced

RATE_HZ = 16000
FRAME_S = 0.02
FRAME_BYTES = int(RATE_HZ * FRAME_S) * 2
EARLY_S = 0.01  # a timer may fire this much early (the loop's clock resolution, with margin)


def answer(seconds: float) -> bytes:
    """Distinct 16-bit samples, so a reordered or repeated frame changes the bytes."""
    count = int(RATE_HZ * seconds)
    return b"".join((n % 30000).to_bytes(2, "little") for n in range(count))


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[float, bytes]] = []

    def __call__(self, data: bytes) -> None:
        self.sent.append((time.monotonic(), data))

    @property
    def data(self) -> bytes:
        return b"".join(data for _, data in self.sent)


async def drain(out: AudioOut, recorder: Recorder, *, lead_s: float, max_frames: int = 1) -> None:
    task = asyncio.create_task(send_paced(out, recorder, lead_s=lead_s, max_frames=max_frames))
    await out.drained()
    out.close()
    await asyncio.wait_for(task, 30)


async def test_audio_is_sent_in_order_at_most_the_lead_ahead() -> None:
    out = AudioOut(RATE_HZ)
    pcm = answer(1.0)
    out.write(pcm)
    recorder = Recorder()
    await drain(out, recorder, lead_s=0.2)
    assert recorder.data == pcm  # every frame, once, in order
    assert all(len(data) == FRAME_BYTES for _, data in recorder.sent)  # one frame per send
    started = recorder.sent[0][0]
    sent_s = 0.0
    for at, data in recorder.sent:
        # Audio sent before this one, against the time since the first send: never past the lead.
        assert sent_s - (at - started) <= 0.2 + FRAME_S + EARLY_S
        sent_s += len(data) / 2 / RATE_HZ
    # The last frame is not sent before its time less the lead (1 s of audio, 0.2 s lead).
    assert recorder.sent[-1][0] - started >= 1.0 - FRAME_S - 0.2 - EARLY_S


async def test_queued_frames_are_joined_up_to_max_frames() -> None:
    out = AudioOut(RATE_HZ)
    pcm = answer(0.5)  # 25 frames, all queued before the sender starts
    out.write(pcm)
    recorder = Recorder()
    await drain(out, recorder, lead_s=60.0, max_frames=5)
    assert recorder.data == pcm
    assert [len(data) // FRAME_BYTES for _, data in recorder.sent] == [5] * 5


async def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(FRAME_S / 4)


async def test_a_barge_in_stops_what_was_not_sent() -> None:
    """After the barge-in, the next audio sent is the next answer's: nothing of the cleared one,
    proven by order (the sender reached the new answer) rather than by watching for a while."""
    out = AudioOut(RATE_HZ)
    pcm = answer(10.0)  # far more than is sent before the barge-in, even on a loaded machine
    out.write(pcm)
    recorder = Recorder()
    task = asyncio.create_task(send_paced(out, recorder, lead_s=0.1))
    await until(lambda: len(recorder.sent) >= 15)  # 0.3 s of audio: past the lead, the sender paces
    out.clear()
    cleared_at = time.monotonic()
    following = b"\x07\x00" * int(RATE_HZ * 0.1)  # the next answer: 5 frames unlike any of the first
    out.write(following)
    await until(lambda: following[:FRAME_BYTES] in recorder.data)
    out.close()
    await asyncio.wait_for(task, 30)
    before = b"".join(data for at, data in recorder.sent if at <= cleared_at)
    after = b"".join(data for at, data in recorder.sent if at > cleared_at)
    assert before and pcm.startswith(before)
    assert after and following.startswith(after)  # nothing of the cleared answer after the barge-in
    elapsed_s = cleared_at - recorder.sent[0][0]
    assert len(before) / 2 / RATE_HZ <= elapsed_s + 0.1 + FRAME_S + EARLY_S
    assert len(before) < len(pcm)  # the rest was dropped, not sent
