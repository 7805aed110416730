"""The engine interface: what the TTS service needs from a speech synthesizer.

An engine is one loaded voice. ``synthesize`` is blocking and is only ever called from the
service's worker threads, possibly from two at once (it must be thread-safe); it turns one sentence
into int16 PCM at ``voice.sample_rate_hz``. A second backend (an OpenAI-compatible upstream, another
ONNX model) is one module with a class like ``PiperEngine`` plus one line in ``load_engine``.
"""

from __future__ import annotations

from typing import Protocol

from mediaserver.config import Settings
from mediaserver.tts.types import Pcm16, SynthesisParams, VoiceInfo


class TtsEngine(Protocol):
    voice: VoiceInfo

    def synthesize(self, sentence: str, params: SynthesisParams) -> Pcm16:
        """One sentence → mono int16 PCM at ``voice.sample_rate_hz`` (blocking)."""
        ...

    def close(self) -> None:
        """Release the model (called once, when the voice is unloaded)."""
        ...


def load_engine(voice: VoiceInfo, settings: Settings) -> TtsEngine:
    """Load the engine ``voice`` belongs to (blocking: call it from a thread)."""
    if voice.engine == "piper":
        from mediaserver.tts.piper_engine import PiperEngine

        return PiperEngine(voice, settings)
    raise ValueError(f"voice {voice.name!r} needs engine {voice.engine!r}, which this server does not have")
