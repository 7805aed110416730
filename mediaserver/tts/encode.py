"""Speech PCM → the response formats clients ask for, as a stream (bytes out as audio comes in).

WAV and raw PCM are written here (a header and the samples). Everything else is encoded with
PyAV into a container that is written to a non-seekable sink, so bytes can leave as soon as the
muxer writes them and no muxer goes back to patch a header: MP3, Ogg Opus, AAC in ADTS, FLAC and
Ogg Vorbis.

WAV whose whole audio is known before its header goes out (``data_bytes``) carries its real RIFF
and data sizes. Streamed WAV, whose length is not known yet, carries 0xFFFFFFFF for both: "unknown,
read to the end", the value most readers take (FFmpeg, and so PyAV and browsers, read to the end;
Python's ``wave`` reads every frame but reports ``getnframes()`` as 2**31 - 1). A size of 0, which
XTTS sent, is refused by ``wave`` ("not a WAVE file").
"""

from __future__ import annotations

import contextlib
import fractions
import struct
from dataclasses import dataclass
from typing import Any

import av
import numpy as np


@dataclass(frozen=True)
class AudioFormat:
    name: str
    content_type: str
    codec: str | None = None  # PyAV encoder; None = written here
    container: str | None = None
    # Rates the encoder accepts (the nearest one at or above the input is used); None = any.
    rates: tuple[int, ...] | None = None
    bit_rate: int | None = None
    # Muxer options; Ogg's pages are cut every 100 ms instead of every second so audio can stream.
    options: tuple[tuple[str, str], ...] = ()


_MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
_OGG_OPTIONS = (("page_duration", "100000"),)

FORMATS: dict[str, AudioFormat] = {
    "wav": AudioFormat("wav", "audio/wav"),
    "pcm": AudioFormat("pcm", "audio/pcm"),
    "mp3": AudioFormat("mp3", "audio/mpeg", "libmp3lame", "mp3", _MP3_RATES, 64000),
    "opus": AudioFormat("opus", "audio/ogg", "libopus", "ogg", _OPUS_RATES, 32000, _OGG_OPTIONS),
    "aac": AudioFormat("aac", "audio/aac", "aac", "adts", None, 64000),
    "flac": AudioFormat("flac", "audio/flac", "flac", "flac"),
    # WIS's OGG (libsndfile) was Vorbis; FFmpeg's own Vorbis encoder only takes stereo: Ogg Opus.
    "ogg": AudioFormat("ogg", "audio/ogg", "libopus", "ogg", _OPUS_RATES, 32000, _OGG_OPTIONS),
}


def output_rate(fmt: AudioFormat, rate_hz: int) -> int:
    """The rate ``fmt`` is encoded at for input at ``rate_hz`` (unchanged unless the codec cannot)."""
    if fmt.rates is None or rate_hz in fmt.rates:
        return rate_hz
    higher = [r for r in fmt.rates if r >= rate_hz]
    return min(higher) if higher else max(fmt.rates)


UNKNOWN_SIZE = 0xFFFFFFFF  # a streamed WAV's RIFF and data sizes: read to the end
WAV_HEADER_BYTES = 44


def wav_header(rate_hz: int, *, data_bytes: int | None = None, unknown_size: int = UNKNOWN_SIZE) -> bytes:
    """16-bit mono PCM WAV header: the real sizes for ``data_bytes`` of samples, or, without it
    (streamed), ``unknown_size`` for both (``UNKNOWN_SIZE``; 0 as XTTS wrote it, for Willow)."""
    data_len = unknown_size if data_bytes is None else data_bytes
    riff_len = unknown_size if data_bytes is None else 36 + data_bytes
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_len,
        b"WAVE",
        b"fmt ",
        16,
        1,
        1,
        rate_hz,
        rate_hz * 2,
        2,
        16,
        b"data",
        data_len,
    )


def with_wav_sizes(body: bytes) -> bytes:
    """A whole WAV written by ``StreamEncoder`` (streamed: ``UNKNOWN_SIZE``) with its real sizes."""
    if len(body) < WAV_HEADER_BYTES or body[:4] != b"RIFF" or body[36:40] != b"data":
        raise ValueError("not a WAV written by StreamEncoder")
    data_bytes = len(body) - WAV_HEADER_BYTES
    sizes = struct.pack("<I", 36 + data_bytes), struct.pack("<I", data_bytes)
    return body[:4] + sizes[0] + body[8:40] + sizes[1] + body[WAV_HEADER_BYTES:]


