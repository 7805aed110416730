"""create_app(settings): routes, middlewares and the lifecycle of shared services."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestPayloadError

from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.service import AsrService
from mediaserver.assistant.mcp import McpToolbox
from mediaserver.audio.ffmpeg_threads import limit_ffmpeg_threads
from mediaserver.capabilities import Feature, FeatureRequest, decide
from mediaserver.config import Settings
from mediaserver.devices import DeviceChoice, choose_device
from mediaserver.errors import ApiError, InvalidBody, Unauthorized, VoiceNotAuthorized, retry_after_header
from mediaserver.llm.registry import LlmRegistry
from mediaserver.llm.service import LlmService
from mediaserver.metrics import CONTENT_TYPE_LATEST, Metrics
from mediaserver.openapi import document as openapi
from mediaserver.session_registry import SessionRegistry
from mediaserver.speakers.service import SpeakerService
from mediaserver.state import ASR, CAPABILITIES, LLM, METRICS, SESSIONS, SETTINGS, SPEAKERS, TEXT_EOU, TOOLS, TTS
from mediaserver.transport import cors
from mediaserver.transport import speakers as speakers_http
from mediaserver.transport.common import FAILED_AFTER_HEADERS
from mediaserver.transport.lenient_http import SHUTDOWN_CANCEL
from mediaserver.transport.openai import chat as openai_chat
from mediaserver.transport.openai import models as openai_models
from mediaserver.transport.openai import realtime
from mediaserver.transport.openai import speech as openai_speech
from mediaserver.transport.openai import transcriptions as openai_rest
from mediaserver.transport.openai.realtime import client_secrets
from mediaserver.transport.webrtc import routes as rtc
from mediaserver.transport.wis import chatbot as wis_chatbot
from mediaserver.transport.wis import tts as wis_tts
from mediaserver.transport.wis import willow
from mediaserver.transport.ws import asr as ws
from mediaserver.transport.wyoming.server import WYOMING_PORT, WYOMING_SERVER, wyoming_ctx
from mediaserver.tts.service import TtsService
from mediaserver.tts.voices import tts_unavailable
from mediaserver.turns import model as turn_models
from mediaserver.turns.text_eou import text_eou_of

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Open without credentials: probes, and static pages that hold no secrets (a dashboard frame
# cannot send credentials for them; the APIs they call stay protected). The OpenAPI document is
# what /api/docs loads: it describes the API, it holds nothing secret.
_PUBLIC_PATHS = frozenset({"/health", "/rtc", "/api/docs", "/api/openapi.json"})
_PUBLIC_PREFIXES = ("/rtc/", "/static/")
# Where a client secret (``ek_...``, client_secrets.py) stands in for an API key, and nowhere else
# (not uploads, not minting, not admin). The realtime connect endpoints check the secret themselves
# (its kind decides the session's). The /rtc/ page's own calls (static/rtc/*.js) are checked here and
# take a ``realtime`` (conversation) secret only: the page's WebRTC session turns into the voice
# assistant (LLM and TTS) with a data-channel message, so a ``transcription`` secret would open more
# than it was minted for.
_CLIENT_SECRET_PATHS = frozenset({"/v1/realtime", "/v1/realtime/calls"})
_PAGE_SECRET_ROUTES = frozenset(
    {
        ("POST", "/api/rtc/asr"),  # the session (SDP offer): push-to-talk, hands-free, assistant
        ("GET", "/api/rtc/config"),  # ICE servers
        ("GET", "/v1/models"),  # the model menu
        ("GET", "/api/tts"),  # the Speak panel
        ("GET", "/api/speaker"),  # its voices
    }
)


def _is_openai(request: web.Request) -> bool:
    return request.path.startswith("/v1/")


def error_response(
    request: web.Request, status: int, code: str, message: str, param: str | None = None
) -> web.Response:
    """Render an error in the format of the API the request belongs to."""
    if _is_openai(request):
        kind = "invalid_request_error" if status < 500 else "server_error"
        body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
        return web.json_response(body, status=status)
    return web.json_response({"error": message, "code": code}, status=status)


# Not a registered HTTP status: nginx's "client closed request". Counted in
# mediaserver_requests_total for requests whose client hung up before the answer (never sent).
CLIENT_CLOSED_REQUEST = 499


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _body_error(request: web.Request, exc: Exception) -> web.Response:
    """A request body aiohttp could not decode: a 400 in the API's format, and the connection closed
    afterwards (the parser has lost its place in the stream)."""
    encoding = request.headers.get("Content-Encoding", "").strip()
    if isinstance(exc, ContentEncodingError) or "content-encoding" in str(exc).lower():
        message = f"the request body is not valid {encoding or 'compressed'} data (Content-Encoding: {encoding})"
    else:
        message = "the request body is malformed (its framing or length does not match what was sent)"
    log.info("%s %s: %s", request.method, request.path, message)
    # The payload is spent: mark it finished so aiohttp does not try to read the rest of it again.
    request.content.feed_eof()
    response = error_response(request, 400, InvalidBody.code, message, "body")
    response.force_close()
    return response


def _retry_after(request: web.Request, exc: ApiError) -> str:
    seconds = exc.retry_after_s if exc.retry_after_s is not None else request.app[SETTINGS].retry_after_fallback_s
    return retry_after_header(seconds)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except VoiceNotAuthorized:
        log.info("%s %s -> 406: no enrolled voice matched (voice_auth)", request.method, request.path)
        return web.Response(status=406, text="Unauthorized voice", content_type="text/plain")
    except ApiError as exc:
        # One line each (docs/operations.md): a client's mistake at INFO, the server's at WARNING.
        log.log(
            logging.INFO if exc.status < 500 else logging.WARNING,
            "%s %s -> %d %s: %.300s",
            request.method,
            request.path,
            exc.status,
            exc.code,
            exc.message,
        )
        response = error_response(request, exc.status, exc.code, exc.message, exc.param)
        if isinstance(exc, Unauthorized):
            response.headers["WWW-Authenticate"] = 'Basic realm="mediaserver", charset="UTF-8"'
        if exc.retryable and exc.status in (429, 503):
            response.headers["Retry-After"] = _retry_after(request, exc)
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status, "http_error")
        message = exc.text or exc.reason
        if exc.status == 413:
            message = f"request body too large: {message}"
        # (a 404 or 405 is what a scanner gets: not worth a line at INFO)
        log.log(
            logging.DEBUG if exc.status in (404, 405) else logging.INFO,
            "%s %s -> %d",
            request.method,
            request.path,
            exc.status,
        )
        response = error_response(request, exc.status, code, message)
        for header in ("Allow",):
            if header in exc.headers:
                response.headers[header] = exc.headers[header]
        return response
    except TimeoutError:
        log.warning("timeout on %s %s", request.method, request.path)
        return error_response(request, 504, "timeout", "the request did not finish in time; retry later")
    except asyncio.CancelledError:
        raise
    except (ConnectionError, RequestPayloadError, HttpProcessingError) as exc:
        if _client_gone(request):
            # The client's doing (it hung up mid-upload or before the answer): one line, no traceback.
            log.info("%s %s: the client closed the connection (%s)", request.method, request.path, type(exc).__name__)
            return web.Response(status=CLIENT_CLOSED_REQUEST)
        if isinstance(exc, ConnectionError):
            log.exception("unhandled error on %s %s", request.method, request.path)
            return error_response(request, 500, "internal_error", "internal server error")
        return _body_error(request, exc)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(request, 500, "internal_error", "internal server error")


def _check_credentials(request: web.Request, settings: Settings) -> bool:
    return _api_key_valid(request, settings) or _basic_valid(request, settings)


def _api_key_valid(request: web.Request, settings: Settings) -> bool:
    """The request carries one of ``api_keys``."""
    header = request.headers.get("Authorization", "")
    if settings.api_keys:
        candidates = [request.headers.get("X-API-Key", "")]
        if header.lower().startswith("bearer "):
            candidates.append(header[7:].strip())
        # Browsers cannot set headers on a WebSocket: OpenAI's clients send the key as a subprotocol.
        for protocol in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
            if protocol.strip().startswith("openai-insecure-api-key."):
                candidates.append(protocol.strip().removeprefix("openai-insecure-api-key."))
        # (A header's bytes that are not UTF-8 arrive as surrogates: compared as the bytes sent, they
        # match no key, where encoding them strictly raised, a 500 any client could cause.)
        sent = [c.encode("utf-8", "surrogateescape") for c in candidates if c]
        for key in settings.api_keys:
            if any(hmac.compare_digest(c, key.encode()) for c in sent):
                return True
    return False


def _basic_valid(request: web.Request, settings: Settings) -> bool:
    """The request carries the HTTP Basic credentials (``basic_auth_user``)."""
    header = request.headers.get("Authorization", "")
    if settings.basic_auth_user is not None and header.lower().startswith("basic "):
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):  # (not base64, not ASCII (a ValueError of its own), not UTF-8)
            return False
        user, _, password = decoded.partition(":")
        return hmac.compare_digest(user.encode(), settings.basic_auth_user.encode()) and hmac.compare_digest(
            password.encode(), (settings.basic_auth_password or "").encode()
        )
    return False


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    if request.path in _PUBLIC_PATHS or request.path.startswith(_PUBLIC_PREFIXES) or request.method == "OPTIONS":
        return await handler(request)
    secret = client_secrets.presented(request)
    if secret is not None and request.path in _CLIENT_SECRET_PATHS:
        return await handler(request)  # the realtime handlers check it (and its kind)
    if secret is not None and (request.method, request.path) in _PAGE_SECRET_ROUTES:
        client_secrets.verify(request.app, secret, "realtime")  # a 401 unless valid, unexpired, realtime
        return await handler(request)
    if not _check_credentials(request, settings):
        if secret is not None:
            raise Unauthorized(
                "a client secret opens only realtime sessions and the /rtc/ page's endpoints; "
                "this one needs HTTP Basic credentials or an API key"
            )
        raise Unauthorized("authentication required: HTTP Basic credentials or an API key")
    return await handler(request)


def _sent_on_purpose(request: web.Request) -> bool:
    """The request carries a credential a page must send on purpose, checked before the session
    opens: a valid API key, or a client secret where the realtime handler checks it. (Not HTTP Basic
    credentials: a browser adds those it has cached by itself, to any page's WebSocket.)"""
    if _api_key_valid(request, request.app[SETTINGS]):
        return True
    return client_secrets.presented(request) is not None and request.path in _CLIENT_SECRET_PATHS


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    status = 500
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    in_flight = request.app[METRICS].requests_in_flight.labels(route)
    in_flight.inc()
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError as exc:
        # The server cancels a handler whose client hung up (handler_cancellation): its queued work is
        # withdrawn at once. That is the client's doing, counted as 499 like a hang-up mid-upload.
        # At the end of the shutdown grace it is the server's (lenient_http): counted as a 503.
        if exc.args == (SHUTDOWN_CANCEL,):
            status = 503
            log.info("%s %s: cancelled by the shutdown (shutdown_grace_s is over)", request.method, request.path)
        elif _client_gone(request):
            status = CLIENT_CLOSED_REQUEST
            log.info("%s %s: the client closed the connection before the answer", request.method, request.path)
        raise
    finally:
        in_flight.dec()
        request.app[METRICS].requests.labels(route, str(status)).inc()
        failed = request.get(FAILED_AFTER_HEADERS)
        if failed is not None:
            request.app[METRICS].failed_after_headers.labels(route, failed.code).inc()
            log.warning(
                "%s %s -> %d, then failed after the headers: %s (%s)",
                request.method,
                request.path,
                status,
                failed.message,
                failed.code,
            )
        log.debug(
            "%s %s -> %d in %.1f ms",
            request.method,
            request.path,
            status,
            (time.perf_counter() - started) * 1000,
        )


async def health_handler(request: web.Request) -> web.Response:
    asr = request.app[ASR]
    backends = asr.backend_status()
    # A remote backend that is down degrades this server but does not fail the probe: the other
    # models still work, and replicas sharing one backend must not all leave a load balancer.
    down = any(b["state"] == "down" for b in backends.values())
    body: dict[str, Any] = {
        "status": "degraded" if down else "ok",
        "device": asr.device.device,
        "compute_type": asr.device.compute_type,
        "models_loaded": asr.loaded_models,
        "models_available": asr.models.names(),
        # Names clients may use for them (OpenAI's whisper-1, gpt-4o-transcribe ...): alias -> model.
        "model_aliases": asr.models.alias_targets(),
        "features": request.app[CAPABILITIES].as_dict(),
    }
    if backends:
        body["backends"] = backends
    # Per engine and model: in memory or unloaded (idle past its *_keep_alive_s, evicted), the last
    # load's seconds, loads and unloads, seconds unused. An unloaded model is healthy: it loads on
    # the next request.
    states: dict[str, Any] = {"asr": asr.keeper.status()}
    if TTS in request.app:
        states["tts"] = request.app[TTS].keeper.status()
    if LLM in request.app:
        states["llm"] = request.app[LLM].keeper.status()
        states["embedding"] = request.app[LLM].embedding_keeper.status()
    turn_model = turn_models.shared(request.app[SETTINGS])
    if turn_model is not None:
        states["turn"] = turn_model.weights.keeper.status()
    speaker_model = request.app[SPEAKERS].weights if SPEAKERS in request.app else None
    if speaker_model is not None:
        states["speaker"] = speaker_model.keeper.status()
    body["model_states"] = states
    body["turns"] = turn_models.status(request.app[SETTINGS])
    if TEXT_EOU in request.app:  # turn_text_model "llm": in force, or why not
        body["turns"].update(request.app[TEXT_EOU].status())
    if SPEAKERS in request.app:
        body["speakers"] = request.app[SPEAKERS].status()
    settings = request.app[SETTINGS]
    if SESSIONS in request.app:  # live streaming sessions (WebRTC, device and Realtime sockets), against the cap
        body["sessions"] = {"open": len(request.app[SESSIONS]), "max": settings.max_sessions}
    # Where Home Assistant finds the Wyoming face (the port it listens on, or why not).
    body["wyoming"] = (
        {"enabled": True, "host": settings.wyoming_bind_host(), "port": request.app[WYOMING_PORT]}
        if WYOMING_PORT in request.app
        else {"enabled": False, "reason": "wyoming_enabled is false"}
    )
    if WYOMING_SERVER in request.app:
        open_now = request.app[WYOMING_SERVER].served
        body["wyoming"]["connections"] = {"open": open_now, "max": settings.wyoming_max_connections}
    toolbox = request.app.get(TOOLS)
    if toolbox is not None and settings.mcp_servers:
        # The operator's MCP servers (mcp_servers): one that is down has no tools offered meanwhile.
        body["mcp"] = toolbox.status()
        if toolbox.down:
            body["status"] = "degraded"
    if LLM in request.app:  # slots busy, queue, tokens/s and the engine's state, per model
        llm = await request.app[LLM].status()
        body["llm"] = llm
        # An engine restarting or not answering (wedged) degrades the server the same way.
        engines = [
            model[kind] for model in llm["models"].values() for kind in ("engine", "embedding_engine") if kind in model
        ]
        if any(not engine["healthy"] for engine in engines):
            body["status"] = "degraded"
    return web.json_response(body)


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def openapi_handler(request: web.Request) -> web.Response:
    return web.json_response(openapi.spec())


async def docs_handler(request: web.Request) -> web.Response:
    return web.Response(text=openapi.DOCS_HTML, content_type="text/html")


async def index_handler(request: web.Request) -> web.Response:
    return web.Response(text=openapi.INDEX_HTML, content_type="text/html")


def feature_requests(settings: Settings) -> list[FeatureRequest]:
    """What each feature needs; TTS and the LLM add theirs here as they land."""
    return [
        FeatureRequest("asr", None, settings.vram_asr_mb, required=True),
        FeatureRequest("tts", tts_unavailable(settings), settings.vram_tts_mb),
        FeatureRequest("llm", LlmRegistry(settings).unavailable_reason(), settings.vram_llm_mb),
    ]


def create_app(
    settings: Settings | None = None,
    *,
    asr_service: AsrService | None = None,
    tts_service: TtsService | None = None,
    llm_service: LlmService | None = None,
    device: DeviceChoice | None = None,
) -> web.Application:
    """Build the app. Pass ``asr_service`` / ``tts_service`` / ``llm_service`` to share loaded models
    and voices between apps (tests do)."""
    settings = settings or Settings()
    limit_ffmpeg_threads(settings.ffmpeg_threads)  # process-wide, before any stream converts audio
    middlewares: list[Middleware] = [metrics_middleware, error_middleware]
    if settings.api_keys or settings.basic_auth_user is not None:
        middlewares.append(auth_middleware)
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_upload_bytes)
    cors.install(app, settings.cors_allow_origins)
    cors.install_websocket_check(app, settings.cors_allow_origins, _sent_on_purpose)
    app[SETTINGS] = settings
    if asr_service is not None:
        metrics = asr_service.metrics
    else:
        metrics = tts_service.app_metrics if tts_service is not None else Metrics()
    app[METRICS] = metrics

    async def asr_ctx(app: web.Application) -> AsyncIterator[None]:
        if asr_service is not None:
            app[ASR] = asr_service
            app[CAPABILITIES] = decide(asr_service.device, feature_requests(settings))
            yield
            return
        chosen = device or choose_device(settings.device, settings.compute_type, settings.cpu_threads)
        log.info(
            "ASR device: %s, compute type %s, %d CPU threads (%s)",
            chosen.device,
            chosen.compute_type,
            chosen.cpu_threads,
            chosen.reason,
        )
        service = AsrService(settings, chosen, ModelRegistry(settings), metrics)
        app[ASR] = service
        app[CAPABILITIES] = decide(chosen, feature_requests(settings))
        try:
            await service.start()
            yield
        finally:
            await service.aclose()

    async def close_on_shutdown(app: web.Application) -> None:
        # aiohttp's on_shutdown runs once the listeners are closed and before the server waits
        # (shutdown_grace_s) for the handlers still running: streaming sessions would keep theirs
        # open until the clients left. Close them now (1001 "going away" on WebSockets; WebRTC peers
        # and Realtime calls hang up) and end Wyoming's connections (EOF), so a restart is quick.
        if SESSIONS in app:
            await app[SESSIONS].aclose()
        if WYOMING_SERVER in app:
            await app[WYOMING_SERVER].aclose()

    app.on_shutdown.append(close_on_shutdown)

    async def sessions_ctx(app: web.Application) -> AsyncIterator[None]:
        registry = SessionRegistry(settings, metrics)
        app[SESSIONS] = registry
        try:
            yield
        finally:  # before the ASR service goes: sessions may still be waiting on it
            await registry.aclose()

    async def tts_ctx(app: web.Application) -> AsyncIterator[None]:
        capabilities = app[CAPABILITIES]
        if not capabilities.enabled("tts"):
            yield
            return
        if tts_service is not None:
            app[TTS] = tts_service
            yield
            return
        service = TtsService(settings, metrics)
        try:
            await service.start()
        except Exception as exc:  # the default voice did not load: TTS off, the rest runs
            log.error("TTS is off: %s", exc)
            capabilities.set(Feature("tts", False, f"the default voice could not be loaded: {exc}"))
            await service.aclose()
            yield
            return
        app[TTS] = service
        try:
            yield
        finally:
            await service.aclose()

    def text_eou(app: web.Application, service: LlmService | None) -> None:
        """turn_text_model "llm": the pauses' text scorer, on this LLM (or saying why it is off)."""
        problem = None if service is not None else f"the LLM is off: {app[CAPABILITIES].reason('llm')}"
        scorer = text_eou_of(settings, service, problem)
        if scorer is not None:
            app[TEXT_EOU] = scorer

    async def llm_ctx(app: web.Application) -> AsyncIterator[None]:
        capabilities = app[CAPABILITIES]
        if not capabilities.enabled("llm"):
            text_eou(app, None)
            yield
            return
        if llm_service is not None:
            app[LLM] = llm_service
            text_eou(app, llm_service)
            yield
            return
        service = LlmService(settings, metrics, app[ASR].device)
        app[LLM] = service
        try:
            try:
                await service.start()
            except ApiError as exc:  # a model that does not load turns the LLM off, with the reason
                log.error("LLM disabled: %s", exc.message)
                capabilities.set(Feature("llm", False, exc.message))
            if service.sources.default_name is None:
                reason = f"no model resolves: {service.start_problem or 'set llm_model'}"
                capabilities.set(Feature("llm", False, reason))
            text_eou(app, service if capabilities.enabled("llm") else None)
            yield
        finally:
            await service.aclose()

    async def turn_model_ctx(app: web.Application) -> AsyncIterator[None]:
        # Semantic end of turn (mediaserver/turns): loaded off the event loop; a missing file is
        # logged once and leaves every utterance ending on silence.
        model = await asyncio.get_running_loop().run_in_executor(None, turn_models.load_shared, settings, metrics)
        if model is not None:
            model.weights.announce()  # its idle timer (turn_keep_alive_s) starts now
        yield

    # --- MCP tools (mcp_servers): the assistant's tools, connected before sessions start ---
    async def tools_ctx(app: web.Application) -> AsyncIterator[None]:
        toolbox = McpToolbox(settings, metrics)
        app[TOOLS] = toolbox
        await toolbox.start()
        try:
            yield
        finally:
            await toolbox.aclose()

    # --- end MCP tools ---

    async def speakers_ctx(app: web.Application) -> AsyncIterator[None]:
        # Speaker recognition (mediaserver/speakers): without its model, enrolment and voice_auth
        # answer that it is off, and the rest runs.
        service = SpeakerService(settings, metrics)
        await service.start()
        app[SPEAKERS] = service
        try:
            yield
        finally:
            await service.aclose()

    # Cleanup runs in reverse: sessions (and their assistants) close before the services they use.
    app.cleanup_ctx.append(turn_model_ctx)
    app.cleanup_ctx.append(asr_ctx)
    app.cleanup_ctx.append(tts_ctx)
    app.cleanup_ctx.append(llm_ctx)
    app.cleanup_ctx.append(tools_ctx)
    app.cleanup_ctx.append(speakers_ctx)
    app.cleanup_ctx.append(sessions_ctx)
    app.cleanup_ctx.append(wyoming_ctx)
    willow.add_routes(app)
    openai_rest.add_routes(app)
    openai_models.add_routes(app)
    rtc.add_routes(app)
    ws.add_routes(app)
    realtime.add_routes(app)
    wis_tts.add_routes(app)
    openai_speech.add_routes(app)
    openai_chat.add_routes(app)
    wis_chatbot.add_routes(app)
    speakers_http.add_routes(app)
    app.router.add_get("/", index_handler)
    app.router.add_get("/health", health_handler)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/api/openapi.json", openapi_handler)
    app.router.add_get("/api/docs", docs_handler)
    settings.save_audio_dir.mkdir(parents=True, exist_ok=True)
    app.router.add_static("/audio/", settings.save_audio_dir, show_index=False)
    if settings.static_dir.is_dir():
        app.router.add_static("/static/", settings.static_dir, show_index=False)
        rtc_dir = settings.static_dir / "rtc"
        if rtc_dir.is_dir():

            async def rtc_index(request: web.Request) -> web.FileResponse:
                return web.FileResponse(rtc_dir / "index.html")

            app.router.add_get("/rtc", rtc_index)
            app.router.add_get("/rtc/", rtc_index)
            app.router.add_static("/rtc/", rtc_dir, show_index=False)
    return app
