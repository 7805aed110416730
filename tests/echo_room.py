"""A simulated device without echo cancellation, shared by tests/unit/test_echo.py and
tools/bench_echo.py.

The server plays answers (the *reference*, on the stream clock; silence between answers); the
device's small loudspeaker clips them (tanh), the room smears them (exponentially decaying noise,
RT60 about 0.3 s), they reach the microphone after a delay that can change mid-session (device
buffers, 20-300 ms) with some gain, plus a little noise and, in some trials, the person barging in.
The metrics are measured against the parts the simulation knows separately (echo, near end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

RATE = 16_000
Audio = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]
VAD_FRAME = 480  # 30 ms, as the server's segmenter
ACTIVE_RMS = 10 ** (-45 / 20)  # a 30 ms frame with more echo / near end than this is "active"


def room_ir(rng: np.random.Generator, rt60_s: float = 0.3) -> Audio:
    """Exponentially decaying noise (60 dB down at ``rt60_s``) after a direct path, unit energy."""
    n = int(rt60_s * RATE)
    t = np.arange(n) / RATE
    ir = rng.standard_normal(n) * np.exp(-6.91 * t / rt60_s) * 0.3
    ir[0] = 1.0
    ir[: int(0.002 * RATE)] *= 0.5  # a little early spread
    ir[0] = 1.0
    unit: Audio = (ir / np.sqrt(np.sum(ir**2))).astype(np.float32)
    return unit


def convolve(x: Audio, h: Audio) -> Audio:
    n = x.size + h.size - 1
    size = 1 << (n - 1).bit_length()
    y = np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(h, size), size)[: x.size]
    return y.astype(np.float32)


def rms(x: Audio) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


@dataclass
class Trial:
    reference: Audio  # what the server played, on the stream clock
    mic: Audio  # what the device's microphone heard: echo + near + noise
    echo: Audio  # the echo alone
    near: Audio  # the person alone (zeros where silent)
    delays: list[tuple[int, int]]  # (from sample, echo delay in samples)
    barge_at: int | None  # where the person starts, if they do

    def frames(self) -> tuple[Mask, Mask]:
        """Per 30 ms frame: echo only (echo active, nobody speaking), double talk (both)."""
        n = self.mic.size // VAD_FRAME
        e = np.sqrt(np.mean(np.square(self.echo[: n * VAD_FRAME].reshape(n, VAD_FRAME)), axis=1))
        s = np.sqrt(np.mean(np.square(self.near[: n * VAD_FRAME].reshape(n, VAD_FRAME)), axis=1))
        near_any = np.abs(self.near[: n * VAD_FRAME].reshape(n, VAD_FRAME)).max(axis=1) > 0
        return (e > ACTIVE_RMS) & ~near_any, (e > ACTIVE_RMS) & (s > ACTIVE_RMS)


def simulate(
    answers: Sequence[Audio],
    rng: np.random.Generator,
    *,
    near: Audio | None = None,
    delays_ms: Sequence[float] | None = None,
    echo_rms: float | None = None,
    cut_after_s: float | None = 0.4,
    noise_rms: float = 10 ** (-60 / 20),
) -> Trial:
    """A session: the answers with pauses between them, echoed into the microphone.

    ``delays_ms``: the echo delay, changing at evenly spaced points (default: two random delays in
    20-300 ms, the change at a random time). ``near``: a person barges in during the last answer,
    which the server then cuts ``cut_after_s`` later (None: it plays on).
    """
    gaps = [int(rng.uniform(0.4, 1.2) * RATE) for _ in answers]
    parts: list[Audio] = [np.zeros(int(0.5 * RATE), np.float32)]
    starts = []
    for answer, gap in zip(answers, gaps, strict=True):
        starts.append(sum(p.size for p in parts))
        parts += [answer.astype(np.float32), np.zeros(gap, np.float32)]
    reference = np.concatenate(parts)
    near_track = np.zeros(reference.size, np.float32)
    barge_at = None
    if near is not None:
        last = answers[-1]
        barge_at = starts[-1] + int(rng.uniform(0.2, 0.6) * last.size)
        if cut_after_s is not None:
            reference[barge_at + int(cut_after_s * RATE) :] = 0.0
        end = barge_at + near.size + int(0.5 * RATE)
        if end > reference.size:
            reference = np.concatenate([reference, np.zeros(end - reference.size, np.float32)])
            near_track = np.concatenate([near_track, np.zeros(end - near_track.size, np.float32)])
        near_track[barge_at : barge_at + near.size] = near
    # Loudspeaker: tanh clipping, then the room.
    drive = rng.uniform(1.5, 3.0)
    speaker = (np.tanh(drive * reference) / np.tanh(drive)).astype(np.float32)
    wet = convolve(speaker, room_ir(rng))
    # The delay, changing mid-session.
    if delays_ms is None:
        delays_ms = [rng.uniform(20, 300), rng.uniform(20, 300)]
        points = [0, int(rng.uniform(0.3, 0.7) * reference.size)]
    else:
        points = [i * reference.size // len(delays_ms) for i in range(len(delays_ms))]
    delays = [(p, int(d * RATE / 1000)) for p, d in zip(points, delays_ms, strict=True)]
    echo = np.zeros(reference.size, np.float32)
    for i, (p, d) in enumerate(delays):
        q = delays[i + 1][0] if i + 1 < len(delays) else reference.size
        src = np.arange(p, q) - d
        ok = src >= 0
        echo[p:q][ok] = wet[src[ok]]
    active = np.abs(reference) > 0.01
    level = rms(echo[np.convolve(active, np.ones(2000), "same")[: echo.size] > 0]) or 1.0
    echo *= (echo_rms if echo_rms is not None else rng.uniform(0.04, 0.12)) / level
    noise = (rng.standard_normal(reference.size) * noise_rms).astype(np.float32)
    mic = (echo + near_track + noise).astype(np.float32)
    return Trial(reference, mic, echo, near_track, delays, barge_at)


def echoing_device(
    answers: Sequence[Audio],
    delay_ms: float = 150.0,
    gain: float = 0.7,
    seed: int = 7,
    pause_s: float = 1.5,
    noise_rms: float = 1e-3,
    late: Sequence[int] = (),
) -> tuple[Audio, Audio, list[int]]:
    """The live echo tests' device (tests/integration/test_echo_loop.py): the answers after a second of
    quiet, ``pause_s`` apart, through a clipping loudspeaker and a room (RT60 0.2 s, seeded as the
    tests seed it), ``delay_ms`` late at ``gain``, over a noise floor (``noise_rms``: -60 dBFS);
    answer ``i`` plays ``late[i]`` samples after where the reference has it (a device that starts
    playing at its next frame; none given: 0). Returns the reference on the stream clock, the
    microphone, and the sample where each answer's echo begins (as placed, without ``late``)."""
    pause = np.zeros(int(pause_s * RATE), np.float32)
    parts: list[Audio] = [np.zeros(RATE, np.float32)]
    starts = []
    for answer in answers:
        starts.append(sum(p.size for p in parts))
        parts += [answer.astype(np.float32), pause]
    reference = np.concatenate(parts)
    played = reference
    if any(late):
        played = np.zeros_like(reference)
        for i, (start, answer) in enumerate(zip(starts, answers, strict=True)):
            shift = late[i] if i < len(late) else 0
            end = min(start + shift + answer.size, played.size)
            played[start + shift : end] = answer[: end - start - shift]
    delay = int(delay_ms * RATE / 1000)
    ir = room_ir(np.random.default_rng(seed), rt60_s=0.2)
    wet = np.convolve(np.concatenate([np.zeros(delay, np.float32), played]), ir)[: reference.size] * gain
    noise = np.random.default_rng(1).standard_normal(reference.size) * noise_rms
    mic = (np.tanh(wet * 1.5) / 1.5 + noise).astype(np.float32)
    return reference, mic, [s + delay for s in starts]


