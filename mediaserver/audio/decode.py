"""Decode whatever clients send into 16 kHz mono float32, the only format the core handles.

Raw PCM and PCM WAV are parsed here directly: devices stream WAV with placeholder length fields
(ESP-ADF writes the header before it knows the length), which a strict demuxer would truncate.
Everything else (flac, mp3, ogg/opus, webm, m4a, AMR-WB, non-PCM WAV ...) goes through PyAV.
"""

from __future__ import annotations

import io
import logging
import struct
from dataclasses import dataclass

import av
import numpy as np

from mediaserver.errors import AudioTooLarge, InvalidAudio
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

log = logging.getLogger(__name__)

_WAVE_FORMAT_PCM = 0x0001
_WAVE_FORMAT_IEEE_FLOAT = 0x0003
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE
_MAX_CHANNELS = 32
MAX_DAMAGED_PACKETS = 16  # in a row: past this a file is garbage, not a damaged recording


@dataclass(frozen=True)
class PcmFormat:
    sample_rate_hz: int
    bits: int
    channels: int
    is_float: bool = False

    def validate(self) -> None:
        if not 1000 <= self.sample_rate_hz <= 384000:
            raise InvalidAudio(f"Invalid audio: sample rate {self.sample_rate_hz} Hz is out of range")
        allowed_bits = (32, 64) if self.is_float else (8, 16, 24, 32)
        if self.bits not in allowed_bits:
            raise InvalidAudio(f"Invalid audio: unsupported sample width {self.bits} bits")
        if not 1 <= self.channels <= _MAX_CHANNELS:
            raise InvalidAudio(f"Invalid audio: unsupported channel count {self.channels}")

    @property
    def frame_bytes(self) -> int:
        return self.bits // 8 * self.channels


def duration_of_pcm(num_bytes: int, fmt: PcmFormat) -> float:
    return num_bytes / fmt.frame_bytes / fmt.sample_rate_hz


def _check_duration(duration_s: float, max_duration_s: float) -> None:
    if duration_s > max_duration_s:
        raise AudioTooLarge(f"audio is {duration_s:.1f} s long; the limit is {max_duration_s:.0f} s")


