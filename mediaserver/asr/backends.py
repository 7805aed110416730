"""Which engine serves a model name: a remote backend from ``remote_models``, or a local Whisper."""

from __future__ import annotations

from mediaserver.asr.guards import GuardConfig
from mediaserver.asr.remote import RemoteEngine
from mediaserver.asr.remote_openai import OpenAIEngine
from mediaserver.asr.triton import TritonEngine
from mediaserver.audio.vad import VadConfig
from mediaserver.config import RemoteModel
from mediaserver.metrics import Metrics

REMOTE_ENGINES: dict[str, type[RemoteEngine]] = {"openai": OpenAIEngine, "triton": TritonEngine}


def build_remote_engine(
    name: str,
    config: RemoteModel,
    *,
    vad: VadConfig,
    metrics: Metrics | None,
    default_language: str,
    guards: GuardConfig | None = None,
) -> RemoteEngine:
    """The engine for one ``remote_models`` entry; contacts nothing (the backend may be down at start)."""
    engine = REMOTE_ENGINES[config.backend]
    return engine(name, config, vad=vad, metrics=metrics, default_language=default_language, guards=guards)
