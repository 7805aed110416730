"""The upstream backend against a real OpenAI-compatible server: llama-cpp-python's own server
(``python -m llama_cpp.server``) on the bundled GGUF, a child process on a loopback port.

Pointing mediaserver at it needs only settings. Failures are real too: "upstream down" is a port
nothing listens on (what a stopped server leaves), and the hanging upstream is a plain socket server
that accepts and never answers, since no real server can be made to hang on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from mediaserver.config import Settings
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage
from mediaserver.llm.upstream import UpstreamError
from mediaserver.metrics import Metrics
from tests.llama_upstream import llama_server
from tests.ports import bound_port, free_port

UPSTREAM_MODEL = "smollm2-upstream"
UPSTREAM_KEY = "upstream-secret"
COLORS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    """llama-cpp-python's OpenAI-compatible server on the bundled GGUF."""
    with llama_server(UPSTREAM_MODEL, api_key=UPSTREAM_KEY) as url:
        yield url


async def _service(base_settings: Settings, **overrides: Any) -> LlmService:
    service = LlmService(base_settings.model_copy(update=overrides), Metrics())
    await service.start()
    return service


@contextlib.asynccontextmanager
async def upstream_live(
    server_factory: Any, base_settings: Settings, upstream_url: str, **overrides: Any
) -> AsyncIterator[Any]:
    """A mediaserver whose LLM is the upstream (only settings differ), and its service."""
    settings = {"llm_upstream_url": upstream_url, "llm_upstream_api_key": UPSTREAM_KEY, **overrides}
    service = await _service(base_settings, **settings)
    try:
        yield await server_factory(llm=service, **settings), service
    finally:
        await service.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def upstream_server(server_factory: Any, base_settings: Settings, upstream_url: str) -> AsyncIterator[Any]:
    async with upstream_live(server_factory, base_settings, upstream_url) as live:
        yield live


async def test_upstream_models_are_listed_and_default(upstream_server: Any) -> None:
    live, service = upstream_server
    assert service.sources.default_name == UPSTREAM_MODEL
    async with aiohttp.ClientSession() as session, session.get(f"{live.url}/v1/models") as resp:
        models = {m["id"]: m for m in (await resp.json())["data"]}
    assert models[UPSTREAM_MODEL]["kind"] == "llm" and models[UPSTREAM_MODEL]["backend"] == "upstream"


async def test_streams_from_the_upstream_through_the_sdk(upstream_server: Any) -> None:
    live, _ = upstream_server
    async with openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(
            model="gpt-4o-mini", messages=COLORS, temperature=0, max_tokens=40, stream=True
        )
        deltas = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
        whole = await sdk.chat.completions.create(model=UPSTREAM_MODEL, messages=COLORS, temperature=0, max_tokens=40)
    # The same GGUF, chat template and greedy decoding as the embedded backend: the same answer.
    assert "".join(deltas) == "1. Red\n2. Blue\n3. Green"
    assert len(deltas) > 3
    assert whole.choices[0].message.content == "1. Red\n2. Blue\n3. Green"
    assert whole.model == UPSTREAM_MODEL


async def test_service_stream_from_upstream_cancels(upstream_server: Any) -> None:
    from mediaserver.llm.types import GenerationParams

    _, service = upstream_server
    story = [ChatMessage("user", "Tell me a long story about a cat who travels the world.")]
    received = []
    async with service.stream(story, GenerationParams(temperature=0.0, max_tokens=500)) as answer:
        async for delta in answer:
            received.append(delta)
            if len(received) == 5:
                break
    assert len(received) == 5
    # The upstream's HTTP stream was closed: the next request is served at once, not after the story.
    text = await service.complete([ChatMessage("user", "Name three colors.")], GenerationParams(temperature=0.0))
    assert text.text == "1. Red\n2. Blue\n3. Green"