# Metrics -----------------------------------------------------------------------------------------


def _frames(x: Audio, mask: Mask) -> Audio:
    n = mask.size
    return x[: n * VAD_FRAME].reshape(n, VAD_FRAME)[mask]


def erle_db(mic: Audio, out: Audio, mask: Mask) -> float:
    """Echo return loss enhancement over the masked 30 ms frames: mic energy / output energy."""
    a = np.sum(np.square(_frames(mic, mask), dtype=np.float64))
    b = np.sum(np.square(_frames(out, mask), dtype=np.float64))
    return float(10 * np.log10(a / max(b, 1e-12)))


def speech_band(x: Audio, low_hz: float = 150.0) -> Audio:
    """``x`` without what lies below ``low_hz`` (rumble and hum that AEC3's high-pass filter removes
    and that would otherwise dominate the correlation of some recordings)."""
    spectrum = np.fft.rfft(x)
    spectrum[: int(low_hz * x.size / RATE)] = 0
    return np.fft.irfft(spectrum, x.size).astype(np.float32)


def correlation(out: Audio, near: Audio, mask: Mask) -> float:
    """Correlation of the output with the clean near end over the masked frames (e.g. double
    talk), both in the speech band (above 150 Hz)."""
    a = _frames(speech_band(out), mask).ravel().astype(np.float64)
    b = _frames(speech_band(near[: out.size]), mask).ravel().astype(np.float64)
    if a.size == 0:
        return float("nan")
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def voiced(out: Audio, aggressiveness: int = 3) -> Mask:
    """webrtcvad's verdict per 30 ms frame, as the server's segmenter runs it."""
    import webrtcvad

    vad = webrtcvad.Vad(aggressiveness)
    pcm = (np.clip(out, -1, 1) * 32767).astype("<i2")
    n = pcm.size // VAD_FRAME
    return np.array(
        [vad.is_speech(pcm[i * VAD_FRAME : (i + 1) * VAD_FRAME].tobytes(), RATE) for i in range(n)], np.bool_
    )


def longest_run(mask: Mask) -> int:
    best = run = 0
    for v in mask:
        run = run + 1 if v else 0
        best = max(best, run)
    return best
