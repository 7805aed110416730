"""Regression tests of issue #14 on the HTTP side, one per defect, against a live server: malformed
SDP and deeply nested JSON are 400s, bodies that lie about their Content-Encoding are 400s (real
gzip works), a client hanging up mid-upload is a 499 and one INFO line, transient 503s carry
Retry-After, the docs page works with auth on, and malformed requests are one quiet log line."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from mediaserver.cli import configure_logging
from mediaserver.state import SESSIONS
from tests.conftest import SENTENCES, Clip, LiveServer
from tests.faults import (
    fds_back_to,
    in_flight,
    own_fds,
    raw_exchange,
    requests_with_status,
    server_errors,
    statuses,
)
from tests.rtc_peer import make_offer

NESTED = "[" * 5000 + "]" * 5000


def _without(sdp: str, prefix: str) -> str:
    return "\r\n".join(line for line in sdp.split("\r\n") if not line.startswith(prefix))


# --- 1. malformed SDP, deeply nested JSON ------------------------------------------------------------


@pytest.mark.parametrize(
    ("mangle", "message_part"),
    [
        (lambda sdp: json.dumps({"type": "offer", "sdp": "v=0\r\nm=audio"}), "malformed SDP offer"),  # AssertionError
        (lambda sdp: json.dumps({"type": "offer", "sdp": _without(sdp, "a=sendrecv")}), "malformed SDP"),  # ValueError
        (lambda sdp: json.dumps({"type": "offer", "sdp": _without(sdp, "a=mid:0")}), "malformed SDP"),  # close() raised
        (lambda sdp: json.dumps({"type": "offer", "sdp": _without(sdp, "m=application")}), "malformed SDP"),
        (lambda sdp: NESTED, "must be JSON"),  # RecursionError
        (lambda sdp: '{"type": "offer", "sdp": ' + NESTED + "}", "must be JSON"),
    ],
    ids=["truncated", "no-direction", "no-mid", "no-application-line", "nested-json", "nested-sdp-field"],
)
async def test_malformed_offers_are_400_and_leave_nothing_behind(
    server: LiveServer, caplog: pytest.LogCaptureFixture, mangle: Callable[[str], str], message_part: str
) -> None:
    pc, sdp = await make_offer()
    try:
        body = mangle(sdp)
    finally:
        await pc.close()
    sessions_before, fds_before = set(server.app[SESSIONS].ids()), own_fds(server.port)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.url}/api/rtc/asr", data=body, headers={"Content-Type": "application/json"}) as resp,
    ):
        assert resp.status == 400, await resp.text()
        error = await resp.json()
    assert error["code"] == "invalid_parameter" and message_part in error["error"], error
    assert "NoneType" not in error["error"] and "not in list" not in error["error"]  # no parser internals
    assert not set(server.app[SESSIONS].ids()) - sessions_before
    await fds_back_to(fds_before, server.port, 5)  # the half-built peer connection closed its sockets
    assert server_errors(caplog) == []


def _call_form(sdp: str, session: str | None = None, boundary: str = "cut") -> bytes:
    """The multipart form the openai SDK posts to /v1/realtime/calls."""
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="sdp"\r\n\r\n{sdp}\r\n']
    if session is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="session"\r\n\r\n{session}\r\n')
    return ("".join(parts) + f"--{boundary}--\r\n").encode()


FORM = "multipart/form-data; boundary=cut"


@pytest.mark.parametrize(
    ("mangle", "content_type", "message_part"),
    [
        (lambda sdp: b"v=0\r\nm=audio", "application/sdp", "malformed SDP offer"),
        (lambda sdp: _without(sdp, "a=sendrecv").encode(), "application/sdp", "malformed SDP"),
        (lambda sdp: _without(sdp, "a=mid:0").encode(), "application/sdp", "malformed SDP"),
        (lambda sdp: _without(sdp, "a=fingerprint").encode(), "application/sdp", "a=fingerprint"),
        (lambda sdp: _call_form(_without(sdp, "a=mid:0")), FORM, "malformed SDP"),
        (lambda sdp: _call_form(sdp, NESTED), FORM, "'session' must be a JSON object"),  # RecursionError
        (lambda sdp: _call_form(sdp)[:-12], FORM, "malformed multipart"),  # cut before the closing boundary
        (lambda sdp: b"garbage", FORM, "malformed multipart"),  # no starting boundary
        (lambda sdp: _call_form(sdp), "multipart/form-data", "malformed multipart"),  # no boundary parameter
    ],
    ids=[
        "truncated",
        "no-direction",
        "no-mid",
        "no-fingerprint",
        "form-no-mid",
        "form-nested-session",
        "form-cut",
        "form-garbage",
        "form-no-boundary",
    ],
)
async def test_malformed_realtime_calls_are_400_and_leave_nothing_behind(
    server: LiveServer,
    caplog: pytest.LogCaptureFixture,
    mangle: Callable[[str], bytes],
    content_type: str,
    message_part: str,
) -> None:
    """The same for OpenAI Realtime calls (POST /v1/realtime/calls): the raw SDP body or the SDK's form."""
    pc, sdp = await make_offer()
    try:
        body = mangle(sdp)
    finally:
        await pc.close()
    sessions_before, fds_before = set(server.app[SESSIONS].ids()), own_fds(server.port)
    headers = {"Content-Type": content_type}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.url}/v1/realtime/calls", data=body, headers=headers) as resp,
    ):
        assert resp.status == 400, await resp.text()
        error = (await resp.json())["error"]
    assert error["code"] == "invalid_parameter" and message_part in error["message"], error
    assert "NoneType" not in error["message"] and "not in list" not in error["message"]
    assert not set(server.app[SESSIONS].ids()) - sessions_before
    await fds_back_to(fds_before, server.port, 5)
    assert server_errors(caplog) == []