async def test_prompt_cap_holds_for_the_upstream(
    server_factory: Any, base_settings: Settings, upstream_url: str
) -> None:
    """``llm_max_prompt_tokens`` (64 here) holds for an upstream model: a prompt of about 400 tokens,
    which the upstream would answer, is a 400 in OpenAI's shape that says its size is an estimate
    (``llm_upstream_bytes_per_token``), streamed or not; a short one is answered."""
    long_prompt: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 40 + "Name three colors."}
    ]
    async with (
        upstream_live(server_factory, base_settings, upstream_url, llm_max_prompt_tokens=64) as (live, _),
        openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as sdk,
    ):
        refused = []
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                await sdk.chat.completions.create(
                    model=UPSTREAM_MODEL, messages=long_prompt, max_tokens=5, stream=stream
                )
            refused.append(caught.value)
        answer = await sdk.chat.completions.create(model=UPSTREAM_MODEL, messages=COLORS, temperature=0, max_tokens=40)
    for error in refused:
        assert error.code == "context_length_exceeded" and error.param == "messages"
        assert "about 612 tokens, an estimate (1834 bytes at 3 bytes a token" in error.message, error.message
        assert "at most 64 (llm_max_prompt_tokens)" in error.message
    assert answer.choices[0].message.content == "1. Red\n2. Blue\n3. Green"


async def test_upstream_failing_after_200_is_502(
    server_factory: Any, base_settings: Settings, upstream_url: str
) -> None:
    """llama-cpp-python's server answers 200 to a prompt over its context window, then fails and
    ends the stream empty: that is the upstream's failure, named as such. (This server's own cap,
    ``llm_max_prompt_tokens``, is set above the upstream's window to let the prompt through.)"""
    async with (
        upstream_live(server_factory, base_settings, upstream_url, llm_max_prompt_tokens=4096) as (live, _),
        openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as sdk,
    ):
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk.chat.completions.create(
                model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "x " * 3000}], max_tokens=10
            )
    assert caught.value.status_code == 502
    assert "ended its stream without an answer" in caught.value.message
    assert live.url not in caught.value.message and "127.0.0.1" in caught.value.message


async def test_upstream_error_status_is_502_with_its_message(upstream_server: Any) -> None:
    from mediaserver.llm.types import ChatRequest

    _, service = upstream_server
    upstream = await service.backend(service.sources.source(UPSTREAM_MODEL))
    # Out of range for the upstream's own validation (ours refuses it first); llama-cpp-python's
    # server answers that with a 500.
    request = ChatRequest(UPSTREAM_MODEL, (ChatMessage("user", "hi"),), 10, 0.5, top_p=1.5)
    with pytest.raises(UpstreamError) as caught:
        async for _ in upstream.stream(request, threading.Event(), 4096):
            pass
    assert caught.value.status == 502
    assert "answered 500" in caught.value.message and "top_p" in caught.value.message


async def test_upstream_400_is_the_clients_400(server_factory: Any, base_settings: Settings) -> None:
    """vLLM and OpenAI refuse a prompt over the context window with a 400 before streaming; the
    llama.cpp server above cannot be made to, so this one answer comes from a stand-in."""

    async def refuse(request: web.Request) -> web.Response:
        error = {"message": "This model's maximum context length is 2048 tokens.", "type": "invalid_request_error",
                 "param": "messages", "code": "context_length_exceeded"}  # fmt: skip
        return web.json_response({"error": error}, status=400)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = bound_port(runner)
    settings = {"llm_upstream_url": f"http://127.0.0.1:{port}/v1", "llm_upstream_models": [UPSTREAM_MODEL]}
    service = await _service(base_settings, **settings)
    try:
        live = await server_factory(llm=service, **settings)
        async with openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as sdk:
            with pytest.raises(openai.BadRequestError) as caught:
                await sdk.chat.completions.create(model=UPSTREAM_MODEL, messages=COLORS)
    finally:
        await service.aclose()
        await runner.cleanup()
    assert "refused the request (400): This model's maximum context length is 2048 tokens." in caught.value.message
    assert f"127.0.0.1:{port}" in caught.value.message


async def test_wrong_upstream_key_is_502(base_settings: Settings, upstream_url: str) -> None:
    service = await _service(
        base_settings, llm_upstream_url=upstream_url, llm_upstream_api_key="wrong", llm_upstream_models=[UPSTREAM_MODEL]
    )
    try:
        with pytest.raises(UpstreamError) as caught:
            await service.complete([ChatMessage("user", "hi")])
    finally:
        await service.aclose()
    assert f"the upstream LLM at {upstream_url} answered 401" in caught.value.message


