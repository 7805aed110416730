"""CORS (``cors_allow_origins``): a web page of another origin calling the API, as a browser app
built on OpenAI's Realtime WebRTC guide does (a browser trial found every such call refused: the
preflight got a 405)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from tests.conftest import LiveServer

APP = "http://app.example:8080"
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
}


async def test_an_allowed_origin_gets_its_preflight_and_its_headers_on_every_answer(
    server_factory: Callable[..., Any],
) -> None:
    live: LiveServer = await server_factory(cors_allow_origins=[APP], api_keys=["sk-test"])
    async with aiohttp.ClientSession() as http:
        # The preflight: before auth (a browser sends no credentials with it), any route.
        for path in ("/v1/realtime/calls", "/v1/audio/speech", "/v1/chat/completions"):
            async with http.options(live.url + path, headers=PREFLIGHT) as response:
                assert response.status == 204, path
                assert response.headers["Access-Control-Allow-Origin"] == APP
                assert "POST" in response.headers["Access-Control-Allow-Methods"]
                assert response.headers["Access-Control-Allow-Headers"] == "authorization,content-type"
        # The answers, a streamed one and an error included, carry the origin.
        auth = {"Origin": APP, "Authorization": "Bearer sk-test"}
        body = {"model": "tts-1", "voice": "alloy", "input": "Hello.", "stream_format": "sse", "response_format": "pcm"}
        async with http.post(live.url + "/v1/audio/speech", data=json.dumps(body), headers=auth) as response:
            assert response.status == 200 and response.headers["Access-Control-Allow-Origin"] == APP
            assert response.headers["Access-Control-Expose-Headers"] == "*" and "Origin" in response.headers["Vary"]
            await response.read()
        async with http.post(live.url + "/v1/audio/speech", data=b"{}", headers={"Origin": APP}) as response:
            assert response.status == 401 and response.headers["Access-Control-Allow-Origin"] == APP
        # Another origin gets nothing: its preflight goes on to the route (405), its answers unlabelled.
        other = {**PREFLIGHT, "Origin": "http://evil.example"}
        async with http.options(live.url + "/v1/audio/speech", headers=other) as response:
            assert response.status == 405 and "Access-Control-Allow-Origin" not in response.headers
        async with http.get(live.url + "/health", headers={"Origin": "http://evil.example"}) as response:
            assert "Access-Control-Allow-Origin" not in response.headers


async def test_any_origin_with_a_star_and_none_by_default(
    server: LiveServer, server_factory: Callable[..., Any]
) -> None:
    star: LiveServer = await server_factory(cors_allow_origins=["*"])
    async with aiohttp.ClientSession() as http:
        async with http.options(star.url + "/v1/realtime/calls", headers=PREFLIGHT) as response:
            assert response.status == 204 and response.headers["Access-Control-Allow-Origin"] == "*"
        async with http.get(star.url + "/health", headers={"Origin": APP}) as response:
            assert response.headers["Access-Control-Allow-Origin"] == "*" and "Vary" not in response.headers
        # The default: no cross-origin page is allowed (a server without api_keys would take its orders).
        async with http.options(server.url + "/v1/realtime/calls", headers=PREFLIGHT) as response:
            assert response.status == 405 and "Access-Control-Allow-Origin" not in response.headers
        async with http.get(server.url + "/health", headers={"Origin": APP}) as response:
            assert response.status == 200 and "Access-Control-Allow-Origin" not in response.headers


UPGRADE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}  # fmt: skip
SOCKETS = ("/api/ws/asr", "/v1/realtime?model=gpt-realtime", "/api/ws/chatbot")
BASIC = "Basic " + base64.b64encode(b"willow:secret").decode()


async def upgrade_status(http: aiohttp.ClientSession, url: str, origin: str | None, **headers: str) -> int:
    """Open a WebSocket to ``url`` as a browser page of ``origin`` would (None: a client that is not
    a browser); the upgrade's status, with the refusal's error shape checked."""
    sent = {**UPGRADE, **headers, **({"Origin": origin} if origin is not None else {})}
    async with http.get(url, headers=sent) as response:
        if response.status == 403:  # in the shape of the API asked: OpenAI's, or the server's own
            body = await response.json()
            error = body["error"] if isinstance(body["error"], dict) else {**body, "message": body["error"]}
            assert error["code"] == "forbidden" and "cors_allow_origins" in error["message"], error
            assert "API key" in error["message"], error
            assert origin is not None and origin in error["message"], error
        return response.status


async def test_a_page_of_another_origin_opens_no_websocket_without_a_key(
    server: LiveServer, server_factory: Callable[..., Any]
) -> None:
    """Browsers apply no CORS to WebSockets: on a server without api_keys (the default) any page a
    user visits could talk to the voice loop, or open a Realtime session that calls the operator's
    MCP tools; with Basic auth too, once the browser remembers the credentials (it sends them to any
    page's WebSocket by itself). Its upgrade is refused (403); the server's own pages, clients that
    send no Origin (devices, SDKs), origins in cors_allow_origins, and pages that send an API key
    still connect."""
    own = f"http://{server.host}:{server.port}"
    allowed: LiveServer = await server_factory(cors_allow_origins=[APP])
    keyed: LiveServer = await server_factory(api_keys=["sk-test"])
    basic: LiveServer = await server_factory(basic_auth_user="willow", basic_auth_password="secret")
    async with aiohttp.ClientSession() as http:
        for path in SOCKETS:
            assert await upgrade_status(http, server.url + path, "http://evil.example") == 403
            assert await upgrade_status(http, server.url + path, "null") == 403  # a file, a sandboxed frame
            assert await upgrade_status(http, server.url + path, None) == 101
            assert await upgrade_status(http, server.url + path, own) == 101
            # behind a proxy that names the host the page was served from
            proxied = {"X-Forwarded-Host": "assistant.example"}
            assert await upgrade_status(http, server.url + path, "https://assistant.example", **proxied) == 101
            rfc = {"Forwarded": 'for=192.0.2.7;proto=https;host="assistant.example:8443"'}
            assert await upgrade_status(http, server.url + path, "https://assistant.example:8443", **rfc) == 101
            assert await upgrade_status(http, server.url + path, "https://other.example:8443", **rfc) == 403
            assert await upgrade_status(http, allowed.url + path, APP) == 101
            assert await upgrade_status(http, allowed.url + path, "http://evil.example") == 403
            key = {"Authorization": "Bearer sk-test"}
            assert await upgrade_status(http, keyed.url + path, "http://evil.example", **key) == 101
            # (a browser page sends its key as a subprotocol: the only header it can set)
            offered = {"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.sk-test"}
            assert await upgrade_status(http, keyed.url + path, "http://evil.example", **offered) == 101
            assert await upgrade_status(http, keyed.url + path, "http://evil.example") == 401
            # Basic credentials come with any page's upgrade: they do not let another origin in.
            remembered = {"Authorization": BASIC}
            assert await upgrade_status(http, basic.url + path, "http://evil.example", **remembered) == 403
            assert await upgrade_status(http, basic.url + path, f"http://127.0.0.1:{basic.port}", **remembered) == 101
            # On a server without keys, a page cannot name one to get in.
            named = {"Sec-WebSocket-Protocol": "openai-insecure-api-key.anything"}
            assert await upgrade_status(http, server.url + path, "http://evil.example", **named) == 403
        # A page with a client secret (minted by its own server) opens a Realtime session from its
        # origin, as with OpenAI; a made-up one is refused by the session's own check.
        mint = {"session": {"type": "realtime"}}
        async with http.post(keyed.url + "/v1/realtime/client_secrets", json=mint, headers=key) as response:
            assert response.status == 200, await response.text()
            secret = (await response.json())["value"]
        realtime = keyed.url + SOCKETS[1]
        with_secret = {"Sec-WebSocket-Protocol": f"realtime, openai-insecure-api-key.{secret}"}
        assert await upgrade_status(http, realtime, "http://evil.example", **with_secret) == 101
        made_up = {"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.ek_abc"}
        assert await upgrade_status(http, server.url + SOCKETS[1], "http://evil.example", **made_up) == 401
        # A page of the server's own origin talks over it as before.
        async with http.ws_connect(server.url + "/api/ws/asr", origin=own) as ws:
            await ws.send_json({"type": "ping"})
            assert (await ws.receive_json(timeout=10))["type"] == "pong"


async def test_any_origin_opens_websockets_with_a_star(server_factory: Callable[..., Any]) -> None:
    star: LiveServer = await server_factory(cors_allow_origins=["*"])
    async with aiohttp.ClientSession() as http:
        for path in SOCKETS:
            assert await upgrade_status(http, star.url + path, "http://evil.example") == 101