# --- 2. Content-Encoding that the body does not match --------------------------------------------------


async def _form_bytes(field: str, data: bytes, extra: dict[str, str] | None = None) -> tuple[bytes, str]:
    """A multipart/form-data body as bytes, and its Content-Type (boundary included)."""
    form = aiohttp.FormData()
    form.add_field(field, data, filename="speech.wav", content_type="audio/wav")
    for key, value in (extra or {}).items():
        form.add_field(key, value)
    payload = form()
    return await payload.as_bytes(), payload.content_type


ENDPOINTS = {
    "/api/willow": ("raw", None),
    "/api/asr": ("form", "audio_file"),
    "/v1/audio/transcriptions": ("form", "file"),
    "/api/rtc/asr": ("json", None),
    "/v1/realtime/calls": ("sdp", None),
}


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("path", list(ENDPOINTS))
async def test_a_body_that_is_not_what_its_content_encoding_says_is_400(
    server: LiveServer, caplog: pytest.LogCaptureFixture, speech: Callable[[str], Clip], path: str, encoding: str
) -> None:
    kind, field = ENDPOINTS[path]
    if kind == "form":
        assert field is not None
        body, content_type = await _form_bytes(field, speech("kitchen").wav_bytes(), {"model": "whisper-1"})
    elif kind == "json":
        body, content_type = json.dumps({"type": "offer", "sdp": "v=0"}).encode(), "application/json"
    elif kind == "sdp":
        body, content_type = b"v=0\r\n", "application/sdp"
    else:
        body, content_type = speech("kitchen").pcm16k_bytes, "application/octet-stream"
    headers = {"Content-Encoding": encoding, "Content-Type": content_type}
    async with aiohttp.ClientSession() as http, http.post(f"{server.url}{path}", data=body, headers=headers) as resp:
        assert resp.status == 400, await resp.text()
        payload = await resp.json()
    error = payload["error"]
    if isinstance(error, dict):  # the OpenAI shape
        assert error["code"] == "invalid_body" and encoding in error["message"], payload
    else:
        assert payload["code"] == "invalid_body" and encoding in error, payload
    assert server_errors(caplog) == []
    # The server goes on: a well-formed request right after works.
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/ping") as resp:
        assert resp.status == 200


async def test_a_real_gzip_or_deflate_body_works(server: LiveServer, speech: Callable[[str], Clip], wer: Any) -> None:
    clip = speech("kitchen")
    async with aiohttp.ClientSession() as http:
        headers = {"Content-Encoding": "gzip", "x-audio-codec": "wav"}
        async with http.post(f"{server.url}/api/willow", data=gzip.compress(clip.wav_bytes()), headers=headers) as r:
            assert r.status == 200, await r.text()
            assert wer(SENTENCES["kitchen"], (await r.json())["text"]) <= 0.2
        body, content_type = await _form_bytes("file", clip.wav_bytes(), {"model": "whisper-1"})
        headers = {"Content-Encoding": "deflate", "Content-Type": content_type}
        async with http.post(f"{server.url}/v1/audio/transcriptions", data=zlib.compress(body), headers=headers) as r:
            assert r.status == 200, await r.text()
            assert wer(SENTENCES["kitchen"], (await r.json())["text"]) <= 0.2


