"""POST /v1/chat/completions through the official ``openai`` SDK, on the bundled SmolLM2 GGUF.

Generations use temperature 0 and a fixed seed, so the same request gives the same answer on
every run; the answers asserted are what SmolLM2-135M-Instruct Q4_1 says to these prompts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from mediaserver.llm.service import LlmService
from mediaserver.state import METRICS
from tests.faults import eventually
from tests.llm_engine import busy_slots, wait_idle, wait_stopped

COLORS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colors."}]
COLORS_ANSWER = "1. Red\n2. Blue\n3. Green"
# The bundled model's default repeat penalty (1.1) breaks its numbered lists; these tests are about
# the API, so they turn it off (vLLM's repetition_penalty extension). DRY stays on.
NO_PENALTY: dict[str, Any] = {"repetition_penalty": 1.0}
STORY: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me a long story about a cat who travels the world."}
]
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture
async def client(server: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


async def _post(url: str, body: Any, *, raw: bytes | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        kwargs: dict[str, Any] = (
            {"data": raw, "headers": {"Content-Type": "application/json"}} if raw else {"json": body}
        )
        async with session.post(url, **kwargs) as resp:
            return resp.status, await resp.json(content_type=None)


def _openai_error(body: Any, status: int) -> dict[str, Any]:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == OPENAI_ERROR_KEYS, error
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert isinstance(error["message"], str) and error["message"]
    return error


# --- answers -------------------------------------------------------------------------------------


async def test_completion_is_deterministic_with_usage(client: openai.AsyncOpenAI) -> None:
    first = await client.chat.completions.create(
        model="smollm2-135m-instruct", messages=COLORS, temperature=0, seed=7, max_tokens=40, extra_body=NO_PENALTY
    )
    assert first.object == "chat.completion"
    assert first.id.startswith("chatcmpl-")
    choice = first.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == COLORS_ANSWER
    assert choice.finish_reason == "stop"
    assert first.usage is not None
    assert first.usage.prompt_tokens > 10
    assert 0 < first.usage.completion_tokens < 40
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    again = await client.chat.completions.create(
        model="gpt-4o-mini", messages=COLORS, temperature=0, seed=7, max_tokens=40, extra_body=NO_PENALTY
    )
    assert again.choices[0].message.content == COLORS_ANSWER
    assert again.model == "smollm2-135m-instruct"  # the alias answers with the default model
    # A seeded request is read from scratch (the same seed, the same answer), and its usage says so.
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 0, again.usage


async def test_a_prompt_sent_again_reports_the_tokens_its_cache_held(client: openai.AsyncOpenAI) -> None:
    """OpenAI's ``usage.prompt_tokens_details.cached_tokens``: what the engine's prompt cache gave."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three animals on a farm."}]
    usages = []
    for _ in range(2):
        answer = await client.chat.completions.create(
            model="smollm2-135m-instruct", messages=messages, temperature=0, max_tokens=20
        )
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        usages.append(answer.usage)
    cached = usages[1].prompt_tokens_details.cached_tokens if usages[1].prompt_tokens_details else None
    assert cached is not None and usages[1].prompt_tokens // 2 <= cached < usages[1].prompt_tokens, usages


async def test_stream_matches_the_completion_and_reports_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=COLORS,
        temperature=0,
        seed=7,
        max_tokens=40,
        extra_body=NO_PENALTY,
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas: list[str] = []
    finish: list[str] = []
    usage = None
    roles = []
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                deltas.append(choice.delta.content)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert roles == ["assistant"]
    assert len(deltas) > 3  # streamed token by token, not in one piece
    assert "".join(deltas) == COLORS_ANSWER
    assert finish == ["stop"]
    # llama-server counts the end-of-generation token too.
    assert usage is not None and usage.completion_tokens in (len(deltas), len(deltas) + 1)


async def test_max_tokens_and_max_completion_tokens_stop_at_length(client: openai.AsyncOpenAI) -> None:
    results = [
        await client.chat.completions.create(model="gpt-4o-mini", messages=STORY, temperature=0, max_tokens=5),
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=STORY, temperature=0, max_completion_tokens=5
        ),
    ]
    for result in results:
        assert result.choices[0].finish_reason == "length"
        assert result.usage is not None and result.usage.completion_tokens == 5


