"""The legacy WIS chatbot (willow-contract.md §6): GET /api/chatbot and /api/chatbot/tts, WS /api/ws/chatbot.

``GET /api/chatbot?text=…&max_new_tokens=&temperature=&top_p=&repetition_penalty=`` answers
``{"response": "…"}``. ``GET /api/chatbot/tts`` takes the same plus ``format`` and ``speaker`` (as
``/api/tts``) and answers with the answer spoken (streamed sentence by sentence as it is
synthesized), its text in ``X-Response`` (percent-encoded UTF-8). The WebSocket takes a plain text
frame (the question) and answers with a plain text frame (the answer), no JSON, as WIS's
``chatbot.js`` expects; a failure is answered as a text frame starting with ``error:``. An answer is
at most ``max_new_tokens`` tokens, ``llm_chatbot_max_tokens`` (512, as WIS) when the question sets
none, as every socket question does. WIS prompted
Vicuna with ``USER: …\nASSISTANT:``; here the model's own chat template is used, with
``llm_system_prompt`` as the system message. Each question stands alone, as in WIS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import quote

from aiohttp import WSMsgType, web

from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidParameter
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.state import CAPABILITIES, LLM, SETTINGS
from mediaserver.transport.common import parse_float, parse_int
from mediaserver.transport.socket_session import LimitedWebSocket
from mediaserver.transport.tts_http import SpeechRequest, respond_with_speech, tts_of
from mediaserver.transport.wis.query import parse_format
from mediaserver.tts.types import SynthesisParams

log = logging.getLogger(__name__)

# Questions a WebSocket client may queue while one is being answered; more get an error frame.
WS_MAX_PENDING_QUESTIONS = 4


def _messages(settings: Settings, text: str) -> list[ChatMessage]:
    messages = [ChatMessage("system", settings.llm_system_prompt)] if settings.llm_system_prompt else []
    return [*messages, ChatMessage("user", text)]


def default_max_tokens(settings: Settings) -> int:
    """A question's max_tokens when it sets none: ``llm_chatbot_max_tokens`` (WIS's 512), within the cap."""
    return min(settings.llm_chatbot_max_tokens, settings.llm_max_completion_tokens)


def _question(request: web.Request) -> tuple[str, GenerationParams]:
    settings = request.app[SETTINGS]
    query = request.query
    text = (query.get("text") or "").strip()
    if not text:
        raise InvalidParameter("the query parameter 'text' (the question) is required", param="text")
    params = GenerationParams(
        max_tokens=parse_int(
            query,
            "max_new_tokens",
            default_max_tokens(settings),
            minimum=1,
            maximum=settings.llm_max_completion_tokens,
        ),
        temperature=parse_float(query, "temperature", None, minimum=0.0, maximum=2.0),
        top_p=parse_float(query, "top_p", None, minimum=0.01, maximum=1.0),
        repeat_penalty=parse_float(query, "repetition_penalty", None, minimum=0.5, maximum=2.0),
    )
    return text, params


async def chatbot_handler(request: web.Request) -> web.Response:
    request.app[CAPABILITIES].require("llm")
    text, params = _question(request)
    completion = await request.app[LLM].complete(_messages(request.app[SETTINGS], text), params)
    return web.json_response({"response": completion.text.strip()})


async def chatbot_tts_handler(request: web.Request) -> web.StreamResponse:
    """GET /api/chatbot/tts: the answer, spoken (WIS's chatbot with its TTS)."""
    started_at = asyncio.get_running_loop().time()  # (the answer's writing counts in tts_wis_whole_wav_s)
    request.app[CAPABILITIES].require("llm")
    tts = tts_of(request)
    settings = request.app[SETTINGS]
    query = request.query
    text, params = _question(request)
    fmt = parse_format(query.get("format"), settings.tts_wis_default_format)
    voice = await tts.voice(query.get("speaker") or query.get("voice"), language=query.get("language") or None)
    # The whole answer first: the response header carries its text, and a WIS client expects a file.
    completion = await request.app[LLM].complete(_messages(settings, text), params)
    answer = completion.text.strip() or "I have no answer to that."
    spoken = SpeechRequest(answer[: settings.tts_max_input_chars], voice, SynthesisParams(), fmt)
    headers = {"X-Response": quote(answer, safe=" ,.?!'")}
    return await respond_with_speech(
        request, spoken, cache=False, whole_wav=True, headers=headers, started_at=started_at
    )


async def _answer_questions(
    ws: web.WebSocketResponse, llm: LlmService, settings: Settings, questions: asyncio.Queue[str]
) -> None:
    while True:
        question = await questions.get()
        try:
            params = GenerationParams(max_tokens=default_max_tokens(settings))
            completion = await llm.complete(_messages(settings, question), params)
            reply = completion.text.strip()
        except ApiError as exc:
            reply = f"error: {exc.message}"
        if ws.closed:
            return
        try:
            await ws.send_str(reply)
        except ConnectionResetError:
            return


async def ws_chatbot_handler(request: web.Request) -> web.WebSocketResponse:
    request.app[CAPABILITIES].require("llm")
    settings = request.app[SETTINGS]
    llm = request.app[LLM]
    ws = LimitedWebSocket(heartbeat=settings.ws_heartbeat_s, max_message_bytes=settings.ws_max_message_bytes)
    await ws.prepare(request)
    questions: asyncio.Queue[str] = asyncio.Queue(WS_MAX_PENDING_QUESTIONS)
    # Answers run beside the reader, so a client that hangs up mid-answer stops the generation.
    answering = asyncio.create_task(_answer_questions(ws, llm, settings, questions))
    try:
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                text = message.data.strip()
                if not text:
                    await ws.send_str("error: send a question as a text frame")
                elif questions.full():
                    await ws.send_str(f"error: at most {WS_MAX_PENDING_QUESTIONS} questions may wait; ask again")
                else:
                    questions.put_nowait(text)
            elif message.type == WSMsgType.BINARY:
                await ws.send_str("error: send the question as a text frame, not binary")
            if answering.done():
                break
    finally:
        answering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await answering
        await ws.close()
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/chatbot", chatbot_handler)
    app.router.add_get("/api/chatbot/tts", chatbot_tts_handler)
    app.router.add_get("/api/ws/chatbot", ws_chatbot_handler)