# --- 3. a client hanging up mid-upload ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/willow", "/api/asr", "/v1/audio/transcriptions"])
async def test_a_client_hanging_up_mid_upload_is_a_499_and_one_info_line(
    server: LiveServer, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    caplog.set_level(logging.INFO)
    before = await requests_with_status(server.url, 499)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
        "Content-Type: multipart/form-data; boundary=xx\r\n\r\n"
    ).encode()
    part = b'--xx\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n' + bytes(5000)
    _reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(head + part)
    await writer.drain()
    async with asyncio.timeout(30):  # the handler is reading the body
        while await in_flight(server.url, path) < 1:
            await asyncio.sleep(0.02)
    writer.transport.abort()  # gone, mid-body
    async with asyncio.timeout(2):  # "cleaned up in < 2 s"
        while await requests_with_status(server.url, 499) < before + 1:
            await asyncio.sleep(0.05)
    assert server_errors(caplog) == []
    lines = [r.getMessage() for r in caplog.records if "closed the connection" in r.getMessage()]
    assert any(path in line for line in lines), lines
    assert all(r.exc_info is None for r in caplog.records if "closed the connection" in r.getMessage())


# --- 6. Retry-After on transient 503s -------------------------------------------------------------------


async def test_the_session_cap_is_a_503_with_retry_after(server_factory: Any) -> None:
    capped: LiveServer = await server_factory(max_sessions=1, wyoming_enabled=False, retry_after_fallback_s=7.0)
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{capped.url}/api/ws/asr")
        try:
            await ws.send_json({"type": "start"})
            assert (await ws.receive_json(timeout=10))["type"] == "ready"
            async with http.get(f"{capped.url}/health") as resp:  # the operator sees the cap reached
                assert (await resp.json())["sessions"] == {"open": 1, "max": 1}
            pc, sdp = await make_offer()
            await pc.close()
            async with http.post(f"{capped.url}/api/rtc/asr", json={"type": "offer", "sdp": sdp}) as resp:
                assert resp.status == 503
                assert (await resp.json())["code"] == "too_many_sessions"
                assert resp.headers["Retry-After"] == "7"
            async with http.post(
                f"{capped.url}/v1/realtime/calls", data=sdp, headers={"Content-Type": "application/sdp"}
            ) as resp:
                assert resp.status == 503
                assert (await resp.json())["error"]["code"] == "too_many_sessions"
                assert resp.headers["Retry-After"] == "7"
            async with http.get(f"{capped.url}/v1/realtime", headers={"Upgrade": "websocket"}) as resp:
                assert resp.status in (503, 426)
            try:
                await http.ws_connect(f"{capped.url}/v1/realtime?intent=transcription")
                raise AssertionError("a second session was accepted")
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 503
                assert exc.headers is not None and exc.headers["Retry-After"] == "7"
        finally:
            await ws.close()


async def test_a_disabled_feature_is_a_503_without_retry_after(server_factory: Any) -> None:
    """Switched off in settings is not transient: retrying will not help, so no Retry-After."""
    off: LiveServer = await server_factory(tts_enabled=False, wyoming_enabled=False)
    async with aiohttp.ClientSession() as http, http.get(f"{off.url}/api/tts", params={"text": "hi"}) as resp:
        assert resp.status == 503 and (await resp.json())["code"] == "feature_disabled"
        assert "Retry-After" not in resp.headers


# --- 9. docs with auth on; malformed requests and aioice kept quiet -----------------------------------


async def test_the_docs_page_works_with_auth_on(server_factory: Any) -> None:
    secured: LiveServer = await server_factory(api_keys=["k1"], wyoming_enabled=False)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{secured.url}/api/docs") as resp:
            assert resp.status == 200
            page = await resp.text()
        assert "/api/openapi.json" in page  # what the page loads ...
        async with http.get(f"{secured.url}/api/openapi.json") as resp:
            assert resp.status == 200  # ... is reachable without credentials, as the page itself
            assert "paths" in await resp.json()
        async with http.get(f"{secured.url}/v1/models") as resp:
            assert resp.status == 401  # the API stays closed


