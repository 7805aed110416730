"""What the app knows that Realtime configuration is checked against: its LLM models and TTS voices."""

from __future__ import annotations

import contextlib

from aiohttp import web

from mediaserver.config import Settings
from mediaserver.errors import UnknownModel
from mediaserver.llm.defaults import defaults_for
from mediaserver.state import CAPABILITIES, LLM, TTS
from mediaserver.transport.openai.realtime.conversation_config import AnswerDefaults
from mediaserver.transport.openai.realtime.values import EventError


def check_voice(app: web.Application, name: str, param: str) -> None:
    """An unknown voice is an ``invalid_value`` error (a Piper voice the server may download is known)."""
    tts = app.get(TTS)
    if tts is None or not app[CAPABILITIES].enabled("tts"):
        return  # a response that asks for audio reports the missing stage
    if not tts.voices.known(name):
        voices = ", ".join(tts.voices.names()) or "none"
        raise EventError(
            "invalid_value",
            f"Invalid '{param}': unknown voice {name!r}. Voices: {voices}, and OpenAI's voice names.",
            param,
        )


def is_llm_model(app: web.Application, name: str) -> bool:
    """The app's LLM registry knows ``name`` (a model or an alias)."""
    llm = app.get(LLM)
    if llm is None:
        return False
    try:
        llm.sources.resolve(name)
    except UnknownModel:
        return False
    return True


def llm_model_names(app: web.Application) -> list[str]:
    """The chat models the app's LLM registry serves (none without the LLM)."""
    llm = app.get(LLM)
    return llm.sources.names() if llm is not None else []


def answer_defaults(app: web.Application, settings: Settings, llm_model: str | None) -> AnswerDefaults:
    """What a conversation's answers run with where the client sets nothing, for ``llm_model``
    (None: the assistant's): the temperature the LLM service would fill in, and the token limits."""
    name = llm_model or settings.assistant_llm_model
    llm = app.get(LLM)
    if llm is not None:
        with contextlib.suppress(UnknownModel):  # answering reports it; the configured defaults show meanwhile
            name = llm.sources.resolve(name).name
    return AnswerDefaults.of(settings, defaults_for(name or "", settings).temperature)
