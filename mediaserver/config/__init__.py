"""Settings: every limit, timeout and default of the server, in one typed place.

Each field can be set from the environment as ``MEDIASERVER_<FIELD>`` (case-insensitive) or from a
``.env`` file in the working directory. Units are part of the names so a value can be read without
looking up the code (``max_upload_bytes``, ``asr_max_wait_ms``).

The fields live beside their subsystem, one model per module (``asr``, ``streams``, ``transports``,
``tts``, ``llm``, ``assistant``, ``speakers``, ``server``); ``Settings`` inherits them all and adds the one
environment source, so ``Settings()`` is still one flat object with one prefix.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from mediaserver.config.asr import DEFAULT_MODEL_ALIASES, AsrSettings, RemoteModel
from mediaserver.config.assistant import AssistantSettings, McpServerConfig
from mediaserver.config.llm import (
    DEFAULT_EMBEDDING_ALIASES,
    DEFAULT_LLM_ALIASES,
    GenerationDefaults,
    LlmSettings,
)
from mediaserver.config.server import ServerSettings
from mediaserver.config.speakers import SpeakerSettings
from mediaserver.config.streams import StreamSettings
from mediaserver.config.transports import TransportSettings
from mediaserver.config.tts import DEFAULT_VOICE_ALIASES, OPENAI_VOICES, PIPER_VOICE_URL, WIS_SPEAKERS, TtsSettings

__all__ = [
    "DEFAULT_EMBEDDING_ALIASES",
    "DEFAULT_LLM_ALIASES",
    "DEFAULT_MODEL_ALIASES",
    "DEFAULT_VOICE_ALIASES",
    "OPENAI_VOICES",
    "PIPER_VOICE_URL",
    "WIS_SPEAKERS",
    "GenerationDefaults",
    "McpServerConfig",
    "RemoteModel",
    "Settings",
]


# Pydantic collects the fields of the last base first: the parts are listed from the last to the
# first so the fields keep the order they had in one class (server, ASR, streams ... assistant).
class Settings(
    SpeakerSettings,
    AssistantSettings,
    LlmSettings,
    TtsSettings,
    TransportSettings,
    StreamSettings,
    AsrSettings,
    ServerSettings,
    BaseSettings,
):
    """All configuration; the docs site's configuration page lists every field (tools/gen_config_docs.py)."""

    # validate_by_name: Settings(asr_default_model=...) by field name, next to the renamed settings'
    # environment aliases (asr._renamed).
    model_config = SettingsConfigDict(
        env_prefix="MEDIASERVER_", env_file=".env", extra="ignore", validate_by_name=True, validate_by_alias=True
    )

    def wyoming_bind_host(self) -> str:
        """Where Wyoming listens: ``wyoming_host`` when set, else loopback when auth is on, else all."""
        if self.wyoming_host is not None:
            return self.wyoming_host
        return "127.0.0.1" if self.auth_enabled else "0.0.0.0"
