"""Live audio streams (PCM frames, G.711) → 16 kHz mono float32, piece by piece.

The streaming transports (device WebSocket, OpenAI Realtime) receive audio in small pieces of
any size. A decoder lives as long as the stream's format: one resampler spans the pieces, so its
filter state carries over (resampling each 20 ms frame on its own would put a click at every
boundary), and ``flush`` returns the resampler's delayed tail at the end of a recording.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final, Literal, Protocol

import numpy as np
import numpy.typing as npt

from mediaserver.audio.decode import PcmFormat, StreamResampler, pcm_to_float
from mediaserver.errors import InvalidAudio
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

G711_RATE_HZ: Final = 8000


def _ulaw_table() -> npt.NDArray[np.int16]:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (codes >> 4) & 0x07
    magnitude = (((codes & 0x0F) << 3) + 0x84 << exponent) - 0x84
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> npt.NDArray[np.int16]:
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(codes & 0x80, magnitude, -magnitude).astype(np.int16)


ULAW_TO_PCM16: Final = _ulaw_table()
ALAW_TO_PCM16: Final = _alaw_table()


def _encoder_table(decoded: npt.NDArray[np.int16]) -> npt.NDArray[np.uint8]:
    """Every 16-bit sample (indexed as its uint16 bit pattern) → the code that decodes nearest to it."""
    order = np.argsort(decoded, kind="stable")
    values = decoded[order].astype(np.int32)
    samples = np.arange(-32768, 32768, dtype=np.int32)
    right = np.clip(np.searchsorted(values, samples), 1, len(values) - 1)
    left = right - 1
    nearest = np.where(samples - values[left] <= values[right] - samples, left, right)
    table = np.empty(65536, np.uint8)
    table[samples & 0xFFFF] = order[nearest]
    return table


_PCM16_TO_G711: Final = {"ulaw": _encoder_table(ULAW_TO_PCM16), "alaw": _encoder_table(ALAW_TO_PCM16)}


def encode_g711(pcm16: bytes, law: Literal["ulaw", "alaw"]) -> bytes:
    """Little-endian PCM16 → G.711 bytes (one per sample; the rate is the caller's, 8 kHz on the wire)."""
    samples = np.frombuffer(pcm16[: len(pcm16) - len(pcm16) % 2], dtype="<i2").view(np.uint16)
    return bytes(_PCM16_TO_G711[law][samples].tobytes())


class StreamDecoder(Protocol):
    def decode(self, data: bytes) -> AudioArray: ...

    def flush(self) -> AudioArray: ...

    def reset(self) -> None: ...


class PcmStreamDecoder:
    """Little-endian PCM frames (any rate, width and channel count) → 16 kHz mono float32.

    ``carry_partial``: a piece that ends inside a sample frame keeps those bytes for the next piece
    (OpenAI Realtime clients cut base64 appends anywhere); without it such a piece is refused with
    ``InvalidAudio`` (the device WebSocket protocol says every frame holds whole samples).
    """

    def __init__(self, fmt: PcmFormat, *, carry_partial: bool = False) -> None:
        self.format = fmt
        self._carry_partial = carry_partial
        self._carry = b""
        # pcm_to_float converts and downmixes; told the rate is 16 kHz, it leaves resampling to us.
        self._convert_format = replace(fmt, sample_rate_hz=SAMPLE_RATE_HZ)
        self._resampler = StreamResampler(fmt.sample_rate_hz)

    def decode(self, data: bytes) -> AudioArray:
        frame_bytes = self.format.frame_bytes
        if self._carry_partial:
            data = self._carry + data
            usable = len(data) - len(data) % frame_bytes
            self._carry = data[usable:]
            data = data[:usable]
            if not data:
                return np.zeros(0, np.float32)
        elif len(data) % frame_bytes:
            raise InvalidAudio(
                f"binary frame of {len(data)} bytes is not a whole number of samples "
                f"({frame_bytes} bytes per sample frame); the frame was dropped"
            )
        return self._resampler.push(pcm_to_float(data, self._convert_format))

    def flush(self) -> AudioArray:
        """The resampler's delayed tail (end of a recording); the next piece starts afresh."""
        self._carry = b""
        return self._resampler.flush()

    def reset(self) -> None:
        self._carry = b""
        self._resampler.reset()


class G711StreamDecoder:
    """G.711 μ-law or A-law bytes at 8 kHz → 16 kHz mono float32."""

    def __init__(self, law: Literal["ulaw", "alaw"]) -> None:
        self._table = ULAW_TO_PCM16 if law == "ulaw" else ALAW_TO_PCM16
        self._resampler = StreamResampler(G711_RATE_HZ)

    def decode(self, data: bytes) -> AudioArray:
        mono = self._table[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / 32768.0
        return self._resampler.push(mono)

    def flush(self) -> AudioArray:
        return self._resampler.flush()

    def reset(self) -> None:
        self._resampler.reset()
