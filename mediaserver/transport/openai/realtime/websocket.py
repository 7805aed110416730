"""``GET /v1/realtime``: what the URL opens (a transcription or a conversation session), the
upgrade, and the session's life (see the package docstring for the protocol)."""

from __future__ import annotations

import logging
from typing import Final

from aiohttp import WSCloseCode, web

from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.state import ASR, SESSIONS, SETTINGS
from mediaserver.transport.openai.realtime import client_secrets
from mediaserver.transport.openai.realtime.config import RealtimeConfig
from mediaserver.transport.openai.realtime.conversation_config import ConversationConfig, default_conversation
from mediaserver.transport.openai.realtime.lookups import answer_defaults, is_llm_model, llm_model_names
from mediaserver.transport.openai.realtime.session import RealtimeSession, max_message_bytes
from mediaserver.transport.openai.realtime.session_update import SessionKind, session_kind
from mediaserver.transport.socket_session import LimitedWebSocket

log = logging.getLogger(__name__)

PATH: Final = "/v1/realtime"


class UpgradeRequired(ApiError):
    status = 426
    code = "upgrade_required"


def _is_beta(request: web.Request) -> bool:
    header = request.headers.get("OpenAI-Beta", "").replace(" ", "").lower()
    protocols = request.headers.get("Sec-WebSocket-Protocol", "").replace(" ", "").lower().split(",")
    return "realtime=v1" in header.split(",") or "openai-beta.realtime-v1" in protocols


def open_session(
    request: web.Request, settings: Settings
) -> tuple[SessionKind, RealtimeConfig, ConversationConfig | None]:
    """What the URL asks for (``config.session_kind``); a bad query is a 400 before any upgrade.
    A client secret (``client_secrets``) must be of that kind, and its session config applies."""
    app = request.app
    secret = client_secrets.from_request(request)
    query = request.query if secret is None else client_secrets.url_query_for(secret, request.query)
    kind, config, llm_model = session_kind(
        settings, app[ASR].models, query, lambda name: is_llm_model(app, name), lambda: llm_model_names(app)
    )
    conversation = None
    if kind == "conversation":
        model = query.get("model", "").strip() or None
        conversation = default_conversation(
            settings, config, llm_model, model, lambda name: answer_defaults(app, settings, name)
        )
    if secret is not None:
        client_secrets.check_kind(secret, kind)
        config, conversation = client_secrets.apply(app, secret.session, config, conversation)
    return kind, config, conversation


async def realtime_handler(request: web.Request) -> web.StreamResponse:
    """GET /v1/realtime: upgrade, register the session, read until it closes, clean up."""
    settings = request.app[SETTINGS]
    kind, config, conversation = open_session(request, settings)
    ws = LimitedWebSocket(
        heartbeat=settings.ws_heartbeat_s,
        max_message_bytes=max_message_bytes(settings),
        protocols=("realtime",),
    )
    if not ws.can_prepare(request).ok:
        raise UpgradeRequired(
            "GET /v1/realtime is a WebSocket endpoint (the OpenAI Realtime API); upgrade the connection"
        )
    session = RealtimeSession(request.app, ws, settings, config, beta=_is_beta(request), conversation=conversation)
    try:
        request.app[SESSIONS].add(session.id, session)  # over the cap: a 503 before the upgrade
    except ApiError:
        await session.aclose()
        raise
    try:
        await ws.prepare(request)
        session.start()
        log.info(
            "realtime session %s: %s opened from %s (transcription model %s)",
            session.id,
            kind,
            request.remote,
            config.resolved_model,
        )
        session.send_created()
        await session.run()
    finally:
        await session.aclose(WSCloseCode.GOING_AWAY, "session closed")
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get(PATH, realtime_handler)
