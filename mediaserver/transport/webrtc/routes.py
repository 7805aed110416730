"""WebRTC's HTTP side (willow-contract.md §7.1): the SDP offer at POST /api/rtc/asr answered with a
new ``RtcSession`` (webrtc/asr.py: the peer connection's session and its data channel), the ICE
servers at GET /api/rtc/config, and the UDP ports ICE binds (``rtc_udp_port_min`` /
``rtc_udp_port_max``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from mediaserver.errors import AudioTooLarge, InvalidParameter
from mediaserver.state import ASR, SESSIONS, SETTINGS
from mediaserver.transport.common import json_error, loads_json, read_body_limited, stream_options_from
from mediaserver.transport.rtc_peer import patches
from mediaserver.transport.rtc_peer.peer import answer_offer, ice_servers
from mediaserver.transport.webrtc.asr import RtcSession

log = logging.getLogger(__name__)

MAX_SDP_BYTES = 64 * 1024


async def offer_handler(request: web.Request) -> web.Response:
    """POST /api/rtc/asr: SDP offer in, SDP answer out (non-trickle ICE)."""
    settings = request.app[SETTINGS]
    try:
        raw = await read_body_limited(request, max_bytes=MAX_SDP_BYTES, idle_timeout_s=settings.body_read_timeout_s)
    except AudioTooLarge:
        raise InvalidParameter(f"offer too large (max {MAX_SDP_BYTES} bytes)", param="sdp") from None
    try:
        body = loads_json(raw)
    except ValueError as exc:
        raise InvalidParameter(
            json_error(exc, 'body must be JSON {"sdp": "...", "type": "offer"}'), param="body"
        ) from None
    if not isinstance(body, dict) or not isinstance(body.get("sdp"), str) or body.get("type") != "offer":
        raise InvalidParameter('body must be JSON {"sdp": "...", "type": "offer"}', param="body")
    options = stream_options_from(request.query, settings)
    # Check the model name now, so a bad query is a 400 here rather than an error later.
    request.app[ASR].models.resolve(options.model)
    session = RtcSession(request.app, options, settings)

    def prepare() -> None:
        if not any(t.kind == "audio" for t in session.peer.pc.getTransceivers()) and session.peer.pc.sctp is None:
            raise InvalidParameter("the SDP offer has neither an audio track nor a data channel", param="sdp")
        session.add_outbound_track()

    try:
        request.app[SESSIONS].add(session.id, session)  # over the cap: a 503 (with Retry-After)
        sdp = await answer_offer(
            session.peer.pc,
            body["sdp"],
            session_id=session.id,
            prepare=prepare,
            opus_dtx=settings.rtc_opus_dtx,
            idle_rtcp_interval_s=settings.rtc_idle_rtcp_interval_s,
            audio_jitter_frames=settings.rtc_audio_jitter_frames,
        )
    except BaseException:
        await session.aclose()
        raise
    session.start_watchdogs()
    session.remote = request.remote or "unknown"
    log.debug("session %s: answered an offer from %s", session.id, session.remote)
    return web.json_response({"sdp": sdp, "type": "answer"})


async def config_handler(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    servers: list[dict[str, Any]] = []
    for server in ice_servers(settings):
        entry: dict[str, Any] = {"urls": server.urls}
        if server.username:
            entry.update(username=server.username, credential=server.credential)
        servers.append(entry)
    return web.json_response({"iceServers": servers})


def _limit_udp_ports(loop: asyncio.AbstractEventLoop, low: int, high: int) -> None:
    """Bind ICE host candidates inside [low, high] (for firewalls and container port maps)."""
    original = loop.create_datagram_endpoint
    if getattr(original, "_mediaserver_port_range", None) == (low, high):
        return

    async def create_datagram_endpoint(protocol_factory: Any, local_addr: Any = None, **kwargs: Any) -> Any:
        if local_addr is None or local_addr[1] != 0:
            return await original(protocol_factory, local_addr=local_addr, **kwargs)
        last_error: OSError | None = None
        for port in range(low, high + 1):
            try:
                return await original(protocol_factory, local_addr=(local_addr[0], port), **kwargs)
            except OSError as exc:
                last_error = exc
        raise last_error or OSError(f"no free UDP port in {low}-{high}")

    create_datagram_endpoint._mediaserver_port_range = (low, high)  # type: ignore[attr-defined]
    loop.create_datagram_endpoint = create_datagram_endpoint  # type: ignore[method-assign,assignment]


async def rtc_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    if settings.rtc_udp_port_min and settings.rtc_udp_port_max:
        _limit_udp_ports(asyncio.get_running_loop(), settings.rtc_udp_port_min, settings.rtc_udp_port_max)
    yield


def add_routes(app: web.Application) -> None:
    patches.install()
    app.router.add_post("/api/rtc/asr", offer_handler)
    app.router.add_get("/api/rtc/config", config_handler)
    app.cleanup_ctx.append(rtc_ctx)
