"""Short-lived client secrets for browsers: OpenAI's ``POST /v1/realtime/client_secrets`` (GA) and
the beta ``POST /v1/realtime/sessions`` / ``/v1/realtime/transcription_sessions``.

An app's backend mints a secret with its real key; the page connects with the secret instead of the
key: as ``Authorization: Bearer ek_...`` on ``POST /v1/realtime/calls`` or ``GET /v1/realtime``, or
as the WebSocket subprotocol ``openai-insecure-api-key.ek_...`` (browsers cannot set headers on a
WebSocket). A secret opens sessions of the kind it was minted for (a conversation, ``realtime``, or
a ``transcription`` session) until it expires, each with the session configuration given at minting.

Secrets are stateless: ``ek_`` + the base64url of a nonce and the zlib-compressed JSON claims (kind,
expiry, session configuration) sealed with AES-256-GCM under a key derived from
``realtime_client_secret_key``. Sealed, not only signed: the session may hold an MCP server's
``authorization`` or headers, or instructions, which the browser holding the secret must not read
(the session events show them as ``<redacted>``: ``ConversationConfig.instructions_sealed``); and
any change to a secret makes it fail to open (one spelling only: ``_unb64``). The server keeps
nothing, so any replica that has the same key accepts a secret another replica minted (behind
HAProxy, set the same key on every replica). Without the setting each process draws a random key at
start: a restart invalidates every secret. A secret cannot be revoked before it expires.

A presented ``ek_`` credential is always checked, whether auth is on or off: unknown (it does not open),
expired, or used for the other kind of session is a 401 in OpenAI's error shape. Only the realtime
connect endpoints accept a secret, and, when auth is on, the /rtc/ page's own endpoints take a
``realtime`` one (``verify``; the allow-list is in app.py); minting needs a real key when auth is on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import secrets
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from aiohttp import web
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mediaserver.errors import ApiError, InvalidParameter
from mediaserver.state import ASR, SETTINGS
from mediaserver.transport.openai.bodies import read_json_object
from mediaserver.transport.openai.realtime.config import RealtimeConfig
from mediaserver.transport.openai.realtime.conversation_config import (
    ConversationConfig,
    default_conversation,
    parse_conversation_session,
)
from mediaserver.transport.openai.realtime.lookups import answer_defaults, check_voice, is_llm_model
from mediaserver.transport.openai.realtime.mcp_tools import McpPolicy
from mediaserver.transport.openai.realtime.session_update import SessionKind, default_config, parse_session
from mediaserver.transport.openai.realtime.values import EventError, new_id

PREFIX: Final = "ek_"
SUBPROTOCOL_PREFIX: Final = "openai-insecure-api-key."
SIGNING_KEY: Final = web.AppKey("realtime_client_secret_key", bytes)
BETA_DEFAULT_TTL_S: Final = 60  # the beta endpoints' secrets lived one minute at OpenAI
MIN_TTL_S: Final = 10

SecretKind = Literal["realtime", "transcription"]
_SESSION_KIND: Final[dict[SecretKind, SessionKind]] = {"realtime": "conversation", "transcription": "transcription"}


class InvalidClientSecret(ApiError):
    status = 401
    code = "invalid_api_key"


@dataclass(frozen=True)
class ClientSecret:
    kind: SecretKind
    expires_at: int
    session: Mapping[str, Any]

    @property
    def session_kind(self) -> SessionKind:
        return _SESSION_KIND[self.kind]


def setup(app: web.Application) -> None:
    """The signing key: the setting, else random for this process (called while the app is built)."""
    configured = app[SETTINGS].realtime_client_secret_key
    app[SIGNING_KEY] = configured.get_secret_value().encode() if configured is not None else os.urandom(32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


_B64URL: Final = re.compile(r"[A-Za-z0-9_-]*")


def _unb64(text: str) -> bytes:
    """Strictly the inverse of ``_b64``: one spelling per secret. ``urlsafe_b64decode`` alone skips
    characters outside the alphabet and ignores a last character's unused bits, so ``ek_ab.c`` or a
    changed final character would open the same secret (ValueError instead)."""
    if not _B64URL.fullmatch(text):
        raise ValueError("not unpadded base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not the canonical spelling")
    return data


_NONCE_BYTES: Final = 12
_AAD: Final = b"mediaserver ek2"


def _sealing_key(key: bytes) -> AESGCM:
    return AESGCM(hashlib.sha256(b"mediaserver client secret AES-GCM\0" + key).digest())


def encode(app: web.Application, secret: ClientSecret) -> str:
    claims = {"k": secret.kind, "exp": secret.expires_at, "s": secret.session}
    plain = zlib.compress(json.dumps(claims, separators=(",", ":")).encode("utf-8"), 9)
    nonce = secrets.token_bytes(_NONCE_BYTES)
    value = PREFIX + _b64(nonce + _sealing_key(app[SIGNING_KEY]).encrypt(nonce, plain, _AAD))
    limit = app[SETTINGS].realtime_client_secret_max_chars
    if len(value) > limit:
        raise InvalidParameter(
            f"the session configuration makes a client secret of {len(value)} characters, more than "
            f"realtime_client_secret_max_chars ({limit}); shorten it (instructions, most likely)",
            param="session",
        )
    return value


def decode(app: web.Application, value: str, *, now: float | None = None) -> ClientSecret:
    """The secret's claims, checked; a 401 when it is not one of ours or has expired."""
    try:
        sealed = _unb64(value.removeprefix(PREFIX))
        plain = _sealing_key(app[SIGNING_KEY]).decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], _AAD)
    except (ValueError, binascii.Error, InvalidTag):
        raise InvalidClientSecret(
            "Invalid client secret: unknown to this server (or minted under another key)."
        ) from None
    try:
        claims = json.loads(zlib.decompress(plain))
        kind, expires_at, session = claims["k"], int(claims["exp"]), claims["s"]
    except (ValueError, KeyError, TypeError, zlib.error):
        raise InvalidClientSecret("Invalid client secret: malformed.") from None
    if kind not in _SESSION_KIND or not isinstance(session, dict):
        raise InvalidClientSecret("Invalid client secret: malformed.")
    if expires_at <= (time.time() if now is None else now):
        raise InvalidClientSecret("Invalid client secret: it has expired; mint a new one.")
    return ClientSecret(kind, expires_at, session)


