"""CORS: the web pages of other origins that may call the HTTP API (``cors_allow_origins``).

OpenAI's API answers browsers from any origin: its WebRTC guide has a page POST its SDP offer to
``/v1/realtime/calls`` with an ephemeral key. A page served from elsewhere can only do that here
when its origin is allowed; by default none is (only the server's own pages, same-origin).

Browsers apply no CORS to WebSockets: any page a user visits may open one to any server it can
reach, with the browser's ``Origin`` on the upgrade, and with the HTTP Basic credentials the
browser has cached for that server. On a server without ``api_keys`` (a home LAN's default), or
with Basic auth that the user's browser remembers, such a page could talk to the voice loop or open
a Realtime session that calls the operator's MCP tools. So a WebSocket upgrade from a page of
another origin that is not allowed is refused (403) unless it carries a credential a page must send
on purpose: an API key, or a client secret (as OpenAI lets a page of any origin in with one).
Clients that are not browsers send no ``Origin`` and are not affected.

Same origin is judged by the ``Host`` the request names, which a page that rebinds its own name
to the server's address (DNS rebinding) controls too: that attack passes this check as it passes
the browser's same-origin policy for plain HTTP. ``api_keys`` are the defence against it.

Two parts, both only for an allowed ``Origin``: a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) is answered 204 before routing and auth (a browser sends no
credentials with it), and every response gets its ``Access-Control-*`` headers in
``on_response_prepare``, so streamed answers (SSE, chunked audio) and errors carry them too.
Written here rather than with aiohttp-cors, which is configured route by route: one setting, every
route.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler

from mediaserver.errors import Forbidden

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


def _normalized(origins: list[str]) -> frozenset[str]:
    """``cors_allow_origins`` as compared with a request's ``Origin`` (which has no trailing slash)."""
    return frozenset(o.rstrip("/") for o in origins)


_DEFAULT_PORTS = {"http": "80", "https": "443"}  # (an Origin's scheme is a page's: never ws or wss)


def _host_port(host: str, scheme: str) -> str:
    """``host[:port]`` lowercased, a scheme's default port dropped (an Origin omits it, a Host may not)."""
    host = host.strip().lower()
    default = _DEFAULT_PORTS.get(scheme)
    return host.removesuffix(f":{default}") if default else host


def _forwarded_hosts(request: web.BaseRequest) -> list[str]:
    """The hosts a proxy says the request was sent to: ``X-Forwarded-Host``, and the ``host=`` of
    each element of RFC 7239's ``Forwarded`` (``for=1.2.3.4;host="a.example:8443", ...``)."""
    hosts = request.headers.get("X-Forwarded-Host", "").split(",")
    for element in request.headers.get("Forwarded", "").split(","):
        for pair in element.split(";"):
            name, _, value = pair.partition("=")
            if name.strip().lower() == "host":
                hosts.append(value.strip().strip('"'))
    return [host for host in hosts if host.strip()]


def _same_origin(request: web.BaseRequest, origin: str) -> bool:
    """``origin`` is this server's own: its host and port are the ``Host`` the request was sent to
    (or the one a proxy names: ``_forwarded_hosts``). An opaque origin (``null``: a file, a
    sandboxed frame) is not."""
    parts = urlsplit(origin)
    if not parts.hostname:
        return False
    own = _host_port(parts.netloc, parts.scheme)
    return any(own == _host_port(host, parts.scheme) for host in [request.host, *_forwarded_hosts(request)])


def install_websocket_check(
    app: web.Application, origins: list[str], sent_on_purpose: Callable[[web.Request], bool]
) -> None:
    """Refuse a WebSocket upgrade from a page of another origin than the server's, unless
    ``origins`` allows it or ``sent_on_purpose`` says it carries a key or a client secret (the
    module's docstring). Appended after the auth middleware, which has checked a key by then."""
    allowed = _normalized(origins)
    if "*" in allowed:
        return

    @web.middleware
    async def websocket_origin(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        if (
            upgrade
            and origin is not None
            and _allowed(request, allowed) is None
            and not _same_origin(request, origin)
            and not sent_on_purpose(request)
        ):
            raise Forbidden(
                f"a WebSocket from a page of another origin ({origin}) is refused: any page a user visits "
                "could open one (with the Basic credentials their browser remembers); add the origin to "
                "cors_allow_origins, or have the page send an API key or a client secret"
            )
        return await handler(request)

    app.middlewares.append(websocket_origin)


def install(app: web.Application, origins: list[str]) -> None:
    """Answer preflights and label responses for ``origins`` (nothing when it is empty)."""
    allowed = _normalized(origins)
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
