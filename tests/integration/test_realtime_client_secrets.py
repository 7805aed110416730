"""Client secrets (ephemeral keys) for browsers, against a live server with auth on.

The app's backend mints a secret with its real key through the official SDK (GA
``client.realtime.client_secrets.create``, beta ``client.beta.realtime.sessions.create`` and
``transcription_sessions.create``); the "page" connects with the secret: the SDK's
``realtime.connect`` with the secret as its key (Bearer), a raw WebSocket with the
``openai-insecure-api-key.<secret>`` subprotocol as browsers send it, and a WebRTC call. The secret's
session config is what the session starts with; a secret of the other kind, an expired one, a
forged one, or one from another server is a 401 in OpenAI's error shape.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
import websockets
from pydantic import SecretStr

from mediaserver.transport.openai.realtime.client_secrets import ClientSecret, encode
from tests.conftest import LiveServer
from tests.integration.test_realtime_conversation import GA_EVENTS, until
from tests.integration.test_voice_loop import VOICE_SETTINGS
from tests.rtc_peer import connect_call

KEY = "the-real-key"
INSTRUCTIONS = "You are a terse test assistant."
REDACTED = "<redacted>"
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def auth_server(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(
        **VOICE_SETTINGS, api_keys=[KEY], realtime_client_secret_key=SecretStr("shared-by-every-replica")
    )
    return server


def _client(server: LiveServer, key: str = KEY) -> Any:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


async def _mint(server: LiveServer, session: dict[str, Any], seconds: int = 60) -> Any:
    return await _client(server).realtime.client_secrets.create(
        session=session, expires_after={"anchor": "created_at", "seconds": seconds}
    )


async def _get(server: LiveServer, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """A plain GET (no upgrade): the realtime endpoint checks credentials before it asks for one."""
    async with aiohttp.ClientSession() as http, http.get(server.url + path, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def _assert_401(status: int, body: Any, *words: str) -> None:
    assert status == 401, body
    assert set(body) == {"error"} and set(body["error"]) == OPENAI_ERROR_KEYS, body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "invalid_api_key", body
    for word in words:
        assert word in body["error"]["message"], body


# --- minting ---------------------------------------------------------------------------------------


async def test_mint_ga_secret_and_connect_with_it(auth_server: LiveServer) -> None:
    before = int(time.time())
    secret = await _mint(auth_server, {"type": "realtime", "instructions": INSTRUCTIONS, "output_modalities": ["text"]})
    assert isinstance(secret, openai.types.realtime.ClientSecretCreateResponse)
    assert secret.value.startswith("ek_")
    assert before + 60 <= secret.expires_at <= int(time.time()) + 60
    assert secret.session.type == "realtime" and secret.session.instructions == INSTRUCTIONS
    async with _client(auth_server, secret.value).realtime.connect(model="gpt-realtime") as connection:
        (created,) = await until(connection, "session.created")
        # the instructions reach the LLM, not the browser holding the secret
        assert created.session.instructions == REDACTED and created.session.output_modalities == ["text"]
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}
        )
        await connection.response.create()
        events = await until(connection, "response.done")
    kinds = [e.type for e in events]
    assert "response.output_text.done" in kinds and "response.output_audio.delta" not in kinds, kinds


async def test_sealed_instructions_never_reach_the_browser(auth_server: LiveServer) -> None:
    """session.created and every session.updated show the secret's instructions as <redacted>, on the
    raw WebSocket as a browser opens it; the session still answers under them, and a session.update
    that sends the shown session back keeps them; instructions the client sets itself are echoed."""
    secret = await _mint(auth_server, {"type": "realtime", "instructions": INSTRUCTIONS, "output_modalities": ["text"]})
    url = auth_server.url.replace("http://", "ws://") + "/v1/realtime"
    async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{secret.value}"]) as ws:  # type: ignore[list-item]

        async def next_of(kind: str) -> dict[str, Any]:
            while True:
                text = await ws.recv()
                assert INSTRUCTIONS not in str(text), text
                event: dict[str, Any] = json.loads(text)
                assert event["type"] != "error", event
                if event["type"] == kind:
                    return event

        async def update(session: dict[str, Any]) -> str:
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", **session}}))
            instructions: str = (await next_of("session.updated"))["session"]["instructions"]
            return instructions

        assert (await next_of("session.created"))["session"]["instructions"] == REDACTED
        assert await update({"max_output_tokens": 40}) == REDACTED
        assert await update({"instructions": REDACTED}) == REDACTED  # the shown session sent back
        user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": user}))
        await ws.send(json.dumps({"type": "response.create"}))
        done = await next_of("response.done")
        assert done["response"]["status"] == "completed", done
        assert await update({"instructions": "Be brief."}) == "Be brief."  # the client's own


async def test_transcription_secret_over_the_browser_subprotocol(auth_server: LiveServer) -> None:
    secret = await _mint(
        auth_server,
        {
            "type": "transcription",
            "audio": {"input": {"transcription": {"model": "whisper-1", "language": "en"}, "turn_detection": None}},
        },
    )
    assert secret.session.type == "transcription"
    url = auth_server.url.replace("http://", "ws://") + "/v1/realtime"  # no intent: the secret decides
    async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{secret.value}"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "realtime"
        created = json.loads(await ws.recv())
    GA_EVENTS.validate_python(created)
    assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
    assert created["session"]["audio"]["input"]["turn_detection"] is None  # the secret's config applied
    assert created["session"]["audio"]["input"]["transcription"]["model"] == "whisper-1"


async def test_secret_opens_a_webrtc_call(auth_server: LiveServer) -> None:
    secret = await _mint(auth_server, {"type": "realtime", "instructions": INSTRUCTIONS})
    peer, _location = await connect_call(auth_server, api_key=secret.value)
    try:
        created = await peer.next("session.created")
        assert created["session"]["instructions"] == REDACTED
    finally:
        await peer.close()


async def test_beta_endpoints_mint_secrets(auth_server: LiveServer) -> None:
    client = _client(auth_server)
    session = await client.beta.realtime.sessions.create(
        model="gpt-4o-realtime-preview", modalities=["text"], instructions=INSTRUCTIONS
    )
    assert session.client_secret.value.startswith("ek_")
    assert 0 < session.client_secret.expires_at - time.time() <= 60  # a minute, as OpenAI's beta
    assert session.instructions == INSTRUCTIONS and session.modalities == ["text"]
    transcription = await client.beta.realtime.transcription_sessions.create(
        input_audio_transcription={"model": "whisper-1"},
        turn_detection={"type": "server_vad", "silence_duration_ms": 700},
    )
    assert transcription.client_secret.value.startswith("ek_")
    assert transcription.turn_detection is not None and transcription.turn_detection.silence_duration_ms == 700
    url = auth_server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    headers = {"Authorization": f"Bearer {transcription.client_secret.value}", "OpenAI-Beta": "realtime=v1"}
    async with websockets.connect(url, additional_headers=headers) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        created = json.loads(await ws.recv())
    assert created["type"] == "transcription_session.created"  # the beta shape
    assert created["session"]["turn_detection"]["silence_duration_ms"] == 700
    # and the conversation secret opens a conversation
    async with _client(auth_server, session.client_secret.value).realtime.connect(model="gpt-realtime") as connection:
        (created_event,) = await until(connection, "session.created")
    assert created_event.session.instructions == REDACTED


# --- refusals --------------------------------------------------------------------------------------


async def test_wrong_kind_is_401(auth_server: LiveServer) -> None:
    transcription = await _mint(auth_server, {"type": "transcription"})
    status, body = await _get(
        auth_server, "/v1/realtime?model=gpt-realtime", {"Authorization": f"Bearer {transcription.value}"}
    )
    _assert_401(status, body, "transcription")
    conversation = await _mint(auth_server, {"type": "realtime"})
    status, body = await _get(
        auth_server, "/v1/realtime?intent=transcription", {"Authorization": f"Bearer {conversation.value}"}
    )
    _assert_401(status, body, "realtime")
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            auth_server.url + "/v1/realtime/calls",
            data="v=0\r\n",
            headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {transcription.value}"},
        ) as resp,
    ):
        _assert_401(resp.status, await resp.json(), "transcription")


async def test_expired_unknown_and_foreign_secrets_are_401(
    auth_server: LiveServer, server_factory: Callable[..., Any]
) -> None:
    expired = encode(auth_server.app, ClientSecret("realtime", int(time.time()) - 1, {}))
    status, body = await _get(auth_server, "/v1/realtime", {"Authorization": f"Bearer {expired}"})
    _assert_401(status, body, "expired")
    status, body = await _get(auth_server, "/v1/realtime", {"Authorization": "Bearer ek_bm90LWEtc2VjcmV0.forged"})
    _assert_401(status, body, "unknown")
    other: LiveServer = await server_factory(**VOICE_SETTINGS, api_keys=[KEY])  # its own random key
    foreign = await _mint(other, {"type": "realtime"})
    status, body = await _get(auth_server, "/v1/realtime", {"Authorization": f"Bearer {foreign.value}"})
    _assert_401(status, body, "unknown")
    with pytest.raises(websockets.InvalidStatus) as caught:
        url = auth_server.url.replace("http://", "ws://") + "/v1/realtime"
        async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{expired}"]):  # type: ignore[list-item]
            pass
    assert caught.value.response.status_code == 401


async def test_replicas_with_the_same_key_accept_each_others_secrets(
    auth_server: LiveServer, server_factory: Callable[..., Any]
) -> None:
    replica: LiveServer = await server_factory(
        **VOICE_SETTINGS, api_keys=[KEY], realtime_client_secret_key=SecretStr("shared-by-every-replica")
    )
    secret = await _mint(replica, {"type": "realtime", "instructions": INSTRUCTIONS})
    async with _client(auth_server, secret.value).realtime.connect(model="gpt-realtime") as connection:
        (created,) = await until(connection, "session.created")
    assert created.session.instructions == REDACTED


async def test_minting_needs_a_real_key(auth_server: LiveServer) -> None:
    with pytest.raises(openai.AuthenticationError):
        await _client(auth_server, "wrong").realtime.client_secrets.create(session={"type": "realtime"})
    secret = await _mint(auth_server, {"type": "realtime"})
    with pytest.raises(openai.AuthenticationError):  # a secret mints nothing
        await _client(auth_server, secret.value).realtime.client_secrets.create(session={"type": "realtime"})
    with pytest.raises(openai.AuthenticationError):  # nor opens anything but realtime sessions (and the
        # /rtc/ page's endpoints: tests/integration/test_rtc_page_secret.py)
        await _client(auth_server, secret.value).audio.speech.create(model="tts-1", input="hi", voice="alloy")


@pytest.mark.parametrize("seconds", [5, 7201, "600"])
async def test_expires_after_out_of_range_is_400(auth_server: LiveServer, seconds: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await _client(auth_server).realtime.client_secrets.create(
            session={"type": "realtime"}, expires_after={"anchor": "created_at", "seconds": seconds}
        )
    assert caught.value.param == "expires_after.seconds"


async def test_bad_session_config_is_400_at_minting(auth_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await _client(auth_server).realtime.client_secrets.create(
            session={"type": "realtime", "audio": {"input": {"turn_detection": {"type": "loud_vad"}}}}
        )
    assert caught.value.param == "session.audio.input.turn_detection.type"
    with pytest.raises(openai.BadRequestError) as caught:
        await _client(auth_server).realtime.client_secrets.create(session={"type": "dictation"})
    assert caught.value.param == "session.type"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"not json", "body"),
        (b"[]", "body"),
        (b'{"session": "realtime"}', "session"),
        (b'{"expires_after": 600}', "expires_after"),
        (b'{"expires_after": {"anchor": "now", "seconds": 60}}', "expires_after.anchor"),
        (b'{"expires_after": {"seconds": true}}', "expires_after.seconds"),
        (json.dumps({"session": {"type": "realtime", "instructions": os.urandom(4000).hex()}}).encode(), "session"),
    ],
    ids=["not-json", "array", "session-string", "expires-number", "anchor", "seconds-bool", "too-long"],
)
async def test_bad_mint_bodies_are_400(auth_server: LiveServer, body: bytes, param: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            auth_server.url + "/v1/realtime/client_secrets",
            data=body,
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        ) as resp,
    ):
        answer = await resp.json()
    assert resp.status == 400, answer
    assert set(answer["error"]) == OPENAI_ERROR_KEYS and answer["error"]["param"] == param, answer


@pytest.mark.parametrize("value", ["ek_", "ek_abc", "ek_.", "ek_abc.def.ghi", "ek_" + "A" * 5000 + ".x"])
async def test_malformed_secrets_are_401(auth_server: LiveServer, value: str) -> None:
    status, body = await _get(auth_server, "/v1/realtime", {"Authorization": f"Bearer {value}"})
    _assert_401(status, body)


async def test_a_secret_has_one_spelling(auth_server: LiveServer) -> None:
    """Characters outside base64url, padding, the standard alphabet's + and /, and a last character's
    unused bits changed: each decoded to the same bytes, so each opened the minted secret."""
    for length in range(1, 9):  # a length whose last character has unused bits
        secret = (await _mint(auth_server, {"type": "realtime", "instructions": os.urandom(length).hex()})).value
        if len(secret.removeprefix("ek_")) % 4:
            break
    status, _ = await _get(auth_server, "/v1/realtime", {"Authorization": f"Bearer {secret}"})
    assert status == 426  # the secret itself is good: the endpoint asks for the upgrade
    body = secret.removeprefix("ek_")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    spellings = [
        f"ek_{body[:10]}.{body[10:]}",
        f"ek_{body[:10]}!!{body[10:]}",
        f"ek_{body}.",
        f"ek_{body}" + "=" * (-len(body) % 4 or 4),
        "ek_" + body.replace("-", "+").replace("_", "/"),
    ]
    if len(body) % 4:  # the last character's lowest bit carries nothing
        spellings.append(f"ek_{body[:-1]}{alphabet[alphabet.index(body[-1]) ^ 1]}")
    if "-" not in body and "_" not in body:
        spellings.pop(4)
    for spelling in spellings:
        status, answer = await _get(auth_server, "/v1/realtime", {"Authorization": f"Bearer {spelling}"})
        _assert_401(status, answer, "unknown")
        if not re.fullmatch(r"[\w!#$%&'*+.^`|~-]+", spelling):
            continue  # not an HTTP token ("=", "/"): a browser cannot send it as a subprotocol
        protocols = ["realtime", f"openai-insecure-api-key.{spelling}"]
        with pytest.raises(websockets.InvalidStatus) as caught:
            url = auth_server.url.replace("http://", "ws://") + "/v1/realtime"
            async with websockets.connect(url, subprotocols=protocols):  # type: ignore[arg-type]
                pass
        assert caught.value.response.status_code == 401, spelling


# --- the limits are settings -------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def limited_server(server_factory: Callable[..., Any]) -> LiveServer:
    """One app (the shared models) with every Realtime minting limit below its default."""
    server: LiveServer = await server_factory(
        **VOICE_SETTINGS,
        api_keys=[KEY],
        realtime_client_secret_default_ttl_s=60,
        realtime_client_secret_max_ttl_s=120,
        realtime_client_secret_max_chars=256,
        realtime_max_call_bytes=2048,
    )
    return server


async def _post(server: LiveServer, path: str, body: bytes, content_type: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": content_type}
    async with aiohttp.ClientSession() as http, http.post(server.url + path, data=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_realtime_client_secret_default_ttl_s_is_the_life_of_a_secret_that_names_none(
    limited_server: LiveServer,
) -> None:
    before = time.time()
    secret = await _client(limited_server).realtime.client_secrets.create(session={"type": "realtime"})
    assert before + 60 - 5 <= secret.expires_at <= time.time() + 60 + 1  # the default: 600 s


async def test_realtime_client_secret_max_ttl_s_caps_expires_after(limited_server: LiveServer) -> None:
    secret = await _mint(limited_server, {"type": "realtime"}, seconds=120)
    assert secret.value.startswith("ek_")
    with pytest.raises(openai.BadRequestError) as caught:  # the default (7200) takes it
        await _mint(limited_server, {"type": "realtime"}, seconds=121)
    assert caught.value.param == "expires_after.seconds"


async def test_realtime_client_secret_max_chars_refuses_a_longer_secret(limited_server: LiveServer) -> None:
    session = {"type": "realtime", "instructions": os.urandom(200).hex()}  # about 400 chars sealed (< 4096)
    with pytest.raises(openai.BadRequestError) as caught:
        await _mint(limited_server, session)
    assert caught.value.param == "session" and "realtime_client_secret_max_chars (256)" in caught.value.message


async def test_realtime_max_call_bytes_refuses_a_larger_offer_or_mint_body(limited_server: LiveServer) -> None:
    offer = "v=0\r\n" + "a=x-padding\r\n" * 300  # about 4 KB: far under the default (256 KiB)
    status, body = await _post(limited_server, "/v1/realtime/calls", offer.encode(), "application/sdp")
    assert status == 400 and body["error"]["param"] == "sdp", body
    assert "realtime_max_call_bytes=2048" in body["error"]["message"], body
    mint = json.dumps({"session": {"type": "realtime", "instructions": "a" * 3000}}).encode()
    status, body = await _post(limited_server, "/v1/realtime/client_secrets", mint, "application/json")
    assert status == 413 and "realtime_max_call_bytes" in body["error"]["message"], body