def pcm_to_float(data: bytes, fmt: PcmFormat, *, max_duration_s: float = float("inf")) -> AudioArray:
    """Interleaved little-endian PCM → 16 kHz mono float32 in [-1, 1]."""
    fmt.validate()
    usable = len(data) - len(data) % fmt.frame_bytes
    if usable <= 0:
        raise InvalidAudio("Invalid audio: the body holds no complete audio sample")
    _check_duration(duration_of_pcm(usable, fmt), max_duration_s)
    raw = memoryview(data)[:usable]
    samples: np.ndarray
    if fmt.is_float:
        wide = np.frombuffer(raw, dtype="<f4" if fmt.bits == 32 else "<f8")
        samples = np.clip(np.nan_to_num(wide, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0).astype(np.float32)
    elif fmt.bits == 8:  # WAV 8-bit is unsigned
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif fmt.bits == 16:
        samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif fmt.bits == 24:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        ints = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        ints = np.where(ints & 0x800000, ints - 0x1000000, ints)
        samples = ints.astype(np.float32) / 8388608.0
    else:
        samples = (np.frombuffer(raw, dtype="<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
    if fmt.channels > 1:
        samples = samples.reshape(-1, fmt.channels).mean(axis=1, dtype=np.float32)
    resampled = resample_mono(samples, fmt.sample_rate_hz)
    if resampled.size == 0:
        raise InvalidAudio("Invalid audio: too short to hold a single 16 kHz sample")
    return resampled


def resample_mono(samples: AudioArray, rate_hz: int) -> AudioArray:
    """Resample mono float32 to 16 kHz with libswresample (band-limited, not linear)."""
    resampler = StreamResampler(rate_hz)
    head = resampler.push(samples)
    tail = resampler.flush()
    return np.concatenate([head, tail]) if tail.size else head


class StreamResampler:
    """Mono float32 at ``rate_hz`` → ``target_hz`` (16 kHz unless told otherwise; TTS asks for 24 or
    48 kHz), for a live stream arriving in small pieces.

    One libswresample context spans the pieces, so its filter state carries over (resampling each
    20 ms frame on its own would put a click at every boundary). ``flush`` returns the delayed
    tail at the end of a recording; the next piece then starts a fresh context.
    """

    def __init__(self, rate_hz: int, target_hz: int = SAMPLE_RATE_HZ) -> None:
        self.rate_hz = rate_hz
        self.target_hz = target_hz
        self._resampler: av.AudioResampler | None = None

    def push(self, samples: AudioArray) -> AudioArray:
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        if self.rate_hz == self.target_hz or samples.size == 0:
            return samples
        if self._resampler is None:
            self._resampler = av.AudioResampler(format="flt", layout="mono", rate=self.target_hz)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = self.rate_hz
        return _collect(self._resampler.resample(frame))

    def flush(self) -> AudioArray:
        resampler, self._resampler = self._resampler, None
        if resampler is None:
            return np.zeros(0, np.float32)
        return _collect(resampler.resample(None))

    def reset(self) -> None:
        self._resampler = None


def _collect(frames: list[av.AudioFrame]) -> AudioArray:
    parts = [np.asarray(f.to_ndarray(), dtype=np.float32).reshape(-1) for f in frames]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def parse_wav_header(data: bytes) -> tuple[PcmFormat, int, int] | None:
    """Find fmt and data chunks of a RIFF/WAVE file.

    Returns (format, data_offset, data_length) for PCM or float WAV, None for a WAV that needs a
    real decoder (ADPCM, mu-law ...). The data length is what is actually present: streaming
    headers declare 0 or 0xFFFFFFFF, and a truncated upload declares more than it sends.
    """
    if len(data) < 12 or data[:4] not in (b"RIFF", b"RF64") or data[8:12] != b"WAVE":
        raise InvalidAudio("Invalid audio: not a RIFF/WAVE file")
    pos = 12
    fmt: PcmFormat | None = None
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        (chunk_len,) = struct.unpack_from("<I", data, pos + 4)
        body = pos + 8
        if chunk_id == b"fmt ":
            if body + 16 > len(data):
                break
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, body)
            if tag == _WAVE_FORMAT_EXTENSIBLE and chunk_len >= 40 and body + 26 <= len(data):
                (tag,) = struct.unpack_from("<H", data, body + 24)
            if tag not in (_WAVE_FORMAT_PCM, _WAVE_FORMAT_IEEE_FLOAT):
                return None
            fmt = PcmFormat(rate, bits, channels, is_float=tag == _WAVE_FORMAT_IEEE_FLOAT)
        elif chunk_id == b"data":
            if fmt is None:
                raise InvalidAudio("Invalid audio: WAV data chunk before its fmt chunk")
            available = len(data) - body
            declared = chunk_len
            length = available if declared in (0, 0xFFFFFFFF) else min(declared, available)
            return fmt, body, length
        if chunk_len > len(data):
            break
        pos = body + chunk_len + (chunk_len & 1)
    raise InvalidAudio("Invalid audio: WAV header is truncated or has no data chunk")


def decode_wav(data: bytes, *, max_duration_s: float = float("inf")) -> AudioArray:
    parsed = parse_wav_header(data)
    if parsed is None:
        return decode_container(data, max_duration_s=max_duration_s)
    fmt, offset, length = parsed
    return pcm_to_float(data[offset : offset + length], fmt, max_duration_s=max_duration_s)


def decode_container(
    data: bytes, *, max_duration_s: float = float("inf"), format_hint: str | None = None
) -> AudioArray:
    """Decode any container/codec FFmpeg knows, downmix and resample to 16 kHz mono."""
    if not data:
        raise InvalidAudio("Invalid audio: empty body")
    max_samples = max_duration_s * SAMPLE_RATE_HZ
    parts: list[AudioArray] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), mode="r", format=format_hint, metadata_errors="ignore") as container:
            streams = [s for s in container.streams if s.type == "audio"]
            if not streams:
                raise InvalidAudio("Invalid audio: the file has no audio stream")
            stream = streams[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE_HZ)
            # A damaged packet is skipped and the rest decoded, as FFmpeg's own tools do; a file cut
            # short keeps the audio before the cut (a trial's AMR-WB upload 1 byte short, a FLAC cut
            # to a third: the whole utterance was refused). Only many damaged packets in a row, or
            # nothing decodable at all, make it invalid.
            damaged = skipped = 0
            try:
                for packet in container.demux(stream):
                    try:
                        frames = packet.decode()
                    except (av.FFmpegError, ValueError, IndexError):
                        damaged += 1
                        skipped += 1
                        if damaged > MAX_DAMAGED_PACKETS:
                            raise
                        continue
                    damaged = 0
                    for frame in frames:
                        if not isinstance(frame, av.AudioFrame):
                            continue
                        frame.pts = None
                        for out in resampler.resample(frame):
                            chunk = np.asarray(out.to_ndarray(), dtype=np.float32).reshape(-1)
                            parts.append(chunk)
                            total += chunk.size
                        if total > max_samples:
                            _check_duration(total / SAMPLE_RATE_HZ, max_duration_s)
            except (av.FFmpegError, ValueError, IndexError) as exc:
                if not parts:
                    raise
                log.info("audio decoded up to a damaged or cut end (%s): %.2f s kept", exc, total / SAMPLE_RATE_HZ)
            if skipped:
                log.info("audio decoded past %d damaged packet(s): %.2f s", skipped, total / SAMPLE_RATE_HZ)
            for out in resampler.resample(None):
                parts.append(np.asarray(out.to_ndarray(), dtype=np.float32).reshape(-1))
    except InvalidAudio:
        raise
    except (av.FFmpegError, ValueError, UnicodeDecodeError, IndexError) as exc:
        # FFmpeg's own words ("Invalid data found when processing input"), without its errno and the
        # '<none>' file name it reports for a buffer.
        reason = exc.strerror if isinstance(exc, av.FFmpegError) and exc.strerror else str(exc)
        raise InvalidAudio(f"Invalid audio: could not decode the file ({reason})") from exc
    if not parts:
        raise InvalidAudio("Invalid audio: no audio samples could be decoded")
    audio = np.concatenate(parts).astype(np.float32, copy=False)
    if audio.size == 0:
        raise InvalidAudio("Invalid audio: no audio samples could be decoded")
    _check_duration(audio.size / SAMPLE_RATE_HZ, max_duration_s)
    return audio


def decode_any(data: bytes, *, max_duration_s: float = float("inf")) -> AudioArray:
    """Decode an uploaded file whose format is not declared (sniff WAV, else let FFmpeg probe)."""
    if not data:
        raise InvalidAudio("Invalid audio: empty body")
    if data[:4] in (b"RIFF", b"RF64") and data[8:12] == b"WAVE":
        return decode_wav(data, max_duration_s=max_duration_s)
    return decode_container(data, max_duration_s=max_duration_s)


def float_to_pcm16(audio: AudioArray) -> bytes:
    clipped = np.clip(audio, -1.0, 1.0)
    return (clipped * 32767.0).astype("<i2").tobytes()


def encode_wav(audio: AudioArray, sample_rate_hz: int = SAMPLE_RATE_HZ) -> bytes:
    """16-bit mono WAV, for save_audio and tests."""
    pcm = float_to_pcm16(audio)
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + len(pcm),
        b"WAVE",
        b"fmt ",
        16,
        _WAVE_FORMAT_PCM,
        1,
        sample_rate_hz,
        sample_rate_hz * 2,
        2,
        16,
        b"data",
        len(pcm),
    )
    return header + pcm