async def test_credentials_that_are_not_utf8_are_a_401_not_a_500(
    server_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # An operator trial: a key with bytes that are not UTF-8 raised while being compared (a 500 and
    # an ERROR traceback, from any client without credentials).
    secured: LiveServer = await server_factory(
        api_keys=["k1"], basic_auth_user="u", basic_auth_password="p", wyoming_enabled=False
    )
    headers = (
        b"X-API-Key: \xff\xfeabc",
        b"Authorization: Bearer \xe9t\xe9",
        b"Authorization: Basic \xff",  # (not base64: not even ASCII, which base64 raises on otherwise)
        b"Authorization: Basic \xc3\xa9",
    )
    for header in headers:
        for path in (b"/v1/models", b"/metrics"):
            request = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + header + b"\r\nConnection: close\r\n\r\n"
            answer = await raw_exchange(secured.host, secured.port, request, timeout_s=10, half_close=False)
            assert statuses(answer)[:1] == [401], (header, path, answer[:200])
    assert server_errors(caplog) == []
    async with aiohttp.ClientSession() as http, http.get(f"{secured.url}/v1/models", headers={"X-API-Key": "k1"}) as r:
        assert r.status == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"POST /api/willow HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /api/ping HTTP/1.1\r\nHo st: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # TLS to the HTTP port
    ],
    ids=["bad-length", "bad-chunk", "bad-header", "tls-hello"],
)
async def test_a_malformed_request_is_a_400_and_one_quiet_line(
    server: LiveServer, caplog: pytest.LogCaptureFixture, request_bytes: bytes
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    answer = await raw_exchange(server.host, server.port, request_bytes, timeout_s=5)
    assert statuses(answer)[:1] in ([400], []), answer[:200]
    assert server_errors(caplog) == []
    aiohttp_lines = [r for r in caplog.records if r.name == "aiohttp.server" and r.levelno >= logging.INFO]
    assert len(aiohttp_lines) <= 1 and all(r.exc_info is None for r in aiohttp_lines)


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/api/willow", b"", 400, "invalid_audio"),
        ("/v1/audio/speech", b'{"model": "tts-1", "voice": "alloy"}', 400, "invalid_parameter"),
        ("/api/rtc/asr", b'{"type": "offer", "sdp": "nonsense"}', 400, "invalid_parameter"),
    ],
)
async def test_a_clients_mistake_is_one_info_line(
    server: LiveServer, caplog: pytest.LogCaptureFixture, path: str, body: bytes, status: int, code: str
) -> None:
    """docs/operations.md promises one INFO line for each client mistake; a trial found none at all
    for a 400 on /api/willow, a malformed offer or a bad JSON body."""
    caplog.set_level(logging.INFO, logger="mediaserver")
    async with aiohttp.ClientSession() as http, http.post(server.url + path, data=body) as response:
        assert response.status == status, await response.text()
    lines = [r for r in caplog.records if r.name == "mediaserver.app" and f"-> {status} {code}" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
    assert server_errors(caplog) == []


async def test_a_connection_without_a_request_is_closed_after_http_keepalive_timeout_s(
    server_factory: Any, speech: Callable[[str], Clip]
) -> None:
    """A trial's half-sent requests (headers never finished) held their sockets past two minutes:
    aiohttp's own keep-alive is an hour. Here at 1 s: such a connection, and one idle after its
    answer, is closed; a slow upload in progress is not."""
    limited = await server_factory(http_keepalive_timeout_s=1.0)
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(limited.host, limited.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 15) == b""  # closed by the server
    assert time.monotonic() - started < 10
    writer.close()
    reader, writer = await asyncio.open_connection(limited.host, limited.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 15)  # the answer, then the close (idle 1 s)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    writer.close()
    # An upload that keeps coming, slower than the keep-alive, is answered.
    wav = speech("kitchen").wav_bytes()

    async def slowly() -> AsyncIterator[bytes]:
        for start in range(0, len(wav), len(wav) // 4):
            yield wav[start : start + len(wav) // 4]
            await asyncio.sleep(0.6)

    async with (
        aiohttp.ClientSession() as http,
        http.post(limited.url + "/api/willow", data=slowly(), headers={"x-audio-codec": "wav"}) as response,
    ):
        assert response.status == 200 and "kitchen" in (await response.json())["text"].lower()


def test_aioice_is_quiet_unless_debugging() -> None:
    aioice = logging.getLogger("aioice")
    level = aioice.level
    try:
        configure_logging("INFO")
        assert not aioice.isEnabledFor(logging.INFO) and aioice.isEnabledFor(logging.WARNING)
    finally:
        aioice.setLevel(level)
