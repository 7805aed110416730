"""The /rtc/ page without the real key: a ``realtime`` client secret opens the page's endpoints (and
nothing else) on a live server with auth on; ``python -m mediaserver.mint_secret`` prints a page URL
that carries one.

The page's endpoints (``_PAGE_SECRET_ROUTES`` in mediaserver/app.py) answer a minted secret as they
answer the key: a WebRTC session that really connects, the ICE config, the model list, the voices
and speech. An expired, tampered, foreign or ``transcription`` secret is a 401 in the endpoint
family's error shape (``{"error", "code"}`` under /api, OpenAI's under /v1); uploads, minting,
metrics and the other APIs refuse a secret however valid.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import pytest_asyncio
from aiortc import RTCPeerConnection, RTCSessionDescription

from mediaserver.mint_secret import MintError, mint, page_url
from mediaserver.transport.openai.realtime.client_secrets import ClientSecret, decode, encode
from tests.conftest import LiveServer
from tests.rtc_peer import make_offer

KEY = "the-real-key"
ROOT = Path(__file__).resolve().parents[2]
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}

# What static/rtc/*.js calls, and what each answers with the key.
PAGE_GETS = ["/api/rtc/config", "/v1/models", "/api/speaker", "/api/tts?text=hello%20there"]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def auth_server(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(api_keys=[KEY])
    return server


async def _mint(server: LiveServer, kind: str = "realtime", seconds: int = 120, **session: Any) -> str:
    """A secret minted over HTTP with the real key, as an app's backend does."""
    body = {"expires_after": {"anchor": "created_at", "seconds": seconds}, "session": {"type": kind, **session}}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            server.url + "/v1/realtime/client_secrets", json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        value: str = (await resp.json())["value"]
    return value


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def _get(server: LiveServer, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession() as http, http.get(server.url + path, headers=headers) as resp:
        return resp.status, resp.content_type, await resp.read()


async def _offer(server: LiveServer, headers: dict[str, str], sdp: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(server.url + "/api/rtc/asr", json={"sdp": sdp, "type": "offer"}, headers=headers) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def _session_connects(server: LiveServer, headers: dict[str, str]) -> None:
    """POST /api/rtc/asr with ``headers``: the answer connects, and the data channel answers a ping."""
    pc = RTCPeerConnection()
    try:
        channel = pc.createDataChannel("chat", ordered=True)
        opened = asyncio.Event()
        pong: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        channel.on("open", opened.set)

        @channel.on("message")
        def on_message(data: str) -> None:
            message = json.loads(data)
            if message.get("type") == "pong" and not pong.done():
                pong.set_result(message)

        await pc.setLocalDescription(await pc.createOffer())
        status, answer = await _offer(server, headers, pc.localDescription.sdp)
        assert status == 200, answer
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
        await asyncio.wait_for(opened.wait(), timeout=20)
        channel.send(json.dumps({"type": "ping", "message": "with a secret", "obj": None}))
        assert (await asyncio.wait_for(pong, timeout=10))["message"] == "with a secret"
    finally:
        await pc.close()


def _assert_401(path: str, status: int, body: bytes, *words: str) -> None:
    assert status == 401, body
    decoded = json.loads(body)
    if path.startswith("/v1/"):  # OpenAI's shape
        assert set(decoded) == {"error"} and set(decoded["error"]) == OPENAI_ERROR_KEYS, decoded
        message, code = decoded["error"]["message"], decoded["error"]["code"]
    else:  # the /api family's
        assert set(decoded) == {"error", "code"}, decoded
        message, code = decoded["error"], decoded["code"]
    assert code == "invalid_api_key", decoded
    for word in words:
        assert word in message, decoded


# --- a valid secret --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PAGE_GETS)
async def test_page_endpoint_answers_a_secret_as_it_answers_the_key(auth_server: LiveServer, path: str) -> None:
    status, _, body = await _get(auth_server, path, {})
    assert status == 401, body  # auth is on
    with_key = await _get(auth_server, path, _bearer(KEY))
    assert with_key[0] == 200, with_key
    status, content_type, body = await _get(auth_server, path, _bearer(await _mint(auth_server)))
    assert status == 200, body
    assert content_type == with_key[1]
    if path.startswith("/api/tts"):
        assert body[:4] == b"RIFF" and len(body) > 10_000  # speech, not a header alone
    else:
        assert json.loads(body) == json.loads(with_key[2])


async def test_page_session_connects_with_a_secret(auth_server: LiveServer) -> None:
    await _session_connects(auth_server, _bearer(await _mint(auth_server)))


# --- secrets that open nothing ---------------------------------------------------------------------


def _tampered(secret: str) -> str:
    """The secret with one bit of its sealed claims flipped."""
    text = secret.removeprefix("ek_")
    body = bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    body[len(body) // 2] ^= 0x01
    return "ek_" + base64.urlsafe_b64encode(bytes(body)).rstrip(b"=").decode()


async def test_the_browser_cannot_read_what_a_secret_carries(auth_server: LiveServer) -> None:
    """The session a backend mints with (instructions, an MCP server's token) is sealed, not just signed."""
    secret = await _mint(auth_server, instructions="The door code is 4711-PRIVATE.")
    text = secret.removeprefix("ek_")
    body = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    assert b"PRIVATE" not in body
    with pytest.raises(zlib.error):
        zlib.decompress(body)
    for start in range(0, 32):  # not a compressed payload at any offset either
        with contextlib.suppress(zlib.error):
            assert b"PRIVATE" not in zlib.decompressobj().decompress(body[start:])
    assert decode(auth_server.app, secret).session["instructions"] == "The door code is 4711-PRIVATE."


@pytest.mark.parametrize("path", [*PAGE_GETS, "/api/rtc/asr"])
async def test_bad_secrets_are_401_in_the_family_shape(auth_server: LiveServer, path: str) -> None:
    expired = encode(auth_server.app, ClientSecret("realtime", int(time.time()) - 1, {}))
    cases = [
        (expired, "expired"),
        (_tampered(await _mint(auth_server)), "unknown"),
        ("ek_bm90LWEtc2VjcmV0.forged", "unknown"),
        (await _mint(auth_server, "transcription"), "'transcription'"),
    ]
    for secret, word in cases:
        if path == "/api/rtc/asr":
            pc, sdp = await make_offer()
            try:
                async with (
                    aiohttp.ClientSession() as http,
                    http.post(
                        auth_server.url + path, json={"sdp": sdp, "type": "offer"}, headers=_bearer(secret)
                    ) as resp,
                ):
                    status, body = resp.status, await resp.read()
            finally:
                await pc.close()
        else:
            status, _, body = await _get(auth_server, path, _bearer(secret))
        _assert_401(path, status, body, word)


async def test_a_secret_from_another_server_is_401(auth_server: LiveServer, server_factory: Callable[..., Any]) -> None:
    other: LiveServer = await server_factory(api_keys=[KEY])  # its own random signing key
    status, _, body = await _get(auth_server, "/api/rtc/config", _bearer(await _mint(other)))
    _assert_401("/api/rtc/config", status, body, "unknown")


@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        ("POST", "/v1/audio/transcriptions", aiohttp.FormData({"model": "whisper-1"})),
        ("POST", "/v1/realtime/client_secrets", b"{}"),
        ("POST", "/v1/realtime/sessions", b"{}"),
        ("POST", "/api/willow", b"\x00" * 320),
        ("POST", "/api/sts", b"\x00" * 320),
        ("POST", "/api/tts", None),  # only GET is the page's
        ("POST", "/v1/audio/speech", b'{"model": "tts-1", "input": "hi", "voice": "alloy"}'),
        ("POST", "/v1/chat/completions", b'{"model": "x", "messages": []}'),
        ("GET", "/v1/models/whisper-1", None),
        ("GET", "/metrics", None),
        ("GET", "/api/ping", None),
    ],
)
async def test_a_secret_opens_nothing_else(auth_server: LiveServer, method: str, path: str, data: Any) -> None:
    secret = await _mint(auth_server)
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, auth_server.url + path, data=data, headers=_bearer(secret)) as resp,
    ):
        assert resp.status == 401, await resp.text()
        body = await resp.json()
    message = body["error"]["message"] if path.startswith("/v1/") else body["error"]
    assert "client secret opens only" in message, body


