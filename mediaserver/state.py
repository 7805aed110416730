"""Typed keys for what the app shares with its handlers (aiohttp ``web.AppKey``)."""

from __future__ import annotations

from aiohttp import web

from mediaserver.asr.service import AsrService
from mediaserver.assistant.mcp import McpToolbox
from mediaserver.capabilities import Capabilities
from mediaserver.config import Settings
from mediaserver.llm.service import LlmService
from mediaserver.metrics import Metrics
from mediaserver.session_registry import SessionRegistry
from mediaserver.speakers.service import SpeakerService
from mediaserver.tts.service import TtsService
from mediaserver.turns.text_eou import TextEou

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
ASR = web.AppKey("asr", AsrService)
SESSIONS = web.AppKey("sessions", SessionRegistry)
CAPABILITIES = web.AppKey("capabilities", Capabilities)
TTS = web.AppKey("tts", TtsService)
LLM = web.AppKey("llm", LlmService)
TEXT_EOU = web.AppKey("text_eou", TextEou)  # turn_text_model "llm": the pauses' text scorer (absent: off)
TOOLS = web.AppKey("tools", McpToolbox)  # the MCP servers' tools (mcp_servers), always present
SPEAKERS = web.AppKey("speakers", SpeakerService)  # enrolled speakers and the speaker encoder
