"""The Wyoming ``info`` event: what ``describe`` is answered with (the ASR program and its models,
the TTS program when TTS is on, the wake-word program when wake models are loaded)."""

from __future__ import annotations

import functools
from typing import Final

from wyoming.info import AsrModel, AsrProgram, Attribution, Info

from mediaserver import __version__
from mediaserver.asr.service import AsrService
from mediaserver.transport.wyoming.tts import tts_program
from mediaserver.transport.wyoming.wake import wake_program
from mediaserver.tts.service import TtsService
from mediaserver.wake.models import WakeModels

_PROGRAM_ATTRIBUTION: Final = Attribution(
    name="mediaserver (faster-whisper)", url="https://github.com/SYSTRAN/faster-whisper"
)
_MODEL_ATTRIBUTION: Final = Attribution(name="OpenAI", url="https://github.com/openai/whisper")


@functools.cache
def _engine_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("faster-whisper")
    except PackageNotFoundError:
        return "unknown"


def asr_program(asr: AsrService) -> AsrProgram:
    """The ASR program of ``info``: one model per model the registry knows."""
    models: list[AsrModel] = []
    for source in asr.models.sources():
        multilingual = asr.models.is_multilingual(source.name)
        models.append(
            AsrModel(
                name=source.name,
                description=f"Whisper {source.name} ({'multilingual' if multilingual else 'English-only'})",
                languages=asr.models.languages(source.name),
                attribution=_MODEL_ATTRIBUTION,
                installed=True,
                version=_engine_version(),
            )
        )
    return AsrProgram(
        name="mediaserver",
        description="mediaserver speech-to-text (Whisper on CTranslate2)",
        attribution=_PROGRAM_ATTRIBUTION,
        installed=True,
        version=__version__,
        supports_transcript_streaming=True,
        models=models,
    )


def build_info(asr: AsrService, tts: TtsService | None = None, wake: WakeModels | None = None) -> Info:
    """The answer to ``describe``: the ASR program, the TTS program when TTS is on, the wake program."""
    return Info(
        asr=[asr_program(asr)],
        tts=[tts_program(tts)] if tts is not None else [],
        wake=[wake_program(wake)] if wake is not None and wake.names() else [],
    )
