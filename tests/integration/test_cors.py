"""CORS (``cors_allow_origins``): a web page of another origin calling the API, as a browser app
built on OpenAI's Realtime WebRTC guide does (a browser trial found every such call refused: the
preflight got a 405)."""

from __future__ import annotations

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
