"""webrtcvad over 16 kHz float audio.

webrtcvad is cheap (microseconds a frame) and catches digital silence and quiet rooms before any
model runs, but it also calls broadband noise "speech". It is therefore a first gate only; the ASR
engine runs a neural VAD (Silero, bundled with faster-whisper) on whatever passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import webrtcvad

from mediaserver.audio.decode import float_to_pcm16
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray


@dataclass(frozen=True)
class VadConfig:
    aggressiveness: int = 2
    frame_ms: int = 30
    min_speech_ms: int = 120


def speech_flags(audio: AudioArray, aggressiveness: int = 2, frame_ms: int = 30) -> list[bool]:
    """One flag per whole frame of ``frame_ms``; a trailing partial frame is ignored."""
    vad = webrtcvad.Vad(aggressiveness)
    frame_samples = SAMPLE_RATE_HZ * frame_ms // 1000
    pcm = float_to_pcm16(audio)
    frame_bytes = frame_samples * 2
    return [
        bool(vad.is_speech(pcm[i : i + frame_bytes], SAMPLE_RATE_HZ))
        for i in range(0, len(pcm) - frame_bytes + 1, frame_bytes)
    ]


def speech_ms(audio: AudioArray, config: VadConfig) -> int:
    flags = speech_flags(audio, config.aggressiveness, config.frame_ms)
    return sum(flags) * config.frame_ms


def has_speech(audio: AudioArray, config: VadConfig) -> bool:
    """False for silence, near-silence and clips too short to hold a word."""
    if audio.size == 0 or float(np.max(np.abs(audio))) < 1e-4:
        return False
    return speech_ms(audio, config) >= config.min_speech_ms
