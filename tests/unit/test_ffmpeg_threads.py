"""ffmpeg_threads: FFmpeg's audio conversions and encoders start no threads at 1, one per core at 0."""

from __future__ import annotations

import fractions
import os
from collections.abc import Iterator

import av
import numpy as np
import pytest

from mediaserver.audio.ffmpeg_threads import limit_ffmpeg_threads


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def convert_and_encode() -> list[object]:
    """A live stream's objects: an input resampler (24 kHz → 16 kHz) and an Opus encoder (PyAV makes
    a resampler of its own inside ``encode``), each used once."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
    frame = av.AudioFrame.from_ndarray(np.zeros((1, 480), np.float32), format="flt", layout="mono")
    frame.sample_rate = 24000
    resampler.resample(frame)
    encoder = av.CodecContext.create("libopus", "w")
    encoder.format, encoder.layout, encoder.sample_rate = "s16", "stereo", 48000
    encoder.time_base = fractions.Fraction(1, 48000)
    pcm = av.AudioFrame.from_ndarray(np.zeros((1, 1920), np.int16), format="s16", layout="stereo")
    pcm.sample_rate, pcm.pts, pcm.time_base = 48000, 0, fractions.Fraction(1, 48000)
    encoder.encode(pcm)
    return [resampler, encoder]


@pytest.fixture
def restored() -> Iterator[None]:
    yield
    assert limit_ffmpeg_threads(1)  # the default, which the app sets


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="counts threads in /proc")
def test_one_starts_no_threads_and_zero_starts_ffmpegs_pools(restored: None) -> None:
    assert limit_ffmpeg_threads(1)
    before = threads()
    kept = [convert_and_encode() for _ in range(4)]
    assert threads() == before, "ffmpeg_threads=1 must start no threads"
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: FFmpeg's own default starts no threads either")
    assert limit_ffmpeg_threads(0)
    kept += [convert_and_encode() for _ in range(4)]
    assert threads() >= before + 8, "ffmpeg_threads=0: FFmpeg's pool per conversion, as without the setting"
    del kept