async def test_stop_sequence_cuts_the_answer(client: openai.AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model="gpt-4o-mini", messages=COLORS, temperature=0, max_tokens=40, stop=["Blue"], extra_body=NO_PENALTY
    )
    assert result.choices[0].message.content == "1. Red\n2. "
    assert result.choices[0].finish_reason == "stop"


async def test_text_parts_system_and_history_are_accepted(client: openai.AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[
            {"role": "developer", "content": "You answer in lists."},
            {"role": "user", "content": [{"type": "text", "text": "Name three "}, {"type": "text", "text": "colors."}]},
            {"role": "assistant", "content": COLORS_ANSWER},
            {"role": "user", "content": "And three animals?"},
        ],
        temperature=0,
        max_tokens=30,
    )
    assert result.choices[0].message.content
    assert result.usage is not None and result.usage.prompt_tokens > 40


async def test_a_history_ending_with_the_assistants_messages_is_answered(client: openai.AsyncOpenAI) -> None:
    # OpenAI reads a last assistant message as a whole one and answers after it; llama-server's own
    # default continued it ("prefill"), and refused two in a row with a 400 (a user trial: "Cannot
    # have 2 or more assistant messages at the end of the list").
    for answers in ([COLORS_ANSWER], [COLORS_ANSWER, "Do you want more?"]):
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colors."}]
        messages += [{"role": "assistant", "content": answer} for answer in answers]
        result = await client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, temperature=0, max_tokens=12
        )
        assert result.choices[0].message.content, answers
        assert result.usage is not None and result.usage.completion_tokens > 0


async def test_frequency_and_presence_penalties_reach_the_model(client: openai.AsyncOpenAI) -> None:
    # LiveKit and pipecat send them; they were accepted and dropped.
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say the word dog ten times."}]
    answers = {}
    for penalty in (0.0, 2.0):
        result = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            temperature=0,
            max_tokens=24,
            frequency_penalty=penalty,
            presence_penalty=penalty,
        )
        answers[penalty] = result.choices[0].message.content
    assert answers[0.0] != answers[2.0], answers


async def test_models_list_has_the_llm_with_its_kind(server: Any) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/v1/models") as resp:
        body = await resp.json()
    kinds = {m["id"]: m.get("kind") for m in body["data"]}
    assert kinds["smollm2-135m-instruct"] == "llm"
    assert kinds["gpt-4o-mini"] == "llm"
    assert kinds["text-embedding-3-small"] == "embedding"
    assert kinds["tiny.en"] == "asr" and kinds["whisper-1"] == "asr"


# --- bad input: 400 in OpenAI's shape ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": "gpt-4o-mini"}, "messages", "required"),
        ({"model": "gpt-4o-mini", "messages": []}, "messages", "at least 1"),
        ({"model": "gpt-4o-mini", "messages": [{"role": "robot", "content": "hi"}]}, "messages", "role"),
        ({"model": "gpt-4o-mini", "messages": [{"role": "tool", "content": "hi"}]}, "messages", "role"),
        (  # a result for a call nobody made (OpenAI's 400 too)
            {"model": "gpt-4o-mini", "messages": [*COLORS, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "messages",
            "which no earlier assistant message's tool_calls has",
        ),
        ({"model": "gpt-4o-mini", "messages": COLORS, "n": 2}, "n", "n must be 1"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "max_tokens": -3}, "max_tokens", "at least 1"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "max_tokens": 100000}, "max_tokens", "at most 1024"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "max_completion_tokens": 5000}, "max_completion_tokens", "1024"),
        ({"model": "no-such-model", "messages": COLORS}, "model", "smollm2-135m-instruct"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "temperature": 3}, "temperature", "less than or equal"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "frequency_penalty": 3}, "frequency_penalty", "less than"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "presence_penalty": -2.5}, "presence_penalty", "greater than"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "tools": [{"type": "function"}]}, "tools", "function must be"),
        (  # a content part of a type chat does not take: what it could be, not "a valid string"
            {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "messages",
            "'messages[0].content[0]': a content part is an object whose type is 'text' or 'image_url'",
        ),
        (  # an image part judged as one: its image_url is what is wrong, not its type
            {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
            },
            "messages",
            "'messages[0].content[0].image_url': Input should be a valid dictionary",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "zz"}]}]}, "model", "'model'"),  # the first field's
        ({"model": "gpt-4o-mini", "messages": COLORS, "stream": "yes"}, "stream", "valid boolean"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "stream": 1}, "stream", "valid boolean"),
        # Numbers are numbers (a trial's max_tokens true was taken as 1).
        ({"model": "gpt-4o-mini", "messages": COLORS, "max_tokens": True}, "max_tokens", "valid integer"),
        ({"model": "gpt-4o-mini", "messages": COLORS, "temperature": "0.5"}, "temperature", "valid number"),
        ([1, 2], "body", "JSON object"),
    ],
)
async def test_bad_requests_are_400(server: Any, body: Any, param: str, words: str) -> None:
    status, answer = await _post(f"{server.url}/v1/chat/completions", body)
    assert status == 400, answer
    error = _openai_error(answer, status)
    assert error["param"] == param
    assert words in error["message"]