# --- the helper ------------------------------------------------------------------------------------


async def _helper(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mediaserver.mint_secret",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_helper_prints_a_page_url_that_opens_the_page(auth_server: LiveServer) -> None:
    code, out, err = await _helper("--server", auth_server.url, "--api-key", KEY, "--ttl", "600")
    assert code == 0, err
    url = urlsplit(out.strip())
    assert f"{url.scheme}://{url.netloc}" == auth_server.url and url.path == "/rtc/" and not url.query, out
    name, _, secret = url.fragment.partition("=")
    assert name == "client_secret" and secret.startswith("ek_"), out
    status, _, body = await _get(auth_server, f"{url.path}", {})  # the page itself is public
    assert status == 200 and b"<html" in body.lower()
    await _session_connects(auth_server, _bearer(secret))
    status, _, body = await _get(auth_server, "/api/tts?text=hi", _bearer(secret))
    assert status == 200, body


async def test_helper_public_url_page_and_key_from_the_environment(auth_server: LiveServer) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mediaserver.mint_secret",
        "--server",
        auth_server.url,
        "--public-url",
        "https://speech.example:19000/",
        "--page",
        "rtc/embed.html?assistant=1",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "MEDIASERVER_API_KEY": KEY},
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err
    assert out.decode().startswith("https://speech.example:19000/rtc/embed.html?assistant=1#client_secret=ek_"), out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--api-key", "wrong"], ["401", "wrong API key?"]),
        ([], ["401", "--api-key"]),
        (["--api-key", KEY, "--ttl", "5"], ["400", "expires_after.seconds"]),
    ],
    ids=["wrong-key", "no-key", "ttl-out-of-range"],
)
async def test_helper_errors_are_one_clear_line(auth_server: LiveServer, args: list[str], words: list[str]) -> None:
    code, out, err = await _helper("--server", auth_server.url, *args)
    assert code == 1 and out == "", (out, err)
    assert err.startswith("mint_secret: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


async def test_helper_function_against_a_live_server(auth_server: LiveServer, server: LiveServer) -> None:
    answer = await asyncio.to_thread(mint, auth_server.url + "/", KEY, 60)
    assert answer["session"]["type"] == "realtime"
    assert 0 < answer["expires_at"] - time.time() <= 60
    assert page_url("http://h:1/", "/rtc/", answer["value"]) == f"http://h:1/rtc/#client_secret={answer['value']}"
    status, _, _ = await _get(auth_server, "/v1/models", _bearer(answer["value"]))
    assert status == 200
    with pytest.raises(MintError, match="does not exist"):  # a server with nothing there (auth off: a 404)
        await asyncio.to_thread(mint, server.url + "/elsewhere", KEY, 60)
    with pytest.raises(MintError, match="cannot reach"):
        await asyncio.to_thread(mint, "http://127.0.0.1:9", KEY, 60, timeout_s=5)
