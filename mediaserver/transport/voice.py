"""What the streaming transports share to run the voice loop: an assistant built from the app's
services and a client's options, attached to the session's ``StreamSession``."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from mediaserver.assistant.audio_out import AudioOut
from mediaserver.assistant.turn_types import AssistantOptions, assistant_options_from
from mediaserver.assistant.turns import Assistant
from mediaserver.state import CAPABILITIES, LLM, METRICS, SETTINGS, TOOLS, TTS
from mediaserver.stream.session import Emit, StreamSession


def make_assistant(
    app: web.Application, name: str, emit: Emit, out: AudioOut | None, values: Mapping[str, object]
) -> Assistant:
    """An assistant built from the app's services, with the client's ``system_prompt`` / ``voice`` /
    ``speak``. Disabled features are not an error here: the first turn reports the stage that is
    missing (``AssistantError``). Wrong option types are (``InvalidParameter``)."""
    settings = app[SETTINGS]
    capabilities = app[CAPABILITIES]
    options = assistant_options_from(dict(values), AssistantOptions.from_settings(settings))
    llm = app.get(LLM) if capabilities.enabled("llm") else None
    tts = app.get(TTS) if capabilities.enabled("tts") else None
    unavailable = {name: capabilities.reason(name) for name in ("llm", "tts") if not capabilities.enabled(name)}
    assistant = Assistant(llm, tts, settings, options, emit, out, app[METRICS], name=name, unavailable=unavailable)
    assistant.toolbox = app.get(TOOLS)  # MCP tools: the voice loop's own turns (answer()) may call them
    return assistant


def new_assistant(
    app: web.Application, stream: StreamSession, emit: Emit, out: AudioOut | None, values: Mapping[str, object]
) -> Assistant:
    """An assistant answering ``stream``'s final transcripts (the voice loop of WebRTC and the device socket)."""
    assistant = make_assistant(app, stream.id, emit, out, values)
    stream.assistant = assistant
    assistant.prefill()  # the system prompt, while the user has not spoken yet
    return assistant


def check_voice(app: web.Application, values: Mapping[str, object], base: AssistantOptions | None = None) -> None:
    """Refuse at a stream's start (``UnknownVoice``, ``param: voice``) a ``voice`` that no answer
    could be spoken in, when the answers are spoken (``speak``, here or in ``base``) and TTS is on:
    otherwise every turn would fail with ``voice_not_found``. Wrong types are ``InvalidParameter``."""
    options = assistant_options_from(dict(values), base or AssistantOptions.from_settings(app[SETTINGS]))
    voice = values.get("voice")
    if not isinstance(voice, str) or not options.speak:
        return
    if not app[CAPABILITIES].enabled("tts") or TTS not in app:
        return  # the first turn reports the missing stage
    app[TTS].voices.check_name(voice)


def update_assistant(assistant: Assistant, values: Mapping[str, object]) -> None:
    before = assistant.options.system_prompt
    assistant.configure(assistant_options_from(dict(values), assistant.options))
    if assistant.options.system_prompt != before:
        assistant.prefill()