async def test_non_json_body_is_400(server: Any) -> None:
    status, answer = await _post(f"{server.url}/v1/chat/completions", None, raw=b"{not json")
    assert status == 400
    assert "not valid JSON" in _openai_error(answer, status)["message"]


async def test_a_body_over_llm_max_request_bytes_is_413(server_factory: Any) -> None:
    limited = await server_factory(llm_max_request_bytes=2048)
    url = f"{limited.url}/v1/chat/completions"
    question = {"model": "gpt-4o-mini", "max_tokens": 1}
    long_text = "The quick brown fox jumps over the lazy dog. " * 60  # 2700 bytes: the default 4 MiB takes it
    status, answer = await _post(url, {**question, "messages": [{"role": "user", "content": long_text}]})
    assert status == 413, answer
    error = _openai_error(answer, status)
    assert error["code"] == "request_too_large" and "llm_max_request_bytes" in error["message"]
    status, answer = await _post(url, {**question, "messages": [{"role": "user", "content": long_text[:900]}]})
    assert status == 200, answer


async def test_prompt_over_the_context_window_is_400(client: openai.AsyncOpenAI) -> None:
    long_text = "The quick brown fox jumps over the lazy dog. " * 500  # ~5000 tokens
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": long_text}])
    assert caught.value.code == "context_length_exceeded"
    assert "tokens" in caught.value.message


async def test_sdk_raises_bad_request_for_n(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="gpt-4o-mini", messages=COLORS, n=3)
    assert caught.value.param == "n"


# --- disconnects, gating ---------------------------------------------------------------------------


