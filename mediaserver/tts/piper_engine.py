"""Piper (VITS on ONNX Runtime, espeak-ng phonemes): the embedded engine.

The ONNX session is created here rather than by ``PiperVoice.load`` so its thread count is ours
(``tts_onnx_threads``): with ``tts_workers_per_voice`` workers sharing the cores, each session's
own thread pool must not ask for every core as well. ONNX Runtime releases the GIL while it runs,
so a synthesis in a worker thread leaves the event loop free.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np

from mediaserver.config import Settings
from mediaserver.tts.types import Pcm16, SynthesisParams, VoiceInfo

log = logging.getLogger(__name__)


class PiperEngine:
    def __init__(self, voice: VoiceInfo, settings: Settings) -> None:
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        self.voice = voice
        started = time.perf_counter()
        config = PiperConfig.from_dict(json.loads(voice.config_path.read_text(encoding="utf-8")))
        options = onnxruntime.SessionOptions()
        if settings.tts_onnx_threads > 0:
            options.intra_op_num_threads = settings.tts_onnx_threads
        options.inter_op_num_threads = 1
        # Busy-waiting threads would take CPU from ASR and the other TTS worker for nothing.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        if settings.device != "cpu" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        session = onnxruntime.InferenceSession(str(voice.model_path), sess_options=options, providers=providers)
        self._voice = PiperVoice(session=session, config=config)
        self._config = config
        self._default_length_scale = config.length_scale
        # The voice's own noise unless the operator set one (tts_noise_scale, tts_noise_w_scale).
        self._noise_scale = config.noise_scale if settings.tts_noise_scale is None else settings.tts_noise_scale
        self._noise_w_scale = config.noise_w_scale if settings.tts_noise_w_scale is None else settings.tts_noise_w_scale
        log.info(
            "TTS voice %s loaded (%s, %d Hz, %s) in %.2f s",
            voice.name,
            voice.source,
            config.sample_rate,
            session.get_providers()[0],
            time.perf_counter() - started,
        )

    def _speaker_id(self, speaker: str | None) -> int | None:
        if speaker is None or self._config.num_speakers <= 1:
            return None
        if speaker in self._config.speaker_id_map:
            return int(self._config.speaker_id_map[speaker])
        return int(speaker) if speaker.isdigit() else None

    def synthesize(self, sentence: str, params: SynthesisParams) -> Pcm16:
        from piper import SynthesisConfig

        config = SynthesisConfig(
            speaker_id=self._speaker_id(params.speaker),
            length_scale=self._default_length_scale / params.speed,
            noise_scale=self._noise_scale,
            noise_w_scale=self._noise_w_scale,
        )
        parts = [chunk.audio_int16_array for chunk in self._voice.synthesize(sentence, syn_config=config)]
        if not parts:
            return np.zeros(0, np.int16)
        return np.concatenate(parts).astype(np.int16, copy=False)

    def close(self) -> None:
        self._voice = None  # type: ignore[assignment]