def presented(request: web.Request) -> str | None:
    """The ``ek_`` credential the request carries (Bearer or WebSocket subprotocol), if any."""
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer ") and header[7:].strip().startswith(PREFIX):
        return header[7:].strip()
    for protocol in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        candidate = protocol.strip().removeprefix(SUBPROTOCOL_PREFIX)
        if protocol.strip().startswith(SUBPROTOCOL_PREFIX) and candidate.startswith(PREFIX):
            return candidate
    return None


def from_request(request: web.Request) -> ClientSecret | None:
    value = presented(request)
    return None if value is None else decode(request.app, value)


def check_kind(secret: ClientSecret, kind: SessionKind) -> None:
    if secret.session_kind != kind:
        raise InvalidClientSecret(
            f"Invalid client secret: it was minted for a {secret.kind!r} session and cannot open a {kind} session."
        )


def verify(app: web.Application, value: str, kind: SecretKind) -> ClientSecret:
    """A secret presented where only secrets of ``kind`` are accepted (the /rtc/ page's endpoints:
    see ``_PAGE_SECRET_ROUTES`` in app.py): its claims, or a 401 when it is unknown, expired or of
    the other kind."""
    secret = decode(app, value)
    if secret.kind != kind:
        raise InvalidClientSecret(
            f"Invalid client secret: it was minted for a {secret.kind!r} session; this endpoint takes a "
            f"{kind!r} one (or an API key)."
        )
    return secret


def url_query_for(secret: ClientSecret, query: Mapping[str, str]) -> Mapping[str, str]:
    """A URL that names no session lets the secret decide its kind."""
    if secret.kind == "transcription" and not query.get("intent") and not query.get("model"):
        return {**query, "intent": "transcription"}
    return query


def apply(
    app: web.Application,
    session: Mapping[str, Any],
    config: RealtimeConfig,
    conversation: ConversationConfig | None,
    *,
    sealed: bool = True,
) -> tuple[RealtimeConfig, ConversationConfig | None]:
    """A session configuration over a new session's defaults, as a ``session.update`` would; a 400
    naming the field when it is not valid.

    ``sealed``: the session is being opened with the secret, so the instructions it carries are
    shown to the client as ``<redacted>`` (False when minting: the backend sent them)."""
    try:
        if conversation is not None:
            conversation = parse_conversation_session(
                session,
                conversation,
                app[ASR].models,
                check_voice=lambda name, param: check_voice(app, name, param),
                is_llm=lambda name: is_llm_model(app, name),
                answer_of=lambda name: answer_defaults(app, app[SETTINGS], name),
                mcp_policy=McpPolicy.of(app[SETTINGS]),
            )
            if sealed and "instructions" in session:
                conversation = replace(conversation, instructions_sealed=True)
            return conversation.input, conversation
        return parse_session(session, config, app[ASR].models), None
    except EventError as exc:
        raise InvalidParameter(exc.message, param=exc.param) from None


# --- minting ---------------------------------------------------------------------------------------