class _Sink:
    """A write-only file for PyAV: no seek, so muxers stream and never rewrite what was sent."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        block = bytes(data)
        self._parts.append(block)
        return len(block)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class StreamEncoder:
    """Feed int16 mono PCM at ``rate_hz`` with ``push``; each call returns the bytes ready so far.

    ``finish`` flushes the encoder and returns the rest. The caller resamples beforehand to
    ``output_rate(fmt, rate_hz)`` when that differs (``rate_hz`` here must be a rate the codec takes).
    ``total_bytes``: all the PCM that will be pushed, when it is known before the first push (a WAV
    header then carries the real sizes, else ``UNKNOWN_SIZE``).
    """

    def __init__(
        self, fmt: AudioFormat, rate_hz: int, *, total_bytes: int | None = None, unknown_size: int = UNKNOWN_SIZE
    ) -> None:
        self.fmt = fmt
        self.rate_hz = rate_hz
        self._total_bytes = total_bytes
        self._unknown_size = unknown_size
        self._started = False
        self._finished = False
        self._container: Any = None
        if fmt.codec is None:
            return
        if output_rate(fmt, rate_hz) != rate_hz:
            raise ValueError(f"{fmt.name} cannot be encoded at {rate_hz} Hz")
        self._sink = _Sink()
        self._container = av.open(self._sink, mode="w", format=fmt.container, options=dict(fmt.options))
        stream = self._container.add_stream(fmt.codec, rate=rate_hz, layout="mono")
        if fmt.bit_rate:
            stream.bit_rate = fmt.bit_rate
        self._stream = stream
        codec_context = stream.codec_context
        self._sample_format = codec_context.codec.audio_formats[0].name
        self._frame_size = codec_context.frame_size or 0
        self._fifo = av.AudioFifo()
        # s16 → the encoder's sample format (same rate: no filter state to carry between calls).
        self._converter = av.AudioResampler(format=self._sample_format, layout="mono", rate=rate_hz)
        self._pts = 0
        self._time_base = fractions.Fraction(1, rate_hz)

    def push(self, pcm: bytes) -> bytes:
        if self._finished:
            raise RuntimeError("push() after finish()")
        prefix = b""
        if not self._started:
            self._started = True
            if self.fmt.name == "wav":
                prefix = wav_header(self.rate_hz, data_bytes=self._total_bytes, unknown_size=self._unknown_size)
        if self._container is None:
            return prefix + pcm
        if pcm:
            samples = np.frombuffer(pcm, dtype="<i2").reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.sample_rate = self.rate_hz
            frame.pts = None
            self._fifo.write(frame)
            self._encode_ready(final=False)
        return prefix + self._sink.take()

    def _encode_ready(self, *, final: bool) -> None:
        resampler = self._converter
        while True:
            size = self._frame_size or 4096
            if self._fifo.samples >= size:
                frame = self._fifo.read(size)
            elif final and self._fifo.samples > 0:
                frame = self._fifo.read(self._fifo.samples)
                if frame is not None and self._frame_size:  # whole frames only: pad the last with silence
                    frame = _padded(frame, self._frame_size, self.rate_hz)
            else:
                return
            if frame is None:
                return
            for converted in resampler.resample(frame):
                converted.pts = self._pts
                converted.time_base = self._time_base
                self._pts += converted.samples
                for packet in self._stream.encode(converted):
                    self._container.mux(packet)

    def finish(self) -> bytes:
        if self._finished:
            return b""
        head = self.push(b"") if not self._started else b""
        self._finished = True
        if self._container is None:
            return head
        self._encode_ready(final=True)
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return head + self._sink.take()

    def close(self) -> None:
        """Release the encoder without finishing (the client went away)."""
        if self._container is not None and not self._finished:
            self._finished = True
            with contextlib.suppress(av.FFmpegError, ValueError, OSError):
                self._container.close()


def _padded(frame: av.AudioFrame, size: int, rate_hz: int) -> av.AudioFrame:
    data = frame.to_ndarray().reshape(1, -1)
    padded = np.zeros((1, size), dtype=data.dtype)
    padded[0, : data.shape[1]] = data
    out = av.AudioFrame.from_ndarray(padded, format=frame.format.name, layout="mono")
    out.sample_rate = rate_hz
    return out


def encode_all(pcm: bytes, fmt: AudioFormat, rate_hz: int) -> bytes:
    """A whole clip in one go (tests, cached bodies)."""
    encoder = StreamEncoder(fmt, rate_hz)
    return encoder.push(pcm) + encoder.finish()