async def test_upstream_down_is_502_naming_it(server_factory: Any, base_settings: Settings) -> None:
    down_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there any more
    settings = {
        "llm_upstream_url": down_url,
        "llm_upstream_models": [UPSTREAM_MODEL],
        "llm_upstream_retries": 1,
        "llm_upstream_connect_timeout_s": 2.0,
    }
    service = await _service(base_settings, **settings)
    try:
        live = await server_factory(llm=service, **settings)
        async with aiohttp.ClientSession() as session:
            body = {"model": UPSTREAM_MODEL, "messages": COLORS, "stream": True}
            async with session.post(f"{live.url}/v1/chat/completions", json=body) as resp:
                status, answer = resp.status, await resp.json()
    finally:
        await service.aclose()
    assert status == 502
    assert answer["error"]["code"] == "upstream_error"
    assert down_url in answer["error"]["message"] and "cannot be reached" in answer["error"]["message"]


async def test_hanging_upstream_is_504_within_the_timeout(server_factory: Any, base_settings: Settings) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing, keep the connection open

    hang = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = hang.sockets[0].getsockname()[1]
    settings = {
        "llm_upstream_url": f"http://127.0.0.1:{port}/v1",
        "llm_upstream_models": [UPSTREAM_MODEL],
        "llm_upstream_timeout_s": 1.5,
    }
    service = await _service(base_settings, **settings)
    try:
        live = await server_factory(llm=service, **settings)
        started = time.monotonic()
        async with openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=30) as sdk:
            with pytest.raises(openai.APIStatusError) as caught:
                await sdk.chat.completions.create(model=UPSTREAM_MODEL, messages=COLORS)
        elapsed = time.monotonic() - started
    finally:
        await service.aclose()
        for writer in accepted:
            writer.close()
        hang.close()
        await hang.wait_closed()
    assert caught.value.status_code == 504
    assert "sent nothing for 1.5 s" in caught.value.message
    assert accepted, "the upstream was never contacted"
    assert 1.5 <= elapsed < 10  # one timeout, no retries of it


async def test_upstream_down_at_start_turns_the_llm_off_with_the_reason(
    base_settings: Settings, asr_service: Any
) -> None:
    """Without llm_upstream_models the app asks the upstream at start-up; down, the LLM is off (503)."""
    from mediaserver.app import create_app

    down_url = f"http://127.0.0.1:{free_port()}/v1"
    settings = base_settings.model_copy(update={"llm_upstream_url": down_url, "llm_upstream_retries": 0})
    runner = web.AppRunner(create_app(settings, asr_service=asr_service))  # its own LLM service
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{bound_port(runner)}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/health") as resp:
                feature = (await resp.json())["features"]["llm"]
            async with session.post(f"{url}/v1/chat/completions", json={"model": "x", "messages": COLORS}) as resp:
                status, answer = resp.status, await resp.json()
    finally:
        await runner.cleanup()
    assert feature["enabled"] is False
    assert down_url in feature["reason"] and "llm_upstream_models" in feature["reason"]
    assert status == 503 and down_url in answer["error"]["message"]


async def test_another_mediaserver_as_the_upstream_defaults_to_a_chat_model(
    server: Any, base_settings: Settings
) -> None:
    """An operator trial: an upstream that lists speech models first (another mediaserver: tiny.en;
    OpenAI: whisper-1, tts-1) had its first model taken as the default chat model, and every chat
    named by an alias failed. Its non-LLM models are left out, and the default is a chat model."""
    settings = base_settings.model_copy(update={"llm_upstream_url": f"{server.url}/v1", "llm_preload": False})
    service = LlmService(settings, Metrics())
    await service.start()
    try:
        assert service.start_problem is None
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/v1/models") as resp:
            kinds = {m["id"]: m.get("kind") for m in (await resp.json())["data"]}
        assert next(iter(kinds.values())) != "llm"  # the upstream lists another kind first
        default = service.sources.default_name
        assert default is not None and kinds[default] == "llm", (default, kinds)
        names = [name for name in kinds if service.sources.location_problem(name) is None]
        assert "tiny.en" not in names and "whisper-1" not in names, names
        answer = ""
        async with service.stream([ChatMessage("user", "Name three colors.")]) as stream:
            async for delta in stream:
                answer += delta
        assert answer.strip()
    finally:
        await service.aclose()