async def test_client_disconnect_mid_stream_stops_the_generation(server: Any, llm_service: LlmService) -> None:
    await wait_idle(llm_service)
    body = {"model": "gpt-4o-mini", "messages": STORY, "max_tokens": 1000, "stream": True, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{server.url}/v1/chat/completions", json=body)
        chunks = 0
        async for line in resp.content:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    chunks += 1
            if chunks >= 3:
                break
        (busy,) = await busy_slots(llm_service)
        resp.close()  # hang up mid-answer
    # The server notices at its next write, closes the engine's stream, and llama-server stops.
    generated = await wait_stopped(llm_service, busy)
    assert 3 <= generated < 100, generated
    await wait_idle(llm_service)


async def test_llm_disabled_is_503_naming_the_reason(server_factory: Any) -> None:
    off = await server_factory(llm_enabled=False)
    status, answer = await _post(f"{off.url}/v1/chat/completions", {"model": "gpt-4o-mini", "messages": COLORS})
    assert status == 503
    error = _openai_error(answer, status)
    assert error["code"] == "feature_disabled"
    assert "llm_enabled=false" in error["message"]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{off.url}/health") as resp:
            health = await resp.json()
        async with session.get(f"{off.url}/v1/models") as resp:
            models = await resp.json()
        async with session.get(f"{off.url}/api/chatbot", params={"text": "hi"}) as resp:
            assert resp.status == 503
            assert "llm_enabled=false" in (await resp.json())["error"]
    assert health["features"]["llm"] == {"enabled": False, "reason": "switched off in settings (llm_enabled=false)"}
    assert all(m["kind"] == "asr" for m in models["data"])


async def test_health_says_the_llm_is_on(server: Any) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/health") as resp:
        health = await resp.json()
    assert health["features"]["llm"]["enabled"] is True


async def test_metrics_count_llm_tokens(client: openai.AsyncOpenAI, server: Any) -> None:
    """The token counters move by exactly the request's ``usage``."""

    async def metrics() -> str:
        async with aiohttp.ClientSession() as session, session.get(f"{server.url}/metrics") as resp:
            return await resp.text()

    def sample(text: str, name: str) -> float:
        line = next((line for line in text.splitlines() if line.startswith(name + " ")), None)
        return float(line.split()[-1]) if line is not None else 0.0

    prompt = 'mediaserver_llm_prompt_tokens_total{model="smollm2-135m-instruct"}'
    completion = 'mediaserver_llm_completion_tokens_total{model="smollm2-135m-instruct"}'
    before = await metrics()
    result = await client.chat.completions.create(model="gpt-4o-mini", messages=COLORS, temperature=0, max_tokens=20)
    text = await metrics()
    assert result.usage is not None
    assert sample(text, prompt) - sample(before, prompt) == result.usage.prompt_tokens > 0
    assert sample(text, completion) - sample(before, completion) == result.usage.completion_tokens > 0
    for name in (
        'mediaserver_llm_requests_total{backend="llama.cpp",model="smollm2-135m-instruct",outcome="ok"}',
        "mediaserver_llm_time_to_first_token_seconds_count",
        "mediaserver_llm_tokens_per_second_count",
    ):
        assert name in text, name


async def test_an_error_after_the_stream_started_is_an_error_event(
    server_factory: Any, base_settings: Any, asr_service: Any
) -> None:
    """The deadline passes mid-answer: the SSE stream ends with an OpenAI error, which the SDK raises."""
    settings = base_settings.model_copy(update={"llm_request_timeout_s": 5.0})
    service = LlmService(settings, asr_service.metrics)
    await service.start()
    try:
        live = await server_factory(llm=service)
        # (The test session's servers share one metrics registry: counts are compared before and after.)
        sample = live.app[METRICS].registry.get_sample_value
        route = {"route": "/v1/chat/completions"}
        counted_200 = sample("mediaserver_requests_total", {**route, "status": "200"}) or 0.0
        failed_labels = {**route, "code": "timeout"}
        failed_before = sample("mediaserver_responses_failed_after_headers_total", failed_labels) or 0.0
        async with openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as sdk:
            stream = await sdk.chat.completions.create(
                model="gpt-4o-mini", messages=STORY, temperature=0, max_tokens=1000, stream=True
            )
            received = []
            with pytest.raises(openai.APIError) as caught:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        received.append(chunk.choices[0].delta.content)
        # (The handler counts the request as it returns, just after the client read the error:
        # wait for it rather than race it.)
        failed = await eventually(
            lambda: (sample("mediaserver_responses_failed_after_headers_total", failed_labels) or 0.0) > failed_before,
            10,
        )
        async with aiohttp.ClientSession() as session, session.get(f"{live.url}/metrics") as resp:
            metrics = await resp.text()
    finally:
        await service.aclose()
    assert received  # the answer had started
    assert "llm_request_timeout_s" in caught.value.message
    # /metrics tells the failure from a completed stream: the request counts with the 200 sent, and
    # as failed after its headers, with the error's code.
    assert failed >= 0
    assert sample("mediaserver_requests_total", {**route, "status": "200"}) == counted_200 + 1
    assert sample("mediaserver_responses_failed_after_headers_total", failed_labels) == failed_before + 1
    assert 'mediaserver_responses_failed_after_headers_total{code="timeout",route="/v1/chat/completions"}' in metrics