def _ttl(spec: object, param: str, default_s: int, max_s: int) -> int:
    if spec is None:
        return default_s
    if not isinstance(spec, dict):
        raise InvalidParameter(f"'{param}' must be an object {{anchor, seconds}}", param=param)
    anchor = spec.get("anchor", "created_at")
    if anchor != "created_at":
        raise InvalidParameter(f"'{param}.anchor' must be 'created_at'; got {anchor!r}", param=f"{param}.anchor")
    seconds = spec.get("seconds", default_s)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_TTL_S <= seconds <= max_s:
        raise InvalidParameter(
            f"'{param}.seconds' must be a whole number of seconds from {MIN_TTL_S} to {max_s}; got {seconds!r}",
            param=f"{param}.seconds",
        )
    return seconds


def _new_session(app: web.Application, kind: SecretKind, session: Mapping[str, Any]) -> tuple[Any, Any]:
    settings = app[SETTINGS]
    query = {"intent": "transcription"} if kind == "transcription" else {}
    config = default_config(settings, app[ASR].models, query)
    conversation = (
        default_conversation(settings, config, None, None, lambda name: answer_defaults(app, settings, name))
        if kind == "realtime"
        else None
    )
    return apply(app, session, config, conversation, sealed=False)


def _issue(app: web.Application, kind: SecretKind, session: Mapping[str, Any], ttl_s: int) -> tuple[str, int, Any]:
    config, conversation = _new_session(app, kind, session)  # a 400 now rather than at connect
    expires_at = int(time.time()) + ttl_s
    value = encode(app, ClientSecret(kind, expires_at, dict(session)))
    return value, expires_at, (config, conversation)


async def _body(request: web.Request) -> dict[str, Any]:
    settings = request.app[SETTINGS]
    if not request.can_read_body:
        return {}
    return await read_json_object(
        request, max_bytes=settings.realtime_max_call_bytes, setting="realtime_max_call_bytes"
    )


async def client_secrets_handler(request: web.Request) -> web.Response:
    """GA ``POST /v1/realtime/client_secrets``: ``{expires_after, session}`` → ``{value, expires_at, session}``."""
    app, settings = request.app, request.app[SETTINGS]
    body = await _body(request)
    ttl_s = _ttl(
        body.get("expires_after"),
        "expires_after",
        settings.realtime_client_secret_default_ttl_s,
        settings.realtime_client_secret_max_ttl_s,
    )
    session = body.get("session") or {"type": "realtime"}
    if not isinstance(session, dict):
        raise InvalidParameter("'session' must be an object", param="session")
    session_type = session.get("type", "realtime")
    if session_type not in ("realtime", "transcription"):
        raise InvalidParameter(
            f"'session.type' must be 'realtime' or 'transcription'; got {session_type!r}", param="session.type"
        )
    kind: SecretKind = "transcription" if session_type == "transcription" else "realtime"
    value, expires_at, (config, conversation) = _issue(app, kind, session, ttl_s)
    session_id = new_id("sess")
    described = (
        conversation.describe_ga(session_id, settings)
        if conversation is not None
        else config.describe_ga(session_id, settings)
    )
    described["expires_at"] = expires_at
    return web.json_response({"value": value, "expires_at": expires_at, "session": described})


async def _beta(request: web.Request, kind: SecretKind) -> web.Response:
    app, settings = request.app, request.app[SETTINGS]
    body = await _body(request)
    spec = body.pop("client_secret", None)
    expires_after = spec.get("expires_after") if isinstance(spec, dict) else spec
    ttl_s = _ttl(
        expires_after,
        "client_secret.expires_after",
        min(BETA_DEFAULT_TTL_S, settings.realtime_client_secret_max_ttl_s),
        settings.realtime_client_secret_max_ttl_s,
    )
    value, expires_at, (config, conversation) = _issue(app, kind, body, ttl_s)
    if conversation is not None and conversation.mcp:
        # As session.update refuses them in a beta session: the beta interface has no MCP events.
        raise InvalidParameter(
            "tools of type 'mcp' are part of the GA Realtime interface; mint with POST "
            "/v1/realtime/client_secrets to use them",
            param="tools",
        )
    session_id = new_id("sess")
    described = (
        conversation.describe_beta(session_id, settings)
        if conversation is not None
        else config.describe_beta(session_id, settings)
    )
    described["client_secret"] = {"value": value, "expires_at": expires_at}
    return web.json_response(described)


async def beta_sessions_handler(request: web.Request) -> web.Response:
    """Beta ``POST /v1/realtime/sessions``: a conversation's flat session config → it, with ``client_secret``."""
    return await _beta(request, "realtime")


async def beta_transcription_sessions_handler(request: web.Request) -> web.Response:
    """Beta ``POST /v1/realtime/transcription_sessions``: likewise for a transcription session."""
    return await _beta(request, "transcription")


def add_routes(app: web.Application) -> None:
    setup(app)
    app.router.add_post("/v1/realtime/client_secrets", client_secrets_handler)
    app.router.add_post("/v1/realtime/sessions", beta_sessions_handler)
    app.router.add_post("/v1/realtime/transcription_sessions", beta_transcription_sessions_handler)
