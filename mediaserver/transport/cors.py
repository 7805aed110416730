"""CORS: the web pages of other origins that may call the HTTP API (``cors_allow_origins``).

OpenAI's API answers browsers from any origin: its WebRTC guide has a page POST its SDP offer to
``/v1/realtime/calls`` with an ephemeral key. A page served from elsewhere can only do that here
when its origin is allowed; by default none is (only the server's own pages, same-origin).
Browsers apply no CORS to WebSockets, so this keeps no page off those: ``api_keys`` do.

Two parts, both only for an allowed ``Origin``: a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) is answered 204 before routing and auth (a browser sends no
credentials with it), and every response gets its ``Access-Control-*`` headers in
``on_response_prepare``, so streamed answers (SSE, chunked audio) and errors carry them too.
Written here rather than with aiohttp-cors, which is configured route by route: one setting, every
route.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

PREFLIGHT_MAX_AGE_S = 600
METHODS = "GET, POST, DELETE, OPTIONS"


def _allowed(request: web.BaseRequest, origins: frozenset[str]) -> str | None:
    """The ``Access-Control-Allow-Origin`` for this request, or None when its origin is not allowed."""
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    if "*" in origins:
        return "*"
    return origin if origin in origins else None


def install(app: web.Application, origins: list[str]) -> None:
    """Answer preflights and label responses for ``origins`` (nothing when it is empty)."""
    allowed = frozenset(o.rstrip("/") for o in origins)
    if not allowed:
        return

    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        asking = request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
        if not asking or _allowed(request, allowed) is None:
            return await handler(request)
        response = web.Response(status=204)
        response.headers["Access-Control-Allow-Methods"] = METHODS
        asked = request.headers.get("Access-Control-Request-Headers")
        if asked:
            response.headers["Access-Control-Allow-Headers"] = asked
        response.headers["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
        return response

    async def label(request: web.BaseRequest, response: web.StreamResponse) -> None:
        origin = _allowed(request, allowed)
        if origin is None:
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = "*"  # (Location of a call, X-Cache ...)
        if origin != "*":
            response.headers.add("Vary", "Origin")

    app.middlewares.insert(0, preflight)
    app.on_response_prepare.append(label)
